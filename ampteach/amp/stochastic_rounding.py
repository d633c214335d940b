"""Stochastic rounding to bf16: round up or down at random, so that on average nothing is lost.

    w_bf16 = round_stochastic(w_fp32)                       # each value: one of its two bf16 neighbours
    w_bf16 = round_stochastic(w_fp32, generator=gen)        # reproducible with a torch.Generator

For x between two neighbouring bf16 numbers lo < x < hi (lo nearer zero):

    P(round(x) = hi) = (x - lo) / (hi - lo),  else lo,   so that   E[round(x)] = x.

Rounding to nearest always picks the closer neighbour, so a weight update smaller than half the gap
(w/u beyond about 2^8 in bf16) is lost every time. Stochastic rounding keeps it with probability
|u| / gap: the weight moves by u on average, as it would in exact arithmetic (Gupta et al. 2015,
"Deep Learning with Limited Numerical Precision"; Zamirai et al. 2020, "Revisiting BFloat16
Training", arXiv:2010.06192). torchao's `_AdamW(bf16_stochastic_round=True)` (pytorch/ao PR #1124)
and llm.c's AdamW write their fp32 results into bf16 weights this way.

bf16 is the top half of an fp32 bit pattern, which makes the rule two integer operations: add a
uniform random 16-bit number to the fp32 bits, then drop the low 16 bits. The low 16 bits are k, the
distance from lo to x in units of 2^-16 of the gap; exactly k of the 2^16 equally likely noise values
carry into bit 16, which is the step from lo to hi (also across a power of two, and from the largest
bf16 number to inf). Stochastic rounding to fp16 has no such shortcut and is not provided.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["round_stochastic", "round_with_noise"]

_LOW16 = 0xFFFF                 # the 16 bits of an fp32 number that bf16 does not keep
_NOISE_VALUES = 1 << 16         # the noise is uniform over 0 .. 2^16 - 1


def round_stochastic(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """round_stochastic(torch.tensor([1 + 2**-10])) -> tensor([1.], dtype=torch.bfloat16) 7 times in 8, else 1.0078125.

    x: a float32 tensor. Returns a bfloat16 tensor of x's shape whose every value is one of the two
    bf16 numbers around x (x itself when x is a bf16 number), rounded away from zero with probability
    (|x| - |lo|) / (|hi| - |lo|). NaN stays NaN, +-inf stay +-inf. Draws from generator (default:
    torch's global generator, which ampteach.seed_everything seeds).
    """
    if not isinstance(x, Tensor) or x.dtype != torch.float32:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"round_stochastic rounds float32 values to bf16, got {got}: pass x.float() "
                        f"(a bf16 or fp16 value has no low bits left to round)")
    noise = torch.randint(0, _NOISE_VALUES, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    return round_with_noise(x, noise)


def round_with_noise(x: Tensor, noise: Tensor) -> Tensor:
    """round_with_noise(x, noise): round_stochastic with the random numbers given (int32 in [0, 2^16), one per value).

    bits(result) = (bits(x) + noise) with the low 16 bits cleared; bits are sign and magnitude, so the
    carry moves away from zero for negative x too. Deterministic: the tests feed it every noise value.
    """
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + noise) & ~_LOW16                    # a carry into bit 16 is one step to the next bf16
    out = rounded.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are zero
    return torch.where(x.isnan(), x.to(torch.bfloat16), out)  # a NaN's bits plus noise could become inf
