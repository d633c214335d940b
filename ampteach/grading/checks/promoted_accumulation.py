"""Build it yourself 8: a narrow accumulator and its promotion, graded against exact integer arithmetic.

    from ampteach.grading.checks import check_round_to_bits, check_accumulate
    check_round_to_bits(round_to_bits)     # round_to_bits(x, bits, rounding) -> x kept to `bits` bits
    check_accumulate(accumulate)           # accumulate(products, acc_bits, rounding, promote_every) -> sums

The judge computes the rule on exact rationals, independently of the course's library
(ampteach.amp.accumulator). While the learner's code runs, ampteach's own emulated_matmul and
round_to_bits (their file) and torch's matrix products are refused: the exercise is to write the
loop and the rounding.
"""

from __future__ import annotations

import contextlib

import torch

from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, RefuseOps, package_files

__all__ = ["BECAUSE", "MATMULS", "check_round_to_bits", "check_round_to_bits_hidden", "check_accumulate",
           "check_accumulate_hidden"]

BECAUSE = "the exercise is to add the products one at a time, rounding after each"
MATMULS = ("mm", "bmm", "matmul", "mv", "dot", "vdot", "einsum", "tensordot", "inner", "addmm", "addbmm",
           "baddbmm", "addmv", "linear", "_addmm_activation")


@watch("promoted_accumulation")
def own_loop(who: str) -> contextlib.ExitStack:
    """ampteach's accumulator (by file) and torch's matrix products (as functions, methods and aten ops) refused."""
    stack = contextlib.ExitStack()
    functions = [getattr(torch, n) for n in ("matmul", "mm", "bmm", "mv", "dot", "einsum", "tensordot", "inner",
                                             "addmm")]
    functions += [torch.Tensor.__matmul__, torch.Tensor.matmul, torch.Tensor.mm, torch.nn.functional.linear]
    stack.enter_context(RefuseOps({fn: BECAUSE for fn in functions}))
    stack.enter_context(Borrowed(who, package_files("ampteach.amp.accumulator"), BECAUSE,
                                 aten_ops=[n for n in MATMULS if hasattr(torch.ops.aten, n)]))
    return stack


def check_round_to_bits(round_to_bits) -> None:
    """round_to_bits(x: float64 tensor, bits, rounding) -> the float64 values x becomes when kept to `bits`
    significant bits, rounding "nearest" (ties to even) or "truncate" (toward zero)."""
    run_judge("check_round_to_bits", round_to_bits)


def check_round_to_bits_hidden(round_to_bits) -> None:
    """Values the exercise does not show, drawn each time: other ties and carries, random float64 bit patterns."""
    run_judge("check_round_to_bits_hidden", round_to_bits)


def check_accumulate(accumulate) -> None:
    """accumulate(products: (K, M) float64, acc_bits, rounding, promote_every) -> (M,) float64: each column
    summed in k order, rounded to acc_bits after every add, promoted into an fp32 total every n products."""
    run_judge("check_accumulate", accumulate)


def check_accumulate_hidden(accumulate) -> None:
    """Settings the exercise does not show: 2, 3, 5 and 24 bits, promotion every 1, 7 and 1000, 0 and 1 products."""
    run_judge("check_accumulate_hidden", accumulate)
