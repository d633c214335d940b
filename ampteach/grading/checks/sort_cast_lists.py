"""Build it yourself 4: sort ops into autocast's cast lists, graded against torch 2.13's registered lists.

    from ampteach.grading.checks import CAST_LIST_OPS, CHALLENGE_OPS, check_cast_lists, observe_autocast
    observe_autocast("exp", "cuda")           # what torch.autocast does with it (CUDA on fake tensors)
    check_cast_lists(sort_into_cast_lists)    # the observable ops; the grader also checks CHALLENGE_OPS

The answer key is the course library's tables (ampteach.amp.cast_lists) and torch's dispatcher
registrations: while the learner's function runs, both are refused (observe_autocast, which runs
torch.autocast, is let through), and under grading they are refused for the whole notebook.
"""

from __future__ import annotations

from typing import Callable

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, dispatcher_introspection, package_files

__all__ = ["BECAUSE", "CAST_LIST_OPS", "CHALLENGE_OPS", "observe_autocast", "check_cast_lists",
           "check_cast_lists_reasoned", "is_answer_key", "sealed"]

BECAUSE = ("the exercise is to sort the ops yourself, from what observe_autocast shows and from why the lists are "
           "what they are; the course library's tables (ampteach.amp.cast_lists) and torch's dispatcher registrations "
           "are the answer key, for after you pass")


def r(device: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Values in [0.5, 1.5): valid input for log and pow, probabilities after halving."""
    return (torch.rand(*shape, device=device) + 0.5).to(dtype)


def labels(device: str, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=device)


def _cast_list_calls() -> dict[str, Callable]:
    """For each exercise op, a call taking (device, dtype of the first input, dtype of the others)."""
    import torch.nn.functional as F

    return {
        "mm": lambda d, a, b: torch.mm(r(d, a, 4, 4), r(d, b, 4, 4)),
        "bmm": lambda d, a, b: torch.bmm(r(d, a, 2, 4, 4), r(d, b, 2, 4, 4)),
        "linear": lambda d, a, b: F.linear(r(d, a, 2, 4), r(d, b, 3, 4)),
        "conv2d": lambda d, a, b: F.conv2d(r(d, a, 1, 2, 5, 5), r(d, b, 3, 2, 3, 3)),
        "relu": lambda d, a, b: F.relu(r(d, a, 4)),
        "exp": lambda d, a, b: torch.exp(r(d, a, 4)),
        "log": lambda d, a, b: torch.log(r(d, a, 4)),
        "pow": lambda d, a, b: torch.pow(r(d, a, 4), 2.0),
        "sum": lambda d, a, b: r(d, a, 4, 4).sum(),
        "norm": lambda d, a, b: torch.norm(r(d, a, 4)),
        "softmax": lambda d, a, b: torch.softmax(r(d, a, 4, 4), -1),
        "log_softmax": lambda d, a, b: torch.log_softmax(r(d, a, 4, 4), -1),
        "layer_norm": lambda d, a, b: F.layer_norm(r(d, a, 2, 4), (4,), r(d, b, 4), r(d, b, 4)),
        "mse_loss": lambda d, a, b: F.mse_loss(r(d, a, 4), r(d, b, 4)),
        "nll_loss": lambda d, a, b: F.nll_loss(r(d, a, 3, 5), labels(d, 3, 5)),
        "binary_cross_entropy": lambda d, a, b: F.binary_cross_entropy(r(d, a, 4) * 0.5, r(d, b, 4) * 0.5),
        "binary_cross_entropy_with_logits":
            lambda d, a, b: F.binary_cross_entropy_with_logits(r(d, a, 4), r(d, b, 4) * 0.5),
        "cat": lambda d, a, b: torch.cat([r(d, a, 2), r(d, b, 2)]),
        "addcmul": lambda d, a, b: torch.addcmul(r(d, a, 4), r(d, b, 4), r(d, b, 4)),
    }


CAST_LIST_OPS = (
    "mm", "bmm", "linear", "conv2d", "relu", "exp", "log", "pow", "sum", "norm", "softmax", "log_softmax",
    "layer_norm", "mse_loss", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cat", "addcmul")

# Ops observe_autocast does not run: each has a relative above, and its place follows from the same
# reasons. The grader checks them (a hidden check), so feedback cannot be used to search for them.
CHALLENGE_OPS = ("baddbmm", "conv_transpose2d", "cumsum", "group_norm", "expm1", "log1p", "l1_loss", "addcdiv",
                 "stack", "gelu")


def observe_autocast(op: str, device_type: str) -> str:
    """What torch.autocast does with op: its output dtype for fp32, half and mixed inputs (or its error).

    CUDA on a machine without a GPU runs torch's real CUDA autocast on fake tensors (dtypes only)."""
    from ampteach.lab.compare_torch import LOWER, device_context, torch_autocast

    calls = _cast_list_calls()
    if op not in calls:
        raise ValueError(f"observe_autocast runs only the ops in CAST_LIST_OPS; {op!r} is for you to reason out "
                         f"from its relatives (which op does the same kind of work?)")
    call, half = calls[op], LOWER[device_type]
    results = []
    with device_context(device_type):
        for label, dtypes in (("fp32", (torch.float32,) * 2), (str(half).removeprefix("torch."), (half,) * 2),
                              ("mixed", (half, torch.float32))):
            torch.manual_seed(0)
            try:
                with torch_autocast(device_type, half):
                    out = call(device_type, *dtypes)
                results.append(f"{label} in -> {str(out.dtype).removeprefix('torch.')}")
            except Exception as exc:  # the error is the observation (a banned op)
                return f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return ", ".join(results)


def is_answer_key(name: str) -> bool:
    """A name that reads the answer: the library's tables, or torch's dispatcher introspection."""
    return name in ("cast_lists", "policy_of", "ops_with_policy") or name.startswith("_dispatch_")


def _watch(who: str) -> Borrowed:
    return Borrowed(who, package_files("ampteach.amp"), BECAUSE, builtins=dispatcher_introspection,
                    allowed=(observe_autocast,))


@watch("sort_cast_lists")
def own_sorting(who: str) -> Borrowed:
    return _watch(who)


def sealed() -> Borrowed:
    """Under grading, for the whole notebook: the tables and the dispatcher's registrations are refused."""
    return Borrowed("notebook", package_files("ampteach.amp.cast_lists"), BECAUSE, builtins=dispatcher_introspection,
                    allowed=(observe_autocast,))


@plan("sort_cast_lists.answer")
def answer(*, sort_into_cast_lists) -> dict:
    """The learner's answer, after refusing a notebook that holds the library's tables."""
    from ampteach.amp import cast_lists

    keys = {id(cast_lists): "the module ampteach.amp.cast_lists"}
    for table in ("TABLES", "CUDA", "CPU"):
        keys[id(getattr(cast_lists, table))] = f"ampteach.amp.cast_lists.{table}"
    namespace = getattr(sort_into_cast_lists, "__globals__", {})
    for name, value in list(namespace.items()):
        what = keys.get(id(value))
        if what is None and callable(value) and getattr(value, "__module__", None) == cast_lists.__name__:
            what = f"ampteach.amp.cast_lists.{getattr(value, '__name__', name)}"
        if what is not None:
            raise CheckFailed(f"your notebook holds {what} (as `{name}`): {BECAUSE}. Remove that import, restart the "
                              f"kernel and run the notebook in order")
    with _watch(getattr(sort_into_cast_lists, "__name__", "function")):
        return sort_into_cast_lists()


def check_cast_lists(sort_into_cast_lists) -> None:
    """sort_into_cast_lists() -> {"cpu": {op: category}, "cuda": {op: category}} for every op in
    CAST_LIST_OPS and CHALLENGE_OPS, a category being one of PyTorch's names or None (on no list).
    Grades CAST_LIST_OPS against the lists torch 2.13 registers for CPU and CUDA autocast
    (ampteach.amp.cast_lists, which the course's tests check against torch's dispatcher). A wrong
    placement is explained by what torch.autocast did, not by naming the right category."""
    run_judge("check_cast_lists", sort_into_cast_lists)


def check_cast_lists_reasoned(sort_into_cast_lists) -> None:
    """The CHALLENGE_OPS of the same answer, graded against torch 2.13's lists: ops you could not observe."""
    run_judge("check_cast_lists_reasoned", sort_into_cast_lists)
