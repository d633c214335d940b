"""Build it yourself 1: float32 -> bf16 rounded to nearest even, graded by x.to(torch.bfloat16) bit for bit.

    from ampteach.grading.checks import check_round_to_bf16
    check_round_to_bf16(my_round_to_bf16)     # prints "passed ..." or raises CheckFailed
"""

from __future__ import annotations

from typing import Callable

import torch

from ampteach.grading.checks.borrowed import Borrowed, package_files
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import bits32 as _bits
from ampteach.grading.checks.common import passed as _passed

Case = tuple[str, torch.Tensor]


BECAUSE = ("the exercise is to round from the float32 bits yourself, with integer ops on x.view(torch.int32) "
           "(torch's casts and the course library's rounding are what the check grades you against; compare "
           "with them after you pass)")


def _describe(value: float, bits: int) -> str:
    return f"{value!r} (bits 0x{bits & 0xFFFFFFFF:08x})"


def _expected(value: float, bits: int) -> str:
    """A NaN passes as any NaN (NaN payloads are not graded), so the message names no bits for it."""
    return "any NaN" if value != value else _describe(value, bits)


def _own_rounding(fn: Callable) -> Borrowed:
    """torch's casts to bf16/fp16 (any aten op with a 16-bit float result, torch.ops.aten included) and
    every function of the course's own torch.amp rebuild (ampteach/amp: round_to_format, ...) refused."""
    return Borrowed(getattr(fn, "__name__", "function"), package_files("ampteach.amp"), BECAUSE, half_results=True)


# --- build 1: float32 -> bf16, round to nearest even ---------------------------------------------

class _NoHalfCasts(torch.overrides.TorchFunctionMode):
    """Refuse torch's own casts to a 16-bit float while a learner's rounding function runs."""

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


def bf16_cases(seed: int = 0) -> list[Case]:
    """Named values, every bf16 upper half with every rounding case of the lower half, random bits."""
    f32 = torch.finfo(torch.float32)
    named = torch.tensor([
        1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 257.0, 259.0, -259.0, 0.1, -0.0, 0.0,
        f32.max, f32.tiny, 2.0**-133, 1.5 * 2**-133, 2.0**-134, 2.0**-149, 3.3895e38, 3.3961e38,
        float("inf"), float("-inf"), float("nan"),
    ], dtype=torch.float32)
    upper = torch.arange(1 << 16, dtype=torch.int64) << 16
    lower = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    every = (upper[:, None] | lower[None, :]).flatten()
    every = torch.where(every >= 1 << 31, every - (1 << 32), every).to(torch.int32).view(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    random = torch.randint(-(1 << 31), 1 << 31, (1_000_000,), generator=gen, dtype=torch.int64)
    return [
        ("named values (ties, overflow, subnormals, signed zero, inf, NaN)", named),
        ("all 65,536 bf16 upper halves x lower halves 0x0000/0x0001/0x7fff/0x8000/0x8001/0xffff", every),
        ("1,000,000 random float32 bit patterns", random.to(torch.int32).view(torch.float32)),
    ]


def check_round_to_bf16(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """fn(x: float32 tensor) -> float32 tensor of the values x becomes in bf16; graded by x.to(torch.bfloat16)."""
    total = 0
    for name, x in bf16_cases():
        with _NoHalfCasts(), _own_rounding(fn):
            got = fn(x.clone())
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            raise CheckFailed(f"{name}: expected a tensor of shape {tuple(x.shape)}, got "
                              f"{type(got).__name__} {tuple(getattr(got, 'shape', ()))}")
        if got.dtype != torch.float32:
            raise CheckFailed(f"{name}: expected a float32 tensor (bf16 values stored in float32), got {got.dtype}")
        want = x.to(torch.bfloat16).float()
        both_nan = torch.isnan(want) & torch.isnan(got)
        wrong = (_bits(want) != _bits(got)) & ~both_nan
        if wrong.any():
            i = int(wrong.nonzero()[0])
            raise CheckFailed(
                f"{name}: {int(wrong.sum()):,} of {len(x):,} values wrong; first: input "
                f"{_describe(x[i].item(), int(_bits(x)[i]))}: "
                f"expected {_expected(want[i].item(), int(_bits(want)[i]))}, "
                f"got {_describe(got[i].item(), int(_bits(got)[i]))}")
        total += len(x)
    _passed("check_round_to_bf16", f"{total:,} values in 3 cases, bit-exact with x.to(torch.bfloat16)")

