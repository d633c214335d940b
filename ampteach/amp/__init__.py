"""The torch.amp rebuild: what a learner swaps for torch's, one concept per module. Imports torch only.

    from ampteach.amp import GradScaler, autocast       # drop-ins for torch.amp.GradScaler, torch.autocast

formats (float formats and rounding), scaler with unscale_kernels and scaler_checks (GradScaler),
master (fp32 master weights), half_weights, kahan and stochastic_rounding (pure half-precision
weights), cast_lists and autocast with autocast_kernels, autocast_cache and containers (the cast
policy, registered in the dispatcher), accumulator (a matmul's accumulator of n bits, emulated),
fp8 and mx (scaled 8-bit and microscaling formats), nvfp4, hadamard and fp4 (4-bit formats, the random
Hadamard transform, and the FP4 training recipes that fp8's Float8Linear runs).
"""

from ampteach.amp.autocast import autocast, custom_bwd, custom_fwd
from ampteach.amp.master import MasterWeights, to_half
from ampteach.amp.scaler import GradScaler

__all__ = ["GradScaler", "MasterWeights", "autocast", "custom_bwd", "custom_fwd", "to_half"]
