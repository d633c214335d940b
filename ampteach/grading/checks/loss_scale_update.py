"""Build it yourself 2: one step of the dynamic loss-scale update, graded against torch.amp.GradScaler.

    from ampteach.grading.checks import check_loss_scale_update
    check_loss_scale_update(update_scale)     # update_scale(scale, tracker, found_inf, growth, backoff, interval)

While the learner's update_scale runs, torch's scale updates (GradScaler's methods, the
_amp_update_scale_ kernel even as torch.ops.aten) and every function of the course's torch.amp rebuild
(its one loss-scale rule, ampteach.amp.scaler.next_scale, wherever it lives now) are refused.
"""

from __future__ import annotations

from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, module_files

__all__ = ["BECAUSE", "TORCH_SCALER_MODULES", "check_loss_scale_update", "check_loss_scale_update_hidden"]

# torch's GradScaler, in any of its homes (torch.amp, and the deprecated torch.cuda.amp / torch.cpu.amp)
TORCH_SCALER_MODULES = ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler", "torch.cpu.amp.grad_scaler")
BECAUSE = ("the exercise is to write the rule yourself: what an overflow does to the scale and to the count of "
           "clean steps, and what a clean step does (torch's GradScaler and the course library's own rule, "
           "ampteach.amp.scaler.next_scale, are for comparing after you pass)")


@watch("loss_scale_update")
def own_rule(who: str) -> Borrowed:
    return Borrowed(who, module_files("ampteach.amp", *TORCH_SCALER_MODULES), BECAUSE,
                    aten_ops=("_amp_update_scale_", "_amp_update_scale"))


def check_loss_scale_update(update_scale) -> None:
    """update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    -> (new_scale, new_growth_tracker); graded step for step against torch.amp.GradScaler."""
    run_judge("check_loss_scale_update", update_scale)


def check_loss_scale_update_hidden(update_scale) -> None:
    """The same rule on plans the exercise does not show (new ones each time it is graded)."""
    run_judge("check_loss_scale_update_hidden", update_scale)
