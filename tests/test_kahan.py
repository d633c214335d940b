"""ampteach.amp.kahan against exact arithmetic: w + c keeps every update, up to the rounding of c + u alone.

Exact sums are Fractions (every bf16 and fp32 number is a rational). The claim tested step by step:
(w + c) after = (w + c) before + u + e, where e = round(c + u) - (c + u) is the only rounding error,
whenever |c + u| <= |w| (the small updates Kahan summation is for).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ampteach.amp.kahan import kahan_add_


def exact(t: torch.Tensor) -> list[Fraction]:
    return [Fraction(v) for v in t.double().tolist()]


def bf16(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


def half_gap(value: float) -> Fraction:
    """Half the gap between bf16 numbers at value: the largest error of rounding value to bf16."""
    return Fraction(2.0 ** (max(math.frexp(value)[1], -125) - 9))


fractions = st.lists(st.floats(-1.0, 1.0), min_size=64, max_size=64)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-30, 1e30), min_size=64, max_size=64), fractions, fractions, fractions)
def test_one_step_rounds_only_the_compensation(magnitudes, signs, c_in_gaps, u_in_weights):
    w = bf16([m if s >= 0 else -m for m, s in zip(magnitudes, signs)])
    c = bf16([float(half_gap(v)) * f for v, f in zip(w.float().tolist(), c_in_gaps)])   # |c| <= half a gap
    u = w.float() * torch.tensor(u_in_weights) / 16                                       # |u| <= |w| / 16
    c_plus_u = (c.float() + u).to(torch.bfloat16)          # the one rounding: c + u in fp32, stored in bf16
    before = [a + b + d for a, b, d in zip(exact(w), exact(c), exact(u))]
    errors = [r - (a + d) for r, a, d in zip(exact(c_plus_u), exact(c), exact(u))]
    w_after, c_after = w.clone(), c.clone()
    kahan_add_(w_after, u, c_after)
    after = [a + b for a, b in zip(exact(w_after), exact(c_after))]
    assert after == [b + e for b, e in zip(before, errors)]
    # that error is at most half a gap of c + u (c + u is about w's gap, so about 2^-8 of w's own error),
    # plus the fp32 add's own rounding (half an fp32 ulp: it can land c + u on a bf16 tie, rounded away)
    fp32_sum = exact(c.float() + u)
    assert all(abs(e) <= half_gap(float(r)) + abs(s) * Fraction(2) ** -24
               for e, r, s in zip(errors, exact(c_plus_u), fp32_sum))


def test_many_small_updates_are_kept_where_plain_bf16_loses_them_all():
    """4096 updates of u = w / 2^12: rounding to nearest never moves w; Kahan's w + c tracks the exact sum."""
    w0 = torch.tensor([1.0, 1.5, -0.75, 3.0e-3, 100.0]).to(torch.bfloat16).float()   # bf16 numbers
    u = (w0 / 4096).float()
    plain = w0.to(torch.bfloat16)
    w, c = w0.to(torch.bfloat16), torch.zeros(5, dtype=torch.bfloat16)
    bound = [Fraction(0)] * 5                               # the sum of each step's |rounding error| bound
    for _ in range(4096):
        plain = (plain.float() + u).to(torch.bfloat16)
        r = (c.float() + u).to(torch.bfloat16)
        bound = [b + half_gap(v) for b, v in zip(bound, r.float().tolist())]
        kahan_add_(w, u, c)
    target = [Fraction(a) + 4096 * Fraction(b) for a, b in zip(w0.tolist(), u.tolist())]   # = 2 w0, exactly
    assert torch.equal(plain, w0.to(torch.bfloat16))        # every update lost
    for wk, ck, t, b in zip(exact(w), exact(c), target, bound):
        assert abs(wk + ck - t) <= b                        # only the compensation's roundings remain
        assert abs(wk - t) <= abs(t) * Fraction(2, 2**8)    # w itself: within one bf16 gap of the exact sum


def test_updates_of_both_signs_cancel_exactly():
    w, c = torch.ones(3, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    for _ in range(300):
        kahan_add_(w, torch.full((3,), 2.0**-12), c)
    for _ in range(300):
        kahan_add_(w, torch.full((3,), -(2.0**-12)), c)
    assert torch.equal(w.float() + c.float(), torch.ones(3))


def test_the_compensation_must_match_the_weight():
    w = torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="zeros_like"):
        kahan_add_(w, torch.ones(4), torch.zeros(4))          # fp32 compensation
    with pytest.raises(ValueError, match="zeros_like"):
        kahan_add_(w, torch.ones(4), torch.zeros(3, dtype=torch.bfloat16))
