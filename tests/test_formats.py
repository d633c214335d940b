"""ampteach.amp.formats against torch, bit for bit: constants, every bit pattern, every tie, 10^6 random values.

torch is the reference wherever it has the dtype. tf32 has none, so it (and every format a second
time) is checked against `reference_round`, an independent float64 + NumPy definition of rounding:
y = round_half_even(x / q) * q with q = 2^(max(exponent of x, emin) - M). NaN is compared by
NaN-ness (torch's own NaN bit patterns differ between its cast kernels); everything else by bits.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampteach.amp.formats import (
    ELEMENT_FORMATS,
    FORMATS,
    FloatFormat,
    as_format,
    bit_string,
    decode,
    encode,
    format_table,
    formula,
    grid_near,
    like_torch,
    round_to_bf16,
    round_to_format,
    ulp,
)

TORCH_FORMATS = [name for name, f in FORMATS.items() if f.torch_dtype not in (None, torch.float32)]
SMALL_FORMATS = TORCH_FORMATS  # 8 or 16 bits: every bit pattern can be tried
INT_OF_WIDTH = {8: torch.int8, 16: torch.int16, 32: torch.int32}


# --- helpers -------------------------------------------------------------------------------------

def all_patterns(fmt: FloatFormat) -> torch.Tensor:
    """Every bit pattern of a format up to 16 bits, as the torch dtype (a bit reinterpretation)."""
    codes = np.arange(2**fmt.bits, dtype=f"uint{fmt.bits}").view(f"int{fmt.bits}")
    return torch.from_numpy(codes).view(fmt.torch_dtype)


def codes_of(t: torch.Tensor, fmt: FloatFormat) -> list[int]:
    """Bit patterns of a tensor of fmt's torch dtype, as non-negative ints."""
    return [c & (2**fmt.bits - 1) for c in t.view(INT_OF_WIDTH[fmt.bits]).tolist()]


def assert_same_floats(ours: torch.Tensor, ref: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
    """Bitwise equality except that any NaN matches any NaN (same dtype, same shape)."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    int_dtype = {torch.float32: torch.int32, torch.float64: torch.int64}[ref.dtype]
    nan = ref.isnan()
    assert torch.equal(ours.isnan(), nan), "NaN in one result but not the other"
    differ = (ours.view(int_dtype) != ref.view(int_dtype)) & ~nan
    if differ.any():
        i = int(differ.nonzero()[0])
        where = f" for input {inputs.view(-1)[i].item()!r}" if inputs is not None else ""
        raise AssertionError(f"{int(differ.sum())} values differ; first at {i}{where}: "
                             f"ours {ours.view(-1)[i].item()!r}, reference {ref.view(-1)[i].item()!r}")


def torch_round(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    return x.to(fmt.torch_dtype).float()


def random_float32(n: int, seed: int) -> torch.Tensor:
    """n float32 values from uniformly random bit patterns: every exponent, sign, NaN and inf."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g).to(torch.int32).view(torch.float32)


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def tie_cases(fmt: FloatFormat, codes) -> torch.Tensor:
    """For each positive finite code c: the midpoint between c's value and the next one up, and the
    float32 values just below and above it, with both signs. Above max, the "next one" is where the
    next binade would continue (max + ulp): that midpoint is the overflow threshold (65520 for fp16)."""
    lows = [decode(c, fmt) for c in codes if c <= fmt.max_code]
    highs = [decode(c + 1, fmt) if c < fmt.max_code else fmt.max + ulp(fmt.max, fmt)
             for c in codes if c <= fmt.max_code]
    exact = torch.tensor([(a + b) / 2 for a, b in zip(lows, highs)], dtype=torch.float64)
    mids = exact.float()
    assert torch.equal(mids.double(), exact), "midpoints of neighbours are exact in float32"
    near = [mids, torch.nextafter(mids, f32(math.inf)), torch.nextafter(mids, f32(0.0))]
    cases = torch.cat(near)
    return torch.cat([cases, -cases])


def reference_round(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """fmt's value of each float32 in x, from the definition with float64 arithmetic (no bit tricks).

    q = 2^(max(floor(log2|x|), emin) - M); y = np.round(x / q) * q  (NumPy rounds halves to even;
    x / q is exact, a power-of-two scaling); then overflow by fmt.overflow. NaN in, NaN out.
    """
    bias = 2 ** (fmt.exp_bits - 1) - 1
    emin = 1 - bias
    emax = 2**fmt.exp_bits - (2 if fmt.has_inf else 1) - bias     # no inf: the top exponent holds numbers
    fn = fmt.has_nan and not fmt.has_inf                           # "fn": S.1..1.1..1 is NaN, the rest numbers
    top_mantissa = Fraction(2**fmt.man_bits - (2 if fn else 1), 2**fmt.man_bits)
    largest = float((1 + top_mantissa) * Fraction(2) ** emax)
    v = x.double().numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        _, e = np.frexp(np.abs(v))                     # |v| = f * 2^e with f in [0.5, 1)
        q = np.ldexp(1.0, np.maximum(e - 1, emin) - fmt.man_bits)
        y = np.where(np.isfinite(v), np.round(v / q) * q, v)
        too_big = np.abs(y) > largest
        overflowed = {"inf": np.inf, "saturate": largest, "nan": np.nan}[fmt.overflow]
        y = np.where(too_big & ~np.isnan(v), np.copysign(overflowed, v), y)
    return torch.from_numpy(y).float()                 # exact: y has at most M+1 significant bits


# --- the format table ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n, f in FORMATS.items() if f.torch_dtype is not None])
def test_constants_equal_torch_finfo(name):
    fmt = FORMATS[name]
    info = torch.finfo(fmt.torch_dtype)
    assert (fmt.bits, fmt.max, fmt.min_normal, fmt.eps) == (info.bits, info.max, info.smallest_normal, info.eps)
    one = torch.tensor([1], dtype=torch.int32).to(INT_OF_WIDTH[fmt.bits]).view(fmt.torch_dtype)
    assert fmt.min_subnormal == one.double().item()    # smallest subnormal: pattern 0...01
    if fmt.bits <= 16:
        patterns = all_patterns(fmt).double()
        assert fmt.max == patterns[patterns.isfinite()].max().item()
        assert decode(fmt.max_code, fmt) == fmt.max


def test_tf32_constants_derived_from_float32():
    """tf32 = float32 with 13 mantissa bits fewer: same exponent range, fp16's precision."""
    tf32, info = FORMATS["tf32"], torch.finfo(torch.float32)
    fp32_max_bits = torch.tensor([info.max]).view(torch.int32)
    assert tf32.max == (fp32_max_bits & ~0x1FFF).view(torch.float32).item()   # clear 13 mantissa bits
    assert tf32.min_normal == info.smallest_normal
    assert tf32.eps == torch.finfo(torch.float16).eps
    assert Fraction(tf32.min_subnormal) == Fraction(1, 2**136)   # float32's 2^-149, 13 bits coarser
    assert (tf32.exp_bits, tf32.man_bits, tf32.bias, tf32.bits) == (8, 10, 127, 19)


def test_overflow_and_nan_rules_are_explicit():
    assert [FORMATS[n].overflow for n in FORMATS] == ["inf", "inf", "inf", "inf", "saturate", "inf"]
    assert not FORMATS["fp8_e4m3"].has_inf and all(FORMATS[n].has_inf for n in FORMATS if n != "fp8_e4m3")
    for fmt in FORMATS.values():
        assert math.isnan(decode(fmt.nan_code, fmt))
        assert fmt.inf_code is None if not fmt.has_inf else decode(fmt.inf_code, fmt) == math.inf


def test_format_table_lists_every_format():
    lines = format_table().splitlines()
    assert len(lines) == 1 + len(FORMATS)
    for line, fmt in zip(lines[1:], FORMATS.values()):
        assert line.split()[0] == fmt.name and f"{fmt.max:.5g}" in line and fmt.overflow in line


def test_bad_formats_and_inputs_raise_with_advice():
    with pytest.raises(ValueError, match="no inf"):
        FloatFormat("bad", 4, 3, has_inf=False, overflow="inf")
    with pytest.raises(ValueError, match="overflow must be one of"):
        FloatFormat("bad", 5, 10, overflow="wrap")
    with pytest.raises(ValueError, match="unknown format 'fp12'"):
        decode(0, "fp12")
    with pytest.raises(ValueError, match=r"ints in \[0, 2\^16\)"):
        decode(2**16, "fp16")
    with pytest.raises(TypeError, match="float32 tensor, got torch.float64"):
        round_to_format(torch.ones(3, dtype=torch.float64), "fp16")
    with pytest.raises(TypeError, match="round_to_bf16 takes a float32 tensor, got list"):
        round_to_bf16([1.0])
    assert decode(np.uint16(0x3C00), "fp16") == 1.0 == decode(torch.tensor(0x3C00).item(), "fp16")


# --- decode and encode, every bit pattern ----------------------------------------------------------

@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_decode_every_pattern_like_torch_view(name):
    fmt = FORMATS[name]
    theirs = all_patterns(fmt).double()                # torch's reading of each pattern, exact in float64
    ours = torch.tensor([decode(c, fmt) for c in range(2**fmt.bits)], dtype=torch.float64)
    assert_same_floats(ours, theirs)                    # bitwise in float64: -0.0 is not 0.0


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_encode_inverts_decode_on_every_pattern(name):
    fmt = FORMATS[name]
    for c in range(2**fmt.bits):
        v = decode(c, fmt)
        if math.isnan(v):
            back = encode(v, fmt)
            assert math.isnan(decode(back, fmt)) and (back >> (fmt.bits - 1)) == (c >> (fmt.bits - 1))
        else:
            assert encode(v, fmt) == c, (bit_string(c, fmt), v)


@pytest.mark.parametrize("name", ["fp32", "tf32"])
def test_encode_inverts_decode_on_wide_formats(name):
    fmt = FORMATS[name]
    rng = np.random.default_rng(0)
    edges = [0, 1, 2, fmt.max_code, fmt.max_code - 1, 1 << fmt.man_bits, (1 << fmt.man_bits) - 1]
    codes = edges + rng.integers(0, 2**fmt.bits, 20_000).tolist()
    for c in codes + [c | (1 << (fmt.bits - 1)) for c in edges]:
        v = decode(c, fmt)
        assert (math.isnan(v) and math.isnan(decode(encode(v, fmt), fmt))) or encode(v, fmt) == c


def test_fp32_decode_is_struct_unpack():
    rng = np.random.default_rng(1)
    for c in rng.integers(0, 2**32, 5_000).tolist() + [0x7F7FFFFF, 0x00000001, 0x80000000, 0x7F800000]:
        v = decode(c, "fp32")
        expected = struct.unpack("<f", struct.pack("<I", c))[0]
        assert (math.isnan(v) and math.isnan(expected)) or struct.pack("<d", v) == struct.pack("<d", expected)


@pytest.mark.parametrize("name", TORCH_FORMATS)
@settings(max_examples=200, deadline=None)
@given(value=st.floats(width=32))
def test_encode_matches_torch_cast(name, value):
    fmt = like_torch(FORMATS[name])
    theirs = f32([value]).to(fmt.torch_dtype)
    ours = encode(value, fmt)
    if theirs.isnan().item():
        assert math.isnan(decode(ours, fmt))
    else:
        assert ours == codes_of(theirs, fmt)[0], (value, bit_string(ours, fmt))


# --- round_to_format: random patterns, every tie, named edge cases -----------------------------------

@pytest.fixture(scope="module")
def million_values() -> torch.Tensor:
    return random_float32(2**20, seed=0)               # 1,048,576 values, every exponent


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_round_to_format_like_torch_on_a_million_random_patterns(name, million_values):
    fmt = like_torch(FORMATS[name])
    assert_same_floats(round_to_format(million_values, fmt), torch_round(million_values, fmt), million_values)


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_round_to_format_like_torch_at_every_tie(name):
    fmt = like_torch(FORMATS[name])
    codes = range(2**(fmt.bits - 1))                   # every non-negative pattern
    x = tie_cases(fmt, codes)
    assert_same_floats(round_to_format(x, fmt), torch_round(x, fmt), x)


def edge_cases() -> torch.Tensor:
    named = [
        2049, 2051, 257, 259, 2.5, 3.5,                # ties to even (fp16 at 2048, bf16 at 256, fp8)
        65504, 65519, 65520, 65536, 1e5,               # fp16 max, the last value below the tie, the tie
        448, 449, 464, 465, 479, 480, 500, 1e6,        # e4m3fn max, its tie, beyond (saturation)
        57344, 61439, 61440, 65536,                    # e5m2 max, below the tie, the tie
        2.0**-24, 2.0**-25, 2.0**-25 * (1 + 2**-20), 1.5 * 2.0**-24, 2.0**-26,     # fp16 subnormal ties
        2.0**-9, 2.0**-10, 1.5 * 2.0**-9, 2.0**-16, 2.0**-17, 1.5 * 2.0**-16,   # fp8 subnormals
        2.0**-133, 2.0**-134, 2.0**-136, 2.0**-137, 2.0**-149, 2.0**-126,        # bf16/tf32 subnormals
        0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028234663852886e38, 1.0 + 2**-23, 0.1,
    ]
    x = f32(named)
    return torch.cat([x, -x, f32([struct.unpack("<f", struct.pack("<I", b))[0]
                                  for b in (0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0x00000001, 0x807FFFFF)])])


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_round_to_format_like_torch_on_named_edge_cases(name):
    fmt = like_torch(FORMATS[name])
    x = edge_cases()
    assert_same_floats(round_to_format(x, fmt), torch_round(x, fmt), x)


def test_rounding_facts_the_lessons_state():
    """Roundings lessons 1 and 2 state in words (torch checks them too)."""
    facts = {
        "fp16": ([2049, 2051, 65519, 65520], [2048, 2052, 65504, math.inf]),
        "bf16": ([257, 259, 3.4028234663852886e38], [256, 260, math.inf]),
        "fp8_e4m3": ([464, 500, 1e6, math.inf, -math.inf], [448, 448, 448, 448, -448]),
        "fp8_e5m2": ([61439, 61440], [57344, math.inf]),
    }
    for name, (x, expected) in facts.items():
        assert round_to_format(f32(x), name).tolist() == expected, name
        if name != "fp8_e4m3" or like_torch(name).overflow == "saturate":
            assert torch_round(f32(x), FORMATS[name]).tolist() == expected, name


@pytest.mark.parametrize("name", list(FORMATS))
def test_round_to_format_matches_the_float64_reference(name, million_values):
    fmt = FORMATS[name]
    x = torch.cat([million_values[: 2**18], edge_cases()])
    assert_same_floats(round_to_format(x, fmt), reference_round(x, fmt), x)


def test_tf32_against_the_reference_at_ties_and_on_a_million_values(million_values):
    """tf32 has no torch dtype: the independent float64 definition is its reference."""
    fmt = FORMATS["tf32"]
    assert_same_floats(round_to_format(million_values, fmt), reference_round(million_values, fmt), million_values)
    rng = np.random.default_rng(2)
    codes = rng.integers(0, fmt.max_code, 20_000).tolist() + [0, 1, 1023, 1024, 1025, fmt.max_code]
    x = tie_cases(fmt, codes)
    assert_same_floats(round_to_format(x, fmt), reference_round(x, fmt), x)


def test_fp32_is_left_alone(million_values):
    x = million_values[: 2**18]
    assert_same_floats(round_to_format(x, "fp32"), x)


def test_custom_format_against_the_reference(million_values):
    """The code is not specialised to the six formats: a 6-bit IEEE-style toy and e4m3fn's NaN rule."""
    x = torch.cat([million_values[: 2**14], edge_cases()])
    for fmt in (FloatFormat("toy_e3m2", 3, 2), FloatFormat("toy_e3m2_sat", 3, 2, overflow="saturate"),
                replace(FORMATS["fp8_e4m3"], overflow="nan"), FloatFormat("e6m9", 6, 9)):
        assert_same_floats(round_to_format(x, fmt), reference_round(x, fmt), x)


def test_round_to_format_keeps_shape_and_handles_non_contiguous():
    x = random_float32(6 * 7, seed=3).view(6, 7).t()
    y = round_to_format(x, "fp16")
    assert y.shape == (7, 6)
    assert_same_floats(y, torch_round(x, FORMATS["fp16"]))


LAYOUTS = {   # shape -> a float32 tensor of that shape in some memory layout
    "channels_last": lambda t: t(2, 3, 4, 5).to(memory_format=torch.channels_last),
    "channels_last_3d": lambda t: t(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d),
    "channels_last, 1x1 images": lambda t: t(2, 3, 1, 1).to(memory_format=torch.channels_last),
    "transposed": lambda t: t(6, 7).t(),
    "permuted": lambda t: t(2, 3, 4).permute(2, 0, 1),
    "sliced (with gaps)": lambda t: t(6, 8)[:, ::2],
    "expanded (stride 0)": lambda t: t(1, 5).expand(4, 5),
    "empty, transposed": lambda t: t(0, 3).t(),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_round_to_format_keeps_the_memory_format_as_to_does(name, layout):
    """x.to(dtype) keeps x's strides (channels_last stays channels_last): round_to_format and round_to_bf16 too."""
    fmt = like_torch(FORMATS[name])
    seed = iter(range(10**6))
    x = LAYOUTS[layout](lambda *shape: random_float32(math.prod(shape), next(seed)).view(shape))
    ref = torch_round(x, fmt)
    ours = round_to_format(x, fmt)
    assert ours.stride() == ref.stride(), f"{layout}: strides {ours.stride()}, x.to() gives {ref.stride()}"
    assert_same_floats(ours, ref, x)
    if name == "bf16":
        assert round_to_bf16(x).stride() == ref.stride()
        assert_same_floats(round_to_bf16(x), ref, x)


# --- the float8_e4m3fn overflow rule across torch versions -----------------------------------------

def test_like_torch_names_the_e4m3fn_overflow_rule_per_version():
    assert like_torch("fp8_e4m3", "2.11.0+cu128").overflow == "nan"
    assert like_torch("fp8_e4m3", "2.12.0").overflow == "saturate"
    assert like_torch("fp8_e4m3", "2.13.0+cpu").overflow == "saturate"
    assert like_torch("fp16", "2.11.0") is FORMATS["fp16"]


def test_e4m3fn_nan_rule_of_older_torch():
    """torch <= 2.11: round first, then anything past 448 (and +-inf) is NaN; 464 still ties down to 448."""
    old = replace(FORMATS["fp8_e4m3"], overflow="nan")
    y = round_to_format(f32([448, 464, 465, 480, 1e6, math.inf, -math.inf, -465]), old)
    assert y[:2].tolist() == [448, 448] and y[2:].isnan().all()
    assert math.isnan(decode(encode(465.0, old), old)) and decode(encode(464.0, old), old) == 448
    assert math.copysign(1, decode(encode(-465.0, old), old)) == -1


# --- the one registry: MX's element formats beside the storage formats -------------------------------

SUB_BYTE = [name for name, f in ELEMENT_FORMATS.items() if f.bits < 8]   # fp6_e3m2, fp6_e2m3, fp4_e2m1


def test_one_registry_that_mx_and_fp8_read():
    """Each format is defined once, here: mx and fp8 hand out the same objects, and FORMATS stays lesson 1's six."""
    from ampteach.amp import fp8, mx

    assert list(FORMATS) == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
    assert mx.ELEMENT_FORMATS is ELEMENT_FORMATS is fp8.ELEMENT_FORMATS
    assert all(ELEMENT_FORMATS[name] is FORMATS[name] for name in ("fp8_e4m3", "fp8_e5m2"))
    assert fp8.FP8_DTYPES == {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    for name, dtype in fp8.FP8_DTYPES.items():
        assert fp8.fp8_max(name) == torch.finfo(dtype).max == FORMATS[name].max
    for name, fmt in {**FORMATS, **ELEMENT_FORMATS}.items():
        assert as_format(name) is fmt
    assert all(mx.element_format(name) is fmt for name, fmt in ELEMENT_FORMATS.items())


@pytest.mark.parametrize("name", SUB_BYTE)
def test_sub_byte_formats_have_no_inf_or_nan_and_saturate(name):
    """OCP MX v1.0's fp6 and fp4: every bit pattern is a number, decode and encode invert each other, and a
    value past max (inf too) saturates; NaN has no pattern (encode refuses it, round_to_format keeps it)."""
    fmt = ELEMENT_FORMATS[name]
    values = [decode(c, fmt) for c in range(2**fmt.bits)]
    assert all(math.isfinite(v) for v in values) and fmt.nan_code is None and fmt.inf_code is None
    assert fmt.max == max(values) == decode(2 ** (fmt.bits - 1) - 1, fmt)     # the top pattern is max
    assert fmt.values().tolist() == sorted(v for v in values if math.copysign(1, v) > 0)
    for c, v in enumerate(values):
        assert encode(v, fmt) == c, (bit_string(c, fmt), v)
        assert formula(c, fmt) != "NaN pattern"
    assert encode(math.inf, fmt) == encode(fmt.max * 4, fmt) == fmt.max_code
    assert round_to_format(f32([math.inf, -1e30, 1e-30]), fmt).tolist() == [fmt.max, -fmt.max, 0.0]
    assert round_to_format(f32([math.nan]), fmt).isnan().all()
    with pytest.raises(ValueError, match="no NaN"):
        encode(math.nan, fmt)
    assert like_torch(fmt) is fmt


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64),
       name=st.sampled_from(SUB_BYTE))
def test_sub_byte_vector_scalar_and_reference_agree(values, name):
    fmt = ELEMENT_FORMATS[name]
    x = f32(values)
    scalar = f32([decode(encode(v, fmt), fmt) for v in values])
    assert_same_floats(round_to_format(x, fmt), scalar, x)
    assert_same_floats(round_to_format(x, fmt), reference_round(x, fmt), x)


def test_formats_refuse_impossible_special_values():
    with pytest.raises(ValueError, match="inf and NaN together"):
        FloatFormat("bad", 3, 2, has_nan=False)
    with pytest.raises(ValueError, match="no NaN to overflow to"):
        FloatFormat("bad", 3, 2, has_inf=False, has_nan=False, overflow="nan")
    with pytest.raises(ValueError, match="at most 16 bits"):
        FORMATS["fp32"].values()


# --- round_to_bf16, the short version --------------------------------------------------------------

def test_round_to_bf16_like_torch_on_every_upper_half_and_every_rounding_case():
    """Every one of the 2^16 upper halves with lower halves 0, 1, just below/at/above the tie, all ones."""
    upper = torch.arange(2**16, dtype=torch.int32) << 16
    lowers = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234], dtype=torch.int32)
    x = (upper[:, None] | lowers[None, :]).view(-1).view(torch.float32)
    ours = round_to_bf16(x)
    assert_same_floats(ours, x.to(torch.bfloat16).float(), x)
    assert_same_floats(ours, round_to_format(x, "bf16"), x)


# --- properties --------------------------------------------------------------------------------------

float32s = st.lists(st.floats(width=32), min_size=1, max_size=64)


@settings(max_examples=100, deadline=None)
@given(values=float32s, name=st.sampled_from(list(FORMATS)))
def test_vector_and_scalar_paths_agree(values, name):
    """round_to_format (bit tricks on tensors) == decode(encode(v)) (the definition, one value at a time)."""
    fmt = FORMATS[name]
    scalar = f32([decode(encode(v, fmt), fmt) for v in values])
    assert_same_floats(round_to_format(f32(values), fmt), scalar)


@settings(max_examples=100, deadline=None)
@given(values=float32s, name=st.sampled_from(TORCH_FORMATS))
def test_round_to_format_like_torch_property(values, name):
    fmt = like_torch(FORMATS[name])
    x = f32(values)
    assert_same_floats(round_to_format(x, fmt), torch_round(x, fmt), x)


@settings(max_examples=100, deadline=None)
@given(values=float32s, name=st.sampled_from(list(FORMATS)))
def test_rounding_is_idempotent_monotonic_and_within_half_an_ulp(values, name):
    fmt = FORMATS[name]
    x = f32(sorted(v for v in values if not math.isnan(v)) or [0.0])
    y = round_to_format(x, fmt)
    assert_same_floats(round_to_format(y, fmt), y)
    assert bool((y[1:] >= y[:-1]).all())
    for xi, yi in zip(x.tolist(), y.tolist()):
        if math.isfinite(yi) and abs(yi) < fmt.max:
            assert abs(Fraction(yi) - Fraction(xi)) <= Fraction(ulp(xi, fmt)) / 2


@settings(max_examples=100, deadline=None)
@given(value=st.floats(width=32, allow_nan=False), name=st.sampled_from(list(FORMATS)))
def test_grid_near_is_the_format_grid(value, name):
    fmt = FORMATS[name]
    grid = grid_near(value, fmt, k=2)
    assert decode(encode(value, fmt), fmt) in grid and len(grid) >= 3
    for a, b in zip(grid, grid[1:]):
        if math.isfinite(a) and math.isfinite(b):
            assert b - a == ulp(min(abs(a), abs(b)), fmt)   # ulp: the gap above a magnitude


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_ulp_is_the_gap_between_neighbours(name):
    fmt = FORMATS[name]
    for c in range(fmt.max_code):                      # every non-negative finite pattern but max
        assert ulp(decode(c, fmt), fmt) == decode(c + 1, fmt) - decode(c, fmt)
    assert ulp(1.0, fmt) == fmt.eps and ulp(0.0, fmt) == fmt.min_subnormal
    assert ulp(2.0 ** (fmt.emax + 1), fmt) == math.inf and math.isnan(ulp(math.nan, fmt))


def test_bit_string_shows_the_three_fields():
    assert bit_string(0x3C00, "fp16") == "0 01111 0000000000"
    assert bit_string(encode(-2.0, "bf16"), "bf16") == "1 10000000 0000000"
    assert bit_string(FORMATS["fp8_e4m3"].max_code, "fp8_e4m3") == "0 1111 110"


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_formula_written_out_evaluates_to_torchs_value_for_every_pattern(name):
    fmt = FORMATS[name]
    theirs = all_patterns(fmt).double().tolist()
    for code, value in enumerate(theirs):
        text = formula(code, fmt)
        if math.isnan(value):
            assert text == "NaN pattern", (code, text)
        elif math.isinf(value):
            assert text == "all-ones exponent: inf", (code, text)
        else:
            ours = eval(text.split("   ")[0].replace("^", "**"), {})   # e.g. (-1)**1 * 2**(1-15) * 3/1024
            assert ours == value and math.copysign(1, ours) == math.copysign(1, value), (code, text)
            assert text.endswith("(subnormal)") == (code & (2 ** (fmt.bits - 1) - 1) < 2**fmt.man_bits)
