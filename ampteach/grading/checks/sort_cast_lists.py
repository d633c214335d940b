"""Build it yourself 4: sort ops into autocast's cast lists, graded against torch 2.13's registered lists.

    from ampteach.grading.checks import CAST_LIST_OPS, CHALLENGE_OPS, check_cast_lists, observe_autocast
    observe_autocast("exp", "cuda")           # what torch.autocast does with it (CUDA on fake tensors)
    check_cast_lists(sort_into_cast_lists)    # the observable ops; the grader also checks CHALLENGE_OPS
"""

from __future__ import annotations

from typing import Callable

import torch

from ampteach.grading.checks.borrowed import Borrowed, dispatcher_introspection, notebook_uses, package_files
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed

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

FAMILIES = {"lower_precision_fp": "lower", "fp32": "fp32", "fp32_set_opt_dtype": "fp32",
            "fp32_append_dtype": "fp32", "promote": "inputs", None: "inputs", "banned": "banned"}


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


def _why_wrong(op: str, device: str, got: str | None, want: str | None) -> str:
    """What is wrong with a placement, without naming the right one."""
    seen = f"torch.autocast: {observe_autocast(op, device)}"
    if FAMILIES.get(got) != FAMILIES[want]:
        return f"{seen}; that does not fit {got!r}"
    if FAMILIES[want] == "fp32":
        return (f"the dtypes fit an fp32 list, but not {got!r}: does the op take a dtype= argument (the "
                f"*_set_opt_dtype list), is it norm, or neither?")
    return (f"the dtypes cannot tell None from 'promote' ({seen}): does the op combine several tensors that must "
            f"share a dtype, and is it on this device's promote list? The CPU and CUDA promote lists differ")


def _is_answer_key(name: str) -> bool:
    return name in ("cast_lists", "policy_of", "ops_with_policy") or name.startswith("_dispatch_")


def _refuse_answer_keys(fn: Callable) -> None:
    """An answer read from the library's tables or torch's dispatcher before the check called fn (in
    another cell) leaves them in the notebook's namespace or in the cells it ran: both are refused."""
    from ampteach.amp import cast_lists

    keys = {id(cast_lists): "the module ampteach.amp.cast_lists"}
    for table in ("TABLES", "CUDA", "CPU"):
        keys[id(getattr(cast_lists, table))] = f"ampteach.amp.cast_lists.{table}"
    namespace = getattr(fn, "__globals__", {})
    for name, value in list(namespace.items()):
        what = keys.get(id(value))
        if what is None and callable(value) and getattr(value, "__module__", None) == cast_lists.__name__:
            what = f"ampteach.amp.cast_lists.{getattr(value, '__name__', name)}"
        if what is not None:
            raise CheckFailed(f"your notebook holds {what} (as `{name}`): {BECAUSE}. Remove that import, restart the "
                              f"kernel and run the notebook in order")
    used = notebook_uses(namespace, _is_answer_key)
    if used:
        cells = ", ".join(f"`{name}` in cell In[{number}]" for number, name in used)
        raise CheckFailed(f"your notebook used {cells}: {BECAUSE}. Take that code out, restart the kernel and run "
                          f"the notebook in order")


def _answer(sort_into_cast_lists: Callable[[], dict], ops: tuple[str, ...]) -> dict:
    from ampteach.amp.cast_lists import POLICIES

    _refuse_answer_keys(sort_into_cast_lists)
    with Borrowed(getattr(sort_into_cast_lists, "__name__", "function"), package_files("ampteach.amp"), BECAUSE,
                  builtins=dispatcher_introspection, allowed=(observe_autocast,)):
        answer = sort_into_cast_lists()
    if not isinstance(answer, dict) or set(answer) != {"cpu", "cuda"}:
        raise CheckFailed(f'expected a dict with keys "cpu" and "cuda", got {answer!r:.200}')
    for device in ("cpu", "cuda"):
        missing = [op for op in ops if op not in answer[device]]
        if missing:
            raise CheckFailed(f"{device}: expected a category (or None) for every op; missing {missing}")
        for op in ops:
            got = answer[device][op]
            if got is not None and got not in POLICIES:
                raise CheckFailed(f"{device}, {op}: {got!r} is not a category; use one of {POLICIES} or None")
    return answer


def check_cast_lists(sort_into_cast_lists: Callable[[], dict]) -> None:
    """sort_into_cast_lists() -> {"cpu": {op: category}, "cuda": {op: category}} for every op in
    CAST_LIST_OPS and CHALLENGE_OPS, a category being one of PyTorch's names or None (on no list).
    Grades CAST_LIST_OPS against the lists torch 2.13 registers for CPU and CUDA autocast
    (ampteach.amp.cast_lists, which the course's tests check against torch's dispatcher). A wrong
    placement is explained by what torch.autocast did, not by naming the right category."""
    from ampteach.amp.cast_lists import policy_of

    answer = _answer(sort_into_cast_lists, CAST_LIST_OPS + CHALLENGE_OPS)
    wrong = [f"{device:4s} {op}: {_why_wrong(op, device, answer[device][op], policy_of(op, device))}"
             for device in ("cpu", "cuda") for op in CAST_LIST_OPS
             if answer[device][op] != policy_of(op, device)]
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {2 * len(CAST_LIST_OPS)} placements wrong:\n  " + "\n  ".join(wrong))
    _passed("check_cast_lists", f"all {len(CAST_LIST_OPS)} observable ops placed as torch 2.13 places them, on CPU "
            f"and on CUDA ({len(CHALLENGE_OPS)} more are graded by `ampteach grade`)")


def check_cast_lists_reasoned(sort_into_cast_lists: Callable[[], dict]) -> None:
    """The CHALLENGE_OPS of the same answer, graded against torch 2.13's lists: ops you could not observe."""
    from ampteach.amp.cast_lists import policy_of

    answer = _answer(sort_into_cast_lists, CHALLENGE_OPS)
    wrong = [f"{device} {op}" for device in ("cpu", "cuda") for op in CHALLENGE_OPS
             if answer[device][op] != policy_of(op, device)]
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {2 * len(CHALLENGE_OPS)} reasoned placements wrong: {', '.join(wrong)}")
    _passed("check_cast_lists_reasoned", f"all {len(CHALLENGE_OPS)} reasoned ops placed as torch 2.13 places them")
