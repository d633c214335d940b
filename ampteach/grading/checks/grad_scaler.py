"""Build it yourself 5: the whole GradScaler, graded step for step against torch.amp.GradScaler.

    from ampteach.grading.checks import check_grad_scaler, check_grad_scaler_errors
    check_grad_scaler(MyGradScaler)          # random plans of clean, inf and NaN steps: every value, bit for bit
    check_grad_scaler_errors(MyGradScaler)   # misuse raises what torch raises (the exception type)

The plans below run a scaler through clean, inf and NaN steps and write down what came back after
every call: the scaled loss (value and dtype), the gradients after unscale_, the parameters after
step (skipped or not, per optimizer), the scale and growth tracker after update, and state_dict().
The learner's process runs them with the learner's class; the judge (ampteach.grading.judges.grad_scaler)
runs the same plan with torch.amp.GradScaler and compares. While the learner's class runs, torch's and
ampteach's scalers (their files, so a copied method is refused too) and torch's fused AMP kernels are
refused.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed, one_thread
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, module_files
from ampteach.grading.checks.wire import RemoteError

__all__ = ["BECAUSE", "Step", "Plan", "random_plan", "visible_plans", "run_plan", "misuse_cases", "run_misuse",
           "check_grad_scaler", "check_grad_scaler_errors", "check_grad_scaler_hidden_plans"]

BECAUSE = "the exercise is to build the scaler from ordinary tensor ops"
SCALER_MODULES = ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler", "torch.cpu.amp.grad_scaler",
                  "ampteach.amp.scaler", "ampteach.amp.unscale_kernels", "ampteach.amp.scaler_checks")
KERNELS = ("_amp_update_scale_", "_amp_update_scale", "_amp_foreach_non_finite_check_and_unscale_",
           "_amp_foreach_non_finite_check_and_unscale")


def _is_fused_kernel(fn: Any) -> bool:
    return getattr(fn, "__name__", "") in KERNELS


@watch("grad_scaler")
def own_work(who: str) -> Borrowed:
    """torch's and ampteach's scalers (by file: a copied method too) and torch's fused AMP kernels refused."""
    return Borrowed(who, module_files(*SCALER_MODULES), BECAUSE, builtins=_is_fused_kernel, aten_ops=KERNELS)


def _own_class(cls: Any) -> None:
    from ampteach.amp import scaler as ampteach_scaler

    if not isinstance(cls, type):
        raise CheckFailed(f"expected your scaler class (MyGradScaler), got {cls!r:.100}")
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

    def to_wire(self) -> dict:
        out = asdict(self)
        out["steps"] = [dict(asdict(s), inject=[list(i) for i in s.inject]) for s in self.steps]
        return out

    @classmethod
    def from_wire(cls, d: dict) -> Plan:
        steps = [Step([(int(i), float(v)) for i, v in s["inject"]], bool(s["unscale_first"]), s["no_grad"],
                      s["new_scale"]) for s in d["steps"]]
        return cls(d["name"], dict(d["settings"]), steps, bool(d["two_optimizers"]), d["loss_dtype"])


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


def visible_plans(seed: int = 1) -> list[Plan]:
    """Every kind of step the hidden plans draw, once: odd factors (1/3 is not exact in float32), two optimizers,
    growth capped below inf, a float16 loss with the scale falling below 1, and 40 random steps."""
    return [
        Plan("grow every 2 clean steps, one overflow", dict(init_scale=8.0, growth_interval=2),
             [Step(), Step(), Step(), Step([(0, math.inf)]), Step(unscale_first=True), Step(), Step()]),
        random_plan("40 random steps (inf, -inf, NaN; unscale_ first on some)", dict(init_scale=2.0**16,
                    growth_interval=3), 40, seed=seed),
        Plan("odd factors and scale (1/3 is not exact in float32)",
             dict(init_scale=3.0, growth_factor=1.7, backoff_factor=0.35, growth_interval=2),
             [Step(unscale_first=True), Step(), Step([(1, math.nan)]), Step(unscale_first=True), Step()]),
        Plan("two optimizers: each skips on its own inf", dict(init_scale=2.0**10, growth_interval=2),
             [Step([(2, math.inf)]), Step(), Step([(0, -math.inf)], unscale_first=True), Step()], two_optimizers=True),
        Plan("growth every step, never to inf", dict(init_scale=2.0**126, growth_interval=1), [Step(), Step(), Step()]),
        Plan("a float16 loss, scale falling below 1", dict(init_scale=4.0, growth_interval=50),
             [Step([(0, math.inf)])] * 4 + [Step(unscale_first=True)], loss_dtype=torch.float16),
    ]


# --- running one plan through one scaler ------------------------------------------------------------------

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


def _grads(rig: _Rig) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in rig.params]


def _state(scaler: Any) -> Any:
    state = scaler.state_dict()
    return {k: (float(v) if k == "scale" else v) for k, v in state.items()} if isinstance(state, dict) else state


def run_plan(cls: type, spec: dict, watched: bool = True) -> dict:
    """Drive cls through the plan; what came back after every call, and the error that stopped it (if any).
    With watched=False (the judge's replay with torch's class) nothing is refused."""
    plan_ = Plan.from_wire(spec)
    guard: Callable = (lambda: own_work(getattr(cls, "__name__", "scaler"))) if watched else contextlib.nullcontext
    trace: dict = {"steps": [], "error": None, "at": None}
    with one_thread():
        try:
            with guard():
                rig = _Rig(cls("cpu", **plan_.settings), plan_.two_optimizers)
                trace["init"] = rig.scaler.get_scale()
            for s in plan_.steps:
                record: dict = {}
                trace["steps"].append(record)
                for opt in rig.opts:
                    opt.zero_grad(set_to_none=True)
                with guard():
                    scaled = rig.scaler.scale(rig.loss(plan_.loss_dtype))
                record["loss"] = scaled.detach().clone() if isinstance(scaled, torch.Tensor) else scaled
                scaled.backward()
                with torch.no_grad():
                    for index, value in s.inject:
                        rig.params[index].grad.view(-1)[0] = value
                if s.no_grad is not None:
                    rig.params[s.no_grad].grad = None
                if s.unscale_first:
                    with guard():
                        for opt in rig.opts:
                            rig.scaler.unscale_(opt)
                    record["unscaled"] = _grads(rig)
                with guard():
                    for opt in rig.opts:
                        rig.scaler.step(opt)
                record["params"] = [p.detach().clone() for p in rig.params]
                with guard():
                    rig.scaler.update(s.new_scale)
                    record["state"], record["scale"] = _state(rig.scaler), rig.scaler.get_scale()
        except Exception as exc:  # the run stops here: the judge compares what came before, then reports it
            trace["error"], trace["at"] = RemoteError.of(exc), len(trace["steps"]) - 1
            trace["refused"] = isinstance(exc, CheckFailed)
    return trace


@plan("grad_scaler.run")
def run_learner_plan(spec: dict, *, cls: type) -> dict:
    _own_class(cls)
    return run_plan(cls, spec)


def resume_plan() -> Plan:
    return random_plan("resume from state_dict", dict(init_scale=2.0**8, growth_interval=2), 12, seed=7, p_bad=0.3)


def run_resume(cls: type, watched: bool = True) -> Any:
    """A few steps of state to carry, then state_dict / load_state_dict into a fresh scaler: its state_dict."""
    guard = (lambda: own_work(getattr(cls, "__name__", "scaler"))) if watched else contextlib.nullcontext
    settings = resume_plan().settings
    with one_thread(), guard():
        first = cls("cpu", **settings)
        p = nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.1)
        for bad in (False, True, False, False):
            first.scale(p.sum()).backward()
            if bad:
                p.grad[0] = math.inf
            first.step(opt)
            first.update()
            opt.zero_grad()
        second = cls("cpu")
        second.load_state_dict(first.state_dict())
        return _state(second)


@plan("grad_scaler.resume_and_disabled")
def resume_and_disabled(*, cls: type) -> dict:
    _own_class(cls)
    state = run_resume(cls)
    with own_work(getattr(cls, "__name__", "scaler")):
        off = cls("cpu", enabled=False)
        loss = torch.tensor(2.5)
        same = off.scale(loss) is loss
        return {"resumed": state, "disabled": (same, float(off.get_scale()), off.state_dict())}


# --- misuse -------------------------------------------------------------------------------------------------

def misuse_cases() -> dict[str, Callable[[Any], None]]:
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


def run_misuse(cls: type, name: str, watched: bool = True) -> RemoteError | None:
    """The error one misuse raises with cls (None: it raised nothing)."""
    guard = own_work(getattr(cls, "__name__", "scaler")) if watched else contextlib.nullcontext()
    try:
        with one_thread(), guard:
            misuse_cases()[name](cls("cpu"))
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:  # the exception's type is the answer
        return RemoteError.of(exc)
    return None


@plan("grad_scaler.misuse")
def learner_misuse(name: str, *, cls: type) -> RemoteError | None:
    _own_class(cls)
    return run_misuse(cls, name)


def check_grad_scaler(cls) -> None:
    """cls(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled) with scale,
    unscale_, step, update, get_scale, state_dict, load_state_dict; graded step for step against
    torch.amp.GradScaler on plans of clean, inf and NaN steps."""
    run_judge("check_grad_scaler", cls)


def check_grad_scaler_errors(cls) -> None:
    """Each misuse raises the exception type torch.amp.GradScaler raises (AssertionError, RuntimeError,
    ValueError), so code that catches torch's errors catches yours; correct use raises nothing."""
    run_judge("check_grad_scaler_errors", cls)


def check_grad_scaler_hidden_plans(cls) -> None:
    """More plans, drawn each time: odd factors and a scale whose reciprocal is not exact, two optimizers,
    growth capped below inf, a float16 loss with the scale falling below 1."""
    run_judge("check_grad_scaler_hidden_plans", cls)
