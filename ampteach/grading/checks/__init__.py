"""The exercises' checks, as a learner's notebook calls them: each runs its judge in another process.

    from ampteach.grading.checks import check_round_to_bf16
    check_round_to_bf16(my_round_to_bf16)     # prints "passed ..." or raises CheckFailed

This package is the learner's side of grading, what runs in their kernel (and in the sandbox
`ampteach grade` starts): one module per exercise, holding the check functions the notebook calls,
the helpers it uses (observe_autocast, bug_hunt_problem, ...), the refusals that watch the learner's
code while it runs (`watch`es) and the plans that drive it (a training loop, a GradScaler step by step).
It never decides a verdict: every check starts its judge (ampteach.grading.judges) as a subprocess,
which sends the inputs, gets back what the learner's code made of them, computes what is expected
and compares (checks/visible.py). The judges, their reference answers and their hidden cases are not
imported from here, and a notebook under `ampteach grade` cannot reach them.

    checks/visible.py   run_judge: a check called in a notebook
    checks/driver.py    the learner's side of the conversation (and the sandbox's entry point)
    checks/wire.py      what travels between the two processes: tensors and plain values, never code
    checks/watches.py   refusing a borrowed answer (the library's own, or torch's) while the learner's code runs
    checks/guard.py     what a notebook under grading may not do at all (threads, processes, frames, ...)
"""

from __future__ import annotations

import importlib

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
from ampteach.grading.checks.nvfp4_blocks import check_nvfp4_quantize, check_nvfp4_quantize_hidden, check_round_to_e2m1
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
           "bug_hunt", "mx_blocks", "promoted_accumulation", "fp16_attention", "bf16_weight_decay", "nvfp4_blocks")
SEALED = {"build_4_cast_lists": "sort_cast_lists", "predict_transformer_dtypes": "transformer_dtypes"}


def _registry() -> dict[str, str]:
    """check function name -> the module of this package that defines it."""
    found = {}
    for module_name in MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for name, value in vars(module).items():
            if name.startswith("check_") and callable(value) and getattr(value, "__module__", "") == module.__name__:
                found[name] = module_name
    return found


CHECKS = _registry()


def course_check(name: str):
    """The course's own check `name`, as the nbgrader and Otter exports call it (never a learner's redefinition:
    the verdict comes from the judge's process either way)."""
    if name not in CHECKS:
        raise CheckFailed(f"{name} is not one of the course's checks")
    return getattr(importlib.import_module(f"{__name__}.{CHECKS[name]}"), name)


def sealed_watch(exercise: str):
    """The refusals that hold for a whole notebook under grading (an exercise whose answer could be read off a
    run before the check: the cast lists, the transformer's dtypes), or None."""
    module = SEALED.get(exercise)
    return importlib.import_module(f"{__name__}.{module}").sealed() if module else None


__all__ = ["CheckFailed", "course_check", "sealed_watch", "CHECKS", "check_round_to_bf16", "check_loss_scale_update",
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
           "check_keep_decay", "check_keep_decay_hidden", "check_round_to_e2m1", "check_nvfp4_quantize",
           "check_nvfp4_quantize_hidden"]
