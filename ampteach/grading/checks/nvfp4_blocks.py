"""Build it yourself 9: NVFP4 quantization, graded bit for bit against torchao's NVFP4 (or the course's own).

    from ampteach.grading.checks import check_nvfp4_quantize, check_round_to_e2m1
    check_round_to_e2m1(round_to_e2m1)       # round_to_e2m1(v) -> v on E2M1's grid, nearest even, saturating
    check_nvfp4_quantize(nvfp4_quantize)     # nvfp4_quantize(x, S) -> (E4M3 block scales, E2M1 values)

While the learner's functions run, the course library's FP4, MX and format code (ampteach/amp: its
E2M1 rounding and its NVFP4) and torchao are refused: the exercise is to write the rounding and the
two levels of scales. torch's E4M3 cast (`.to(torch.float8_e4m3fn)`) is allowed, for the block scale.
"""

from __future__ import annotations

import importlib.util

from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, package_files

__all__ = ["BECAUSE", "check_round_to_e2m1", "check_nvfp4_quantize", "check_nvfp4_quantize_hidden"]

BECAUSE = ("the exercise is to write E2M1's rounding and NVFP4's two levels of scales yourself (the course "
           "library's NVFP4 and torchao's are what the check grades you against: compare with them after you pass)")


def _refused_files() -> frozenset[str]:
    files = set(package_files("ampteach.amp"))
    if importlib.util.find_spec("torchao") is not None:
        files |= package_files("torchao.prototype.mx_formats")
    return frozenset(files)


@watch("nvfp4_blocks")
def own_quantizer(who: str) -> Borrowed:
    return Borrowed(who, _refused_files(), BECAUSE)


def check_round_to_e2m1(round_to_e2m1) -> None:
    """round_to_e2m1(v: float32 tensor) -> float32 tensor on E2M1's grid (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
    negatives): nearest, ties to even, saturating at +-6, the sign kept; graded on every multiple of 1/16
    from -8 to 8, the grid's ties, huge values and random ones."""
    run_judge("check_round_to_e2m1", round_to_e2m1)


def check_nvfp4_quantize(nvfp4_quantize) -> None:
    """nvfp4_quantize(x, S) -> (E4M3 block scales as float32, shape (..., n / 16); E2M1 values shaped like x),
    graded bit for bit against torchao's NVFP4Tensor.to_nvfp4 (or the course's own NVFP4 where torchao is not
    installed) on normal, scaled, tiny, outlier, all-zero-block, bf16 and 3-d inputs."""
    run_judge("check_nvfp4_quantize", nvfp4_quantize)


def check_nvfp4_quantize_hidden(nvfp4_quantize) -> None:
    """Inputs the exercise does not show, drawn each time: other shapes, blocks each at its own scale, exponents
    from 2^-60 to 2^60."""
    run_judge("check_nvfp4_quantize_hidden", nvfp4_quantize)
