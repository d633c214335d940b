"""ampteach.amp.stochastic_rounding against exact arithmetic: always a neighbour, and unbiased.

Unbiased is checked two ways: exactly, by feeding round_with_noise every one of the 2^16 noise
values (their mean must be x as a rational number), and statistically, through the public
round_stochastic and a seeded generator, against a bound derived from the Bernoulli variance.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from ampteach.amp.stochastic_rounding import round_stochastic, round_with_noise

ALL_NOISE = torch.arange(1 << 16, dtype=torch.int32)
BF16_MAX = torch.finfo(torch.bfloat16).max


def neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi): the bf16 numbers around each float32 x (lo == hi == x for a bf16 number), as float64.

    From torch's own cast (round to nearest) and nextafter, not from the bit trick under test.
    """
    nearest = x.to(torch.bfloat16)
    toward = torch.where(x.double() > nearest.double(), math.inf, -math.inf).to(torch.bfloat16)
    other = torch.where(nearest.float() == x, nearest, torch.nextafter(nearest, toward))
    return torch.minimum(nearest, other).double(), torch.maximum(nearest, other).double()


def sample_values(n: int = 300) -> torch.Tensor:
    """Finite float32 values below bf16's max: random bit patterns (every exponent, both signs,
    subnormals) and the edges: bf16 numbers themselves, ties, and values just below a power of two."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=gen).to(torch.int32)
    edges = torch.tensor([1.0, -1.0, 1 + 2**-8, 2 - 2**-24, -(2 - 2**-24), 2.0**-126, 2.0**-133 * 1.5,
                          1e-45, 3.0e38, -3.0e38, 0.0, -0.0])
    x = torch.cat([bits.view(torch.float32), edges])
    return x[x.isfinite() & (x.abs() < BF16_MAX)]


def round_with_every_noise(x: torch.Tensor) -> torch.Tensor:
    """round_with_noise of each value of x with each of the 2^16 noise values: shape (len(x), 2^16), float64."""
    return torch.cat([round_with_noise(part[:, None].expand(-1, len(ALL_NOISE)), ALL_NOISE[None, :]).double()
                      for part in x.split(256)])


@pytest.fixture(scope="module")
def every_rounding():
    """x, its neighbours and round_with_noise(x, noise) for every noise value (computed once)."""
    x = sample_values()
    return x, *neighbours(x), round_with_every_noise(x)


def test_every_result_is_one_of_the_two_bf16_neighbours(every_rounding):
    x, lo, hi, rounded = every_rounding
    assert ((rounded == lo[:, None]) | (rounded == hi[:, None])).all()
    exact = lo == hi
    assert (rounded[exact] == x.double()[exact, None]).all()     # a bf16 number is never moved


def test_over_all_noise_values_the_mean_is_exactly_x(every_rounding):
    """k of the 2^16 noise values round up, and k / 2^16 = (x - lo) / (hi - lo) exactly.

    Exact in float64: x, lo and hi are float32 numbers in neighbouring binades, so x - lo is exact,
    hi - lo is a power of two, and so is 2^16: both sides are computed without rounding.
    """
    x, lo, hi, rounded = every_rounding
    inexact = lo != hi
    x, lo, hi = x[inexact], lo[inexact], hi[inexact]
    ups = (rounded[inexact] == hi[:, None]).sum(1).double()
    assert torch.equal(ups / len(ALL_NOISE), (x.double() - lo) / (hi - lo))
    some = slice(0, None, 23)                      # and once more with rationals, for a few of them
    for xi, k, low, high in zip(x[some].tolist(), ups[some].tolist(), lo[some].tolist(), hi[some].tolist()):
        mean = Fraction(low) + (Fraction(high) - Fraction(low)) * Fraction(int(k), len(ALL_NOISE))
        assert mean == Fraction(xi)


def test_the_round_up_probability_is_the_distance_over_the_gap():
    x = 1 + 2**-10                                  # between 1 and 1 + 2^-7: an eighth of the way
    up = (round_with_noise(torch.full((len(ALL_NOISE),), x), ALL_NOISE).float() > 1).sum().item()
    assert Fraction(up, len(ALL_NOISE)) == Fraction(1, 8)
    x = -(3 + 2**-7)                                # negative: rounds away from zero with probability 1/2
    away = (round_with_noise(torch.full((len(ALL_NOISE),), x), ALL_NOISE).float() < -3).sum().item()
    assert Fraction(away, len(ALL_NOISE)) == Fraction(1, 2)


@pytest.mark.parametrize("x", [1 + 2**-10, 0.1, -2.7182817, 3.0e-39, 1e30, 1.3 * 2.0**-130])
def test_the_mean_of_many_rounded_values_is_the_value_within_five_standard_errors(x):
    """E[round(x)] = x; the mean of N draws has standard error gap * sqrt(p (1 - p) / N)."""
    x = torch.tensor(x).item()                      # the float32 value that is rounded
    n = 200_000
    gen = torch.Generator().manual_seed(1234)
    rounded = round_stochastic(torch.full((n,), x), generator=gen).double()
    lo, hi = (v.item() for v in neighbours(torch.tensor([x])))
    p = (x - lo) / (hi - lo)
    standard_error = (hi - lo) * math.sqrt(p * (1 - p) / n)
    assert abs(rounded.mean().item() - x) <= 5 * standard_error
    assert 0.5 * p < (rounded == hi).double().mean().item() < 1.5 * p   # neither always up nor always down


def test_nearest_rounding_is_biased_where_stochastic_rounding_is_not():
    """Adding u = 2^-10 to 1.0 a thousand times: to nearest it never moves; stochastically it lands near 1 + 1000 u."""
    gen = torch.Generator().manual_seed(0)
    w_nearest = w_stochastic = torch.ones(4096, dtype=torch.bfloat16)
    for _ in range(1000):
        w_nearest = (w_nearest.float() + 2**-10).to(torch.bfloat16)
        w_stochastic = round_stochastic(w_stochastic.float() + 2**-10, generator=gen)
    exact = 1 + 1000 * 2**-10
    assert (w_nearest == 1).all()
    # Each step moves up one gap (2^-7 below 2, 2^-6 above) with probability u / gap: the mean over
    # 4096 independent weights is within a few standard errors (at most 0.09 each) of exact.
    assert abs(w_stochastic.double().mean().item() - exact) < 5 * 0.09 / math.sqrt(4096)


def test_special_values_and_reproducibility():
    x = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, float(BF16_MAX)])
    out = round_stochastic(x)
    assert out.dtype == torch.bfloat16 and out[0].isnan()
    assert out[1:].float().tolist() == [math.inf, -math.inf, 0.0, -0.0, float(BF16_MAX)]
    assert torch.signbit(out[4])
    x = torch.randn(1000)
    a = round_stochastic(x, generator=torch.Generator().manual_seed(7))
    b = round_stochastic(x, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_only_float32_is_accepted():
    with pytest.raises(TypeError, match="float32"):
        round_stochastic(torch.ones(3, dtype=torch.bfloat16))
