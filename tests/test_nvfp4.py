"""NVFP4 and MXFP4 bit for bit against torchao, stochastic rounding's two promises, and the RHT's orthogonality.

torchao 0.18's NVFP4Tensor.to_nvfp4 and MXTensor's to_mx run on a CPU; over hypothesis-drawn shapes, scales,
dtypes and special blocks, ampteach.amp.nvfp4 and ampteach.amp.mx must give their codes, scales and dequantized
values bit for bit (MX: except the two documented places where torchao's eager path departs from the spec's
arithmetic, each tested for what it is). Without torchao those tests skip; the rest stands on its own.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampteach.amp.hadamard import hadamard_matrix, inverse_rht, random_signs, rht, rht_matrix
from ampteach.amp.mx import mx_dequantize, mx_quantize
from ampteach.amp.nvfp4 import (
    E2M1,
    block_amax,
    e2m1_codes,
    e2m1_values,
    nvfp4_fake_quantize,
    nvfp4_quantize,
    nvfp4_quantize_2d,
    per_tensor_scale,
    round_e2m1,
)

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().contiguous().view(torch.int32)


# --- E2M1 by hand --------------------------------------------------------------------------------------

def test_the_grid_and_its_codes():
    assert E2M1.values().tolist() == GRID
    codes = e2m1_codes(torch.tensor(GRID + [-g for g in GRID]))
    assert codes.tolist() == list(range(16))
    assert e2m1_values(codes).tolist() == GRID + [-g for g in GRID]


def test_rounding_to_nearest_by_hand():
    # ties go to the even code: 0.25 -> 0 (code 0), 0.75 -> 1 (code 2), 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, 1e30, 0.2499, 0.2501, -2.5, -0.1])
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, 0.0, 0.5, -2.0, -0.0]
    out = round_e2m1(v)
    assert out.tolist() == expected and out[-1].signbit()          # -0.1 keeps its sign, as torchao's codes do
    assert e2m1_codes(v).tolist() == e2m1_codes(out).tolist()


@settings(max_examples=300, deadline=None)
@given(st.floats(-10, 10, width=32))
def test_nearest_is_the_closest_grid_value(x):
    """Against a brute-force reference: the closest signed grid value, ties to the even code, saturating."""
    signed = sorted({s * g for g in GRID for s in (1, -1)})
    best = min(signed, key=lambda g: (abs(g - x), e2m1_codes(torch.tensor([g])).item() & 1))
    assert abs(round_e2m1(torch.tensor([x])).item()) == abs(best)


# --- stochastic rounding -------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.floats(-6, 6, width=32), st.integers(0, 2**31 - 1))
def test_stochastic_rounding_picks_a_grid_neighbour(x, seed):
    out = round_e2m1(torch.full((256,), x), "stochastic", torch.Generator().manual_seed(seed))
    lo = max(g for g in GRID if g <= abs(x))
    hi = min((g for g in GRID if g >= abs(x)), default=6.0)
    assert set(out.abs().tolist()) <= {lo, hi}
    assert (out.signbit() == (math.copysign(1, x) < 0)).all()              # the sign kept, zeros included


@pytest.mark.parametrize("x", [0.1, 0.3, 0.7, 1.2, 1.9, 2.3, 3.01, 4.4, 5.9, -2.7])
def test_stochastic_rounding_is_unbiased_where_nearest_is_not(x):
    n = 2**20
    out = round_e2m1(torch.full((n,), x), "stochastic", torch.Generator().manual_seed(0)).double()
    lo = max(g for g in GRID if g <= abs(x))
    hi = min(g for g in GRID if g >= abs(x))
    p = (abs(x) - lo) / (hi - lo)
    sigma = (hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(out.mean().item() - x) < 5 * sigma + 1e-12
    bias = round_e2m1(torch.tensor([x])).item() - x                 # nearest: the same error every time
    assert abs(bias) > 20 * sigma


def test_stochastic_rounding_is_reproducible_and_exact_on_the_grid():
    x = torch.randn(1000) * 3
    a = round_e2m1(x, "stochastic", torch.Generator().manual_seed(7))
    assert torch.equal(a, round_e2m1(x, "stochastic", torch.Generator().manual_seed(7)))
    on_grid = round_e2m1(x)
    assert torch.equal(round_e2m1(on_grid, "stochastic"), on_grid)


def test_stochastic_nvfp4_is_unbiased_through_the_scales():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 64, generator=g) * 1e-3
    S = per_tensor_scale(x)
    runs = torch.stack([nvfp4_fake_quantize(x, S, rounding="stochastic", generator=g) for _ in range(400)])
    nearest = nvfp4_fake_quantize(x, S)
    assert (runs.mean(0) - x).abs().mean() < (nearest - x).abs().mean() / 5
    q = nvfp4_quantize(x, S, rounding="stochastic", generator=torch.Generator().manual_seed(3))
    assert torch.equal(q.block_scales.view(torch.uint8), nvfp4_quantize(x, S).block_scales.view(torch.uint8))


# --- NVFP4 against torchao -----------------------------------------------------------------------------

def _torchao_nvfp4():
    nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    return nvfp4, kernels.unpack_uint4


def _drawn_tensor(seed: int, shape: tuple[int, ...], exponent: int, kind: str, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 2.0**exponent
    flat = x.view(-1)
    if kind == "outlier":                       # one value 2^12 times the rest
        flat[torch.randint(0, flat.numel(), (1,), generator=g)] *= 4096
    elif kind == "zero block":
        flat[16:32] = 0.0
    elif kind == "spread":                      # every block at its own scale, 2^-20 .. 2^20
        blocks = x.view(-1, 16)
        blocks *= torch.exp2(torch.randint(-20, 21, (blocks.shape[0], 1), generator=g).float())
    return x.to(dtype)


@settings(max_examples=500, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 9), blocks=st.integers(1, 6), batch=st.sampled_from([0, 3]),
       exponent=st.integers(-100, 100), kind=st.sampled_from(["normal", "outlier", "zero block", "spread"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), two_level=st.booleans())
def test_nvfp4_matches_torchao(seed, rows, blocks, batch, exponent, kind, dtype, two_level):
    """Codes, E4M3 block scales and dequantized values, with and without the per-tensor scale."""
    nvfp4, unpack = _torchao_nvfp4()
    shape = (batch, rows, 16 * blocks) if batch else (rows, 16 * blocks)
    x = _drawn_tensor(seed, shape, exponent, kind, dtype)
    S = nvfp4.per_tensor_amax_to_scale(x.abs().amax()) if two_level else None
    if S is not None and not S > 0:             # an amax below 2688 * 2^-149: a scale of 0 (NaN in both)
        return
    theirs = nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=S)
    ours = nvfp4_quantize(x, S)
    assert torch.equal(unpack(theirs.qdata.contiguous().view(torch.uint8)), ours.codes)
    assert torch.equal(theirs.scale.view(torch.uint8), ours.block_scales.view(torch.uint8))
    assert torch.equal(bits(theirs.dequantize(torch.float32)), bits(ours.dequantize()))
    assert torch.equal(bits(nvfp4_fake_quantize(x, S)), bits(ours.dequantize()))
    if S is not None:
        assert torch.equal(bits(per_tensor_scale(x)), bits(S))


@pytest.mark.parametrize("kind", ["normal", "scaled", "tiny", "outlier", "all-zero block", "bf16"])
def test_nvfp4_matches_torchao_on_the_named_cases(kind):
    nvfp4, unpack = _torchao_nvfp4()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(32, 64, generator=g)
    x = {"scaled": x * 1e4, "tiny": x * 1e-6, "bf16": x.bfloat16()}.get(kind, x)
    if kind == "outlier":
        x[3, 5] = 1e5
    if kind == "all-zero block":
        x[:, :16] = 0.0
    for S in (None, nvfp4.per_tensor_amax_to_scale(x.abs().amax())):
        theirs, ours = nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=S), nvfp4_quantize(x, S)
        assert torch.equal(unpack(theirs.qdata.contiguous().view(torch.uint8)), ours.codes)
        assert torch.equal(bits(theirs.dequantize(torch.float32)), bits(ours.dequantize()))


def test_what_the_per_tensor_scale_is_for():
    """One level: a block amax above 448 * 6 saturates its scale, one below 6 * 2^-6 gets the floor 2^-6."""
    big = torch.tensor([[5000.0] + [1.0] * 15])
    assert nvfp4_quantize(big).block_scales.float().item() == 448.0
    assert nvfp4_quantize(big).dequantize()[0, 0] == 448 * 6                       # clipped
    assert nvfp4_quantize(big, per_tensor_scale(big)).dequantize()[0, 0] == 5000.0
    small = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 1e-3
    one, two = nvfp4_quantize(small), nvfp4_quantize(small, per_tensor_scale(small))
    assert (one.block_scales.float() == 2**-6).all()                               # every scale at the floor
    error = {n: ((q.dequantize() - small).norm() / small.norm()).item() for n, q in (("one", one), ("two", two))}
    assert error["one"] > 0.5 > 0.15 > error["two"], error
    assert two.bits_per_value() == 4 + (8 * 256 + 32) / 4096


def test_shorter_last_blocks_are_zero_padded():
    x = torch.randn(5, 40)
    padded = torch.nn.functional.pad(x, (0, 8))
    assert torch.equal(nvfp4_quantize(x).dequantize(), nvfp4_quantize(padded).dequantize()[:, :40])


def test_misuse_is_refused():
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        nvfp4_quantize(torch.ones(4, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="rounding"):
        nvfp4_quantize(torch.ones(4, 16), rounding="up")
    with pytest.raises(ValueError, match="2-D weight"):
        nvfp4_quantize_2d(torch.ones(2, 4, 16))


# --- the 16x16 weight variant --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 70), st.integers(1, 70), st.booleans())
def test_tiles_quantize_w_and_w_transposed_alike(seed, m, k, two_level):
    w = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    S = per_tensor_scale(w) if two_level else None
    a = nvfp4_quantize_2d(w, S).dequantize()
    b = nvfp4_quantize_2d(w.t().contiguous(), S).dequantize()
    assert torch.equal(bits(a.t()), bits(b))
    assert not torch.equal(bits(nvfp4_quantize(w, S).dequantize().t()),
                           bits(nvfp4_quantize(w.t().contiguous(), S).dequantize())) or min(m, k) < 2


def test_a_tile_is_the_1d_quantizer_with_the_tiles_amax():
    """Where every 1 x 16 block of a tile holds the tile's amax, 2-D and (torchao-checked) 1-D blocks agree."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 48, generator=g)
    tile_amax = block_amax(w, tiled=True)
    w.view(32, 3, 16)[:, :, 0] = tile_amax                       # each block now reaches its tile's amax
    S = per_tensor_scale(w)
    assert torch.equal(nvfp4_quantize_2d(w, S).codes, nvfp4_quantize(w, S).codes)
    assert nvfp4_quantize_2d(w, S).block_scales.shape == (2, 3)


# --- MXFP4 against torchao -----------------------------------------------------------------------------

def _torchao_mx():
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    config = pytest.importorskip("torchao.prototype.mx_formats.config")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    return mx_tensor, config.ScaleCalculationMode, kernels.unpack_uint4


@settings(max_examples=500, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 8), blocks=st.integers(1, 4),
       exponent=st.integers(-60, 60), kind=st.sampled_from(["normal", "outlier", "zero block", "spread"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), rule=st.sampled_from(["floor", "rceil"]))
def test_mxfp4_matches_torchao(seed, rows, blocks, exponent, kind, dtype, rule):
    """Scale codes, E2M1 codes and values, block by block, except where torchao's eager path leaves the rule:
    a block with scale code 0 (2^-127; FLOOR divides by 2^-126 there, RCEIL multiplies by 1), and under RCEIL
    a block whose amax / 6 lies within float32 rounding of a power of two (torchao takes ceil(log2(.)) in
    float32, which rounds; ampteach reads the exponent bits of amax * float32(1/6), as Transformer Engine does)."""
    mx_tensor, mode, unpack = _torchao_mx()
    x = _drawn_tensor(seed, (rows, 32 * blocks), exponent, kind, dtype)
    scale_codes, data = mx_tensor.to_mx(x, torch.float4_e2m1fn_x2, 32, mode.FLOOR if rule == "floor" else mode.RCEIL)
    ours = mx_quantize(x, "fp4_e2m1", 32, rule)
    theirs_codes = scale_codes.view(torch.uint8)
    amax = x.float().abs().unflatten(-1, (-1, 32)).amax(-1)
    comparable = ours.scale_codes > 0
    if rule == "rceil":
        exponent_bits = torch.log2(amax / 6.0)
        comparable &= (exponent_bits - exponent_bits.round()).abs() > 1e-5
    assert comparable.float().mean() > 0.5 or amax.max() == 0
    assert torch.equal(ours.scale_codes[comparable], theirs_codes[comparable])
    elements = comparable.repeat_interleave(32, -1)
    assert torch.equal(ours.elements[elements], unpack(data.contiguous().view(torch.uint8))[elements])
    theirs = mx_tensor.to_dtype(data, scale_codes, torch.float4_e2m1fn_x2, 32, torch.float32)
    assert torch.equal(bits(mx_dequantize(ours))[elements], bits(theirs)[elements])


def test_mxfp4_departures_of_torchao_are_the_documented_ones():
    mx_tensor, mode, unpack = _torchao_mx()
    tiny = torch.full((1, 32), 2.0**-128)                       # FLOOR: e = -130, clamped to -127: code 0
    codes, data = mx_tensor.to_mx(tiny, torch.float4_e2m1fn_x2, 32, mode.FLOOR)
    assert codes.view(torch.uint8).item() == 0 == mx_quantize(tiny, "fp4_e2m1").scale_codes.item()
    assert unpack(data.view(torch.uint8)).max() == 0              # torchao: 2^-128 / 2^-126 = 0.25 -> 0
    assert mx_quantize(tiny, "fp4_e2m1").elements.max() == 1      # the rule: 2^-128 / 2^-127 = 0.5, code 1
    near = torch.full((1, 32), 6.0 * (1 + 2**-23))                   # amax / 6 just above 1 (2^0)
    near_codes = mx_tensor.to_mx(near, torch.float4_e2m1fn_x2, 32, mode.RCEIL)[0].view(torch.uint8).item()
    ours = mx_quantize(near, "fp4_e2m1", 32, "rceil").scale_codes.item()
    assert ours == 128 and near_codes in (127, 128)                   # the exponent bits round up: 2^1


# --- the random Hadamard transform ---------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 32, 64])
def test_the_rht_is_orthogonal(d):
    h = hadamard_matrix(d)
    assert torch.equal(h @ h.t(), d * torch.eye(d)) and set(h.unique().tolist()) <= {-1.0, 1.0}
    for seed in range(3):
        H = rht_matrix(random_signs(d, seed))
        assert torch.allclose(H @ H.t(), torch.eye(d), atol=1e-6) and torch.allclose(H.t() @ H, torch.eye(d), atol=1e-6)
    H16 = rht_matrix(random_signs(16, 0))
    assert torch.equal(H16 @ H16.t(), torch.eye(16)) and set(H16.abs().unique().tolist()) == {0.25}   # exact at 16


def test_one_seeded_sign_vector():
    assert torch.equal(random_signs(16, 3), random_signs(16, 3))
    assert not torch.equal(random_signs(16, 0), random_signs(16, 1))
    assert set(random_signs(16, 0).tolist()) == {-1.0, 1.0}


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(1, 5))
def test_the_rht_inverts_and_leaves_dot_products_alone(seed, rows, blocks):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rows, 16 * blocks, generator=g), torch.randn(rows + 1, 16 * blocks, generator=g)
    H = rht_matrix(random_signs(16, seed % 100))
    assert torch.allclose(inverse_rht(rht(a, H), H), a, atol=1e-5)
    assert torch.allclose(rht(a, H) @ rht(b, H).t(), a @ b.t(), atol=1e-4)
    assert torch.allclose(rht(a, H).norm(), a.norm(), rtol=1e-5)


def test_the_rht_spreads_an_outlier():
    x = torch.zeros(1, 16)
    x[0, 3] = 16.0
    y = rht(x, rht_matrix(random_signs(16, 0)))
    assert torch.equal(y.abs(), torch.full((1, 16), 4.0))
    with pytest.raises(ValueError, match="multiple"):
        rht(torch.ones(2, 10), rht_matrix())
