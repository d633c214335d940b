"""Read a scale log: name the cause of a loss-scale trajectory, graded on logs made by torch.amp.GradScaler.

    from ampteach.grading.checks import check_scale_log_diagnosis
    check_scale_log_diagnosis(diagnose)      # diagnose(log) -> one of ampteach.lab.scale_logs.CAUSES

The visible check runs your rule on the exercise's four logs A-D; the grader also runs it on runs you
have not seen, made when it grades (new seeds, settings and lengths, and one real fp16 training run on
the CPU), so a rule that only remembers A-D, or only reads simulations, fails.
"""

from __future__ import annotations

from ampteach.grading.checks.visible import run_judge

__all__ = ["check_scale_log_diagnosis", "check_scale_log_unseen"]


def check_scale_log_diagnosis(diagnose) -> None:
    """diagnose(log) names the cause of each of the logs A-D; a wrong one is named, not corrected."""
    run_judge("check_scale_log_diagnosis", diagnose)


def check_scale_log_unseen(diagnose) -> None:
    """The same rule on 9 runs the exercise does not show, made when the check runs: two simulated per cause
    (new seeds each time), and the log of a real fp16 run (torch.autocast + torch.amp.GradScaler on the CPU),
    whose scaler calibrates normally: it climbs from 2^16 until a scaled gradient overflows, then saws."""
    run_judge("check_scale_log_unseen", diagnose)
