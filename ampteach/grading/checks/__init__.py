"""The exercises' checks: each grades a learner's code against PyTorch or exact arithmetic.

    from ampteach.grading.checks import check_round_to_bf16
    check_round_to_bf16(my_round_to_bf16)     # prints "passed ..." or raises CheckFailed

One module per exercise (the module's docstring says which). Every check runs several cases and
stops at the first wrong one with a message that says which case, what was expected (computed by
PyTorch or by exact arithmetic, never typed in), what came back and, for the common mistakes, what
probably went wrong. Errors raised by the learner's code (NotImplementedError for an untouched
exercise) pass through unchanged.

`ampteach grade` calls every check through `course_check(name)`, which re-reads it from this
package and refuses a function that a learner's notebook put in its place.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from ampteach.grading.checks.amp_throughput import check_amp_step, check_e6_1_measure, check_e6_1_table
from ampteach.grading.checks.autocast_mode import check_autocast_mode, check_autocast_mode_hidden
from ampteach.grading.checks.bf16_rounding import check_round_to_bf16
from ampteach.grading.checks.bf16_weight_decay import (
    check_decay_is_lost,
    check_decay_is_lost_hidden,
    check_keep_decay,
    check_keep_decay_hidden,
)
from ampteach.grading.checks.bug_hunt import HiddenMLP, bug_hunt_problem, check_bug_hunt, check_bug_hunt_hidden
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.fp16_attention import check_fp16_attention, check_fp16_attention_hidden
from ampteach.grading.checks.grad_scaler import (
    check_grad_scaler,
    check_grad_scaler_errors,
    check_grad_scaler_hidden_plans,
)
from ampteach.grading.checks.loss_scale_update import check_loss_scale_update, check_loss_scale_update_hidden
from ampteach.grading.checks.master_step import check_master_step
from ampteach.grading.checks.mx_blocks import ELEMENTS, check_mx_quantize, check_mx_quantize_hidden
from ampteach.grading.checks.promoted_accumulation import (
    check_accumulate,
    check_accumulate_hidden,
    check_round_to_bits,
    check_round_to_bits_hidden,
)
from ampteach.grading.checks.scale_log import check_scale_log_diagnosis, check_scale_log_unseen
from ampteach.grading.checks.sort_cast_lists import (
    CAST_LIST_OPS,
    CHALLENGE_OPS,
    check_cast_lists,
    check_cast_lists_reasoned,
    observe_autocast,
)
from ampteach.grading.checks.static_scale import check_flush_and_overflow, check_static_scale, check_static_scale_hidden
from ampteach.grading.checks.transformer_dtypes import CONFIGS, POINTS, check_pre_norm_output, check_transformer_dtypes
from ampteach.grading.checks.when_amp_is_wrong import check_clip_threshold, check_clipped_step, check_tiny_loss

MODULES = ("bf16_rounding", "loss_scale_update", "master_step", "sort_cast_lists", "amp_throughput",
           "when_amp_is_wrong", "grad_scaler", "autocast_mode", "transformer_dtypes", "static_scale", "scale_log",
           "bug_hunt", "mx_blocks", "promoted_accumulation", "fp16_attention", "bf16_weight_decay")


def _registry() -> dict[str, str]:
    """check function name -> the module of this package that defines it."""
    found = {}
    for module_name in MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for name, value in vars(module).items():
            if name.startswith("check_") and callable(value) and getattr(value, "__module__", "") == module.__name__:
                found[name] = module_name
    return found


def _honest_kernel() -> None:
    """Undo what a notebook could do to hide a check's error from the grader (IPython's error display)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.set_custom_exc((), None)
        for name in ("showtraceback", "_showtraceback", "showsyntaxerror", "run_cell", "run_ast_nodes"):
            shell.__dict__.pop(name, None)


CHECKS = _registry()   # made at import, before any notebook code runs


def course_check(name: str) -> Callable:
    """The course's own check `name`, as `ampteach grade` calls it (never a learner's redefinition)."""
    _honest_kernel()
    if name not in CHECKS:
        raise CheckFailed(f"{name} is not one of the course's checks")
    module = importlib.import_module(f"{__name__}.{CHECKS[name]}")
    fn = getattr(module, name)
    code = getattr(fn, "__code__", None)
    if code is None or Path(code.co_filename).resolve() != Path(module.__file__).resolve():
        raise CheckFailed(f"{name} was replaced by code from your notebook; the grader runs only the course's "
                          f"checks (restart the kernel, and leave ampteach's functions as they are)")
    return fn


__all__ = ["CheckFailed", "course_check", "check_round_to_bf16", "check_loss_scale_update",
           "check_loss_scale_update_hidden", "check_master_step",
           "CAST_LIST_OPS", "CHALLENGE_OPS", "check_cast_lists", "check_cast_lists_reasoned", "observe_autocast",
           "check_amp_step",
           "check_e6_1_table", "check_e6_1_measure", "check_clipped_step", "check_clip_threshold", "check_tiny_loss",
           "check_grad_scaler", "check_grad_scaler_errors", "check_grad_scaler_hidden_plans",
           "check_autocast_mode", "check_autocast_mode_hidden", "CONFIGS", "POINTS", "check_transformer_dtypes",
           "check_pre_norm_output", "check_flush_and_overflow", "check_static_scale", "check_static_scale_hidden",
           "check_scale_log_diagnosis", "check_scale_log_unseen", "HiddenMLP", "bug_hunt_problem", "check_bug_hunt",
           "check_bug_hunt_hidden", "ELEMENTS", "check_mx_quantize", "check_mx_quantize_hidden",
           "check_round_to_bits", "check_round_to_bits_hidden", "check_accumulate", "check_accumulate_hidden",
           "check_fp16_attention", "check_fp16_attention_hidden", "check_decay_is_lost", "check_decay_is_lost_hidden",
           "check_keep_decay", "check_keep_decay_hidden"]
