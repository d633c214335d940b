"""Judge of build it yourself 1: the learner's float32 -> bf16 rounding against x.to(torch.bfloat16), bit for bit.

    @judge("check_round_to_bf16")    # fn(x: float32 tensor) -> the float32 values x becomes in bf16

The cases: named values (ties, overflow, subnormals, signed zero, inf, NaN), every bf16 upper half with
each rounding case of the lower half, and a million random bit patterns (new ones under grading).
"""

from __future__ import annotations

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import bits32 as _bits
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

Case = tuple[str, torch.Tensor]


def _describe(value: float, bits: int) -> str:
    return f"{value!r} (bits 0x{bits & 0xFFFFFFFF:08x})"


def _expected(value: float, bits: int) -> str:
    """A NaN passes as any NaN (NaN payloads are not graded), so the message names no bits for it."""
    return "any NaN" if value != value else _describe(value, bits)


def bf16_cases(generator: torch.Generator) -> list[Case]:
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
    random = torch.randint(-(1 << 31), 1 << 31, (1_000_000,), generator=generator, dtype=torch.int64)
    return [
        ("named values (ties, overflow, subnormals, signed zero, inf, NaN)", named),
        ("all 65,536 bf16 upper halves x lower halves 0x0000/0x0001/0x7fff/0x8000/0x8001/0xffff", every),
        ("1,000,000 random float32 bit patterns", random.to(torch.int32).view(torch.float32)),
    ]


@judge("check_round_to_bf16")
def check_round_to_bf16(learner: Learner, fn: Ref) -> str:
    total = 0
    for name, x in bf16_cases(learner.generator(0)):
        got = learner.call(fn, x.clone(), watch="bf16_rounding")
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            what = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else describe(got)
            raise CheckFailed(f"{name}: expected a tensor of shape {tuple(x.shape)}, got {what}")
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
    return f"{total:,} values in 3 cases, bit-exact with x.to(torch.bfloat16)"
