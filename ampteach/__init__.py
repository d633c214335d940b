"""ampteach: mixed-precision training in PyTorch, rebuilt from scratch and checked against torch.amp.

    import ampteach
    scaler = ampteach.GradScaler("cpu")              # drop-in for torch.amp.GradScaler
    with ampteach.autocast("cpu", dtype=torch.bfloat16):   # drop-in for torch.autocast
        loss = model(x).float().pow(2).mean()

The imports below are the public surface, each name from the module (and lesson) that teaches it.
The package itself has five layers (ampteach/README.md): amp (the torch.amp rebuild), training, lab,
grading and tools; import from those for everything else, e.g. ampteach.grading.checks,
ampteach.tools.doctor, ampteach.lab.compare_torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

# The imports below keep lesson order, not alphabetical order.
# ruff: noqa: I001

# foundation: data, models, one training loop for every precision
from ampteach.training.data import (DataFileError, DatasetNotFoundError, FashionMNIST, course_split,
                                    load_fashion_mnist, preload)
from ampteach.training.models import cnn, mlp
from ampteach.training.seeding import seed_everything
from ampteach.training.course_device import course_device, cpu_only, gpu_skips
from ampteach.training.config import History, TrainConfig
from ampteach.training.train import evaluate, train

# lesson 1: float formats
from ampteach.amp.formats import (FORMATS, FloatFormat, bit_string, decode, encode, format_table, grid_near,
                                  like_torch, round_to_bf16, round_to_format, ulp)

# lesson 2: underflow and loss scaling
from ampteach.amp.scaler import GradScaler, OptState, StaticLossScaler
from ampteach.lab.underflow import ShrinkGradients, collect_gradients, plot_gradient_histogram, zone_fractions

# lesson 3: master weights, memory, and pure bf16 (Kahan-compensated updates, stochastic rounding)
from ampteach.amp.half_weights import HalfWeights
from ampteach.amp.kahan import kahan_add_
from ampteach.amp.master import MasterWeights, to_half
from ampteach.lab.memory import measure_peak, measure_step, memory_breakdown
from ampteach.amp.stochastic_rounding import round_stochastic

# lesson 4: autocast
from ampteach.amp.autocast import autocast, custom_bwd, custom_fwd

# lessons 5 and 6: recipes and checkpoints; debugging and scale-out (their helpers, imported where used:
# ampteach.lab.grad_accumulation, .clipping, .nan_spread, .side_by_side, .distributed)
from ampteach.training.checkpoint import load_checkpoint, save_checkpoint

# lesson 7: when mixed precision pays off
from ampteach.lab.roofline import plot_roofline, roofline_table
from ampteach.lab.step_time import amdahl, profile_step, width_sweep

# lesson 8: fp8 and microscaling
from ampteach.amp.fp8 import DelayedScaling, Float8Linear, convert_to_float8_training, quantize_tensorwise
from ampteach.amp.mx import MXTensor, mx_dequantize, mx_quantize

# lesson 9: mixed precision in a transformer (a tiny GPT on Shakespeare, through the same train())
from ampteach.training.text import load_shakespeare, preload_text
from ampteach.training.gpt import gpt

# lesson 10: accumulation precision (a matmul's running sum kept to fewer bits)
from ampteach.amp.accumulator import emulated_matmul

# lesson 11: fp4 training (NVFP4 and MXFP4, the random Hadamard transform, NVIDIA's recipe as switches)
from ampteach.amp.nvfp4 import NVFP4Tensor, nvfp4_quantize, nvfp4_quantize_2d, per_tensor_scale
from ampteach.amp.hadamard import inverse_rht, rht, rht_matrix
from ampteach.amp.fp4 import FP4Recipe, keep_high_precision

# old module paths (ampteach.checks, ...) still import, with a warning
from ampteach import _moved

_moved.install()

__all__ = [
    "DataFileError", "DatasetNotFoundError", "FashionMNIST", "course_split", "load_fashion_mnist", "preload",
    "cnn", "mlp", "seed_everything", "course_device", "cpu_only", "gpu_skips", "History", "TrainConfig", "evaluate",
    "train",
    "FORMATS", "FloatFormat", "bit_string", "decode", "encode", "format_table", "grid_near", "like_torch",
    "round_to_bf16", "round_to_format", "ulp",
    "GradScaler", "OptState", "StaticLossScaler", "ShrinkGradients", "collect_gradients",
    "plot_gradient_histogram", "zone_fractions",
    "HalfWeights", "kahan_add_", "MasterWeights", "to_half", "measure_peak", "measure_step", "memory_breakdown",
    "round_stochastic",
    "autocast", "custom_bwd", "custom_fwd",
    "load_checkpoint", "save_checkpoint",
    "plot_roofline", "roofline_table", "amdahl", "profile_step", "width_sweep",
    "DelayedScaling", "Float8Linear", "convert_to_float8_training", "quantize_tensorwise", "MXTensor",
    "mx_dequantize", "mx_quantize",
    "load_shakespeare", "preload_text", "gpt",
    "emulated_matmul",
    "NVFP4Tensor", "nvfp4_quantize", "nvfp4_quantize_2d", "per_tensor_scale", "inverse_rht", "rht", "rht_matrix",
    "FP4Recipe", "keep_high_precision",
]
