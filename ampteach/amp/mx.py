"""Microscaling (MX) from scratch: every 32 values share one power-of-two scale (OCP MX v1.0), bit for bit.

    from ampteach.amp.mx import mx_quantize, mx_dequantize
    mx = mx_quantize(x, "fp4_e2m1")              # MXFP4: 4-bit elements, one E8M0 scale per 32 values
    mx.scale_codes                               # uint8 E8M0 codes: the block's scale is 2^(code - 127)
    mx.elements                                  # fp8 dtypes for MXFP8, uint8 bit patterns for MXFP6/MXFP4
    y = mx_dequantize(mx)                        # float32: element * 2^e, block by block

Each block of `block_size` consecutive values along the last dimension (a shorter last block when
the dimension does not divide: it is padded with zeros, which change no maximum) is stored as one
shared exponent e and one element per value:

    "floor" (the OCP spec):              e = floor(log2(amax)) - emax_elem, read from amax's exponent bits
    "rceil" (Transformer Engine, cuBLAS): e = ceil(log2(float32(amax * float32(1 / max_elem))))
    e = clamp(e, -127, 127);   element_i = round_half_even(v_i / 2^e), saturating at +-max_elem

An all-zero block gets e = -127 and zero elements. A block holding inf or NaN gets the E8M0 NaN code
255 and dequantizes to NaN (as torchao does). "floor" is the spec's rule; it may saturate the block's
top values (MXFP4 maps an amax of 7 to 6). "rceil" never saturates, at the price of one binade of
resolution for some blocks. Why read bits instead of calling log2: log2 in float32 rounds, and just below
a power of two it rounds up to the power itself: log2(8 * (1 - 2^-24)) is 3.0 in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ampteach.amp.formats import ELEMENT_FORMATS, FloatFormat

__all__ = ["ELEMENT_FORMATS", "MXTensor", "mx_quantize", "mx_dequantize", "mx_fake_quantize", "round_to_element",
           "element_format", "element_codes", "element_values", "shared_exponent", "check_options",
           "SCALE_ROUNDINGS", "E8M0_BIAS", "E8M0_NAN", "EXPONENT_RANGE"]

SCALE_ROUNDINGS = ("floor", "rceil")
E8M0_BIAS = 127
E8M0_NAN = 255
EXPONENT_RANGE = (-127, 127)   # E8M0 codes 0..254; 255 is NaN


def element_format(elem: FloatFormat | str) -> FloatFormat:
    """element_format("fp4_e2m1") is ELEMENT_FORMATS["fp4_e2m1"] (ampteach.amp.formats' registry); a format itself."""
    if isinstance(elem, FloatFormat):
        return elem
    if elem not in ELEMENT_FORMATS:
        raise ValueError(f"unknown MX element format {elem!r}: use one of {list(ELEMENT_FORMATS)}")
    return ELEMENT_FORMATS[elem]


def round_to_element(v: Tensor, elem: FloatFormat | str) -> Tensor:
    """round_to_element(torch.tensor([2.5, 7.0]), "fp4_e2m1") -> tensor([2., 6.]): nearest, ties to even, saturating.

    |v| ~ n * 2^(E - M), n = round_half_even(|v| / 2^(E - M)), E = max(floor(log2 |v|), emin)
    """
    fmt = element_format(elem)
    magnitude = v.float().abs().clamp_(max=fmt.max)        # saturate first: max is on the grid
    exponent = (_exponent_field(magnitude) - 127).clamp_(min=fmt.emin)   # E: below emin, fmt's subnormals
    step = exponent.add_(127 - fmt.man_bits).bitwise_left_shift_(23).view(torch.float32)   # 2^(E - M), exactly
    return magnitude.div_(step).round_().mul_(step).copysign_(v)   # round: halves to even; NaN stays NaN


def element_codes(values: Tensor, elem: FloatFormat | str) -> Tensor:
    """element_codes(torch.tensor([6.0, -0.5]), "fp4_e2m1") -> tensor([7, 9], dtype=torch.uint8): bit patterns of
    values already on the element grid (e.g. from round_to_element); sign bit | index in fmt.values()."""
    fmt = element_format(elem)
    magnitude_code = torch.searchsorted(fmt.values(), values.abs().contiguous())
    return (magnitude_code | (values.signbit().long() << (fmt.bits - 1))).to(torch.uint8)


def element_values(codes: Tensor, elem: FloatFormat | str) -> Tensor:
    """element_values(torch.tensor([7, 9], dtype=torch.uint8), "fp4_e2m1") -> tensor([6.0, -0.5]): the float32
    values of an element format's bit patterns (element_codes' inverse)."""
    fmt = element_format(elem)
    magnitude_bits = fmt.bits - 1
    magnitude = fmt.values()[(codes.long() & (2**magnitude_bits - 1))]
    return torch.where((codes.long() >> magnitude_bits) & 1 == 1, -magnitude, magnitude)


@dataclass
class MXTensor:
    """What mx_quantize returns: element codes plus one E8M0 scale code per block; mx_dequantize(mx) reads it.

        mx = mx_quantize(x, "fp4_e2m1")
        mx.scale_exponents, mx.element_values(), mx.dequantize(), mx.bits_per_value()   # ..., 4.25

    value[..., i] = element[..., i] * 2^(scale_codes[..., i // block_size] - 127)

    Args:
        elements (Tensor): x's shape; torch.float8_e4m3fn/e5m2 values for MXFP8, uint8 bit patterns
            for MXFP6/MXFP4 (ELEMENT_FORMATS[elem].values()[code] is a pattern's magnitude).
        scale_codes (Tensor): uint8, shape (*x.shape[:-1], number of blocks): E8M0 codes, 255 = NaN.
        elem (str): the element format's name in ELEMENT_FORMATS.
        block_size (int): values per shared scale along the last dimension (32 in the OCP spec).
        scale_rounding (str): how the shared exponent was chosen, "floor" or "rceil".
    """

    elements: Tensor        # x's shape: torch.float8_e4m3fn/e5m2 for MXFP8, uint8 bit patterns for MXFP6/MXFP4
    scale_codes: Tensor     # uint8, (*x.shape[:-1], number of blocks): E8M0, 255 = NaN
    elem: str
    block_size: int
    scale_rounding: str

    @property
    def shape(self) -> torch.Size:
        return self.elements.shape

    @property
    def scale_exponents(self) -> Tensor:
        """e per block (int32): the scale is 2^e. Code 255 (NaN) shows as 128."""
        return self.scale_codes.int() - E8M0_BIAS

    @property
    def scales(self) -> Tensor:
        """2^e per block as float32 (2^-127 is a float32 subnormal, exactly), NaN for code 255."""
        return _scales(self.scale_exponents)

    def element_values(self) -> Tensor:
        """The elements as float32 values, before the block scale."""
        if self.elements.dtype == torch.uint8:
            return element_values(self.elements, self.elem)
        return self.elements.float()

    def dequantize(self) -> Tensor:
        return mx_dequantize(self)

    def bits_per_value(self) -> float:
        """Storage cost: element bits plus the 8-bit scale shared by block_size values (MXFP4: 4.25)."""
        return element_format(self.elem).bits + 8 / self.block_size


def mx_quantize(x: Tensor, elem: FloatFormat | str = "fp8_e4m3", block_size: int = 32,
                scale_rounding: str = "floor") -> MXTensor:
    """mx = mx_quantize(x, "fp8_e4m3"): blocks of block_size values along the last dim, one E8M0 scale each.

    e = clamp(floor(log2 amax) - emax_elem, -127, 127) ("floor") or clamp(ceil(log2(amax / max_elem)),
    -127, 127) ("rceil", amax * float32(1/max_elem) in float32); element = RNE(v / 2^e), saturating.
    """
    fmt = element_format(elem)
    exponent, rounded = _quantize_blocks(x, fmt, block_size, scale_rounding)
    rounded = rounded.flatten(-2)[..., : x.shape[-1]]            # drop the padding
    if fmt.torch_dtype is not None:
        elements = rounded.to(fmt.torch_dtype)                  # exact: every value is on the grid
    else:
        elements = element_codes(rounded, fmt)
    codes = (exponent + E8M0_BIAS).to(torch.uint8)               # 255 (NaN) where exponent is 128
    return MXTensor(elements, codes, fmt.name, block_size, scale_rounding)


def mx_fake_quantize(x: Tensor, elem: FloatFormat | str = "fp8_e4m3", block_size: int = 32,
                     scale_rounding: str = "floor") -> Tensor:
    """mx_dequantize(mx_quantize(x, ...)) in one pass, without storing codes: what an MX matmul multiplies."""
    fmt = element_format(elem)
    exponent, rounded = _quantize_blocks(x, fmt, block_size, scale_rounding)
    return (rounded * _scales(exponent).unsqueeze(-1)).flatten(-2)[..., : x.shape[-1]]


def check_options(block_size: int, scale_rounding: str) -> None:
    """check_options(32, "rceil"): raise ValueError if block_size or scale_rounding is not one mx_quantize takes."""
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError(f"scale_rounding must be 'floor' (the OCP spec) or 'rceil' (Transformer Engine, "
                         f"cuBLAS), got {scale_rounding!r}")
    if not (isinstance(block_size, int) and block_size >= 1):
        raise ValueError(f"block_size must be a positive int (the OCP spec uses 32), got {block_size!r}")


def _quantize_blocks(x: Tensor, fmt: FloatFormat, block_size: int, scale_rounding: str) -> tuple[Tensor, Tensor]:
    """Block exponents (128 where the block holds inf or NaN) and the rounded elements, (..., n_blocks, block_size)."""
    check_options(block_size, scale_rounding)
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() == 0:
        got = f"a {x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"mx_quantize takes a floating-point tensor with at least one dimension, got {got}")
    blocks = _blocks(x.float(), block_size)                      # (..., n_blocks, block_size)
    amax = blocks.abs().amax(dim=-1)                             # NaN in a block gives NaN
    finite = torch.isfinite(amax)
    exponent = torch.where(finite, shared_exponent(amax, fmt, scale_rounding), E8M0_NAN - E8M0_BIAS)
    scaled = blocks / _scales(exponent).unsqueeze(-1)            # exact: a power of two
    rounded = round_to_element(scaled, fmt)
    if not finite.all():
        rounded = torch.where(finite.unsqueeze(-1), rounded, 0.0)
    return exponent, rounded


def mx_dequantize(mx: MXTensor) -> Tensor:
    """y = mx_dequantize(mx_quantize(x, "fp4_e2m1")): float32, element * 2^e per block (NaN where e is NaN)."""
    values = _blocks(mx.element_values(), mx.block_size)
    out = values * mx.scales.unsqueeze(-1)                        # exact: a power of two
    return out.flatten(-2)[..., : mx.shape[-1]]


def shared_exponent(amax: Tensor, elem: FloatFormat | str, scale_rounding: str = "floor") -> Tensor:
    """e = shared_exponent(amax, "fp4_e2m1", "floor"): the block exponent (int32) per amax (float32, >= 0).

    e = clamp(floor(log2 amax) - emax_elem, -127, 127) ("floor"), or ceil(log2(amax / max_elem)) ("rceil").
    """
    fmt = element_format(elem)
    if scale_rounding == "floor":
        # floor(log2 amax) is the unbiased exponent field. A subnormal amax reads as -127, above its
        # true floor(log2), but either way e lands below -127 and the clamp makes it -127.
        exponent = _exponent_field(amax) - E8M0_BIAS - fmt.emax
    elif scale_rounding == "rceil":
        reciprocal = torch.tensor(1.0) / fmt.max                 # float32(1 / max_elem), as TE stores it
        p = amax.float() * reciprocal                            # rounded to float32
        mantissa = p.view(torch.int32) & 0x7FFFFF
        exponent = _exponent_field(p) - E8M0_BIAS + (mantissa != 0).int()   # ceil(log2 p) for normal p
        # subnormal p (< 2^-126): ceil(log2 p) is -126 above 2^-127 (mantissa > 2^22), else <= -127
        exponent = torch.where(_exponent_field(p) == 0, torch.where(mantissa > 2**22, -126, -127), exponent)
    else:
        raise ValueError(f"scale_rounding must be one of {SCALE_ROUNDINGS}, got {scale_rounding!r}")
    return exponent.clamp(*EXPONENT_RANGE).int()


def _exponent_field(x: Tensor) -> Tensor:
    """The 8 exponent bits of float32 values (int32): the unbiased exponent plus 127, 0 for subnormals."""
    return (x.float().view(torch.int32) >> 23) & 0xFF


def _scales(exponent: Tensor) -> Tensor:
    """2^exponent as float32, exactly (2^-127 is subnormal: bit 22 alone); NaN where exponent is 128 (code 255)."""
    code = exponent + E8M0_BIAS
    bits = torch.where(code > 0, code << 23, 1 << 22).int()
    return torch.where(code >= E8M0_NAN, math.nan, bits.view(torch.float32))


def _blocks(x: Tensor, block_size: int) -> Tensor:
    """x (..., n) -> (..., ceil(n / block_size), block_size), the last block padded with zeros."""
    pad = -x.shape[-1] % block_size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.unflatten(-1, (-1, block_size))
