"""The judges: what each exercise's checks expect, computed and compared outside the learner's process.

    from ampteach.grading.judges import run_check
    verdict = run_check("check_round_to_bf16", learner, [Ref("round_to_bf16")])
    verdict.result, verdict.message      # "passed", "passed check_round_to_bf16: ..." / "failed", "..."

Only the grader runs this package: `ampteach grade` in its own process, and the subprocess a learner's
kernel starts for a visible check (`python -m ampteach.grading.judges CHECK ARG...`, see
ampteach/grading/checks/visible.py). It holds what a learner must not reach: the reference answers,
the hidden checks' cases and their random draws. The learner's side (ampteach.grading.checks) never
imports it (tests/test_layers.py), and the sandbox `ampteach grade` runs a notebook in cannot see it.

One module per exercise, named after its learner-side module in ampteach.grading.checks; each
registers its checks with `@judge("check_...")`.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from dataclasses import dataclass
from typing import Callable

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges.learner import JudgeTimeout, Learner, LearnerRaised, NotDone, Ref

__all__ = ["JUDGES", "MODULES", "Verdict", "judge", "run_check", "load", "exercise_checks", "exercise_of",
           "hidden_checks"]

MODULES = ("bf16_rounding", "loss_scale_update", "master_step", "sort_cast_lists", "amp_throughput",
           "when_amp_is_wrong", "grad_scaler", "autocast_mode", "transformer_dtypes", "static_scale", "scale_log",
           "bug_hunt", "mx_blocks", "promoted_accumulation", "fp16_attention", "bf16_weight_decay", "nvfp4_blocks")
JUDGES: dict[str, Callable[..., str]] = {}


def judge(name: str) -> Callable:
    """Register a judge: fn(learner, *refs) -> the pass line's detail; raises CheckFailed on a wrong answer."""
    def register(fn: Callable[..., str]) -> Callable[..., str]:
        JUDGES[name] = fn
        return fn
    return register


def exercise_checks() -> dict[str, dict]:
    """The grader's copy of every exercise's checks (ampteach/grading/exercise_checks/*.json), by exercise."""
    import json
    from importlib import resources

    folder = resources.files("ampteach.grading") / "exercise_checks"
    return {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in folder.iterdir()
            if p.name.endswith(".json")}


def exercise_of(check: str) -> dict | None:
    """The grading copy of the exercise whose check cells call `check`."""
    for copy in exercise_checks().values():
        if any(check in c["functions"] for c in copy["checks"]):
            return copy
    return None


def hidden_checks() -> set[str]:
    """The check functions that only hidden check cells call."""
    shown, hidden = set(), set()
    for copy in exercise_checks().values():
        for check in copy["checks"]:
            (hidden if check["hidden"] else shown).update(check["functions"])
    return hidden - shown


def load() -> dict[str, Callable[..., str]]:
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return JUDGES


@dataclass
class Verdict:
    result: str            # passed, failed, timeout
    message: str
    output: str = ""       # what the judge printed (a table)
    raised: bool = False   # the failure is the learner's own exception (a kernel raises it again)
    not_done: bool = False  # the answer is still the placeholder (a kernel raises NotImplementedError)

    def to_message(self) -> dict:
        return {"op": "verdict", "result": self.result, "message": self.message, "output": self.output,
                "raised": self.raised, "not_done": self.not_done}


def run_check(name: str, learner: Learner, refs: list[Ref]) -> Verdict:
    """Judge one check: its verdict, never an exception (a judge's own bug is reported as one)."""
    load()
    if name not in JUDGES:
        return Verdict("failed", f"{name} is not one of the course's checks")
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            detail = JUDGES[name](learner, *refs)
    except CheckFailed as exc:
        return Verdict("failed", str(exc), printed.getvalue())
    except NotDone as exc:
        return Verdict("failed", f"NotImplementedError: {exc}", printed.getvalue(), not_done=True)
    except LearnerRaised as exc:
        error = exc.error
        if error.short_type == "NotImplementedError":
            return Verdict("failed", "NotImplementedError: not done yet (a `# YOUR CODE HERE` is still to write)",
                           printed.getvalue(), raised=True)
        return Verdict("failed", str(error), printed.getvalue(), raised=True)
    except JudgeTimeout:
        return Verdict("timeout", "ran longer than its time and was interrupted (an endless loop?)", printed.getvalue())
    return Verdict("passed", f"passed {name}: {detail}", printed.getvalue())
