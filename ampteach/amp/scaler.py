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

The rule (next_scale): S <- S * backoff_factor on inf/NaN, else S * growth_factor after growth_interval clean steps.

Why: fp16 flushes values below 2^-24 to zero, and backward through a model produces many such
gradients. Multiplying the loss by S multiplies every gradient by S (the chain rule is linear), which
moves them up into fp16's range; dividing by S in fp32 before the update undoes it. Too large an S
overflows to inf: the step is skipped and S halves, so S settles just below the overflow point.
The numerics are torch's, bit for bit (tests/test_scaler.py): the gradients are multiplied by 1/S
(float64, rounded once to float32), checked for inf/NaN before that, and S is updated in float64
rounded to float32, never to inf. So are the misuse errors' exception types and the hooks fused
optimizers call (_step_supports_amp_scaling). This module is what torch.amp promises; how unscale_
checks many gradients fast is in unscale_kernels.py, the argument checks in scaler_checks.py.
"""

from __future__ import annotations

import functools
import inspect
import math
import operator
import struct
import warnings
from collections import abc, defaultdict
from enum import Enum
from typing import Any

import torch

from ampteach.amp import scaler_checks as checks
from ampteach.amp.unscale_kernels import PerDevice, skip_under_compile, step_fused, unscale_grads_

__all__ = ["GradScaler", "OptState", "StaticLossScaler", "next_scale", "update_scale_", "FLOAT32_MAX"]

FLOAT32_MAX = torch.finfo(torch.float32).max


class OptState(Enum):
    """Where one optimizer is in the current iteration: scale -> (unscale_) -> step -> update."""

    READY = 0       # gradients still multiplied by S
    UNSCALED = 1    # unscale_ ran: gradients are true gradients, inf/NaN noted
    STEPPED = 2     # step ran (or was skipped); only update() moves on


def _refresh_per_optimizer_state() -> dict[str, Any]:   # torch's layout: optimizers on its protocol read it
    return {"stage": OptState.READY, "found_inf_per_device": {}}


# -- the loss-scale rule, written once ------------------------------------------------------------------

def next_scale(scale, tracker, found, growth_factor: float, backoff_factor: float, growth_interval: int):
    """(S, tracker) after one step, on Python numbers or on 0-d tensors (S in float64, tracker int32).

        next_scale(65536.0, 1999, False, 2.0, 0.5, 2000) == (131072.0, 0)   # the 2000th clean step: S grows
        next_scale(65536.0, 5, True, 2.0, 0.5, 2000) == (32768.0, 0)        # an inf/NaN: S backs off

    found (inf/NaN):  S <- float32(S * backoff_factor), tracker <- 0          (NaN counts as found)
    else:             tracker += 1; if tracker == growth_interval:             (==, not >=)
                          S <- float32(S * growth_factor) if that is finite; tracker <- 0
    Products in float64 rounded once to float32, the tracker an int32 that wraps: torch's kernel
    (torch._amp_update_scale_). GradScaler.update() runs it on Python numbers on the CPU (a 0-d
    tensor op costs microseconds, a multiply nanoseconds), elsewhere on tensors (update_scale_); the
    arguments are all numbers or all tensors (scale, tracker and found).
    """
    where, float32, isfinite, int32 = _NUMBER_OPS if isinstance(scale, (int, float)) else _TENSOR_OPS
    tracker = where(found, 0, int32(tracker + 1))          # clean steps in a row
    grow = tracker == growth_interval
    grown, backed_off = float32(scale * growth_factor), float32(scale * backoff_factor)
    return where(found, backed_off, where(grow & isfinite(grown), grown, scale)), where(grow, 0, tracker)


def update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                  growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    """next_scale in place on 0-d tensors, without a host sync: ampteach's torch._amp_update_scale_.

        update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000)   # float32, int32, float32 0-d tensors
    """
    new_scale, new_tracker = next_scale(scale.double(), growth_tracker, found_inf != 0, growth_factor,
                                        backoff_factor, growth_interval)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)


def _float32(x: float, _f32=struct.Struct("f")) -> float:   # noqa: B008 (one Struct, made once)
    """x rounded to the nearest float32, +-inf past its range (C's (float)x, as torch's kernel)."""
    try:
        return _f32.unpack(_f32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


# next_scale's four operations (where, round to float32, isfinite, wrap to int32) on tensors and on numbers
_TENSOR_OPS = (torch.where, torch.Tensor.float, torch.Tensor.isfinite, lambda n: n)   # int32 tensors wrap
_NUMBER_OPS = (lambda c, a, b: a if c else b, _float32, math.isfinite, lambda n: (n + 2**31) % 2**32 - 2**31)


# -- what every loss scaler shares -----------------------------------------------------------------------

class _LossScaler:
    """The scale tensor, the per-optimizer stages, scale, unscale_, step and update. Disabled, a scaler
    keeps no scaling state (as torch's): scale returns its input, step is optimizer.step(), the rest no-ops."""

    def __init__(self, init_scale: float, enabled: bool) -> None:
        skip_under_compile()      # torch.compile runs every call into a scaler eagerly, as it runs torch's
        self._enabled = enabled
        if enabled:
            self._init_scale = init_scale
            self._scale: torch.Tensor | None = None   # float32 0-d, created by the first scale() on its device
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
        self._history: torch.Tensor | None = None  # float32, S after each update() in [:_history_len]; grows x2
        self._history_len = 0
        self._found_this_iteration: list[torch.Tensor | bool] = []   # per step(): skipped? (read lazily)
        self._found_last_iteration: list[torch.Tensor | bool] = []
        self._groupings: dict[int, tuple] = {}   # id(optimizer) -> its gradients grouped (unscale_kernels)

    def _state(self, name: str) -> Any:
        """self.<name>, or torch's AttributeError with the reason: a disabled scaler keeps no scaling state.
        (Not __getattr__: a class with one loses CPython's fast attribute lookups, a microsecond per update.)"""
        try:
            return self.__dict__[name]
        except KeyError:
            raise checks.missing_attribute(self, name) from None

    # -- the three calls of a training step ---------------------------------------------------------

    def scale(self, outputs):
        """loss -> loss * S (a tensor, or lists/tuples of them; fp16 * the fp32 S is fp32); outputs if disabled.

        Several outputs are multiplied by one copy of S made for this call (update() may run before their
        backward); a single tensor by S itself, as torch does."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        copies: list[PerDevice] = []

        def apply_scale(value):
            if isinstance(value, torch.Tensor):
                if not copies:
                    if self._scale is None:
                        self._lazy_init(value.device)
                    copies.append(PerDevice(self._scale))
                return value * copies[0].get(value.device)
            if isinstance(value, abc.Iterable):
                scaled = map(apply_scale, value)
                return type(value)(scaled) if isinstance(value, (list, tuple)) else scaled
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """grads <- grads * fp32(1/S) in place, noting any inf/NaN. Optional, before clipping; once per iteration."""
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(checks.UNSCALED_TWICE)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError(checks.UNSCALE_AFTER_STEP)
        # 1/S in float64, rounded once to float32 (MPS has no float64: there torch divides in float32)
        inv_scale = scale.reciprocal() if scale.is_mps else scale.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = OptState.UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any):
        """optimizer.step(*args, **kwargs) unless a gradient was inf/NaN (then None). Unscales first if need be."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError(checks.STEPPED_TWICE)
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_in_optimizer(optimizer, state, args, kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise AssertionError(checks.NO_GRADS)
        skipped = self._skips(sum(v.item() for v in state["found_inf_per_device"].values()))   # the host sync
        result = None if skipped else optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        self._found_this_iteration.append(skipped)
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Close the iteration: adapt S (subclasses decide how), record it, make every optimizer READY again."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            self._set_scale(new_scale)
        else:
            self._update_scale()
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
        self._record_scale()
        self._found_last_iteration, self._found_this_iteration = self._found_this_iteration, []

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
        """The scale each update() ended with, oldest first: plot it to see the dynamic scaler's sawtooth.

        One float32 per update() in a buffer on S's device (no host sync; doubled when full)."""
        if self._history is None:
            return []
        return self._history[:self._history_len].tolist()

    @property
    def last_step_skipped(self) -> bool:
        """True if step() skipped an optimizer in the current iteration (after update(): in the one it closed)."""
        found = self._found_this_iteration or self._found_last_iteration
        return any(bool(f) for f in found)

    # -- torch's private protocol, for optimizers that unscale themselves (_step_supports_amp_scaling) ----

    def _get_scale_async(self) -> torch.Tensor | None:
        return self._state("_scale")

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        """Check the optimizer's (still scaled) gradients for inf/NaN without unscaling; record and return the flags."""
        self._state("_scale")
        scale = self._require_scale("_check_inf_per_device")
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, None, found_inf, True)
        return state["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        return self._state("_per_optimizer_states")[id(optimizer)]["found_inf_per_device"]

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor | None,
                        found_inf: torch.Tensor, allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        """Check (and, given inv_scale, unscale) the optimizer's gradients: {device: found_inf on it}."""
        return unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16, self._groupings)

    def _step_in_optimizer(self, optimizer, state: dict[str, Any], args, kwargs):
        """torch's protocol for optimizers that set _step_supports_amp_scaling: they unscale and skip themselves,
        given S and found_inf (Adam(fused=True): unscale_kernels.step_fused) or, deprecated, the scaler."""
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(checks.PASSES_ITSELF, FutureWarning, stacklevel=3)
            result = optimizer.step(*args, **{**kwargs, "grad_scaler": self})
            found = list(state["found_inf_per_device"].values())
        else:
            if state["stage"] is OptState.READY:
                self._check_inf_per_device(optimizer)
            result, found_inf = step_fused(optimizer, self._scale, state["found_inf_per_device"],
                                           state["stage"] is OptState.UNSCALED, args, kwargs)
            found = [found_inf]
        state["stage"] = OptState.STEPPED
        self._found_this_iteration.extend(found)
        return result

    # -- state --------------------------------------------------------------------------------------------

    def _lazy_init(self, device: torch.device) -> None:
        try:
            self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        except RuntimeError as error:
            raise RuntimeError(checks.init_scale_overflows(self._init_scale)) from error
        if self._history is not None:   # (unpickled onto another device) the history follows S
            self._history = self._history.to(device)

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {checks.FIX}")
        return self._scale

    def _skips(self, found: float) -> bool:
        return bool(found)

    def _update_scale(self) -> None:
        raise NotImplementedError

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        raise NotImplementedError

    def _record_scale(self) -> None:
        """Append S to the history buffer on S's device (no host sync), doubling the buffer when it is full."""
        n, buffer = self._history_len, self._history
        if buffer is None or n == len(buffer):
            grown = self._scale.new_empty(max(64, 2 * n))
            if n:
                grown[:n].copy_(buffer[:n])
            self._history = buffer = grown
        buffer[n].copy_(self._scale)
        self._history_len = n + 1

    def __getstate__(self) -> dict[str, Any]:
        """Pickle between iterations only, like torch: S and the tracker travel as numbers, re-created lazily."""
        state = self.__dict__.copy()
        state["_groupings"] = {}   # weak references do not pickle; grouping again costs one step
        if self._enabled:
            if self._per_optimizer_states:
                raise AssertionError(checks.PICKLED_MID_ITERATION)
            state["_init_scale"] = self.get_scale()
            state["_scale"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


# -- GradScaler: the dynamic rule -------------------------------------------------------------------------

class GradScaler(_LossScaler):
    """Dynamic loss scaling with torch.amp.GradScaler's API and numerics (see the module docstring).

        scaler = GradScaler("cpu", init_scale=2.0**16, growth_interval=2000)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

    One scaler serves several optimizers (each may skip on its own; S is shared). Beyond torch:
    scaler.last_step_skipped (did step() skip an optimizer in this iteration, or after update() in
    the one it closed?) and scaler.scale_history (S after each update()).

    Args:
        device (str, default "cuda"): the device type of the scale ("cuda", "cpu", ...). "cuda" without
            CUDA warns and disables the scaler, as torch does.
        init_scale (float, default 2.0**16): S before the first update(); a float32 number.
        growth_factor (float, default 2.0): S is multiplied by it after growth_interval clean steps; > 1.
        backoff_factor (float, default 0.5): S is multiplied by it after a step with an inf/NaN gradient; < 1.
        growth_interval (int, default 2000): clean steps in a row before S grows. A bool is refused here
            (TypeError), deliberately earlier than torch, whose scaler takes growth_interval=True and fails at update().
        enabled (bool, default True): False makes every call a pass-through (step() is optimizer.step())
            and ignores the other arguments; the scaler then keeps no scale, factors or interval, and
            get_growth_factor() and friends raise AttributeError, exactly as torch's do.
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        if enabled and device == "cuda" and not torch.cuda.is_available():
            warnings.warn("GradScaler(device='cuda') is enabled, but CUDA is not available.  Disabling: "
                          "scaling becomes a no-op. Pass device='cpu' to scale on the CPU.", stacklevel=2)
            enabled = False
        super().__init__(init_scale, enabled)
        if not enabled:
            return
        checks.check_factors(growth_factor, backoff_factor)
        checks.check_growth_interval(growth_interval)
        checks.warn_if_surely_wrong(init_scale=init_scale, growth_factor=growth_factor,
                                    backoff_factor=backoff_factor, growth_interval=growth_interval)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker: torch.Tensor | None = None   # int32 0-d: clean steps since S last changed

    def _lazy_init(self, device: torch.device) -> None:
        super()._lazy_init(device)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)

    def _update_scale(self) -> None:
        """S by next_scale, from the found_inf flags of every optimizer on every device: any inf/NaN counts."""
        found_infs = [found for state in self._per_optimizer_states.values()
                      for found in state["found_inf_per_device"].values()]
        if not found_infs:
            raise AssertionError(checks.NO_STEP_BEFORE_UPDATE)
        interval = operator.index(self._growth_interval)
        if self._scale.is_cpu:   # reading a CPU tensor is no device sync: the rule in Python numbers
            found = any(f.item() != 0 for f in found_infs)   # (the flags are 0 or positive: as their sum != 0)
            scale, tracker = next_scale(self._scale.item(), self._growth_tracker.item(), found,
                                        float(self._growth_factor), float(self._backoff_factor), interval)
            self._scale.fill_(scale)
            self._growth_tracker.fill_(tracker)
        else:
            found_inf = functools.reduce(torch.add, [f.to(self._scale.device, non_blocking=True) for f in found_infs])
            update_scale_(self._scale, self._growth_tracker, found_inf, self._growth_factor,
                          self._backoff_factor, interval)

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        """update(new_scale=...): S <- new_scale (the tracker is kept), with torch's checks and exception types."""
        if isinstance(new_scale, float):
            self._scale.fill_(new_scale)
        else:
            checks.check_new_scale(new_scale, self._device)
            self._scale.copy_(new_scale)

    def get_growth_factor(self) -> float:
        return self._state("_growth_factor")

    def set_growth_factor(self, new_factor: float) -> None:
        if self._enabled:
            checks.warn_if_surely_wrong(growth_factor=new_factor)
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._state("_backoff_factor")

    def set_backoff_factor(self, new_factor: float) -> None:
        if self._enabled:
            checks.warn_if_surely_wrong(backoff_factor=new_factor)
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._state("_growth_interval")

    def set_growth_interval(self, new_interval: int) -> None:
        if self._enabled:
            checks.warn_if_surely_wrong(growth_interval=checks.check_growth_interval(new_interval))
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def state_dict(self) -> dict[str, Any]:
        """torch.amp.GradScaler's five entries (same keys and types: either loads the other's); {} if disabled."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from state_dict() of this class or of torch.amp.GradScaler (a no-op when disabled).

        A dict with missing keys raises KeyError, as torch's does, but deliberately before anything is loaded:
        the scaler is left as it was (torch's has loaded part of the dict by then)."""
        if not self._enabled:
            return
        checks.check_state_dict(state_dict)
        if self._scale is not None:
            self._scale.fill_(state_dict["scale"])
            self._growth_tracker.fill_(state_dict["_growth_tracker"])
        self._init_scale, self._init_growth_tracker = state_dict["scale"], state_dict["_growth_tracker"]
        self._growth_factor, self._backoff_factor = state_dict["growth_factor"], state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_growth_tracker"] = None
        return state


class StaticLossScaler(_LossScaler):
    """One fixed scale for the whole run: the 2018 paper's static recipe (fastai used 512), same calls as GradScaler.

        scaler = StaticLossScaler(512.0)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

    grads <- grads * fp32(1/S) with S constant; a step whose gradients hold an inf/NaN is skipped, or
    applied anyway (then one overflow writes inf/NaN into the weights, as the paper's plain recipe did).

    Args:
        scale (float): S for every step, a positive float32 number (the paper used 8 to 32768, fastai 512).
        skip_nonfinite (bool, default True): skip a step with an inf/NaN gradient, as Apex's static mode did.
        enabled (bool, default True): False makes every call a pass-through, as GradScaler(enabled=False).
    """

    def __init__(self, scale: float, skip_nonfinite: bool = True, enabled: bool = True) -> None:
        if not 0 < scale <= FLOAT32_MAX:
            raise ValueError(f"scale must be a positive float32 number, got {scale!r}; "
                             "the paper used 8 to 32768, fastai 512.")
        super().__init__(scale, enabled)
        self.skip_nonfinite = skip_nonfinite

    def _skips(self, found: float) -> bool:
        return self.skip_nonfinite and bool(found)

    def _update_scale(self) -> None:
        pass

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        raise ValueError("StaticLossScaler keeps one scale for the whole run; use GradScaler to change it.")

