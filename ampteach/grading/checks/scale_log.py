"""Read a scale log: name the cause of a loss-scale trajectory, graded on logs made by torch.amp.GradScaler.

    from ampteach.grading.checks import check_scale_log_diagnosis
    check_scale_log_diagnosis(diagnose)      # diagnose(log) -> one of ampteach.lab.scale_logs.CAUSES

The visible check runs your rule on the exercise's four logs A-D; the grader also runs it on runs
you have not seen (other seeds, settings and lengths, and one real fp16 training run, made on the
CPU when the check runs), so a rule that only remembers A-D, or only reads simulations, fails.
"""

from __future__ import annotations

from typing import Callable

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed
from ampteach.lab.scale_logs import CAUSES, causes_of_examples, example_logs, real_run, simulate

LOOK_AT = ("what the scale does over the whole run, whether any loss is inf/NaN (and from when: one step "
           "on, or scattered), whether steps are skipped late in the run, and the flushed share")


def _diagnose_all(diagnose: Callable, logs: dict[str, list[dict]], want: dict[str, str]) -> list[str]:
    wrong = []
    for name, log in logs.items():
        got = diagnose([dict(row) for row in log])
        if got not in CAUSES:
            raise CheckFailed(f"log {name}: diagnose returned {got!r}; expected one of {CAUSES}")
        if got != want[name]:
            wrong.append(f"{name} (you said {got!r})")
    return wrong


def check_scale_log_diagnosis(diagnose: Callable[[list[dict]], str]) -> None:
    """diagnose(log) names the cause of each of the logs A-D; a wrong one is named, not corrected."""
    wrong = _diagnose_all(diagnose, example_logs(), causes_of_examples())
    if wrong:
        raise CheckFailed(f"{len(wrong)} of 4 logs misread: {', '.join(wrong)}. Look at {LOOK_AT}")
    _passed("check_scale_log_diagnosis", "logs A-D read right")


REAL = "unseen run 9 (a real fp16 training run)"


def check_scale_log_unseen(diagnose: Callable[[list[dict]], str]) -> None:
    """The same rule on 9 runs the exercise does not show: two simulated per cause, and the log of a real
    fp16 run (torch.autocast + torch.amp.GradScaler on the CPU, ampteach.lab.scale_logs.real_run), whose
    scaler calibrates normally: it climbs from 2^16 until a scaled gradient overflows, then saws."""
    logs, want = {}, {}
    for cause in CAUSES:
        for seed in (101, 202):
            name = f"unseen run {len(logs) + 1}"
            logs[name], want[name] = simulate(cause, seed), cause
    logs[REAL], want[REAL] = real_run(seed=101), "normal calibration"
    wrong = _diagnose_all(diagnose, logs, want)
    if wrong:
        causes = ", ".join(f"{name.split(' (you said')[0]} was {want[name.split(' (you said')[0]]!r}"
                           for name in wrong)
        raise CheckFailed(f"{len(wrong)} of {len(logs)} unseen runs misread: {causes}. A rule that reads A-D "
                          f"right but not these leans on something particular to A-D, or to simulated logs")
    _passed("check_scale_log_unseen", f"{len(logs)} unseen runs read right")
