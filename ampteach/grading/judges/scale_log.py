"""Judge of read_scale_log: the learner's diagnose(log) on the exercise's logs and on runs made when grading.

    @judge("check_scale_log_diagnosis")   # logs A-D
    @judge("check_scale_log_unseen")      # two simulated runs per cause and one real fp16 run, new seeds each time
"""

from __future__ import annotations

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe
from ampteach.lab.scale_logs import CAUSES, causes_of_examples, example_logs, real_run, simulate

LOOK_AT = ("what the scale does over the whole run, whether any loss is inf/NaN (and from when: one step "
           "on, or scattered), whether steps are skipped late in the run, and the flushed share")
REAL = "unseen run 9 (a real fp16 training run)"


def _diagnose_all(learner: Learner, diagnose: Ref, logs: dict[str, list[dict]], want: dict[str, str]) -> list[str]:
    wrong = []
    for name, log in logs.items():
        got = learner.call(diagnose, [dict(row) for row in log])
        if got not in CAUSES:
            raise CheckFailed(f"log {name}: diagnose returned {describe(got)}; expected one of {CAUSES}")
        if got != want[name]:
            wrong.append(f"{name} (you said {got!r})")
    return wrong


@judge("check_scale_log_diagnosis")
def check_scale_log_diagnosis(learner: Learner, diagnose: Ref) -> str:
    wrong = _diagnose_all(learner, diagnose, example_logs(), causes_of_examples())
    if wrong:
        raise CheckFailed(f"{len(wrong)} of 4 logs misread: {', '.join(wrong)}. Look at {LOOK_AT}")
    return "logs A-D read right"


def unseen_logs(learner: Learner) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Two simulated runs per cause and a real fp16 run, each from a seed drawn now (or fixed, while working)."""
    logs, want = {}, {}
    for cause in CAUSES:
        for visible in (101, 202):
            name = f"unseen run {len(logs) + 1}"
            logs[name], want[name] = simulate(cause, learner.seed(visible)), cause
    logs[REAL], want[REAL] = real_run(seed=learner.seed(101)), "normal calibration"
    return logs, want


@judge("check_scale_log_unseen")
def check_scale_log_unseen(learner: Learner, diagnose: Ref) -> str:
    logs, want = unseen_logs(learner)
    wrong = _diagnose_all(learner, diagnose, logs, want)
    if wrong:
        causes = ", ".join(f"{name.split(' (you said')[0]} was {want[name.split(' (you said')[0]]!r}"
                           for name in wrong)
        raise CheckFailed(f"{len(wrong)} of {len(logs)} unseen runs misread: {causes}. A rule that reads A-D "
                          f"right but not these leans on something particular to A-D, or to simulated logs")
    return f"{len(logs)} unseen runs read right"
