"""Choose a static loss scale from a gradient histogram, graded by what fp16 does to the gradients.

    from ampteach.grading.checks import check_flush_and_overflow, check_static_scale
    check_flush_and_overflow(fractions)      # fractions(grads, scale) -> (flushed, overflowed), vs fp16 casts
    check_static_scale(choose_static_scale)  # choose_static_scale(grads, headroom) -> S, graded by outcome

A gradient g stored in fp16 at loss scale S is the fp16 value nearest to S * g. It is flushed when S * g
is not 0 but becomes 0, and overflows when it becomes inf. The judge's reference is torch's own
float32 -> float16 cast, nothing typed in; its gradient sets are drawn anew under grading.
"""

from __future__ import annotations

from ampteach.grading.checks.visible import run_judge

__all__ = ["check_flush_and_overflow", "check_static_scale", "check_static_scale_hidden"]


def check_flush_and_overflow(fractions) -> None:
    """fractions(grads, scale) -> (flushed, overflowed), each a fraction of ALL entries of grads, when
    S * g is stored in fp16; graded against torch's float32 -> float16 cast at several scales."""
    run_judge("check_flush_and_overflow", fractions)


def check_static_scale(choose_static_scale) -> None:
    """choose_static_scale(grads, headroom) -> S: a power of two with no gradient overflowing fp16 even
    `headroom` times larger, and as few flushed to 0 as any such scale allows; graded by those fractions."""
    run_judge("check_static_scale", choose_static_scale)


def check_static_scale_hidden(choose_static_scale) -> None:
    """The same rule on gradient sets the exercise does not show (far below 1, far above 1, on the edges)."""
    run_judge("check_static_scale_hidden", choose_static_scale)
