"""NVFP4 from scratch: 4-bit E2M1 values, one E4M3 scale per 16, one FP32 scale per tensor; bit for bit against torchao.

    from ampteach.amp.nvfp4 import nvfp4_quantize, nvfp4_quantize_2d, per_tensor_scale
    q = nvfp4_quantize(x)                                  # one level: an E4M3 scale per 16 values (torchao's default)
    q = nvfp4_quantize(x, per_tensor_scale(x))             # two levels: amax(x) / (448 * 6) on top (training's)
    q.codes, q.block_scales, q.per_tensor_scale            # uint8 E2M1 patterns, float8_e4m3fn scales, float32
    y = q.dequantize()                                     # float32: element * (per-tensor scale * block scale)
    w = nvfp4_quantize_2d(weight, per_tensor_scale(weight))   # the weight variant: one scale per 16x16 tile
    g = nvfp4_quantize(grad, per_tensor_scale(grad), rounding="stochastic")   # unbiased: E[g.dequantize()] = grad

E2M1 holds the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (ampteach.amp.formats' fp4_e2m1). For each block of
16 values along the last dimension (the steps and their order are torchao 0.18's nvfp4_quantize, so the
result is theirs bit for bit; the order of float operations decides the last bits):

    s     = float32(amax(block) / 6)                          the block's decode scale, unrounded
    s8    = e4m3(clamp(s / S, 2^-6, 448))                     S = the per-tensor scale (1 when there is none)
    v     = x * ((1 / S) / float32(s8))                       a reciprocal, then a multiply: not x / (S * s8)
    code  = E2M1(clamp(v, -6, 6))                             round to nearest, ties to even (or stochastic)
    value = code * float32(S * float32(s8))                   dequantize

S = amax(tensor) / (448 * 6) (per_tensor_scale) maps the largest block scale onto E4M3's largest number, so
the block scales use E4M3's range; without it, a block whose amax passes 6 * 448 = 2688 saturates, and one
whose amax is below 6 * 2^-6 is scaled by 2^-6 anyway (torchao clamps scales to E4M3's smallest normal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ampteach.amp.formats import ELEMENT_FORMATS, FORMATS
from ampteach.amp.mx import _blocks

__all__ = ["NVFP4Tensor", "ROUNDINGS", "E2M1", "E4M3", "nvfp4_quantize", "nvfp4_quantize_2d", "nvfp4_fake_quantize",
           "nvfp4_dequantize", "per_tensor_scale", "per_tensor_amax_to_scale", "round_e2m1", "e2m1_codes",
           "e2m1_values", "block_amax", "nvfp4_four_over_six"]

E2M1, E4M3 = ELEMENT_FORMATS["fp4_e2m1"], FORMATS["fp8_e4m3"]   # the one format registry
F4_MAX, F8_MAX = E2M1.max, E4M3.max                             # 6.0, 448.0
SCALE_MIN = E4M3.min_normal       # 2^-6: torchao clamps block scales here (torch.finfo(float8_e4m3fn).tiny)
ROUNDINGS = ("nearest", "stochastic")
_CHUNK = 2**16                    # values per piece: each step's pass stays in the CPU's cache
_SIGN = -(2**31)                  # 0x80000000 as an int32


def per_tensor_amax_to_scale(amax: Tensor) -> Tensor:
    """S = float32(amax) / (448 * 6): the per-tensor scale that maps the largest block scale to E4M3's max."""
    return amax.to(torch.float32) / (F8_MAX * F4_MAX)


def per_tensor_scale(x: Tensor) -> Tensor:
    """per_tensor_amax_to_scale(amax(|x|)): the FP32 second level of NVFP4 for tensor x (a 0-dim float32 tensor)."""
    return per_tensor_amax_to_scale(x.detach().abs().amax())


def _steps(magnitude: Tensor) -> tuple[Tensor, Tensor]:
    """(exponent field clamped to 127..129, c = 2^23 * the grid step): c is 2^22 below 2, 2^23 in [2, 4), 2^24 from 4.

    Adding c to a magnitude and subtracting it again rounds to a multiple of the step, nearest even: the sum
    lies in c's binade, where float32's last bit is worth one step."""
    field = (magnitude.view(torch.int32) >> 23).clamp_(min=127)      # [0, 2) all as [1, 2): step 0.5 there
    return field, field.add(22).bitwise_left_shift_(23)


def _round_nearest_(v: Tensor) -> Tensor:
    """v (float32) rounded in place to E2M1, nearest even, saturating at +-6; sign kept (-0.1 -> -0.0)."""
    bits = v.view(torch.int32)
    sign = bits & _SIGN
    bits.bitwise_and_(~_SIGN)                                  # |v|
    field, c = _steps(v.clamp_(max=F4_MAX))                    # saturate first: 6 is on the grid
    v.add_(c.view(torch.float32)).sub_(c.view(torch.float32))  # float32 addition rounds to nearest, ties to even
    return bits.bitwise_or_(sign).view(torch.float32)


def _encode_(v: Tensor) -> Tensor:
    """E2M1 codes (uint8) of v (float32, overwritten), rounded to nearest even and saturating.

    With s = |v| + c rounded as in _round_nearest_, s's bits minus c's count the steps k from 0, and
    code = k + 2 * (field - 127): 0, 0.5, 1, 1.5, 2 -> 0..4 (k), 2, 3, 4 -> 4, 5, 6 (k + 2), 4, 6 -> 6, 7 (k + 4)."""
    bits = v.view(torch.int32)
    sign = (bits >> 28).bitwise_and_(8)                        # the sign bit, moved to E2M1's bit 3
    bits.bitwise_and_(~_SIGN)
    field, c = _steps(v.clamp_(max=F4_MAX))
    v.add_(c.view(torch.float32))
    bits.sub_(c).add_(field, alpha=2).sub_(254).bitwise_or_(sign)
    return bits.to(torch.uint8)


def round_e2m1(v: Tensor, rounding: str = "nearest", generator: torch.Generator | None = None) -> Tensor:
    """round_e2m1(torch.tensor([2.5, 0.25, 7.0])) -> tensor([2., 0., 6.]): float32 values on the E2M1 grid, saturating.

    nearest:     the nearer grid neighbour, ties to the even code (2.5 -> 2, 3.5 -> 4, 5 -> 4)
    stochastic:  lo or hi, the grid neighbours around |v|, with P(hi) = (|v| - lo) / (hi - lo), so E[round(v)] = v
                 (from torch.rand(generator=...), whose numbers have 24 bits: exactly unbiased for |v| >= 1,
                 within 2^-25 of it below)
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    v = v.float()
    if rounding == "nearest":
        return _round_nearest_(v.clone())
    magnitude = v.abs().clamp_(max=F4_MAX)
    step = _steps(magnitude)[1].view(torch.float32) * 2.0**-23
    q = magnitude.div_(step)                                   # exact: a power of two
    lo = q.floor()
    up = torch.rand(q.shape, generator=generator, device=q.device) < q.sub_(lo)
    return lo.add_(up).mul_(step).copysign_(v)


def e2m1_codes(values: Tensor) -> Tensor:
    """e2m1_codes(torch.tensor([6.0, -0.5, 1.5])) -> tensor([7, 9, 3], dtype=torch.uint8): E2M1 bit patterns.

    sign << 3 | magnitude code (0, 0.5, 1, 1.5, 2, 3, 4, 6 -> 0..7); values off the grid round to nearest even."""
    return _encode_(values.float().clone())


def e2m1_values(codes: Tensor) -> Tensor:
    """e2m1_values(torch.tensor([7, 9], dtype=torch.uint8)) -> tensor([6.0, -0.5]): float32 values of E2M1 patterns."""
    magnitude = E2M1.values().to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


@dataclass
class NVFP4Tensor:
    """What nvfp4_quantize returns: E2M1 codes, E4M3 block scales and the FP32 per-tensor scale.

        q = nvfp4_quantize(x, per_tensor_scale(x))
        q.dequantize(), q.element_values(), q.scales(), q.bits_per_value()     # ..., 4.5 (plus 32 bits a tensor)

    value[..., i] = E2M1(codes[..., i]) * float32(per_tensor_scale * float32(block_scales[..., i // block_size]))

    Args:
        codes (Tensor): uint8, x's shape, one E2M1 bit pattern a byte (sign bit 8).
        block_scales (Tensor): torch.float8_e4m3fn, (*x.shape[:-1], n_blocks) for 1D blocks, (ceil(rows / 16),
            n_blocks) for the 2D tiles of nvfp4_quantize_2d.
        per_tensor_scale (Tensor | None): float32, 0-dim, or None for one-level scaling.
        block_size (int): values per block along the last dimension (16 for NVFP4).
        tiled (bool): True for 16x16 tiles (one scale per tile, shared by its 16 rows).
        dtype (torch.dtype): the quantized tensor's dtype (float32 or bfloat16).
    """

    codes: Tensor
    block_scales: Tensor
    per_tensor_scale: Tensor | None
    block_size: int = 16
    tiled: bool = False
    dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def element_values(self) -> Tensor:
        """The E2M1 values as float32, before any scale."""
        return e2m1_values(self.codes)

    def scales(self) -> Tensor:
        """float32 decode scale per 1 x block_size block, (*shape[:-1], n_blocks): S * float32(block scale)."""
        s = self.block_scales.float()
        if self.tiled:
            s = s.repeat_interleave(self.block_size, 0)[: self.shape[0]]
        return s if self.per_tensor_scale is None else self.per_tensor_scale * s

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return nvfp4_dequantize(self, dtype)

    def bits_per_value(self) -> float:
        """Storage: 4 bits a value, 8 per block scale, 32 for the tensor's scale (NVFP4: 4.5 plus 32 / numel)."""
        per_tensor = 0 if self.per_tensor_scale is None else 32
        return 4 + (8 * self.block_scales.numel() + per_tensor) / self.codes.numel()


def nvfp4_dequantize(q: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """y = nvfp4_dequantize(nvfp4_quantize(x)): E2M1 value * float32(S * block scale), block by block, in dtype."""
    values = _blocks(q.element_values(), q.block_size)
    out = values * q.scales().unsqueeze(-1)                  # exact: an E2M1 value has at most two significant bits
    return out.flatten(-2)[..., : q.shape[-1]].to(dtype)


def block_amax(x: Tensor, block_size: int = 16, tiled: bool = False) -> Tensor:
    """amax per 1 x block_size block along the last dim, (*x.shape[:-1], n_blocks); tiled=True: the amax of each
    block_size x block_size tile of a 2-D x, repeated for the tile's rows (the weight variant)."""
    amax = _blocks(x.float(), block_size).abs().amax(-1)
    if not tiled:
        return amax
    if x.dim() != 2:
        raise ValueError(f"16x16 tiles are for a 2-D weight, got a tensor of shape {tuple(x.shape)}")
    rows = amax.shape[0]
    tiles = torch.nn.functional.pad(amax, (0, 0, 0, -rows % block_size)).unflatten(0, (-1, block_size)).amax(1)
    return tiles.repeat_interleave(block_size, 0)[:rows]


def nvfp4_quantize(x: Tensor, per_tensor_scale: Tensor | float | None = None, block_size: int = 16,
                   rounding: str = "nearest", generator: torch.Generator | None = None) -> NVFP4Tensor:
    """q = nvfp4_quantize(x, per_tensor_scale(x)): NVFP4 in blocks of 16 along the last dim; torchao's bit for bit.

    s8 = e4m3(clamp(float32(amax / 6) / S, 2^-6, 448)); code = E2M1(clamp(x * ((1 / S) / s8), -6, 6)).
    A last block shorter than block_size is padded with zeros (torchao requires whole blocks).
    """
    scales, codes = _quantize(x, block_amax(x, block_size), per_tensor_scale, block_size, rounding, generator, True)
    return NVFP4Tensor(codes, scales, _scale_tensor(per_tensor_scale), block_size, False, x.dtype)


def nvfp4_quantize_2d(w: Tensor, per_tensor_scale: Tensor | float | None = None, block_size: int = 16,
                      rounding: str = "nearest", generator: torch.Generator | None = None) -> NVFP4Tensor:
    """q = nvfp4_quantize_2d(weight, per_tensor_scale(weight)): one E4M3 scale per 16x16 tile of a 2-D weight.

    Every 1 x 16 block of a tile takes the tile's amax, so W and W.T quantize to the same values:
    nvfp4_quantize_2d(w).dequantize().T == nvfp4_quantize_2d(w.T).dequantize(), bit for bit.
    """
    scales, codes = _quantize(w, block_amax(w, block_size, tiled=True), per_tensor_scale, block_size, rounding,
                              generator, True)
    return NVFP4Tensor(codes, scales[::block_size], _scale_tensor(per_tensor_scale), block_size, True, w.dtype)


def nvfp4_fake_quantize(x: Tensor, per_tensor_scale: Tensor | float | str | None = None, block_size: int = 16,
                        tiled: bool = False, rounding: str = "nearest",
                        generator: torch.Generator | None = None) -> Tensor:
    """nvfp4_quantize(...).dequantize() in one go, without codes: the float32 values an NVFP4 matmul multiplies.

    per_tensor_scale="auto": amax(x) / (448 * 6) from the block amaxes (1 for an all-zero x), what training uses.
    """
    amax = block_amax(x, block_size, tiled)
    if isinstance(per_tensor_scale, str):
        if per_tensor_scale != "auto":
            raise ValueError(f"per_tensor_scale must be a number, a tensor, None or 'auto', got {per_tensor_scale!r}")
        S = per_tensor_amax_to_scale(amax.max())
        per_tensor_scale = torch.where(S > 0, S, 1.0)
    return _quantize(x, amax, per_tensor_scale, block_size, rounding, generator, codes=False)[1]


def nvfp4_four_over_six(x: Tensor, block_size: int = 16) -> tuple[Tensor, Tensor]:
    """values, to_4 = nvfp4_four_over_six(x): NVFP4 where each block's amax lands on 6 or on 4, whichever errs less.

    Two candidates per block, the plain one (amax -> 6) and one with its scale 1.5 times larger (amax -> 4,
    so values near the top use the grid's 2, 3, 4 instead of 4, 6); the block keeps the one with the smaller
    sum of squared errors. The per-tensor scale is amax / (6 * 256), so that 1.5 times a block scale still
    fits E4M3 (256 * 1.5 = 384 <= 448), as the authors' reference code sets it (mit-han-lab/fouroversix,
    "Four Over Six", arXiv:2512.02010). Returns the float32 values and, per block, True where 4 won."""
    S = x.detach().abs().amax().float() / (F4_MAX * 256.0)
    S = torch.where(S > 0, S, 1.0)
    amax, blocks = block_amax(x, block_size), _blocks(x.float(), block_size)
    candidates = []
    for factor in (1.0, 1.5):                                   # the block amax lands on 6, then on 4
        values = _blocks(_quantize(x, amax * factor, S, block_size, "nearest", None, False)[1], block_size)
        candidates.append((values, (values - blocks).pow(2).sum(-1)))
    (six, err6), (four, err4) = candidates
    to_4 = err4 < err6
    return torch.where(to_4.unsqueeze(-1), four, six).flatten(-2)[..., : x.shape[-1]], to_4


def _scale_tensor(per_tensor_scale: Tensor | float | None) -> Tensor | None:
    if per_tensor_scale is None:
        return None
    return torch.as_tensor(per_tensor_scale, dtype=torch.float32).reshape(())


def _check(x: Tensor, block_size: int, rounding: str) -> None:
    if not isinstance(x, Tensor) or x.dtype not in (torch.float32, torch.bfloat16) or x.dim() == 0:
        got = f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"nvfp4_quantize takes a float32 or bfloat16 tensor with at least one dimension (as torchao "
                        f"does), got {got}")
    if not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size must be a positive int (NVFP4 uses 16), got {block_size!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be 'nearest' (weights, activations) or 'stochastic' (gradients), "
                         f"got {rounding!r}")


def _quantize(x: Tensor, amax: Tensor, per_tensor_scale, block_size: int, rounding: str,
              generator: torch.Generator | None, codes: bool) -> tuple[Tensor, Tensor]:
    """(E4M3 block scales, E2M1 codes or the dequantized float32 values, x's shape), torchao's order of operations."""
    _check(x, block_size, rounding)
    block_scale = amax / F4_MAX                                  # float32
    S = _scale_tensor(per_tensor_scale)
    if S is None:
        scale8 = block_scale.clamp(min=SCALE_MIN, max=F8_MAX).to(torch.float8_e4m3fn)
        reciprocal = 1.0 / scale8.float()
    else:
        scale8 = (block_scale / S).clamp(min=SCALE_MIN, max=F8_MAX).to(torch.float8_e4m3fn)
        reciprocal = (1.0 / S) / scale8.float()
    blocks = _blocks(x.float(), block_size).reshape(-1, block_size)
    out = torch.empty(blocks.shape, dtype=torch.uint8 if codes else torch.float32, device=x.device)
    reciprocal = reciprocal.reshape(-1, 1)
    decode = (scale8.float() if S is None else S * scale8.float()).reshape(-1, 1)   # nvfp4_dequantize's scale
    rows = max(1, _CHUNK // block_size)      # pieces of _CHUNK values: each pass over data in the CPU's cache
    for i in range(0, blocks.shape[0], rows):
        v = blocks[i:i + rows] * reciprocal[i:i + rows]
        if rounding == "stochastic":                     # on the grid already: nearest would change nothing
            v = round_e2m1(v, rounding, generator)
        else:
            v = v if codes else _round_nearest_(v)
        out[i:i + rows] = _encode_(v) if codes else v.mul_(decode[i:i + rows])
    out = out.view(*amax.shape, block_size)
    return scale8, out.flatten(-2)[..., : x.shape[-1]]
