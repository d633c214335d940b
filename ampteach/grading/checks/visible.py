"""A check called in a learner's notebook: the judge runs in a process of its own, the learner's code in theirs.

    check_round_to_bf16(round_to_bf16)
    # = run_judge("check_round_to_bf16", round_to_bf16): prints "passed check_round_to_bf16: ..." or raises

The judge (ampteach.grading.judges) starts as a subprocess of the kernel, sends its requests (call
this function with these inputs, run this plan), and ends with its verdict; meanwhile this kernel
answers them with a Driver (checks/driver.py), calling the learner's code here, in their kernel, where
their objects live. A pass prints its line; a failure raises CheckFailed with the judge's message; if
the learner's own code raised (NotImplementedError for an untouched exercise), that exception is
raised again here, with its traceback into their code. `ampteach grade` decides verdicts the same
way, with the notebook in a sandbox instead of the learner's kernel (ampteach/grading/autograde.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ampteach.grading.checks import wire
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.driver import Driver

__all__ = ["run_judge", "JUDGE_MODULE", "caller_namespace"]

JUDGE_MODULE = "ampteach.grading.judges"


def caller_namespace(depth: int = 2) -> dict:
    """The globals of the notebook (or script) that called the check: the nearest `__main__` frame."""
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__main__":
            return frame.f_globals
        frame = frame.f_back
    return {}


def _namespace_of(objects: dict[str, Any]) -> dict | None:
    """The notebook's namespace a learner's function or class lives in (its __globals__), if it has one."""
    for value in objects.values():
        functions = [value] if callable(value) and hasattr(value, "__globals__") else \
            [v for v in vars(value).values() if hasattr(v, "__globals__")] if isinstance(value, type) else []
        for fn in functions:
            namespace = getattr(fn, "__globals__", None)
            if isinstance(namespace, dict) and namespace.get("__name__") == "__main__":
                return namespace
    return None


def _environment() -> dict:
    """The judge imports the same ampteach as this kernel (a checkout without an install included)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("AMPTEACH_GRADING", None)
    return env


def run_judge(name: str, *args: Any, **kwargs: Any) -> None:
    """Judge check `name` on the learner's objects (see the module docstring)."""
    objects = {f"arg{i}": value for i, value in enumerate(args)}
    objects.update({f"kw:{key}": value for key, value in kwargs.items()})
    namespace = _namespace_of(objects)
    driver = Driver(objects, namespace if namespace is not None else caller_namespace(3))
    with tempfile.TemporaryFile() as log:
        judge = subprocess.Popen([sys.executable, "-m", JUDGE_MODULE, name, *objects], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=log, env=_environment())
        verdict = None
        try:
            verdict = driver.serve(judge.stdout, judge.stdin)
        except (EOFError, wire.WireError, BrokenPipeError):
            pass
        finally:
            for stream in (judge.stdin, judge.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                judge.wait(timeout=30)
            except subprocess.TimeoutExpired:
                judge.kill()
                judge.wait()
        if not isinstance(verdict, dict) or verdict.get("op") != "verdict":
            log.seek(0)
            tail = log.read().decode("utf-8", "replace")[-3000:]
            raise RuntimeError(f"the course's judge for {name} stopped without a verdict (exit status "
                               f"{judge.returncode}); what it printed:\n{tail}")
    output = str(verdict.get("output") or "")
    if output:
        print(output, end="" if output.endswith("\n") else "\n")
    if verdict.get("result") == "passed":
        print(verdict.get("message", ""))
        return
    if verdict.get("raised") and driver.raised is not None:
        raise driver.raised
    if verdict.get("not_done"):
        raise NotImplementedError(str(verdict.get("message", "")).removeprefix("NotImplementedError: "))
    raise CheckFailed(str(verdict.get("message", "failed")))
