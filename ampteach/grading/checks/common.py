"""What every check shares: the failure type, and comparing tensors bit for bit.

    from ampteach.grading.checks.common import CheckFailed, same_bits
    if not same_bits(got, want):
        raise CheckFailed("case 3: expected ..., got ...")

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
import html
import re
import traceback
from typing import Iterator

import torch

__all__ = ["CheckFailed", "bits32", "same_bits", "short", "one_thread"]

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
def one_thread() -> Iterator[None]:
    """Run torch's CPU ops on one thread: a plan's numbers then match the judge's replay bit for bit (the
    judge runs on one thread; a reduction split across threads can round differently)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
