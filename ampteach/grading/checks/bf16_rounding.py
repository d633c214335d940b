"""Build it yourself 1: float32 -> bf16 rounded to nearest even, graded by x.to(torch.bfloat16) bit for bit.

    from ampteach.grading.checks import check_round_to_bf16
    check_round_to_bf16(my_round_to_bf16)     # prints "passed ..." or raises CheckFailed

While the learner's function runs, torch's own casts to a 16-bit float and the course library's
rounding (ampteach/amp) are refused: the exercise is to round from the bits.
"""

from __future__ import annotations

import contextlib

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, package_files

__all__ = ["BECAUSE", "check_round_to_bf16"]

BECAUSE = ("the exercise is to round from the float32 bits yourself, with integer ops on x.view(torch.int32) "
           "(torch's casts and the course library's rounding are what the check grades you against; compare "
           "with them after you pass)")


class _NoHalfCasts(torch.overrides.TorchFunctionMode):
    """Refuse torch's own casts to a 16-bit float while a learner's rounding function runs (the clear message;
    the Borrowed watch beside it also refuses them when torch functions are switched off)."""

    HALF = (torch.bfloat16, torch.float16)
    CASTS = {torch.Tensor.to, torch.Tensor.type, torch.Tensor.view, torch.Tensor.bfloat16, torch.Tensor.half,
             torch.Tensor.new_tensor, torch.tensor, torch.as_tensor, torch.Tensor.type_as, torch.Tensor.copy_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.CASTS:
            named = [a for a in list(args[1:]) + list(kwargs.values()) if a in self.HALF]
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            if named or func in (torch.Tensor.bfloat16, torch.Tensor.half) or (
                    func in (torch.Tensor.type_as, torch.Tensor.copy_) and any(t.dtype in self.HALF for t in tensors)):
                name = getattr(func, "__name__", func)
                raise CheckFailed(f"your function called torch's own cast (Tensor.{name} to a 16-bit float): {BECAUSE}")
        return func(*args, **kwargs)


@watch("bf16_rounding")
def own_rounding(who: str) -> contextlib.ExitStack:
    """torch's casts to bf16/fp16 (any aten op with a 16-bit float result, torch.ops.aten included) and every
    function of the course's own torch.amp rebuild (ampteach/amp: round_to_format, ...) refused."""
    stack = contextlib.ExitStack()
    stack.enter_context(_NoHalfCasts())
    stack.enter_context(Borrowed(who, package_files("ampteach.amp"), BECAUSE, half_results=True))
    return stack


def check_round_to_bf16(fn) -> None:
    """fn(x: float32 tensor) -> float32 tensor of the values x becomes in bf16; graded by x.to(torch.bfloat16)."""
    run_judge("check_round_to_bf16", fn)
