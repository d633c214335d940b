"""What every check shares: the failure type, the pass line, and guards against borrowed answers.

    from ampteach.grading.checks.common import CheckFailed, passed, refusing
    with refusing(torch.amp.GradScaler, "update", because="build update() yourself"):
        learner_scaler.update()               # a call into torch's own update raises CheckFailed

A check raises CheckFailed with a message that says which case, what was expected (computed by
PyTorch or by exact arithmetic, never typed in) and what came back. Errors raised by the learner's
code (NotImplementedError for an untouched exercise) pass through unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch


class CheckFailed(AssertionError):
    """Your answer gave a wrong result; the message says which case, what was expected, what came back."""


def passed(name: str, detail: str) -> None:
    print(f"passed {name}: {detail}")


def bits32(x: torch.Tensor) -> torch.Tensor:
    """The int32 bit patterns of a float32 tensor (NaNs compare by pattern, -0 differs from 0)."""
    return x.contiguous().view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values bit for bit, any NaN matching any NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    nan = torch.isnan(a) & torch.isnan(b)
    a32, b32 = a.float(), b.float()
    return bool(((bits32(a32) == bits32(b32)) | nan).all()) and torch.equal(torch.isnan(a), torch.isnan(b))


def short(dtype: torch.dtype | None) -> str:
    return "None" if dtype is None else str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def refusing(owner: Any, names: tuple[str, ...] | str, because: str) -> Iterator[None]:
    """Inside the region, calling owner.<name> raises CheckFailed(because): the exercise is to write it."""
    names = (names,) if isinstance(names, str) else names
    saved = {name: owner.__dict__[name] for name in names if name in getattr(owner, "__dict__", {})}

    def refuse(name: str) -> Callable:
        @functools.wraps(saved[name])
        def refused(*args, **kwargs):
            raise CheckFailed(f"your code called {getattr(owner, '__name__', owner)}.{name}: {because}")
        return refused

    for name in saved:
        setattr(owner, name, refuse(name))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(owner, name, original)


class RefuseOps(torch.overrides.TorchFunctionMode):
    """Inside the region, calling one of `ops` (torch functions) raises CheckFailed(because)."""

    def __init__(self, ops: dict[Callable, str]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.ops:
            raise CheckFailed(f"your code called {getattr(func, '__name__', func)}: {self.ops[func]}")
        return func(*args, **(kwargs or {}))
