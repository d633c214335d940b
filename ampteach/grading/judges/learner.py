"""The judge's handle on the learner's process: call their functions, read their values, run plans, over the wire.

    def check_round_to_bf16(learner: Learner, fn: Ref) -> str:
        x = torch.randn(1000, generator=learner.generator(0))     # seed 0 while the learner works, fresh when graded
        got = learner.call(fn, x, watch="bf16_rounding")           # runs round_to_bf16(x) in their process
        ...                                                         # compare with x.to(torch.bfloat16), here
        return "1,000 values, bit-exact"                            # the pass line; a failure raises CheckFailed

A judge runs in a trusted process: the grader's (`ampteach grade`) or a subprocess that a learner's
kernel starts for a visible check (checks/visible.py). The learner's process (their kernel, or the
sandbox) runs the driver (checks/driver.py), which answers. What comes back is only ever data
(checks/wire.py): the judge computes what is expected and compares.

`fresh` decides the inputs: while a learner works, a visible check draws from fixed seeds, so its
messages repeat; a hidden check, and every check under `ampteach grade`, draws new seeds each time
(`seed`, `generator`, `rng`), so no answer can be looked up from an earlier run.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Any, Callable, Iterable

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.wire import Opaque, RemoteError

__all__ = ["Ref", "Learner", "LearnerRaised", "NotDone", "JudgeTimeout", "Remote", "describe"]


class Ref(str):
    """The name under which the learner's process knows an object: a notebook variable, or arg0, arg1, ..."""


class LearnerRaised(Exception):
    """The learner's code raised (the error is theirs, e.g. NotImplementedError for an untouched exercise)."""

    def __init__(self, error: RemoteError) -> None:
        super().__init__(str(error))
        self.error = error


class NotDone(Exception):
    """The answer is still the exercise's placeholder (a `...`, a '?'): the learner has not done it yet."""


class JudgeTimeout(Exception):
    """The learner's process did not answer within the check's time."""


class Learner:
    """See the module docstring. `request` sends one message to the driver and returns its answer."""

    def __init__(self, request: Callable[[dict], dict], *, fresh: bool,
                 sources: list[tuple[str, str]] | None = None, course_cells: Iterable[str] = (),
                 names: dict[str, str] | None = None, timeout: float | None = None) -> None:
        self._request = request
        self.fresh = fresh
        self._sources = sources
        self.course_cells = frozenset(course_cells)   # fingerprints of the cells the course wrote
        self.names = dict(names or {})          # ref -> the name the learner knows it by, for messages
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.last_report: Any = None
        self.rng = random.Random(secrets.randbits(64) if fresh else 0)

    # --- inputs -------------------------------------------------------------------------------------

    def seed(self, visible: int) -> int:
        """`visible` while a learner works on a visible check; a new random seed otherwise."""
        return secrets.randbits(31) if self.fresh else visible

    def generator(self, visible: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed(visible))

    # --- requests -----------------------------------------------------------------------------------

    def name_of(self, ref: Ref | str) -> str:
        return self.names.get(ref, ref)

    def _ask(self, message: dict) -> Any:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise JudgeTimeout()
            message["timeout"] = left
        reply = self._request(message)
        if not isinstance(reply, dict):
            raise CheckFailed(f"the notebook's process answered the grader with {type(reply).__name__}, not an answer")
        if "value" in reply:
            self.last_report = reply.get("report")
            return reply["value"]
        if "raised" in reply and isinstance(reply["raised"], RemoteError):
            raise LearnerRaised(reply["raised"])
        if "failed" in reply:
            raise CheckFailed(str(reply["failed"]))
        if "missing" in reply:
            name = self.name_of(str(reply["missing"]))
            raise CheckFailed(f"your notebook has no `{name}` when this check runs: run the cells above it (the one "
                              f"that defines {name} included) first, without errors")
        if "timeout" in reply:
            raise JudgeTimeout()
        raise CheckFailed(f"the notebook's process answered the grader with something else: {str(reply)[:200]}")

    def call(self, ref: Ref | str, *args: Any, watch: str | None = None, **kwargs: Any) -> Any:
        """ref(*args, **kwargs) in the learner's process, under the named watch (checks/driver.WATCHES)."""
        return self._ask({"op": "call", "ref": ref, "args": list(args), "kwargs": kwargs, "watch": watch,
                          "who": self.name_of(ref)})

    def function(self, ref: Ref | str, watch: str | None = None) -> Remote:
        return Remote(self, ref, watch)

    def plan(self, name: str, refs: dict[str, Ref | str] | None = None, *args: Any, **kwargs: Any) -> Any:
        """One of the course's plans (checks/driver.PLANS) run in the learner's process with their objects."""
        return self._ask({"op": "plan", "plan": name, "refs": dict(refs or {}), "args": list(args), "kwargs": kwargs})

    def value(self, ref: Ref | str) -> Any:
        return self._ask({"op": "value", "ref": ref})

    def sources(self) -> list[tuple[str, str]]:
        """(label, code) of the learner's own cells: the grader reads them from the file (cell [k], as JupyterLab
        numbers code cells), a kernel from its In list (In[n]); cells the course wrote, unchanged, are left out."""
        if self._sources is None:
            history = self._ask({"op": "sources"})
            self._sources = [(f"cell In[{n}]", s) for n, s in enumerate(history) if isinstance(s, str) and s.strip()]
        from ampteach.grading.exercises import code_fingerprint
        return [(label, s) for label, s in self._sources if code_fingerprint(s) not in self.course_cells]


class Remote:
    """A learner's function, called in their process: remote(x) is learner.call(ref, x, watch=...)."""

    def __init__(self, learner: Learner, ref: Ref | str, watch: str | None) -> None:
        self.learner, self.ref, self.watch = learner, ref, watch
        self.__name__ = learner.name_of(ref)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.learner.call(self.ref, *args, watch=self.watch, **kwargs)

    def __repr__(self) -> str:
        return f"<your {self.__name__}>"


def describe(value: Any) -> str:
    """What came back, in a message: a type name for an object that did not travel."""
    if isinstance(value, Opaque):
        return f"a {value.type} ({value.repr[:80]})"
    return repr(value)[:200]
