"""Build it yourself 5: the whole GradScaler, graded step for step against torch.amp.GradScaler.

    from ampteach.grading.checks import check_grad_scaler, check_grad_scaler_errors
    check_grad_scaler(MyGradScaler)          # random plans of clean, inf and NaN steps: every value, bit for bit
    check_grad_scaler_errors(MyGradScaler)   # misuse raises what torch raises (the exception type)

Both scalers see the same parameters, losses and injected infs/NaNs. After every call the check
compares what came back: the scaled loss (value and dtype), the gradients after unscale_, the
parameters after step (skipped or not, per optimizer), the scale and growth tracker after update,
and state_dict(). The learner's class may not lean on torch's or ampteach's scaler, or on torch's
fused AMP kernels: those are refused while it runs.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed, RefuseOps, refusing, same_bits, short
from ampteach.grading.checks.common import passed as _passed

BECAUSE = "the exercise is to build the scaler from ordinary tensor ops"


@contextlib.contextmanager
def _own_work() -> Iterator[None]:
    """Refuse torch's and ampteach's scalers and torch's fused AMP kernels while the learner's code runs."""
    from ampteach.amp import scaler as ampteach_scaler
    from ampteach.amp import unscale_kernels

    theirs = [(torch.amp.GradScaler, ("scale", "unscale_", "step", "update", "__init__")),
              (ampteach_scaler._LossScaler, ("scale", "unscale_", "step", "update", "__init__")),
              (ampteach_scaler, ("update_scale_", "next_scale")),
              (unscale_kernels, ("non_finite_check_and_unscale_", "unscale_grads_"))]
    kernels = {torch._amp_update_scale_: BECAUSE, torch._amp_foreach_non_finite_check_and_unscale_: BECAUSE}
    with contextlib.ExitStack() as stack:
        for owner, names in theirs:
            stack.enter_context(refusing(owner, tuple(n for n in names if n in vars(owner)), BECAUSE))
        stack.enter_context(RefuseOps(kernels))
        yield


def _own_class(cls: Any) -> None:
    from ampteach.amp import scaler as ampteach_scaler

    if not isinstance(cls, type):
        raise CheckFailed(f"expected your scaler class (MyGradScaler), got {cls!r}")
    if issubclass(cls, (torch.amp.GradScaler, ampteach_scaler._LossScaler)):
        raise CheckFailed(f"{cls.__name__} inherits from a ready-made scaler; {BECAUSE}")


# --- plans ------------------------------------------------------------------------------------------

@dataclass
class Step:
    inject: list[tuple[int, float]] = field(default_factory=list)   # (parameter, inf / -inf / nan) in its grad
    unscale_first: bool = False       # call unscale_ before step (as before clipping)
    no_grad: int | None = None        # a parameter left without a gradient this step
    new_scale: float | None = None    # update(new_scale) instead of the rule


@dataclass
class Plan:
    name: str
    settings: dict
    steps: list[Step]
    two_optimizers: bool = False
    loss_dtype: torch.dtype = torch.float32


def random_plan(name: str, settings: dict, n: int, seed: int, p_bad: float = 0.2, two_optimizers: bool = False,
                loss_dtype: torch.dtype = torch.float32) -> Plan:
    rng = random.Random(seed)
    steps = []
    for _ in range(n):
        inject = [(rng.randrange(3), rng.choice((math.inf, -math.inf, math.nan)))
                  for _ in range(rng.random() < p_bad and rng.randint(1, 2) or 0)]
        steps.append(Step(inject, unscale_first=rng.random() < 0.3,
                          no_grad=rng.randrange(2 if two_optimizers else 3) if rng.random() < 0.15 else None,
                          new_scale=rng.choice((1024.0, 3.0)) if rng.random() < 0.05 else None))
    return Plan(name, settings, steps, two_optimizers, loss_dtype)


def visible_plans() -> list[Plan]:
    return [
        Plan("grow every 2 clean steps, one overflow", dict(init_scale=8.0, growth_interval=2),
             [Step(), Step(), Step(), Step([(0, math.inf)]), Step(unscale_first=True), Step(), Step()]),
        random_plan("40 random steps (inf, -inf, NaN; unscale_ first on some)", dict(init_scale=2.0**16,
                    growth_interval=3), 40, seed=1),
    ]


def hidden_plans() -> list[Plan]:
    return [
        random_plan("odd factors and scale (1/3 is not exact in float32)",
                    dict(init_scale=3.0, growth_factor=1.7, backoff_factor=0.35, growth_interval=2), 40, seed=2),
        random_plan("two optimizers: each skips on its own inf", dict(init_scale=2.0**10, growth_interval=2), 30,
                    seed=3, p_bad=0.35, two_optimizers=True),
        random_plan("growth every step, never to inf", dict(init_scale=2.0**126, growth_interval=1), 12, seed=4,
                    p_bad=0.1),
        random_plan("a float16 loss, scale falling below 1", dict(init_scale=4.0, growth_interval=50), 20, seed=5,
                    p_bad=0.6, loss_dtype=torch.float16),
    ]


# --- running one plan through both scalers -----------------------------------------------------------------

class _Rig:
    """Three parameters, their optimizer(s), and a scaler: one side of the comparison."""

    def __init__(self, scaler: Any, two_optimizers: bool) -> None:
        gen = torch.Generator().manual_seed(0)
        shapes = ((4, 3), (5,), (2, 2))
        self.params = [nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
        self.coeffs = [torch.randn(*s, generator=gen) for s in shapes]
        groups = [self.params[:2], self.params[2:]] if two_optimizers else [self.params]
        self.opts = [torch.optim.SGD(g, lr=0.25, momentum=0.9) for g in groups]
        self.scaler = scaler

    def loss(self, dtype: torch.dtype) -> torch.Tensor:
        return sum((p * c).sum() for p, c in zip(self.params, self.coeffs)).to(dtype)


def _fail(plan: Plan, step: int, what: str) -> CheckFailed:
    return CheckFailed(f"plan '{plan.name}' (settings {plan.settings}), step {step}: {what}")


def _compare_tensors(plan, step, what, mine: list, ref: list, hint: Callable[[int], str] = lambda i: "") -> None:
    for i, (a, b) in enumerate(zip(mine, ref)):
        if (a is None) != (b is None):
            raise _fail(plan, step, f"{what} {i}: expected {'None' if b is None else 'a tensor'}, got "
                                    f"{'None' if a is None else 'a tensor'}")
        if a is not None and not same_bits(a.detach(), b.detach()):
            expected = b.detach().flatten()[:4].tolist()
            raise _fail(plan, step, f"{what} {i} differs from torch's: expected {expected}..., "
                                    f"got {a.detach().flatten()[:4].tolist()}...{hint(i)}")


def _state(scaler) -> dict:
    return {k: (float(v) if k == "scale" else v) for k, v in scaler.state_dict().items()}


def run_plan(cls: type, plan: Plan) -> int:
    """Drive torch.amp.GradScaler and the learner's class through the plan; raise at the first difference."""
    ref = _Rig(torch.amp.GradScaler("cpu", **plan.settings), plan.two_optimizers)
    with _own_work():
        mine = _Rig(cls("cpu", **plan.settings), plan.two_optimizers)
        got = mine.scaler.get_scale()
    if float(got) != ref.scaler.get_scale():
        raise _fail(plan, 0, f"get_scale() before the first scale() should be init_scale "
                             f"{ref.scaler.get_scale()}, got {got!r}")
    for step, s in enumerate(plan.steps):
        for rig in (ref, mine):
            for opt in rig.opts:
                opt.zero_grad(set_to_none=True)
        want_loss = ref.scaler.scale(ref.loss(plan.loss_dtype))
        with _own_work():
            got_loss = mine.scaler.scale(mine.loss(plan.loss_dtype))
        if not isinstance(got_loss, torch.Tensor) or not same_bits(got_loss.detach(), want_loss.detach()):
            raise _fail(plan, step, f"scale(loss) should be {want_loss.item()!r} ({short(want_loss.dtype)}), got "
                                    f"{got_loss!r}")
        for rig, scaled in ((ref, want_loss), (mine, got_loss)):
            scaled.backward()
            with torch.no_grad():
                for index, value in s.inject:
                    rig.params[index].grad.view(-1)[0] = value
            if s.no_grad is not None:
                rig.params[s.no_grad].grad = None
        if s.unscale_first:
            for opt in ref.opts:
                ref.scaler.unscale_(opt)
            with _own_work():
                for opt in mine.opts:
                    mine.scaler.unscale_(opt)
            scale = ref.scaler.get_scale()

            def divided(i: int, scale: float = scale) -> str:
                p = ref.params[i]
                if p.grad is not None and mine.params[i].grad is not None and scale != 1.0:
                    return ("\n  hint: torch multiplies by the float32 reciprocal of S, computed in float64 "
                            "(1/S rounded once), it does not divide by S")
                return ""
            _compare_tensors(plan, step, "after unscale_, the gradient of parameter",
                             [p.grad for p in mine.params], [p.grad for p in ref.params], divided)
        for opt in ref.opts:
            ref.scaler.step(opt)
        with _own_work():
            for opt in mine.opts:
                mine.scaler.step(opt)
        skipped = [p.grad is not None and not torch.isfinite(p.grad).all() for p in ref.params]
        note = "\n  torch skipped this optimizer's step: one of its gradients was inf or NaN" if any(skipped) else ""
        _compare_tensors(plan, step, "after step, parameter", mine.params, ref.params, lambda i, note=note: note)
        ref.scaler.update(s.new_scale)
        with _own_work():
            mine.scaler.update(s.new_scale)
        want, got = _state(ref.scaler), mine.scaler.state_dict()
        if not isinstance(got, dict) or got.keys() != want.keys():
            raise _fail(plan, step, f"state_dict() should have the keys {sorted(want)}, got {got!r}")
        got = {k: (float(v) if k == "scale" else v) for k, v in got.items()}
        if got != want or float(mine.scaler.get_scale()) != ref.scaler.get_scale():
            hint = ""
            if math.isclose(got["scale"], want["scale"], rel_tol=1e-6) and got["scale"] != want["scale"]:
                hint = "\n  hint: torch keeps S in a float32 tensor: every new scale is rounded to float32"
            raise _fail(plan, step, f"after update({'' if s.new_scale is None else s.new_scale}) (inf/NaN this step: "
                                    f"{bool(s.inject)}) state_dict() should be {want}, got {got}{hint}")
    return len(plan.steps)


def _resume(cls: type) -> None:
    """state_dict / load_state_dict: a fresh scaler loaded mid-run continues exactly as torch's does."""
    plan = random_plan("resume from state_dict", dict(init_scale=2.0**8, growth_interval=2), 12, seed=7, p_bad=0.3)
    with _own_work():
        first = cls("cpu", **plan.settings)
    first_ref = torch.amp.GradScaler("cpu", **plan.settings)
    for scaler in (first, first_ref):   # a few steps of state to carry
        p = nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.1)
        for bad in (False, True, False, False):
            with _own_work() if scaler is first else contextlib.nullcontext():
                scaler.scale(p.sum()).backward()
                if bad:
                    p.grad[0] = math.inf
                scaler.step(opt)
                scaler.update()
            opt.zero_grad()
    with _own_work():
        state = first.state_dict()
        second = cls("cpu")
        second.load_state_dict(state)
        got = second.state_dict()
    want = _state(first_ref)
    if {k: (float(v) if k == "scale" else v) for k, v in got.items()} != want:
        raise CheckFailed(f"resume: after load_state_dict(state_dict()) a fresh scaler should hold {want}, got {got}")


def check_grad_scaler(cls: type) -> None:
    """cls(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled) with scale,
    unscale_, step, update, get_scale, state_dict, load_state_dict; graded step for step against
    torch.amp.GradScaler on plans of clean, inf and NaN steps."""
    _own_class(cls)
    steps = sum(run_plan(cls, plan) for plan in visible_plans())
    _resume(cls)
    with _own_work():
        off = cls("cpu", enabled=False)
        loss = torch.tensor(2.5)
        if off.scale(loss) is not loss or float(off.get_scale()) != 1.0 or off.state_dict() != {}:
            raise CheckFailed("enabled=False: scale(loss) must return loss itself, get_scale() 1.0 and state_dict() {} "
                              "(one training loop for every precision)")
    _passed("check_grad_scaler", f"{steps} steps in 2 plans, a resume from state_dict and enabled=False: "
            "identical to torch.amp.GradScaler")


def check_grad_scaler_hidden_plans(cls: type) -> None:
    """More plans: odd factors and a scale whose reciprocal is not exact, two optimizers, growth capped
    below inf, a float16 loss with the scale falling below 1."""
    _own_class(cls)
    steps = sum(run_plan(cls, plan) for plan in hidden_plans())
    _passed("check_grad_scaler_hidden_plans", f"{steps} steps in {len(hidden_plans())} more plans, identical to torch")


# --- misuse -------------------------------------------------------------------------------------------------

def _misuse_cases() -> dict[str, Callable[[Any], None]]:
    def rig(scaler, dtype=torch.float32, backward=True):
        p = nn.Parameter(torch.ones(3, dtype=dtype))
        opt = torch.optim.SGD([p], lr=0.1)
        if backward:
            scaler.scale(p.float().sum()).backward()
        return p, opt

    def twice_unscale(s):
        _, opt = rig(s)
        s.unscale_(opt)
        s.unscale_(opt)

    def unscale_after_step(s):
        _, opt = rig(s)
        s.step(opt)
        s.unscale_(opt)

    def step_twice(s):
        _, opt = rig(s)
        s.step(opt)
        s.step(opt)

    def update_without_step(s):
        rig(s)
        s.update()

    def unscale_before_scale(s):
        _, opt = rig(s, backward=False)
        s.unscale_(opt)

    def step_without_grads(s):
        s.scale(torch.ones(()))
        _, opt = rig(s, backward=False)
        s.step(opt)

    def fp16_grads(s):
        _, opt = rig(s, dtype=torch.float16)
        s.unscale_(opt)

    def load_empty(s):
        s.load_state_dict({})

    return {"unscale_ twice before update": twice_unscale, "unscale_ after step": unscale_after_step,
            "step twice before update": step_twice, "update with no step": update_without_step,
            "unscale_ before any scale()": unscale_before_scale, "step with no gradients": step_without_grads,
            "float16 gradients (a model.half() model)": fp16_grads, "load_state_dict({})": load_empty}


def check_grad_scaler_errors(cls: type) -> None:
    """Each misuse raises the exception type torch.amp.GradScaler raises (AssertionError, RuntimeError,
    ValueError), so code that catches torch's errors catches yours; correct use raises nothing."""
    _own_class(cls)
    for name, misuse in _misuse_cases().items():
        try:
            misuse(torch.amp.GradScaler("cpu"))
        except Exception as exc:  # the type torch raises is the answer
            want = type(exc)
        else:
            raise AssertionError(f"torch raised nothing for {name}: the case list is out of date")
        try:
            with _own_work():
                misuse(cls("cpu"))
        except (CheckFailed, NotImplementedError):
            raise
        except want:
            continue
        except Exception as exc:
            raise CheckFailed(f"{name}: torch raises {want.__name__}, "
                              f"yours raised {type(exc).__name__}: {exc}") from None
        raise CheckFailed(f"{name}: torch raises {want.__name__}, yours raised nothing (track each optimizer's stage: "
                          f"ready, unscaled, stepped)")
    _passed("check_grad_scaler_errors", f"{len(_misuse_cases())} misuses raise torch's exception types")
