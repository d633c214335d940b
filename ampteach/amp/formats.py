"""Floating-point formats from scratch: fp32, tf32, fp16, bf16, fp8, fp6 and fp4, bit-exact against torch.

    from ampteach.amp.formats import FORMATS, decode, encode, round_to_format, ulp
    fp16 = FORMATS["fp16"]
    decode(0b0_01111_0000000001, fp16)           # 1.0009765625 = 1 + fp16.eps
    encode(65520.0, fp16)                        # 0b0_11111_0000000000: inf (65520 is a tie above max)
    round_to_format(torch.tensor([1 + 1e-4, 2049.0, 65519.0]), fp16)   # tensor([1., 2048., 65504.])

Every format is the same recipe with different field widths (E exponent bits, M mantissa bits):

    normal    (exponent field e = 1 .. top):  value = (-1)^sign * 2^(e - bias) * 1.mantissa
    subnormal (exponent field e = 0):         value = (-1)^sign * 2^(1 - bias) * 0.mantissa
    top exponent field (all ones):            inf (mantissa 0) or NaN, IEEE style

with bias = 2^(E-1) - 1. float8_e4m3fn ("fn": finite, NaN only at S.1111.111) has no inf: it spends
the top exponent on seven more normal numbers (256 .. 448) and one NaN per sign. The fp6 and fp4
element formats of OCP Microscaling (MX v1.0) have neither inf nor NaN: every pattern is a number.

The one registry of formats is this module. FORMATS holds the formats a tensor is stored in (torch's
float dtypes, and tf32); ELEMENT_FORMATS the element formats of MX blocks (both fp8s, the same
objects, plus fp6_e3m2, fp6_e2m3 and fp4_e2m1). ampteach.amp.mx and ampteach.amp.fp8 read them
from here; as_format(name) finds a format in either.

Three ways in, each written from that definition rather than by calling torch's casts:
- decode(bits, fmt) / encode(value, fmt): one value at a time, with Python ints and floats.
- round_to_format(x, fmt): a float32 tensor -> the float32 values it becomes when stored in fmt,
  vectorised with integer operations on the float32 bits. round_to_bf16 is the same idea with
  every constant written out, small enough to read in one go.
- ulp, grid_near, bit_string, formula, format_table: what the lesson needs to look at the numbers.

Overflow of float8_e4m3fn depends on the torch version. torch >= 2.12 (pytorch/pytorch#178817)
saturates on the CPU: 464 < |x|, and +-inf, become +-448. Earlier versions (2.11 and before) turn
the same values into NaN. FORMATS["fp8_e4m3"] saturates (overflow="saturate"); like_torch(fmt)
gives the rule of the installed (or a named) torch version, and overflow="nan" the older rule.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, replace

import torch
from torch import Tensor

__all__ = ["FORMATS", "ELEMENT_FORMATS", "FloatFormat", "OVERFLOWS", "E4M3FN_SATURATES_SINCE", "as_format",
           "like_torch", "decode", "encode", "round_to_bf16", "round_to_format", "ulp", "grid_near", "formula",
           "bit_string", "format_table"]

OVERFLOWS = ("inf", "saturate", "nan")
E4M3FN_SATURATES_SINCE = (2, 12)  # pytorch/pytorch#178817: CPU casts saturate instead of giving NaN

_SIGN32 = -(2**31)        # 0x80000000 as an int32
_MAG32 = 0x7FFF_FFFF      # every bit but the sign
_INF32 = 0x7F80_0000      # float32 +inf: exponent all ones, mantissa 0
_QUIET32 = 0x0040_0000    # the top mantissa bit: set in a quiet NaN


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: FORMATS["fp16"], or your own FloatFormat("toy_e3m2", 3, 2).

        fp16 = FloatFormat("fp16", 5, 10, torch_dtype=torch.float16)     # FORMATS["fp16"]
        fp16.max, fp16.min_normal, fp16.eps                              # 65504.0, 6.1e-05, 0.0009765625

    value = (-1)^s * 2^(e - bias) * 1.m  (normal), (-1)^s * 2^(1 - bias) * 0.m  (subnormal, e = 0)

    Args:
        name (str): the key in FORMATS or ELEMENT_FORMATS, and what tables print.
        exp_bits (int): E, exponent bits (2..8); bias = 2^(E-1) - 1.
        man_bits (int): M, mantissa bits (1..23): 2^M numbers per binade.
        has_inf (bool, default True): IEEE encoding, the top exponent field holds inf and NaN. False:
            no inf, and the top exponent holds normal numbers (float8_e4m3fn's "fn" encoding).
        has_nan (bool, default True): False (only with has_inf=False): no NaN either, every pattern
            is a number (MX's fp6 and fp4). With has_inf=False and has_nan=True, NaN is S.1..1.1..1.
        overflow (str, default "inf"): what a value too large becomes: "inf" (IEEE), "saturate"
            (+-max: float8_e4m3fn in torch >= 2.12, MX elements) or "nan" (float8_e4m3fn in torch
            <= 2.11). NaN stays NaN (a float32 NaN where the format has none).
        torch_dtype (torch.dtype, optional): torch's dtype for the format, if it has one.
    """

    name: str
    exp_bits: int
    man_bits: int
    has_inf: bool = True
    overflow: str = "inf"
    torch_dtype: torch.dtype | None = None
    has_nan: bool = True

    def __post_init__(self) -> None:
        if not (2 <= self.exp_bits <= 8 and 1 <= self.man_bits <= 23):
            raise ValueError(f"{self.name}: exp_bits must be 2..8 and man_bits 1..23 (a subset of float32), "
                             f"got {self.exp_bits} and {self.man_bits}")
        if not self.has_inf and self.exp_bits == 8:
            raise ValueError(f"{self.name}: without inf, 8 exponent bits would reach past float32's range; "
                             "use has_inf=True")
        if self.overflow not in OVERFLOWS:
            raise ValueError(f"{self.name}: overflow must be one of {OVERFLOWS}, got {self.overflow!r}")
        if self.overflow == "inf" and not self.has_inf:
            raise ValueError(f"{self.name} has no inf to overflow to: use overflow='saturate' or 'nan'")
        if self.has_inf and not self.has_nan:
            raise ValueError(f"{self.name}: an IEEE top exponent holds inf and NaN together; for a format "
                             "without NaN pass has_inf=False, has_nan=False, overflow='saturate'")
        if self.overflow == "nan" and not self.has_nan:
            raise ValueError(f"{self.name} has no NaN to overflow to: use overflow='saturate'")

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (subnormals share it)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number: the top field is reserved for inf/NaN in IEEE formats."""
        top_field = 2**self.exp_bits - (2 if self.has_inf else 1)
        return top_field - self.bias

    @property
    def eps(self) -> float:
        """Gap between 1 and the next number: 2^-M."""
        return 2.0**-self.man_bits

    @property
    def max(self) -> float:
        """Largest finite value: mantissa all ones, or all ones but the last for "fn" (all ones is NaN)."""
        return decode(self.max_code, self)


    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits the M+1 significand bits hold: (M + 1) * log10(2)."""
        return (self.man_bits + 1) * math.log10(2)

    @property
    def max_code(self) -> int:
        """Bit pattern of +max (the largest finite magnitude)."""
        nan_at_top = self.has_nan and not self.has_inf          # "fn": S.1..1.1..1 is NaN
        top_mantissa = 2**self.man_bits - (2 if nan_at_top else 1)
        return ((self.emax + self.bias) << self.man_bits) | top_mantissa

    @property
    def inf_code(self) -> int | None:
        """Bit pattern of +inf, None for "fn" formats."""
        return (2**self.exp_bits - 1) << self.man_bits if self.has_inf else None

    @property
    def nan_code(self) -> int | None:
        """Bit pattern of the NaN encode returns: a quiet NaN (top mantissa bit set), all ones for "fn", or
        None for a format without NaN."""
        if not self.has_nan:
            return None
        top = (2**self.exp_bits - 1) << self.man_bits
        return top | (1 << (self.man_bits - 1)) if self.has_inf else top | (2**self.man_bits - 1)

    def values(self) -> Tensor:
        """fmt.values()[code]: every non-negative finite value (float32), ascending, indexed by bit pattern.

            FORMATS["fp4_e2m1"] -> tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])   (via ELEMENT_FORMATS)

        For formats of at most 16 bits (a table of 2^(bits-1) values).
        """
        if self.bits > 16:
            raise ValueError(f"{self.name} has {self.bits} bits: values() lists 2^(bits-1) numbers, so it takes "
                             "formats of at most 16 bits; use grid_near(x, fmt) for the numbers near x")
        codes = torch.arange(2 ** (self.bits - 1))
        field, mantissa = codes >> self.man_bits, codes & (2**self.man_bits - 1)
        significand = torch.where(field > 0, mantissa + 2**self.man_bits, mantissa).double()
        values = torch.ldexp(significand, field.clamp(min=1) - self.bias - self.man_bits).float()
        return values[values <= self.max]       # past max: inf and NaN patterns


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("fp32", 8, 23, torch_dtype=torch.float32),
        FloatFormat("tf32", 8, 10),  # NVIDIA TensorFloat-32: fp32's range, fp16's precision; no torch dtype
        FloatFormat("fp16", 5, 10, torch_dtype=torch.float16),
        FloatFormat("bf16", 8, 7, torch_dtype=torch.bfloat16),
        FloatFormat("fp8_e4m3", 4, 3, has_inf=False, overflow="saturate", torch_dtype=torch.float8_e4m3fn),
        FloatFormat("fp8_e5m2", 5, 2, torch_dtype=torch.float8_e5m2),
    )
}

# OCP Microscaling (MX v1.0) element formats: the two fp8s above (the same objects), and three without
# inf or NaN that saturate at max (fp6_e3m2: 28, fp6_e2m3: 7.5, fp4_e2m1: 6). ampteach.amp.mx reads these.
ELEMENT_FORMATS: dict[str, FloatFormat] = {
    "fp8_e4m3": FORMATS["fp8_e4m3"],
    "fp8_e5m2": FORMATS["fp8_e5m2"],
    **{f.name: f for f in (
        FloatFormat("fp6_e3m2", 3, 2, has_inf=False, has_nan=False, overflow="saturate"),
        FloatFormat("fp6_e2m3", 2, 3, has_inf=False, has_nan=False, overflow="saturate"),
        FloatFormat("fp4_e2m1", 2, 1, has_inf=False, has_nan=False, overflow="saturate"),
    )},
}


def as_format(fmt: FloatFormat | str) -> FloatFormat:
    """as_format("fp16") is FORMATS["fp16"]: a format by name (FORMATS, then ELEMENT_FORMATS), or fmt itself."""
    if isinstance(fmt, FloatFormat):
        return fmt
    for registry in (FORMATS, ELEMENT_FORMATS):
        if fmt in registry:
            return registry[fmt]
    raise ValueError(f"unknown format {fmt!r}: use one of {list(FORMATS)} or {list(ELEMENT_FORMATS)[2:]}, "
                     "or a FloatFormat")


def _check_bits(bits: int, fmt: FloatFormat) -> int:
    if not (isinstance(bits, numbers.Integral) and 0 <= bits < 2**fmt.bits):
        raise ValueError(f"{fmt.name} bit patterns are ints in [0, 2^{fmt.bits}), got {bits!r}; "
                         f"for a negative number set the sign bit: bits | (1 << {fmt.bits - 1})")
    return int(bits)


def _check_float32(x: Tensor, fn: str) -> None:
    if not isinstance(x, Tensor) or x.dtype != torch.float32:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{fn} takes a float32 tensor, got {got}: pass torch.as_tensor(x, dtype=torch.float32)")


def like_torch(fmt: FloatFormat | str, version: str | None = None) -> FloatFormat:
    """like_torch("fp8_e4m3", "2.11.0").overflow == "nan": fmt with the overflow rule of torch `version`'s CPU cast.

    (version defaults to the installed torch.)

    Only float8_e4m3fn changed: torch < 2.12 gives NaN where torch >= 2.12 saturates to +-448.
    (GPU kernels and torch.compile have their own history; check them on your machine.)
    """
    fmt = as_format(fmt)
    if fmt.has_inf or not fmt.has_nan:
        return fmt
    major_minor = tuple(int(n) for n in re.findall(r"\d+", version or torch.__version__)[:2])
    return replace(fmt, overflow="saturate" if major_minor >= E4M3FN_SATURATES_SINCE else "nan")


def decode(bits: int, fmt: FloatFormat | str) -> float:
    """decode(0x3C00, "fp16") -> 1.0: the value a bit pattern stands for, from the definition.

    value = (-1)^s * 2^(e - bias) * (1 + m / 2^M), or (-1)^s * 2^(1 - bias) * (m / 2^M) when e = 0
    """
    fmt = as_format(fmt)
    bits = _check_bits(bits, fmt)
    M, top = fmt.man_bits, 2**fmt.exp_bits - 1
    sign = -1.0 if bits >> (fmt.bits - 1) else 1.0
    exponent = (bits >> M) & top
    mantissa = bits & (2**M - 1)
    if exponent == top and fmt.has_inf:                      # IEEE: inf or NaN
        return sign * math.inf if mantissa == 0 else math.copysign(math.nan, sign)
    if exponent == top and fmt.has_nan and mantissa == 2**M - 1:   # "fn": S.1..1.1..1 is the only NaN
        return math.copysign(math.nan, sign)
    if exponent == 0:                                        # subnormal: 0.m * 2^emin
        return sign * math.ldexp(mantissa, fmt.emin - M)
    return sign * math.ldexp(2**M + mantissa, exponent - fmt.bias - M)   # normal: 1.m * 2^(e - bias)


def encode(value: float, fmt: FloatFormat | str) -> int:
    """encode(0.1, "fp16") -> 0x2E66: the bit pattern of the nearest value in fmt, ties to even.

    |value| ~ n * 2^(E - M): n = round_half_even(|value| / 2^(E - M)), E = max(exponent of |value|, emin)
    """
    fmt = as_format(fmt)
    M = fmt.man_bits
    sign_bit = (1 << (fmt.bits - 1)) if math.copysign(1.0, value) < 0 else 0
    if math.isnan(value):
        if fmt.nan_code is None:
            raise ValueError(f"{fmt.name} has no NaN (every bit pattern is a number), so NaN has no encoding; "
                             "MX marks a block holding NaN with its scale code 255 instead")
        return sign_bit | fmt.nan_code
    magnitude = abs(value)
    if magnitude == 0:
        return sign_bit
    if math.isinf(magnitude):
        code = fmt.max_code + 1                              # past max: the overflow rule decides
    else:
        exponent = max(math.frexp(magnitude)[1] - 1, fmt.emin)   # magnitude in [2^exponent, 2^(exponent+1))
        n = round(math.ldexp(magnitude, M - exponent))       # exact scaling; round() halves go to even
        # Normal: n = 2^M + mantissa, field = exponent + bias. Subnormal: exponent = emin, field 0, n = mantissa.
        # n = 2^(M+1) (rounded up into the next binade) carries into the exponent field by itself.
        code = ((exponent + fmt.bias - 1) << M) + n
    if code > fmt.max_code:
        code = {"inf": fmt.inf_code, "saturate": fmt.max_code, "nan": fmt.nan_code}[fmt.overflow]
    return sign_bit | code


def round_to_bf16(x: Tensor) -> Tensor:
    """round_to_bf16(x) == x.to(torch.bfloat16).float() bit for bit (any NaN for NaN); = round_to_format(x, "bf16").

    bf16 is the top 16 bits of fp32, so: drop the low 16 bits, rounding to nearest, ties to even.
    """
    _check_float32(x, "round_to_bf16")
    bits = x.view(torch.int32)
    lowest_kept = (bits >> 16) & 1                     # 1 if the kept part is odd: then a tie rounds up
    rounded = (bits + 0x7FFF + lowest_kept) & ~0xFFFF   # above half a step carries into bit 16; a carry out of
    # the mantissa bumps the exponent (1.11..1 * 2^e -> 2^(e+1)), out of the largest exponent it gives inf
    out = torch.empty_like(x)   # x's strides, as x.to(torch.bfloat16) keeps them
    return torch.where(x.isnan(), x, rounded.view(torch.float32), out=out)   # a NaN could round to inf: keep it


def round_to_format(x: Tensor, fmt: FloatFormat | str) -> Tensor:
    """y = round_to_format(x, "fp16"): the float32 values x becomes when stored in fp16 (x.to(fp16).float()).

    Round to nearest, ties to even, on the float32 bits: drop 23 - M mantissa bits, one more per
    binade below fmt.min_normal (subnormals: the spacing stops shrinking there); then fmt.overflow.
    """
    fmt = as_format(fmt)
    _check_float32(x, "round_to_format")
    out = torch.empty_like(x)   # x's memory format (channels_last, a transpose), as x.to(dtype) keeps it
    order = sorted(range(out.dim()), key=lambda d: -out.stride(d))   # dims outermost first in out's memory
    src, dst = x.permute(order).contiguous(), out.permute(order)     # both in memory order: flat views agree
    # Pieces of 1M values: each of _round_bits' ~25 steps is a pass over its input, and passes over
    # data that stays in the CPU's cache are faster than passes over a large tensor.
    for part, out_part in zip(src.view(-1).split(_CHUNK), dst.view(-1).split(_CHUNK)):
        out_part.view(torch.int32).copy_(_round_bits(part.view(torch.int32), fmt))
    return out


_CHUNK = 2**20


def _round_bits(bits: Tensor, fmt: FloatFormat) -> Tensor:
    """round_to_format on float32 bits (int32): fmt's value of each, as float32 bits.

    Temporaries are updated in place (+=, &=, ...): every new tensor is a trip to the allocator.
    """
    magnitude = bits & _MAG32
    is_nan = magnitude > _INF32                        # exponent all ones, mantissa not 0
    drop_normal = 23 - fmt.man_bits                    # float32 mantissa bits a normal number of fmt lacks
    if fmt.emin == -126:
        # float32's exponent range (bf16, tf32): the same step everywhere, even for float32's own
        # subnormals; a carry out of the mantissa moves to the next binade (and past max to inf).
        out = _round_half_even_(magnitude, drop_normal)
    else:
        # |x| = base + significand, significand = 1.m * 2^23 (0.m for float32 subnormals, which
        # scale like exponent field 1). Round the significand, add base back: a carry to 2^24 moves
        # to the next binade. Below fmt's smallest normal exponent, drop one more bit per binade;
        # at 25 even the leading 1 is gone and everything rounds to 0 (hence the clamp).
        exponent = (magnitude >> 23).clamp_(min=1)
        drop = (drop_normal + fmt.emin + 127 - exponent).clamp_(drop_normal, 25)
        base = exponent.sub_(1).bitwise_left_shift_(23)
        out = _round_half_even_(magnitude.sub_(base), drop)
        nonzero = out != 0                             # rounded to 0: stays 0, base is not added back
        out += base
        out *= nonzero
    max32 = _bits32(fmt.max_code, fmt)
    out.masked_fill_(out > max32, {"inf": _INF32, "saturate": max32, "nan": _nan32(fmt)}[fmt.overflow])
    out.masked_fill_(is_nan, _nan32(fmt))              # NaN stays NaN (fmt's quiet NaN)
    out |= bits & _SIGN32
    return out


def _round_half_even_(v: Tensor, drop: int | Tensor) -> Tensor:
    """Round v (int32, >= 0) in place to the nearest multiple of 2^drop, ties to the even multiple."""
    step = 1 << drop
    increment = (v >> drop) & 1                         # the lowest kept bit: 1 if the kept part is odd
    increment += step - 1
    increment >>= 1                                     # half a step, less 1 unless the kept part is odd
    v += increment
    v &= -step                                          # -step == ~(step - 1): clears the dropped bits
    return v


def _bits32(code: int, fmt: FloatFormat) -> int:
    """float32 bits of a positive normal number of fmt: same value, exponent rebiased, mantissa widened."""
    exponent, mantissa = code >> fmt.man_bits, code & ((1 << fmt.man_bits) - 1)
    return ((exponent - fmt.bias + 127) << 23) | (mantissa << (23 - fmt.man_bits))


def _nan32(fmt: FloatFormat) -> int:
    """float32 bits of fmt's NaN (positive): quiet NaN, or exponent and fmt's mantissa bits all ones for "fn"
    (a format without NaN keeps NaN as float32's quiet NaN: there is nothing else to round it to)."""
    fn = fmt.has_nan and not fmt.has_inf
    return _INF32 | (((1 << fmt.man_bits) - 1) << (23 - fmt.man_bits) if fn else _QUIET32)


def ulp(value: float, fmt: FloatFormat | str) -> float:
    """ulp(1.0, "fp16") -> 0.0009765625: the gap from |value| to the next larger number in fmt.

    ulp(x) = 2^(max(floor(log2 |x|), emin) - M); inf beyond the format's top binade, NaN for NaN.
    """
    fmt = as_format(fmt)
    magnitude = abs(value)
    if math.isnan(magnitude):
        return math.nan
    if magnitude >= 2.0 ** (fmt.emax + 1):
        return math.inf
    exponent = fmt.emin if magnitude == 0 else max(math.frexp(magnitude)[1] - 1, fmt.emin)
    return 2.0 ** (exponent - fmt.man_bits)


def grid_near(value: float, fmt: FloatFormat | str, k: int = 2) -> list[float]:
    """grid_near(1.0, "fp16", 1) -> [0.99951171875, 1.0, 1.0009765625]: the numbers fmt has near value.

    The value nearest to `value` and k neighbours on each side, ascending (inf included, NaN never).
    """
    fmt = as_format(fmt)
    sign_bit = 1 << (fmt.bits - 1)
    code = encode(value, fmt)
    if math.isnan(decode(code, fmt)):
        raise ValueError(f"{value!r} is NaN in {fmt.name}: there is no grid around it")
    ordinal = -(code & ~sign_bit) if code & sign_bit else code   # numbers in order: ..., -1, 0, 1, ...
    top = fmt.max_code + (1 if fmt.has_inf else 0)               # +inf follows +max in IEEE formats
    ordinals = [o for o in range(ordinal - k, ordinal + k + 1) if abs(o) <= top]
    return [decode(sign_bit | -o if o < 0 else o, fmt) for o in ordinals]


def formula(bits: int, fmt: FloatFormat | str) -> str:
    """formula(0x3C01, "fp16") -> '(-1)^0 * 2^(15-15) * (1 + 1/1024)': decode's arithmetic, written out.

    The same three cases as decode: inf/NaN (top exponent field), subnormal (field 0), normal.
    """
    fmt = as_format(fmt)
    s, e, m = (int(field, 2) for field in bit_string(bits, fmt).split())
    if e == 2**fmt.exp_bits - 1 and (fmt.has_inf or (fmt.has_nan and m == 2**fmt.man_bits - 1)):
        return "all-ones exponent: inf" if fmt.has_inf and m == 0 else "NaN pattern"
    if e == 0:
        return f"(-1)^{s} * 2^(1-{fmt.bias}) * {m}/{2**fmt.man_bits}   (subnormal)"
    return f"(-1)^{s} * 2^({e}-{fmt.bias}) * (1 + {m}/{2**fmt.man_bits})"


def bit_string(bits: int, fmt: FloatFormat | str) -> str:
    """bit_string(0x3C00, "fp16") -> '0 01111 0000000000': sign, exponent and mantissa fields."""
    fmt = as_format(fmt)
    s = format(_check_bits(bits, fmt), f"0{fmt.bits}b")
    return f"{s[0]} {s[1:1 + fmt.exp_bits]} {s[1 + fmt.exp_bits:]}"


def format_table(formats: list[FloatFormat] | None = None) -> str:
    """print(format_table()): one line per format with its fields, range, precision and overflow rule."""
    formats = formats if formats is not None else list(FORMATS.values())
    header = ("format", "s/e/m", "bias", "max", "min normal", "min subnormal", "eps", "digits", "overflow")
    rows = [header] + [
        (f.name, f"1/{f.exp_bits}/{f.man_bits}", str(f.bias), f"{f.max:.5g}", f"{f.min_normal:.3g}",
         f"{f.min_subnormal:.3g}", f"{f.eps:.3g}", f"{f.decimal_digits:.1f}", f.overflow)
        for f in formats
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
