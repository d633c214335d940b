"""Judge of build it yourself 4: the learner's cast-list placements against torch 2.13's registered lists.

    @judge("check_cast_lists")            # CAST_LIST_OPS, on CPU and CUDA
    @judge("check_cast_lists_reasoned")   # CHALLENGE_OPS: ops observe_autocast does not run
"""

from __future__ import annotations

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.sort_cast_lists import (
    BECAUSE,
    CAST_LIST_OPS,
    CHALLENGE_OPS,
    is_answer_key,
    observe_autocast,
)
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe
from ampteach.grading.judges.scan import refuse_uses

FAMILIES = {"lower_precision_fp": "lower", "fp32": "fp32", "fp32_set_opt_dtype": "fp32",
            "fp32_append_dtype": "fp32", "promote": "inputs", None: "inputs", "banned": "banned"}


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


def _answer(learner: Learner, fn: Ref, ops: tuple[str, ...]) -> dict:
    from ampteach.amp.cast_lists import POLICIES

    answer = learner.plan("sort_cast_lists.answer", {"sort_into_cast_lists": fn})   # refuses a notebook holding the key
    refuse_uses(learner, is_answer_key, BECAUSE)
    if not isinstance(answer, dict) or set(answer) != {"cpu", "cuda"} or \
            not all(isinstance(answer[d], dict) for d in answer):
        raise CheckFailed(f'expected a dict with keys "cpu" and "cuda", got {describe(answer)}')
    for device in ("cpu", "cuda"):
        missing = [op for op in ops if op not in answer[device]]
        if missing:
            raise CheckFailed(f"{device}: expected a category (or None) for every op; missing {missing}")
        for op in ops:
            got = answer[device][op]
            if got is not None and got not in POLICIES:
                raise CheckFailed(f"{device}, {op}: {got!r} is not a category; use one of {POLICIES} or None")
    return answer


@judge("check_cast_lists")
def check_cast_lists(learner: Learner, fn: Ref) -> str:
    from ampteach.amp.cast_lists import policy_of

    answer = _answer(learner, fn, CAST_LIST_OPS + CHALLENGE_OPS)
    wrong = [f"{device:4s} {op}: {_why_wrong(op, device, answer[device][op], policy_of(op, device))}"
             for device in ("cpu", "cuda") for op in CAST_LIST_OPS
             if answer[device][op] != policy_of(op, device)]
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {2 * len(CAST_LIST_OPS)} placements wrong:\n  " + "\n  ".join(wrong))
    return (f"all {len(CAST_LIST_OPS)} observable ops placed as torch 2.13 places them, on CPU and on CUDA "
            f"({len(CHALLENGE_OPS)} more are graded by `ampteach grade`)")


@judge("check_cast_lists_reasoned")
def check_cast_lists_reasoned(learner: Learner, fn: Ref) -> str:
    from ampteach.amp.cast_lists import policy_of

    answer = _answer(learner, fn, CHALLENGE_OPS)
    wrong = [f"{device} {op}" for device in ("cpu", "cuda") for op in CHALLENGE_OPS
             if answer[device][op] != policy_of(op, device)]
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {2 * len(CHALLENGE_OPS)} reasoned placements wrong: {', '.join(wrong)}")
    return f"all {len(CHALLENGE_OPS)} reasoned ops placed as torch 2.13 places them"
