"""Judge of build it yourself 5: the learner's GradScaler, step for step against torch.amp.GradScaler.

    @judge("check_grad_scaler")               # two plans (the random one new under grading), resume, enabled=False
    @judge("check_grad_scaler_errors")        # each misuse raises torch's exception type
    @judge("check_grad_scaler_hidden_plans")  # four more plans, drawn each time

The learner's process runs a plan with their class (ampteach.grading.checks.grad_scaler.run_plan); this
process runs the same plan with torch.amp.GradScaler and compares what came back after every call.
"""

from __future__ import annotations

import math
import random

import torch

from ampteach.grading.checks.common import CheckFailed, same_bits, short
from ampteach.grading.checks.grad_scaler import (
    Plan,
    misuse_cases,
    random_plan,
    run_misuse,
    run_plan,
    run_resume,
    visible_plans,
)
from ampteach.grading.checks.wire import RemoteError
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, LearnerRaised, Ref, describe


def hidden_plans(rng: random.Random) -> list[Plan]:
    seed = lambda: rng.randrange(1 << 30)   # noqa: E731
    return [
        random_plan("odd factors and scale (1/3 is not exact in float32)",
                    dict(init_scale=rng.choice((3.0, 5.0, 7.0)), growth_factor=rng.choice((1.7, 1.3)),
                         backoff_factor=rng.choice((0.35, 0.3)), growth_interval=2), 40, seed=seed()),
        random_plan("two optimizers: each skips on its own inf", dict(init_scale=2.0**10, growth_interval=2), 30,
                    seed=seed(), p_bad=0.35, two_optimizers=True),
        random_plan("growth every step, never to inf", dict(init_scale=2.0**126, growth_interval=1), 12, seed=seed(),
                    p_bad=0.1),
        random_plan("a float16 loss, scale falling below 1", dict(init_scale=4.0, growth_interval=50), 20,
                    seed=seed(), p_bad=0.6, loss_dtype=torch.float16),
    ]


def _fail(plan: Plan, step: int, what: str) -> CheckFailed:
    return CheckFailed(f"plan '{plan.name}' (settings {plan.settings}), step {step}: {what}")


def _compare_tensors(plan, step, what, mine: list, ref: list, hint=lambda i: "") -> None:
    if not isinstance(mine, list) or len(mine) != len(ref):
        raise _fail(plan, step, f"{what}s: expected {len(ref)} tensors, got {describe(mine)}")
    for i, (a, b) in enumerate(zip(mine, ref)):
        if (a is None) != (b is None):
            raise _fail(plan, step, f"{what} {i}: expected {'None' if b is None else 'a tensor'}, got "
                                    f"{'None' if a is None else 'a tensor'}")
        if a is not None and not (isinstance(a, torch.Tensor) and same_bits(a, b)):
            got = a.flatten()[:4].tolist() if isinstance(a, torch.Tensor) else describe(a)
            raise _fail(plan, step, f"{what} {i} differs from torch's: expected {b.flatten()[:4].tolist()}..., "
                                    f"got {got}...{hint(i)}")


def _stopped(trace: dict) -> None:
    """Raise what stopped the learner's run (after everything before it has been compared)."""
    error: RemoteError = trace["error"]
    if trace.get("refused"):
        raise CheckFailed(error.message)
    raise LearnerRaised(error)


def compare_plan(plan: Plan, mine: dict, ref: dict) -> int:
    """Walk the two traces of one plan; raise at the first difference (the messages name step and call)."""
    if mine.get("error") is not None and "init" not in mine:
        _stopped(mine)
    if not isinstance(mine.get("init"), (int, float)) or float(mine["init"]) != ref["init"]:
        raise _fail(plan, 0, f"get_scale() before the first scale() should be init_scale {ref['init']}, got "
                             f"{describe(mine.get('init'))}")
    for step, (s, got, want) in enumerate(zip(plan.steps, mine["steps"], ref["steps"])):
        if "loss" not in got:
            break
        loss = got["loss"]
        if not isinstance(loss, torch.Tensor) or not same_bits(loss, want["loss"]):
            raise _fail(plan, step, f"scale(loss) should be {want['loss'].item()!r} ({short(want['loss'].dtype)}), "
                                    f"got {describe(loss)}")
        if "unscaled" in want and "unscaled" in got:
            scale = ref["steps"][step - 1]["scale"] if step else ref["init"]

            def divided(i: int, scale: float = scale, want=want, got=got) -> str:
                if want["unscaled"][i] is not None and got["unscaled"][i] is not None and scale != 1.0:
                    return ("\n  hint: torch multiplies by the float32 reciprocal of S, computed in float64 "
                            "(1/S rounded once), it does not divide by S")
                return ""
            _compare_tensors(plan, step, "after unscale_, the gradient of parameter", got["unscaled"],
                             want["unscaled"], divided)
        elif "unscaled" in want:
            break
        if "params" not in got:
            break
        note = "\n  torch skipped this optimizer's step: one of its gradients was inf or NaN" if s.inject else ""
        _compare_tensors(plan, step, "after step, parameter", got["params"], want["params"], lambda i, note=note: note)
        if "state" not in got:
            break
        state, wanted = got["state"], want["state"]
        if not isinstance(state, dict) or state.keys() != wanted.keys():
            raise _fail(plan, step, f"state_dict() should have the keys {sorted(wanted)}, got {describe(state)}")
        scale_now = got.get("scale")
        if state != wanted or not isinstance(scale_now, (int, float)) or float(scale_now) != want["scale"]:
            hint = ""
            if isinstance(state.get("scale"), float) and math.isclose(state["scale"], wanted["scale"], rel_tol=1e-6) \
                    and state["scale"] != wanted["scale"]:
                hint = "\n  hint: torch keeps S in a float32 tensor: every new scale is rounded to float32"
            raise _fail(plan, step, f"after update({'' if s.new_scale is None else s.new_scale}) (inf/NaN this step: "
                                    f"{bool(s.inject)}) state_dict() should be {wanted}, got {state}{hint}")
    if mine.get("error") is not None:
        _stopped(mine)
    return len(plan.steps)


def _run(learner: Learner, cls: Ref, plan: Plan) -> int:
    mine = learner.plan("grad_scaler.run", {"cls": cls}, plan.to_wire())
    ref = run_plan(torch.amp.GradScaler, plan.to_wire(), watched=False)
    return compare_plan(plan, mine, ref)


@judge("check_grad_scaler")
def check_grad_scaler(learner: Learner, cls: Ref) -> str:
    plans = visible_plans(learner.seed(1))
    steps = sum(_run(learner, cls, plan) for plan in plans)
    got = learner.plan("grad_scaler.resume_and_disabled", {"cls": cls})
    want = run_resume(torch.amp.GradScaler, watched=False)
    if got["resumed"] != want:
        raise CheckFailed(f"resume: after load_state_dict(state_dict()) a fresh scaler should hold {want}, "
                          f"got {got['resumed']}")
    same, scale, state = got["disabled"]
    if not same or scale != 1.0 or state != {}:
        raise CheckFailed("enabled=False: scale(loss) must return loss itself, get_scale() 1.0 and state_dict() {} "
                          "(one training loop for every precision)")
    return (f"{steps} steps in {len(plans)} plans, a resume from state_dict and enabled=False: identical to "
            f"torch.amp.GradScaler")


@judge("check_grad_scaler_hidden_plans")
def check_grad_scaler_hidden_plans(learner: Learner, cls: Ref) -> str:
    plans = hidden_plans(learner.rng)
    steps = sum(_run(learner, cls, plan) for plan in plans)
    return f"{steps} steps in {len(plans)} more plans, identical to torch"


@judge("check_grad_scaler_errors")
def check_grad_scaler_errors(learner: Learner, cls: Ref) -> str:
    for name in misuse_cases():
        want = run_misuse(torch.amp.GradScaler, name, watched=False)
        if want is None:
            raise AssertionError(f"torch raised nothing for {name}: the case list is out of date")
        got = learner.plan("grad_scaler.misuse", {"cls": cls}, name)
        if isinstance(got, RemoteError) and got.isinstance(_builtin(want.type)):
            continue
        if isinstance(got, RemoteError):
            raise CheckFailed(f"{name}: torch raises {want.short_type}, yours raised {got.short_type}: {got.message}")
        raise CheckFailed(f"{name}: torch raises {want.short_type}, yours raised nothing (track each optimizer's "
                          f"stage: ready, unscaled, stepped)")
    return f"{len(misuse_cases())} misuses raise torch's exception types"


def _builtin(name: str) -> type:
    import builtins

    kind = getattr(builtins, name, None)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        raise AssertionError(f"torch raised {name}, not a builtin exception: the check needs updating")
    return kind
