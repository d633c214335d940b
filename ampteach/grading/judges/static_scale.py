"""Judge of the static-scale exercise: the learner's fractions and scale, graded by torch's fp16 cast.

    @judge("check_flush_and_overflow")    # (flushed, overflowed) at five scales on six gradient sets
    @judge("check_static_scale")          # a power of two: nothing overflows with headroom, fewest flushed
    @judge("check_static_scale_hidden")   # gradient sets the exercise does not show

Gradient sets are log-normal magnitudes with random signs and some exact zeros, drawn from seeds that
are fixed while a learner works on a visible check and new under grading.
"""

from __future__ import annotations

import math

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

FP16_MAX = torch.finfo(torch.float16).max


def true_fractions(grads: torch.Tensor, scale: float) -> tuple[float, float]:
    """(flushed, overflowed) fractions of all entries of grads when S * g is stored in fp16."""
    g = grads.float().flatten()
    stored = (g * scale).to(torch.float16)
    flushed = ((g != 0) & (stored == 0)).sum().item() / g.numel()
    overflowed = torch.isinf(stored).sum().item() / g.numel()
    return flushed, overflowed


def gradient_sets(gen: torch.Generator, hidden: bool = False) -> dict[str, torch.Tensor]:
    """Gradient samples shaped like a real network's: log-normal magnitudes, random signs, some exact zeros."""

    def lognormal(n: int, center_log2: float, octaves: float, zeros: float = 0.1) -> torch.Tensor:
        mag = torch.exp2(center_log2 + octaves * torch.randn(n, generator=gen))
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
        return mag * sign * (torch.rand(n, generator=gen) >= zeros)

    if not hidden:
        return {"a small network's gradients (centred near 2^-22)": lognormal(50_000, -22, 4),
                "gradients with a few large outliers": torch.cat([lognormal(50_000, -18, 3),
                                                                  torch.tensor([0.5, -2.0, 3.0])]),
                "large gradients: the scale must go below 1": lognormal(20_000, 9, 2)}
    edge = torch.tensor([65504.0 / 8, -2.0 ** -25, 2.0 ** -25 * 1.0000001, 1e-3])
    return {"gradients far below 1 (centred near 2^-30)": lognormal(50_000, -30, 3),
            "large gradients: the scale must go below 1": lognormal(50_000, 8, 2),
            "values on the edges (65504 / 8, 2^-25, just above 2^-25)": torch.cat([edge, lognormal(1000, -24, 1)]),
            "no zeros, narrow spread": lognormal(20_000, -12, 1, zeros=0.0)}


def _check_fractions_on(learner: Learner, fractions: Ref, name: str, grads: torch.Tensor, scale: float) -> None:
    got = learner.call(fractions, grads.clone(), scale)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise CheckFailed(f"{name}, S = {scale:g}: expected (flushed, overflowed), got {describe(got)}")
    want = true_fractions(grads, scale)
    try:
        got = tuple(float(v) for v in got)
    except (TypeError, ValueError):
        raise CheckFailed(f"{name}, S = {scale:g}: expected two numbers, got {describe(got)}") from None
    one = 0.5 / grads.numel()   # fractions are counts over numel: half an entry of slack for float rounding
    if all(math.isclose(a, b, abs_tol=one) for a, b in zip(got, want)):
        return
    hint = ""
    early = true_fractions(grads.to(torch.float16).float(), scale)
    if all(math.isclose(a, b, abs_tol=one) for a, b in zip(got, early)) and early != want:
        hint = (" (that is what you get when g is rounded to fp16 BEFORE it is multiplied by S: backward "
                "computes S * g, then stores it)")
    elif got[0] > want[0] and math.isclose(got[1], want[1], abs_tol=one):
        hint = " (an entry that was 0 before scaling is not flushed: it was never a nonzero gradient)"
    elif got[0] < want[0]:
        hint = (" (fp16 keeps values down to about 2^-24, its smallest subnormal, not only down to 2^-14, "
                "its smallest normal; a value is flushed when it rounds to 0)")
    raise CheckFailed(f"{name}, S = {scale:g}: expected (flushed, overflowed) = ({want[0]:.6g}, {want[1]:.6g}), "
                      f"got ({got[0]:.6g}, {got[1]:.6g}){hint}")


@judge("check_flush_and_overflow")
def check_flush_and_overflow(learner: Learner, fractions: Ref) -> str:
    cases = 0
    sets = {**gradient_sets(learner.generator(3)), **gradient_sets(learner.generator(7), hidden=True)}
    for name, grads in sets.items():
        for scale in (1.0, 2.0**10, 2.0**20, 3.0 * 2**15, 2.0**-6):
            _check_fractions_on(learner, fractions, name, grads, scale)
            cases += 1
    return f"{cases} (gradient set, scale) pairs, exactly as torch's fp16 cast"


def best_scale(grads: torch.Tensor, headroom: float) -> float:
    """The largest power of two at which no gradient overflows fp16 even when it grows by `headroom`."""
    largest = (grads.float().abs().max() * headroom).item()
    e = min(127, math.floor(math.log2(FP16_MAX / largest)) + 2)    # a guess from above, then walk down
    while e > -150 and true_fractions(grads * headroom, 2.0**e)[1] > 0:
        e -= 1
    return 2.0**e


def _grade_scale(learner: Learner, choose: Ref, name: str, grads: torch.Tensor, headroom: float) -> None:
    scale = learner.call(choose, grads.clone(), headroom)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise CheckFailed(f"{name}: expected a number, got {describe(scale)}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise CheckFailed(f"{name}: expected a positive finite scale, got {scale!r}")
    mantissa, _ = math.frexp(scale)
    if mantissa != 0.5:
        raise CheckFailed(f"{name}: S = {scale!r} is not a power of two: multiplying by 2^k is exact in binary "
                          f"floating point, any other S adds a rounding error to every gradient")
    best = best_scale(grads, headroom)
    flushed, overflowed = true_fractions(grads * headroom, scale)
    if overflowed > 0:
        raise CheckFailed(f"{name}: at S = 2^{math.log2(scale):g}, {overflowed:.3%} of the gradients overflow fp16 "
                          f"once they grow {headroom:g}x; the largest safe power of two is smaller")
    at_scale, at_best = true_fractions(grads, scale)[0], true_fractions(grads, best)[0]
    if at_scale > at_best:
        raise CheckFailed(f"{name}: at S = 2^{math.log2(scale):g}, {at_scale:.3%} of the gradients are flushed to 0; "
                          f"a larger safe scale flushes only {at_best:.3%} (nothing overflows there either, with "
                          f"{headroom:g}x headroom)")


@judge("check_static_scale")
def check_static_scale(learner: Learner, choose_static_scale: Ref) -> str:
    n = 0
    sets = gradient_sets(learner.generator(3))
    for headroom in (8.0, 1.0, 64.0):
        for name, grads in sets.items():
            _grade_scale(learner, choose_static_scale, f"{name}, headroom {headroom:g}x", grads, headroom)
            n += 1
    return f"{n} (gradient set, headroom) pairs: no overflow, as few flushed as possible"


@judge("check_static_scale_hidden")
def check_static_scale_hidden(learner: Learner, choose_static_scale: Ref) -> str:
    n = 0
    sets = gradient_sets(learner.generator(7), hidden=True)
    for headroom in (8.0, 2.0):
        for name, grads in sets.items():
            _grade_scale(learner, choose_static_scale, f"{name}, headroom {headroom:g}x", grads, headroom)
            n += 1
    return f"{n} more (gradient set, headroom) pairs"
