"""What every check shares: the failure type, the pass line, and guards against borrowed answers.

    from ampteach.grading.checks.common import CheckFailed, passed, refusing
    with refusing(torch.amp.GradScaler, "update", because="build update() yourself"):
        learner_scaler.update()               # a call into torch's own update raises CheckFailed

A check raises CheckFailed with a message that says which case, what was expected (computed by
PyTorch or by exact arithmetic, never typed in) and what came back. Errors raised by the learner's
code (NotImplementedError for an untouched exercise) pass through unchanged.

In a notebook a failed check shows its message as the cell's error and folds the traceback (the
check's own frames, of no use to a learner) into a closed "where" box above it: IPython shows an
exception through its `_render_traceback_` when it has one. The cell still fails, so Run All stops
there and `ampteach grade` sees the error as before.
"""

from __future__ import annotations

import contextlib
import functools
import html
import re
import traceback
from typing import Any, Callable, Iterator

import torch

__all__ = ["CheckFailed", "passed", "bits32", "same_bits", "short", "refusing", "RefuseOps"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


class CheckFailed(AssertionError):
    """Your answer gave a wrong result; the message says which case, what was expected, what came back."""

    def _render_traceback_(self) -> list[str]:
        """How IPython shows a failed check: the traceback folded in a box, then the message as the error."""
        if not getattr(self, "_folded_shown", False):   # IPython asks twice: for the display and the reply
            self._folded_shown = True
            try:
                _show_folded(self)
            except Exception:  # never let the display hide the failure itself
                pass
        return [f"{_RED}{type(self).__name__}{_RESET}: {self}"]


def _check_name(tb) -> str | None:
    """The course's check function the failure came from (the outermost check_... frame of ampteach's checks)."""
    for frame, _ in traceback.walk_tb(tb):
        code = frame.f_code
        if code.co_name.startswith("check_") and frame.f_globals.get("__name__", "").startswith("ampteach.grading"):
            return code.co_name
    return None


def _show_folded(error: BaseException) -> None:
    """Display the traceback of `error` as a closed <details> box (HTML), or as text where HTML is not shown."""
    from IPython import get_ipython
    from IPython.display import display

    shell = get_ipython()
    if shell is None:
        return
    try:
        lines = shell.InteractiveTB.structured_traceback(type(error), error, error.__traceback__)
    except Exception:
        lines = traceback.format_exception(type(error), error, error.__traceback__)
    text = _ANSI.sub("", "\n".join(line.rstrip("\n") for line in lines))
    name = _check_name(error.__traceback__)
    summary = f"{name} failed: the message is below; where it failed (traceback, {text.count(chr(10)) + 1} lines)" \
        if name else f"where it failed (traceback, {text.count(chr(10)) + 1} lines)"
    folded = (f'<details class="ampteach-traceback"><summary>{html.escape(summary)}</summary>'
              f'<pre>{html.escape(text)}</pre></details>')
    display({"text/html": folded, "text/plain": f"{summary}:\n{text}"}, raw=True)


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
