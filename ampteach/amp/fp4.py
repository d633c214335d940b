"""FP4 training from scratch, emulated: NVFP4 with each element of NVIDIA's recipe a switch, and MXFP4.

    from ampteach.amp.fp8 import convert_to_float8_training
    from ampteach.amp.fp4 import keep_high_precision
    convert_to_float8_training(model, recipe="nvfp4")                          # the full recipe
    convert_to_float8_training(model, recipe="nvfp4", weight_2d=False, rht=False, stochastic=False)   # naive
    convert_to_float8_training(model, recipe="mxfp4")                          # E8M0 scales per 32 values
    convert_to_float8_training(model, recipe="nvfp4", module_filter_fn=keep_high_precision("lm_head", "blocks.3.mlp"))

The layers are ampteach.amp.fp8's Float8Linear (one conversion mechanism for every recipe): a Linear's three
matmuls take quantized operands, each scaled along the dimension its matmul sums over, and multiply them with
float32 accumulation. FP4Recipe decides how each operand is quantized (q) and transformed (H, the 16x16 random
Hadamard transform, ampteach.amp.hadamard):

    forward  out    = q_x(x)          @ q_w(W).T         x: 1 x 16 blocks, nearest; W: 16 x 16 tiles (weight_2d)
    dgrad    grad_x = q_g(g)          @ q_w(W.T).T       g: 1 x 16 blocks, stochastic rounding (stochastic)
    wgrad    grad_W = q_g(H(g.T))     @ q_x(H(x.T)).T    both rotated along the token dimension first (rht)

the recipe of Transformer Engine's NVFP4BlockScaling and of "Pretraining Large Language Models with NVFP4"
(arXiv:2509.25149, section 4), whose fourth element, a few linear layers kept in higher precision, is the
module_filter_fn: keep_high_precision(prefixes...) leaves those Linears alone. Every NVFP4 tensor gets its
per-tensor scale amax / (448 * 6) (ampteach.amp.nvfp4); an all-zero tensor gets 1.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from ampteach.amp.hadamard import random_signs, rht, rht_matrix
from ampteach.amp.mx import SCALE_ROUNDINGS, _blocks, shared_exponent
from ampteach.amp.nvfp4 import block_amax, nvfp4_fake_quantize, round_e2m1

__all__ = ["FP4_FORMATS", "FP4Recipe", "fp4_fake_quantize", "mxfp4_fake_quantize", "keep_high_precision"]

FP4_FORMATS = {"nvfp4": 16, "mxfp4": 32}     # format -> values per block scale


def mxfp4_fake_quantize(x: Tensor, tiled: bool = False, rounding: str = "nearest", scale_rounding: str = "rceil",
                        generator: torch.Generator | None = None) -> Tensor:
    """MXFP4 values of x (float32): 2^e * E2M1(x / 2^e), e from the block's amax (ampteach.amp.mx.shared_exponent).

    Blocks of 32 along the last dim, or 32 x 32 tiles of a 2-D x (tiled); rounding "nearest" gives exactly
    ampteach.amp.mx.mx_fake_quantize(x, "fp4_e2m1", 32, scale_rounding) on finite blocks."""
    amax = block_amax(x, 32, tiled)
    scale = torch.ldexp(torch.ones_like(amax), shared_exponent(amax, "fp4_e2m1", scale_rounding)).unsqueeze(-1)
    values = round_e2m1(_blocks(x.float(), 32) / scale, rounding, generator)    # exact: a power of two
    return (values * scale).flatten(-2)[..., : x.shape[-1]]


def fp4_fake_quantize(x: Tensor, fmt: str = "nvfp4", tiled: bool = False, rounding: str = "nearest",
                      generator: torch.Generator | None = None, scale_rounding: str = "rceil") -> Tensor:
    """The float32 values an FP4 matmul multiplies for x: NVFP4 with its per-tensor scale, or MXFP4."""
    if fmt == "mxfp4":
        return mxfp4_fake_quantize(x, tiled, rounding, scale_rounding, generator)
    return nvfp4_fake_quantize(x, "auto", 16, tiled, rounding, generator)   # S = amax / (448 * 6), 1 for zeros


class FP4Recipe:
    """How Float8Linear quantizes each operand in FP4: convert_to_float8_training(model, recipe="nvfp4", ...).

    Args:
        fmt (str, default "nvfp4"): "nvfp4" (E4M3 scale per 16 and a per-tensor scale) or "mxfp4" (E8M0 per 32).
        weight_2d (bool, default True): one scale per square tile of W (16 x 16 NVFP4, 32 x 32 MXFP4), so the
            forward's W and the backward's W.T are the same numbers; False: 1-D blocks along each matmul's sum.
        rht (bool, default True): rotate the weight-gradient matmul's two inputs with the random Hadamard
            transform (size 16, or 32 for MXFP4 as the NVFP4 paper's MXFP4 runs) before quantizing them.
        stochastic (bool, default True): stochastic rounding for the gradient g (in dgrad and wgrad), nearest
            even for everything else; False: nearest everywhere.
        seed (int, default 0): the RHT's sign vector (one for every layer, for the whole run).
        generator (torch.Generator, optional): stochastic rounding's random numbers (default: torch's global
            generator, which ampteach.seed_everything seeds).
        scale_rounding (str, default "rceil"): MXFP4's exponent rule (ampteach.amp.mx); NVFP4 ignores it.
    """

    blockwise = True   # Float8Linear casts each operand along the dimension its matmul sums over, from float32

    def __init__(self, fmt: str = "nvfp4", weight_2d: bool = True, rht: bool = True, stochastic: bool = True,
                 seed: int = 0, generator: torch.Generator | None = None, scale_rounding: str = "rceil"):
        if fmt not in FP4_FORMATS:
            raise ValueError(f"fmt must be one of {list(FP4_FORMATS)}, got {fmt!r}")
        if scale_rounding not in SCALE_ROUNDINGS:
            raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS} (MXFP4's exponent rule), "
                             f"got {scale_rounding!r}")
        self.fmt, self.weight_2d, self.rht, self.stochastic = fmt, weight_2d, rht, stochastic
        self.generator, self.scale_rounding = generator, scale_rounding
        self.H = rht_matrix(random_signs(FP4_FORMATS[fmt], seed))

    def cast(self, role: str, x: Tensor, record: bool = True) -> Tensor:
        """The FP4 values of operand x in role "input", "weight" or "grad_output", blocked along its last dim."""
        rounding = "stochastic" if role == "grad_output" and self.stochastic else "nearest"
        tiled = role == "weight" and self.weight_2d
        return fp4_fake_quantize(x, self.fmt, tiled, rounding, self.generator, self.scale_rounding)

    def wgrad_operands(self, g_t: Tensor, x_t: Tensor, record: bool = True) -> tuple[Tensor, Tensor]:
        """The weight gradient's operands g.T and x.T (tokens along the last dim), rotated if rht, then cast."""
        if self.rht:
            pad = -g_t.shape[-1] % self.H.shape[0]                # zeros change no dot product
            g_t, x_t = (rht(nn.functional.pad(t.float(), (0, pad)), self.H) for t in (g_t, x_t))
        return self.cast("grad_output", g_t, record), self.cast("input", x_t, record)

    def __repr__(self) -> str:
        return (f"FP4Recipe({self.fmt!r}, weight_2d={self.weight_2d}, rht={self.rht}, "
                f"stochastic={self.stochastic})")


def keep_high_precision(*prefixes: str) -> Callable[[nn.Module, str], bool]:
    """module_filter_fn for convert_to_float8_training: convert every Linear except those whose name starts with
    one of prefixes (keep_high_precision("lm_head", "blocks.3") leaves the head and the last block alone)."""
    return lambda module, fqn: not any(fqn == p or fqn.startswith(p + ".") for p in prefixes)
