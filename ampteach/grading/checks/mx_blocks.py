"""Build it yourself 7: MX block quantization, graded against the OCP Microscaling (MX) v1.0 rule.

    from ampteach.grading.checks import ELEMENTS, check_mx_quantize
    check_mx_quantize(mx_quantize)     # mx_quantize(x, elem) -> (shared exponents, element values)

The rule (the judge computes it independently of the course's library, in float64 with exact
exponents): each block of 32 consecutive values (last dimension) shares one scale X = 2^e, an E8M0
number; e = floor(log2(amax)) - emax_elem, clamped to [-127, 127]; each element P_i = v_i / X rounded
to the element format, to nearest with ties to even, saturating at +-max_elem (no inf). While the
learner's function runs, the course library's torch.amp rebuild (ampteach/amp: its MX code and its
rounding) is refused.
"""

from __future__ import annotations

from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, package_files

__all__ = ["BLOCK", "ELEMENTS", "BECAUSE", "check_mx_quantize", "check_mx_quantize_hidden"]

BLOCK = 32
# element format -> (exponent bits, mantissa bits, emax: largest exponent of a normal value, largest value)
ELEMENTS = {
    "fp8_e4m3": (4, 3, 8, 448.0),
    "fp8_e5m2": (5, 2, 15, 57344.0),
    "fp6_e3m2": (3, 2, 4, 28.0),
    "fp6_e2m3": (2, 3, 2, 7.5),
    "fp4_e2m1": (2, 1, 2, 6.0),
}
BECAUSE = "the exercise is to write the rule yourself (the course library's MX code is for comparing after you pass)"


@watch("mx_blocks")
def own_rule(who: str) -> Borrowed:
    return Borrowed(who, package_files("ampteach.amp"), BECAUSE)


def check_mx_quantize(mx_quantize) -> None:
    """mx_quantize(x, elem) -> (e: one shared exponent per block of 32, P: the element values, float32,
    shaped like x) for each element format in ELEMENTS; graded against the OCP MX v1.0 rule."""
    run_judge("check_mx_quantize", mx_quantize)


def check_mx_quantize_hidden(mx_quantize) -> None:
    """Inputs the exercise does not show, drawn each time: random bit patterns, values near float32's max,
    3-d tensors."""
    run_judge("check_mx_quantize_hidden", mx_quantize)
