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
rounded to float32, never growing to inf. So are the misuse errors (same exception types as torch)
and the private hooks third-party optimizers call (_step_supports_amp_scaling, tests/test_scaler_dropin.py).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import operator
import struct
import warnings
import weakref
from collections import abc, defaultdict
from enum import Enum
from typing import Any

import torch

FLOAT32_MAX = torch.finfo(torch.float32).max
BUCKET_NUMEL = 1 << 18   # smaller gradients are checked together, copied into a buffer of this many elements (1 MiB in fp32)
UNSCALABLE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})   # as torch's kernel

_FIX = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
_FP16_GRADS = (
    "Attempting to unscale FP16 gradients. The optimizer holds fp16 parameters (model.half()?), so "
    "their gradients are fp16 too, and unscaling them in fp16 loses what loss scaling saved: "
    "grad * (1/S) underflows again, and fp16 weights lose small updates (w + 1e-4 == w for w = 1). "
    "Keep fp32 master weights instead: leave the model in fp32 and run the forward under autocast, "
    "or give the optimizer fp32 copies of the weights (lesson 3, ampteach.MasterWeights)."
)
_NONE_REF = lambda: None   # stands for a missing gradient among weak references to gradients  # noqa: E731
_NEW_SCALE = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
              "torch.FloatTensor with requires_grad=False.")


class OptState(Enum):
    """Where one optimizer is in the current iteration: scale -> (unscale_) -> step -> update."""

    READY = 0       # gradients still multiplied by S
    UNSCALED = 1    # unscale_ ran: gradients are true gradients, inf/NaN noted
    STEPPED = 2     # step ran (or was skipped); only update() moves on


def _refresh_per_optimizer_state() -> dict[str, Any]:
    """One optimizer's state, in torch's layout (optimizers on torch's protocol read it): found_inf per device."""
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _PerDevice:
    """Copies of one tensor, made lazily, one per device asked for (torch's _MultiDeviceReplicator).

    own_device=True serves the tensor itself on its own device (for a tensor made for this one use).
    """

    def __init__(self, tensor: torch.Tensor, own_device: bool = False) -> None:
        self.tensor = tensor
        self.copies: dict[torch.device, torch.Tensor] = {tensor.device: tensor} if own_device else {}

    def get(self, device: torch.device) -> torch.Tensor:
        if device not in self.copies:
            self.copies[device] = self.tensor.to(device=device, non_blocking=True, copy=True)
        return self.copies[device]


def non_finite_check_and_unscale_(grads: list[torch.Tensor], found_inf: torch.Tensor,
                                  inv_scale: torch.Tensor | None) -> None:
    """ampteach's torch._amp_foreach_non_finite_check_and_unscale_: same arguments, same result, ordinary ops.

        non_finite_check_and_unscale_(grads, found_inf, inv_scale)   # found_inf: 1-element float32, on grads' device

    found_inf <- 1.0 if any element of grads is inf or NaN (read BEFORE unscaling), else left as it is;
    then every grad <- grad * inv_scale, in place (inv_scale None: check only). The check is one
    aminmax per bucket (min and max: +-inf shows in one of them, a NaN in both): a big gradient
    (BUCKET_NUMEL elements or more) is a bucket of its own, consecutive small ones (most of a model's
    tensors) are copied together, one `_foreach_copy_` per bucket, into one buffer of BUCKET_NUMEL
    elements, reused for every bucket and kept with its views for the last few gradient layouts.
    So there is one reduction for many tensors, and extra memory bounded by the buffer whatever the
    model's size (a new copy per bucket would fragment the heap and grow it by a bucket each time).
    """
    if found_inf.numel() != 1 or found_inf.dtype != torch.float32:
        raise RuntimeError(f"found_inf must be a 1-element float tensor, got {found_inf.dtype} of shape "
                           f"{tuple(found_inf.shape)}: pass torch.zeros((), device=...) and read it afterwards")
    dtypes = set(map(operator.attrgetter("dtype"), grads))
    for dtype in dtypes - UNSCALABLE_DTYPES:
        raise NotImplementedError(
            f"cannot unscale {dtype} gradients (torch's kernel neither): loss scaling serves real "
            f"float16/bfloat16/float32/float64 gradients. Keep {dtype} parameters out of this "
            f"optimizer, or check and scale their gradients yourself.")
    numels = tuple(map(torch.Tensor.numel, grads))
    extremes: list[torch.Tensor] = []
    staging = None
    for start, stop in _bucket_bounds(numels):
        if stop - start == 1:          # one gradient (a big one): no copy
            extremes += torch.aminmax(grads[start])
            continue
        if staging is None:            # one buffer for all buckets: a new copy per bucket fragments the heap
            staging = _staging(tuple(map(operator.attrgetter("shape"), grads)),
                               functools.reduce(torch.promote_types, dtypes), grads[0].device)
        flat, views = staging[start]
        torch._foreach_copy_(views, grads[start:stop])      # one call copies the bucket (casting to flat's dtype)
        extremes += torch.aminmax(flat)
    if extremes:
        found_inf.masked_fill_(~torch.stack(extremes).isfinite().all(), 1.0)
    if inv_scale is not None and grads:
        if inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
            raise RuntimeError(f"inv_scale must be a 1-element float tensor, got {inv_scale.dtype} of shape "
                               f"{tuple(inv_scale.shape)}")
        torch._foreach_mul_(grads, inv_scale.reshape(()) if inv_scale.dim() else inv_scale)   # g * fp32(1/S)


@functools.lru_cache(maxsize=4)
def _staging(shapes: tuple[torch.Size, ...], dtype: torch.dtype, device: torch.device
             ) -> dict[int, tuple[torch.Tensor, list[torch.Tensor]]]:
    """For gradients of these shapes: one buffer of BUCKET_NUMEL elements, and per bucket of small gradients
    (keyed by its first index) the part of the buffer it fills and a view of that part per gradient, shaped
    like it. Cached (a model's shapes are the same every step), because building views costs more than the
    copy: a few MiB stay allocated for the last few layouts seen."""
    numels = tuple(map(math.prod, shapes))
    buffer = torch.empty(BUCKET_NUMEL, dtype=dtype, device=device)
    out = {}
    for start, stop in _bucket_bounds(numels):
        if stop - start > 1:
            offsets = [0, *itertools.accumulate(numels[start:stop])]
            out[start] = (buffer[:offsets[-1]], [buffer[a:b].view(shape) for a, b, shape
                                                 in zip(offsets, offsets[1:], shapes[start:stop])])
    return out


@functools.lru_cache(maxsize=64)
def _bucket_bounds(numels: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each bucket of the check, for gradients of these sizes: a big one alone, consecutive
    small ones together up to BUCKET_NUMEL elements; empty gradients need no check (a bucket of only
    empty ones is left out). Cached: a model's sizes are the same every step."""
    bounds: list[tuple[int, int]] = []
    start = filled = 0
    for i, n in enumerate(numels):
        if n >= BUCKET_NUMEL or filled + n > BUCKET_NUMEL:
            if filled:
                bounds.append((start, i))
            start, filled = i, 0
        if n >= BUCKET_NUMEL:
            bounds.append((i, i + 1))
            start = i + 1
        else:
            filled += n
    if filled:
        bounds.append((start, len(numels)))
    return tuple(bounds)


class _LossScaler:
    """What every loss scaler shares: the scale tensor, the per-optimizer stages, unscale_, step and update."""

    def __init__(self, init_scale: float, enabled: bool) -> None:
        self._enabled = enabled
        self._init_scale = init_scale
        self._scale: torch.Tensor | None = None   # float32 0-d, created by the first scale() on its device
        self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(_refresh_per_optimizer_state)
        self._history: torch.Tensor | None = None  # float32, S after each update() in [:_history_len]; grows x2
        self._history_len = 0
        self._found_this_iteration: list[torch.Tensor | bool] = []   # per step(): skipped? (read lazily)
        self._found_last_iteration: list[torch.Tensor | bool] = []
        self._groupings: dict[int, tuple] = {}   # id(optimizer) -> its gradients grouped (_grads_by_device_and_dtype)

    # -- the three calls of a training step ---------------------------------------------------------

    def scale(self, outputs):
        """loss -> loss * S (a tensor, or lists/tuples of them); outputs itself when disabled.

        Ordinary type promotion applies: a 0-d fp16 loss times the 0-d fp32 scale is fp32. Several
        outputs are multiplied by one copy of S made for this call (so update() may run before their
        backward); a single tensor by S itself, as torch does.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        copies: list[_PerDevice] = []

        def apply_scale(value):
            if isinstance(value, torch.Tensor):
                if not copies:
                    if self._scale is None:
                        self._lazy_init(value.device)
                    copies.append(_PerDevice(self._scale))
                return value * copies[0].get(value.device)
            if isinstance(value, abc.Iterable):
                scaled = map(apply_scale, value)
                return type(value)(scaled) if isinstance(value, (list, tuple)) else scaled
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """grads <- grads * fp32(1/S) in place, noting whether any was inf/NaN. Call it before clipping.

        Optional: step() calls it when you did not. At most once per optimizer per iteration.
        """
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update(). "
                "Call it once per iteration, after the last backward() (with gradient accumulation: "
                "only in the iteration that steps), right before clipping and step()."
            )
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError(
                "unscale_() is being called after step(). step() already unscaled the gradients; "
                "call unscale_() before step(), or update() first to start the next iteration."
            )
        # 1/S in float64, rounded once to float32 (MPS has no float64: there torch divides in float32)
        inv_scale = scale.reciprocal() if scale.device.type == "mps" else scale.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = OptState.UNSCALED

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
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError(
                "step() has already been called since the last update(). "
                "Call scaler.update() once per iteration, after stepping every optimizer."
            )
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return self._step_in_optimizer(optimizer, state, args, kwargs)
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise AssertionError(
                "No inf checks were recorded for this optimizer. None of its parameters has a .grad: "
                "call scaler.scale(loss).backward() before step(), on a loss that depends on them."
            )
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

        Stored compactly: one float32 per update() in a buffer on the scale's device, written without a
        host sync and doubled in size when full; reading it is one sync.
        """
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
        return self._scale

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        """Check the optimizer's (still scaled) gradients for inf/NaN without unscaling them; record and return the flags."""
        scale = self._require_scale("_check_inf_per_device")
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, None, found_inf, True)
        return state["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor | None,
                        found_inf: torch.Tensor, allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        """Check (and, given inv_scale, unscale) every gradient the optimizer holds, grouped by device and dtype.

        Returns {device: found_inf on it}, empty when no parameter has a gradient: found_inf itself on
        its own device (updated in place), copies on the others. fp16 sparse gradients are coalesced
        first (in .grad): duplicate entries may overflow only once summed.
        """
        inv_scales = None if inv_scale is None else _PerDevice(inv_scale, own_device=True)
        found_infs = _PerDevice(found_inf, own_device=True)
        with torch.no_grad():
            grouped = self._grads_by_device_and_dtype(optimizer, allow_fp16)
            for (device, _), grads in grouped.items():
                non_finite_check_and_unscale_(grads, found_infs.get(device),
                                              None if inv_scales is None else inv_scales.get(device))
        return {device: found_infs.copies[device] for device, _ in grouped}

    def _grads_by_device_and_dtype(self, optimizer: torch.optim.Optimizer,
                                   allow_fp16: bool) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
        """The optimizer's gradients grouped by device and dtype (fp16 ones refused unless allow_fp16).

        The grouping is remembered per optimizer as positions in its gradient list, with weak
        references to the gradients it was made from: while they are the same tensors (gradients
        zeroed in place, or accumulated), the next step reuses it instead of asking every gradient
        its device and dtype again. New gradient tensors (zero_grad(set_to_none=True)) group afresh.
        """
        params = [param for group in optimizer.param_groups for param in group["params"]]
        grads = [param.grad for param in params]
        refs, positions = self._groupings.get(id(optimizer), ((), {}))
        if len(refs) != len(grads) or not all(map(operator.is_, grads, [ref() for ref in refs])):
            refs, positions = self._group(params, grads, allow_fp16)
            if refs:
                if len(self._groupings) >= 16:   # optimizers come and go: forget the older ones
                    self._groupings.clear()
                self._groupings[id(optimizer)] = refs, positions
        if not allow_fp16 and any(dtype is torch.float16 for _, dtype in positions):
            raise ValueError(_FP16_GRADS)
        return {key: [grads[i] for i in where] for key, where in positions.items()}

    @staticmethod
    def _group(params: list[torch.Tensor], grads: list[torch.Tensor | None], allow_fp16: bool):
        """(weak references to grads, or () when the grouping must not be reused; {(device, dtype): positions}).

        A sparse gradient is checked through its values, which replace it in grads; an fp16 one is
        coalesced first (in .grad): duplicate entries may overflow only once summed. Its values are a
        new tensor every time, so a grouping with a sparse gradient is not reused.
        """
        kinds = [None if grad is None else (grad.device, grad.dtype, grad.is_sparse) for grad in grads]
        distinct = set(kinds) - {None}
        if not allow_fp16 and any(dtype is torch.float16 for _, dtype, _ in distinct):
            raise ValueError(_FP16_GRADS)
        reusable = not any(sparse for _, _, sparse in distinct)
        if len(distinct) == 1 and reusable:   # the usual case: one device, one dtype, all dense
            (device, dtype, _), = distinct
            return ([_NONE_REF if grad is None else weakref.ref(grad) for grad in grads],
                    {(device, dtype): [i for i, kind in enumerate(kinds) if kind is not None]})
        positions: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
        for i, kind in enumerate(kinds):
            if kind is None:
                continue
            device, dtype, sparse = kind
            if sparse:
                grad = params[i].grad
                if dtype is torch.float16:
                    params[i].grad = grad = grad.coalesce()
                grads[i] = grad._values()
            positions[device, dtype].append(i)
        refs = [_NONE_REF if grad is None else weakref.ref(grad) for grad in grads] if reusable else ()
        return refs, dict(positions)

    # -- the machinery ---------------------------------------------------------------------------------

    def _lazy_init(self, device: torch.device) -> None:
        try:
            self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        except RuntimeError as error:
            raise RuntimeError(f"init_scale={self._init_scale!r} does not fit in float32 (largest "
                               f"{FLOAT32_MAX:.7g}): the scale is a float32 tensor. The usual start is 2.0**16.") from error

    def _require_scale(self, funcname: str) -> torch.Tensor:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {_FIX}")
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
        if buffer is None or n == buffer.numel() or buffer.device != self._scale.device:
            grown = torch.empty(max(64, 2 * n), dtype=torch.float32, device=self._scale.device)
            if n:
                grown[:n].copy_(buffer[:n])
            self._history = buffer = grown
        buffer[n].copy_(self._scale)
        self._history_len = n + 1

    def _step_in_optimizer(self, optimizer, state: dict[str, Any], args, kwargs):
        """torch's protocol for optimizers that set _step_supports_amp_scaling: they unscale and skip themselves.

        New protocol (Adam(fused=True), SGD(fused=True)...): the scaler checks the still-scaled gradients
        and hands the optimizer grad_scale (S) and found_inf; its kernel divides by S and skips on inf.
        Deprecated protocol (step() takes a grad_scaler keyword): the optimizer gets the scaler itself
        and must call scaler.unscale_(self) (or _check_inf_per_device) and skip on its own.
        """
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
                FutureWarning, stacklevel=3)
            result = optimizer.step(*args, **{**kwargs, "grad_scaler": self})
            state["stage"] = OptState.STEPPED
            self._found_this_iteration.extend(state["found_inf_per_device"].values())
            return result
        if state["stage"] is OptState.READY:
            self._check_inf_per_device(optimizer)
        found = [t.to(self._scale.device, non_blocking=True) for t in state["found_inf_per_device"].values()]
        found_inf = functools.reduce(torch.add, found) if found else torch.zeros((), device=self._scale.device)
        if state["stage"] is OptState.UNSCALED:   # grads already true: pass on only a scale the user set
            optimizer.grad_scale = getattr(optimizer, "grad_scale", None)
        else:
            optimizer.grad_scale = self._scale * getattr(optimizer, "grad_scale", 1)
        optimizer.found_inf = found_inf
        try:
            result = optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale, optimizer.found_inf
        state["stage"] = OptState.STEPPED
        self._found_this_iteration.append(found_inf)
        return result

    def __getstate__(self) -> dict[str, Any]:
        """Pickle between iterations only, like torch: S and the tracker travel as numbers, re-created lazily."""
        state = self.__dict__.copy()
        state["_groupings"] = {}   # weak references do not pickle; grouping again costs one step
        if self._enabled:
            if self._per_optimizer_states:
                raise AssertionError("A GradScaler instance may only be pickled at the beginning of an iteration, "
                                     "or at the end after scaler.update().")
            state["_init_scale"] = self.get_scale()
            state["_scale"] = None
        return state


def _warn_if_surely_wrong(**values) -> None:
    """Values torch accepts but that cannot be meant: say what they do (a UserWarning), and carry on.

    Only the keywords given are checked (init_scale, growth_factor, backoff_factor, growth_interval);
    values that are not numbers are left to fail where torch fails on them.
    """
    reasons = {
        "init_scale": lambda s: ("is not a positive finite number: the loss is multiplied by it (0 or inf turn "
                                 "the gradients into 0, inf or NaN; a negative scale flips the loss)"
                                 if not 0 < s < math.inf else
                                 f"overflows float32 (largest {FLOAT32_MAX:.7g}): the first scale() will fail"
                                 if s > FLOAT32_MAX else None),
        "growth_factor": lambda g: ("means the scale never grows (it grows by this factor; a product that is not "
                                    "finite is refused)" if not 1 < g < math.inf else None),
        "backoff_factor": lambda b: ("should lie strictly between 0 and 1: after an overflow the scale must "
                                     "shrink to a smaller positive value" if not 0 < b < 1 else None),
        "growth_interval": lambda n: ("means the scale never grows (it grows after this many clean steps "
                                      "in a row)" if n < 1 else None),
    }
    for name, value in values.items():
        try:
            reason = reasons[name](float(value))
        except (TypeError, ValueError):
            continue
        if reason:
            warnings.warn(f"GradScaler: {name}={value!r} {reason}. The usual values are init_scale=2.0**16, "
                          "growth_factor=2.0, backoff_factor=0.5, growth_interval=2000.", UserWarning, stacklevel=3)


def _check_growth_interval(growth_interval) -> int:
    """torch passes growth_interval to a kernel that takes a 64-bit int: refuse what it refuses, as it does."""
    if isinstance(growth_interval, bool):
        raise TypeError(f"growth_interval must be an int (clean steps before the scale grows), got {growth_interval!r}")
    try:
        interval = operator.index(growth_interval)
    except TypeError:
        raise TypeError(f"growth_interval must be an int (clean steps before the scale grows), got "
                        f"{type(growth_interval).__name__} {growth_interval!r}; e.g. growth_interval=2000") from None
    if not -2**63 <= interval < 2**63:
        raise ValueError(f"growth_interval={interval} does not fit in a 64-bit int; the usual value is 2000")
    return interval


class GradScaler(_LossScaler):
    """Dynamic loss scaling with torch.amp.GradScaler's API and numerics (see the module docstring).

        scaler = GradScaler("cpu", init_scale=2.0**16, growth_interval=2000)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

    S <- S * backoff_factor after an inf/NaN gradient, else S * growth_factor after growth_interval
    clean steps in a row (never to inf). The same per-optimizer stages and errors as torch's; one
    scaler serves several optimizers (each may skip on its own; S is shared). It accepts what torch
    accepts (warning where a value cannot be meant) and refuses what torch refuses, with the same
    exception types; with enabled=False the other arguments are ignored.
    Beyond torch: scaler.last_step_skipped (True if step() skipped any optimizer in the current
    iteration, or after update() in the one it closed) and scaler.scale_history (S after each update()).
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        if enabled and device == "cuda" and not torch.cuda.is_available():
            warnings.warn("GradScaler(device='cuda') is enabled, but CUDA is not available.  Disabling: "
                          "scaling becomes a no-op. Pass device='cpu' to scale on the CPU.", stacklevel=2)
            enabled = False
        if enabled:
            if growth_factor <= 1.0:
                raise AssertionError(f"The growth factor must be > 1.0, got growth_factor={growth_factor!r}: the "
                                     "scale grows by it after growth_interval clean steps. The usual value is 2.0.")
            if backoff_factor >= 1.0:
                raise AssertionError(f"The backoff factor must be < 1.0, got backoff_factor={backoff_factor!r}: the "
                                     "scale shrinks by it after an inf/NaN gradient. The usual value is 0.5.")
            _check_growth_interval(growth_interval)
            _warn_if_surely_wrong(init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
        super().__init__(init_scale, enabled)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker: torch.Tensor | None = None   # int32 0-d: clean steps since S last changed

    def _lazy_init(self, device: torch.device) -> None:
        super()._lazy_init(device)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)

    def _update_scale(self) -> None:
        """S from the found_inf flags of every optimizer on every device (summed): the dynamic rule."""
        found_infs = [found.to(self._scale.device, non_blocking=True)
                      for state in self._per_optimizer_states.values()
                      for found in state["found_inf_per_device"].values()]
        if not found_infs:
            raise AssertionError("No inf checks were recorded prior to update(). Call scaler.step(optimizer) "
                                 "(or scaler.unscale_(optimizer)) on every optimizer before update().")
        found_inf = functools.reduce(torch.add, found_infs)   # any optimizer's inf/NaN counts
        if self._scale.device.type == "cpu":   # reading a CPU tensor is no device sync: the rule in Python numbers
            scale, tracker = next_scale(self._scale.item(), int(self._growth_tracker.item()), found_inf.item() != 0,
                                        self._growth_factor, self._backoff_factor, operator.index(self._growth_interval))
            self._scale.fill_(scale)
            self._growth_tracker.fill_(tracker)
            return
        update_scale_(self._scale, self._growth_tracker, found_inf, self._growth_factor, self._backoff_factor,
                      operator.index(self._growth_interval))

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        """update(new_scale=...): S <- new_scale (the tracker is kept), with torch's checks and exception types."""
        if isinstance(new_scale, float):
            self._scale.fill_(new_scale)
            return
        if not isinstance(new_scale, torch.Tensor):   # torch fails reading new_scale.device: AttributeError
            raise AttributeError(f"{_NEW_SCALE} Got {type(new_scale).__name__} {new_scale!r}: pass a Python "
                                 "float (update(new_scale=float(x))) or a 0-d float tensor on the scale's device.")
        if new_scale.device.type != self._device or new_scale.numel() != 1 or new_scale.requires_grad:
            raise AssertionError(f"{_NEW_SCALE} Got a tensor of shape {tuple(new_scale.shape)} on "
                                 f"{new_scale.device} with requires_grad={new_scale.requires_grad}.")
        if new_scale.dim() != 0:   # torch's copy_ into the 0-d scale refuses it
            raise RuntimeError(f"new_scale has shape {tuple(new_scale.shape)}, but the scale is a 0-d tensor "
                               "(output with shape [] doesn't match the broadcast shape): pass new_scale.reshape(()).")
        self._scale.copy_(new_scale)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        _warn_if_surely_wrong(growth_factor=new_factor)
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        _warn_if_surely_wrong(backoff_factor=new_factor)
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        _warn_if_surely_wrong(growth_interval=_check_growth_interval(new_interval))
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
        _check_growth_interval(state_dict["growth_interval"])
        _warn_if_surely_wrong(init_scale=state_dict["scale"], growth_factor=state_dict["growth_factor"],
                              backoff_factor=state_dict["backoff_factor"], growth_interval=state_dict["growth_interval"])
        if self._scale is not None:
            self._scale.fill_(state_dict["scale"])
            self._growth_tracker.fill_(state_dict["_growth_tracker"])
        self._init_scale = state_dict["scale"]
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if self._enabled:
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_growth_tracker"] = None
        return state


def update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                  growth_factor: float, backoff_factor: float, growth_interval: int) -> None:
    """The dynamic update rule, in place on 0-d tensors, without a host sync (what torch does in one kernel).

        found_inf != 0:  S <- float32(S * backoff_factor), tracker <- 0          (NaN counts as found)
        else:            tracker += 1; if tracker == growth_interval:             (==, not >=)
                             S <- float32(S * growth_factor) if that is finite; tracker <- 0
    The products are taken in float64 and rounded once to float32, as torch's kernel does.
    """
    found = found_inf != 0
    growth_tracker.add_(1).masked_fill_(found, 0)             # clean steps in a row
    grow = growth_tracker == growth_interval
    s = scale.double()
    grown = (s * growth_factor).float()
    backed_off = (s * backoff_factor).float()
    torch.where(found, backed_off, torch.where(grow & grown.isfinite(), grown, scale), out=scale)
    growth_tracker.masked_fill_(grow, 0)


def next_scale(scale: float, tracker: int, found: bool, growth_factor: float, backoff_factor: float,
               growth_interval: int) -> tuple[float, int]:
    """update_scale_'s rule on Python numbers: (S, tracker) after one step, for a scale that lives on the CPU.

        next_scale(65536.0, 1999, False, 2.0, 0.5, 2000) == (131072.0, 0)

    A 0-d tensor op costs microseconds of dispatch, a Python multiply nanoseconds, and reading a CPU tensor
    is no device sync: GradScaler.update() on the CPU reads S and the tracker, applies this, writes them back.
    The same float64 products rounded once to float32, and the tracker wraps around as torch's int32 does.
    """
    if found:   # NaN counts as found (found != 0)
        return _float32(scale * backoff_factor), 0
    tracker = (tracker + 1 + 2**31) % 2**32 - 2**31
    if tracker != growth_interval:
        return scale, tracker
    grown = _float32(scale * growth_factor)
    return (grown if math.isfinite(grown) else scale), 0


def _float32(x: float) -> float:
    """x rounded to the nearest float32, +-inf past its range (C's (float)x, what torch's kernel does)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


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

    def _skips(self, found: float) -> bool:
        return self.skip_nonfinite and bool(found)

    def _update_scale(self) -> None:
        pass

    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        raise ValueError("StaticLossScaler keeps one scale for the whole run; use GradScaler to change it.")
