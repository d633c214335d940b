"""Loss scaling from scratch: torch.amp.GradScaler's contract, rebuilt with ordinary tensor ops.

    scaler = GradScaler("cpu")                   # drop-in for torch.amp.GradScaler("cpu")
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()            # grads of S * loss: tiny fp16 grads lifted out of underflow
        scaler.unscale_(opt)                     # optional (before clipping): grads *= 1/S, note any inf/NaN
        scaler.step(opt)                         # opt.step(), unless a grad was inf/NaN (then skipped)
        scaler.update()                          # S *= backoff after an inf/NaN, S *= growth after N clean steps
    scaler.last_step_skipped, scaler.scale_history   # beyond torch: was the step dropped? S over time

Why: fp16 flushes values below 2^-24 to zero, and backward through a model produces many such
gradients. Multiplying the loss by S multiplies every gradient by S (the chain rule is linear), which
moves them up into fp16's range; dividing by S in fp32 before the update undoes it. Too large an S
overflows to inf: the step is skipped and S halves, so S settles just below the overflow point.
The numerics are torch's, so results agree bit for bit (tests/test_scaler.py): 1/S is computed in
float64 and rounded once to float32, the gradients are multiplied by it (not divided by S), the
inf/NaN check reads the gradients before they are unscaled, and S is updated with float64 math
rounded to float32, never growing to inf.
"""

from __future__ import annotations

import math
import warnings
from collections import abc, defaultdict
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

FLOAT32_MAX = torch.finfo(torch.float32).max

_MISSING_SCALE = ("Attempted {} but _scale is None.  This may indicate your script did not use "
                  "scaler.scale(loss or outputs) earlier in the iteration.")
_FP16_GRADS = (
    "Attempting to unscale FP16 gradients. The optimizer holds fp16 parameters (model.half()?), so "
    "their gradients are fp16 too, and unscaling them in fp16 loses what loss scaling saved: "
    "grad * (1/S) underflows again, and fp16 weights lose small updates (w + 1e-4 == w for w = 1). "
    "Keep fp32 master weights instead: leave the model in fp32 and run the forward under autocast, "
    "or give the optimizer fp32 copies of the weights (lesson 3, ampteach.MasterWeights)."
)


class OptState(Enum):
    """Where one optimizer is in the current iteration: scale -> (unscale_) -> step -> update."""

    READY = 0       # gradients still multiplied by S
    UNSCALED = 1    # unscale_ ran: gradients are true gradients, inf/NaN noted
    STEPPED = 2     # step ran (or was skipped); only update() moves on


@dataclass
class _OptimizerState:
    stage: OptState = OptState.READY
    found_inf: torch.Tensor | None = None   # float32 0-d on the scale's device: 1.0 if a grad was inf/NaN


def _found_inf_and_unscale_(grads: list[torch.Tensor], inv_scale: torch.Tensor | None) -> torch.Tensor:
    """1.0 if any element of grads is inf or NaN (as read BEFORE unscaling), else 0.0; then grads *= inv_scale.

    max|g| per tensor is inf or NaN exactly when the tensor holds an inf or NaN (max propagates NaN).
    """
    max_abs = torch.stack(torch._foreach_max(torch._foreach_abs(grads)))
    found_inf = (~torch.isfinite(max_abs)).any().float()
    if inv_scale is not None:
        torch._foreach_mul_(grads, inv_scale.to(grads[0].device))   # g * fp32(1/S), in g's dtype
    return found_inf


class _LossScaler:
    """What every loss scaler shares: the scale tensor, the per-optimizer stages, unscale_ and step."""

    def __init__(self, init_scale: float, enabled: bool) -> None:
        self._enabled = enabled
        self._init_scale = init_scale
        self._scale: torch.Tensor | None = None   # float32 0-d, created by the first scale() on its device
        self._per_optimizer_states: dict[int, _OptimizerState] = defaultdict(_OptimizerState)
        self._scales: list[float] = []
        self._pending_scales: list[torch.Tensor] = []   # copies made by update(), read on demand (no sync)
        self._stepped_since_update = False
        self.last_step_skipped = False

    # -- the three calls of a training step ---------------------------------------------------------

    def scale(self, outputs):
        """loss -> loss * S (a tensor, or lists/tuples of them); outputs itself when disabled.

        Ordinary type promotion applies: a 0-d fp16 loss times the 0-d fp32 scale is fp32.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device, non_blocking=True)
        if isinstance(outputs, abc.Iterable):
            scaled = map(self.scale, outputs)
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """grads <- grads * fp32(1/S) in place, noting whether any was inf/NaN. Call it before clipping.

        Optional: step() calls it when you did not. At most once per optimizer per iteration.
        """
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state.stage is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update(). "
                "Call it once per iteration, after the last backward() (with gradient accumulation: "
                "only in the iteration that steps), right before clipping and step()."
            )
        if state.stage is OptState.STEPPED:
            raise RuntimeError(
                "unscale_() is being called after step(). step() already unscaled the gradients; "
                "call unscale_() before step(), or update() first to start the next iteration."
            )
        inv_scale = scale.double().reciprocal().float()   # 1/S in float64, rounded once to float32
        state.found_inf = self._unscale_grads_(optimizer, inv_scale, allow_fp16=False)
        state.stage = OptState.UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any):
        """optimizer.step(*args, **kwargs) unless a gradient was inf/NaN; returns its result (None if skipped).

        Unscales first when unscale_ was not called. scaler.last_step_skipped tells what happened.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state.stage is OptState.STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update(). "
                "Call scaler.update() once per iteration, after stepping every optimizer."
            )
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._fused_step(optimizer, state, args, kwargs)
        if state.stage is OptState.READY:
            self.unscale_(optimizer)
        if state.found_inf is None:
            raise RuntimeError(
                "No inf checks were recorded for this optimizer. None of its parameters has a .grad: "
                "call scaler.scale(loss).backward() before step(), on a loss that depends on them."
            )
        skipped = self._skips(state.found_inf)       # the one host sync of an iteration
        result = None if skipped else optimizer.step(*args, **kwargs)
        state.stage = OptState.STEPPED
        self._note_step(skipped)
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Close the iteration: adapt S (subclasses decide how) and make every optimizer READY again."""
        if not self._enabled:
            return
        self._require_scale("update")
        self._update_scale(new_scale)
        self._per_optimizer_states = defaultdict(_OptimizerState)
        self._pending_scales.append(self._scale.detach().clone())
        self._stepped_since_update = False

    # -- what a learner reads ------------------------------------------------------------------------

    def get_scale(self) -> float:
        """The current scale S as a Python float (init_scale before the first scale(); 1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale.item()

    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def scale_history(self) -> list[float]:
        """The scale each update() ended with, oldest first: plot it to see the dynamic scaler's sawtooth."""
        if self._pending_scales:
            self._scales += torch.stack(self._pending_scales).tolist()
            self._pending_scales.clear()
        return list(self._scales)

    # -- the machinery ---------------------------------------------------------------------------------

    def _lazy_init(self, device: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise RuntimeError(_MISSING_SCALE.format(funcname))
        return self._scale

    def _skips(self, found_inf: torch.Tensor) -> bool:
        return bool(found_inf.item())

    def _update_scale(self, new_scale: float | torch.Tensor | None) -> None:
        raise NotImplementedError

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor | None,
                        allow_fp16: bool) -> torch.Tensor | None:
        """Check (and, given inv_scale, unscale) every gradient the optimizer holds; None if it holds none."""
        by_device: dict[torch.device, list[torch.Tensor]] = defaultdict(list)
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.dtype == torch.float16 and not allow_fp16:
                    raise ValueError(_FP16_GRADS)
                by_device[grad.device].append(grad._values() if grad.is_sparse else grad)
        if not by_device:
            return None
        with torch.no_grad():
            found = [_found_inf_and_unscale_(grads, inv_scale).to(self._scale.device)
                     for grads in by_device.values()]
        return found[0] if len(found) == 1 else torch.stack(found).sum()

    def _fused_step(self, optimizer, state: _OptimizerState, args, kwargs):
        """torch's protocol for fused optimizers (Adam(fused=True)...): they unscale and skip in their kernel."""
        if state.stage is OptState.READY:
            state.found_inf = self._unscale_grads_(optimizer, None, allow_fp16=True)   # check only
        if state.found_inf is None:
            raise RuntimeError("No inf checks were recorded for this optimizer: none of its parameters has a .grad.")
        if state.stage is OptState.UNSCALED:   # grads already true: pass on only a scale the user set
            optimizer.grad_scale = getattr(optimizer, "grad_scale", None)
        else:
            optimizer.grad_scale = self._scale * getattr(optimizer, "grad_scale", 1)
        optimizer.found_inf = state.found_inf
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale, optimizer.found_inf
        state.stage = OptState.STEPPED
        self._note_step(self._skips(state.found_inf))
        return result

    def _note_step(self, skipped: bool) -> None:
        """last_step_skipped: True if any optimizer skipped in the current (or, after update(), the last) iteration."""
        self.last_step_skipped = skipped or (self._stepped_since_update and self.last_step_skipped)
        self._stepped_since_update = True


def _check_config(init_scale: float, growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    if not 0 < init_scale <= FLOAT32_MAX:
        raise ValueError(f"init_scale must be a positive float32 number (0 < S <= {FLOAT32_MAX:.4g}), "
                         f"got {init_scale!r}; the usual start is 2.0**16.")
    _check_factors(growth_factor, backoff_factor, growth_interval)


def _check_factors(growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    if not 1.0 < growth_factor < math.inf:
        raise ValueError(f"growth_factor must be a finite number > 1 (the scale grows by it), got {growth_factor!r}; "
                         "the usual value is 2.0.")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must lie strictly between 0 and 1 (the scale shrinks by it), "
                         f"got {backoff_factor!r}; the usual value is 0.5.")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval must be an int >= 1 (clean steps before the scale grows), "
                         f"got {growth_interval!r}; the usual value is 2000.")


class GradScaler(_LossScaler):
    """Dynamic loss scaling with torch.amp.GradScaler's API and numerics (see the module docstring).

        scaler = GradScaler("cpu", init_scale=2.0**16, growth_interval=2000)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

    S <- S * backoff_factor after an inf/NaN gradient, else S * growth_factor after growth_interval
    clean steps in a row (never to inf). The same per-optimizer stages and errors as torch's; one
    scaler serves several optimizers (each may skip on its own; S is shared).
    Beyond torch: scaler.last_step_skipped (True if step() skipped any optimizer in the current
    iteration, or after update() in the one it closed) and scaler.scale_history (S after each update()).
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        _check_config(init_scale, growth_factor, backoff_factor, growth_interval)
        if enabled and device == "cuda" and not torch.cuda.is_available():
            warnings.warn("GradScaler(device='cuda') is enabled, but CUDA is not available.  Disabling: "
                          "scaling becomes a no-op. Pass device='cpu' to scale on the CPU.", stacklevel=2)
            enabled = False
        super().__init__(init_scale, enabled)
        self._device = device
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker: torch.Tensor | None = None   # int32 0-d: clean steps since S last changed

    def _lazy_init(self, device: torch.device) -> None:
        super()._lazy_init(device)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)

    def _update_scale(self, new_scale: float | torch.Tensor | None) -> None:
        """S from the found_inf flags of every optimizer (summed), or new_scale when given (tracker kept)."""
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                if new_scale.device.type != self._device or new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                                     "torch.FloatTensor with requires_grad=False.")
                self._scale.copy_(new_scale.reshape(()))   # torch's own copy_ refuses shape (1,)
            else:
                self._scale.fill_(new_scale)
            return
        found_infs = [s.found_inf for s in self._per_optimizer_states.values() if s.found_inf is not None]
        if not found_infs:
            raise RuntimeError("No inf checks were recorded prior to update(). Call scaler.step(optimizer) "
                               "(or scaler.unscale_(optimizer)) on every optimizer before update().")
        found_inf = torch.stack(found_infs).sum() if len(found_infs) > 1 else found_infs[0]
        update_scale_(self._scale, self._growth_tracker, found_inf,
                      self._growth_factor, self._backoff_factor, self._growth_interval)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        _check_factors(new_factor, self._backoff_factor, self._growth_interval)
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        _check_factors(self._growth_factor, new_factor, self._growth_interval)
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        _check_factors(self._growth_factor, self._backoff_factor, new_interval)
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def state_dict(self) -> dict[str, Any]:
        """The five entries torch.amp.GradScaler saves (same keys and types: either can load the other's); {} when disabled."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from state_dict() of this class or of torch.amp.GradScaler (a no-op when disabled)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
        if missing:
            raise KeyError(f"not a GradScaler state dict: missing {sorted(missing)}")
        scale = state_dict["scale"]
        if not 0 <= scale <= FLOAT32_MAX:
            raise ValueError(f"state_dict['scale'] must be a finite float32 number >= 0, got {scale!r}")
        _check_factors(state_dict["growth_factor"], state_dict["backoff_factor"], state_dict["growth_interval"])
        self._init_scale = scale
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._scale is not None:
            self._scale.fill_(scale)
            self._growth_tracker.fill_(self._init_growth_tracker)


def update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                  growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    """The dynamic update rule, in place on 0-d tensors, without a host sync (what torch does in one kernel).

        found_inf != 0:  S <- float32(S * backoff_factor), tracker <- 0          (NaN counts as found)
        else:            tracker += 1; if tracker == growth_interval:             (==, not >=)
                             S <- float32(S * growth_factor) if that is finite; tracker <- 0
    The products are taken in float64 and rounded once to float32, as torch's kernel does.
    """
    found = found_inf != 0
    successful = growth_tracker + 1
    grow = successful == growth_interval
    grown = (scale.double() * growth_factor).float()
    backed_off = (scale.double() * backoff_factor).float()
    new_scale = torch.where(found, backed_off, torch.where(grow & torch.isfinite(grown), grown, scale))
    scale.copy_(new_scale)
    growth_tracker.copy_(torch.where(found | grow, 0, successful))


class StaticLossScaler(_LossScaler):
    """One fixed scale for the whole run: the 2018 paper's static recipe (fastai used 512), same calls as GradScaler.

        scaler = StaticLossScaler(512.0)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

    grads <- grads * fp32(1/S) with S constant. skip_nonfinite=True (the default, as Apex's static
    mode did) skips a step whose gradients hold an inf/NaN; skip_nonfinite=False applies it anyway,
    as the paper's plain recipe did: one overflow then writes inf/NaN into the weights.
    """

    def __init__(self, scale: float, skip_nonfinite: bool = True, enabled: bool = True) -> None:
        if not 0 < scale <= FLOAT32_MAX:
            raise ValueError(f"scale must be a positive float32 number, got {scale!r}; the paper used 8 to 32768, fastai 512.")
        super().__init__(scale, enabled)
        self.skip_nonfinite = skip_nonfinite

    def _skips(self, found_inf: torch.Tensor) -> bool:
        return self.skip_nonfinite and bool(found_inf.item())

    def _update_scale(self, new_scale: float | torch.Tensor | None) -> None:
        if new_scale is not None:
            raise ValueError("StaticLossScaler keeps one scale for the whole run; use GradScaler to change it.")
