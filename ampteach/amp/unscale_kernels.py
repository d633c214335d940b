"""The GradScaler's machinery: one fused check-and-unscale over many gradients, and what keeps it fast.

    from ampteach.amp.unscale_kernels import non_finite_check_and_unscale_, unscale_grads_
    found_inf = torch.zeros(())
    non_finite_check_and_unscale_(grads, found_inf, inv_scale)   # torch._amp_foreach_non_finite_check_and_unscale_
    unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16=False, groupings={})   # {device: found_inf}

found_inf <- 1 if any gradient holds an inf or NaN (read before unscaling); then every grad <- grad * inv_scale.

`ampteach/amp/scaler.py` holds what torch.amp promises (GradScaler's calls, the loss-scale rule);
this module holds how its unscale_ runs fast with ordinary tensor ops, as torch keeps its fused
CUDA/C++ kernel out of torch/amp/grad_scaler.py:
- buckets: consecutive small gradients are checked together, one aminmax per bucket of up to
  BUCKET_NUMEL elements instead of one reduction per tensor (a model has many small tensors);
- a staging buffer: each bucket is copied with one `_foreach_copy_` into views of one buffer,
  cached per gradient layout, so no step allocates (a new copy per bucket fragments the heap);
- a grouping cache: the optimizer's gradients grouped by device and dtype are remembered per
  optimizer while the gradient tensors stay the same (zeroed in place, or accumulated).
An optimizer with a fused kernel of its own (Adam(fused=True)) unscales in that kernel instead:
step_fused hands it S and the found_inf flag, as torch's protocol (_step_supports_amp_scaling) does.
Under torch.compile none of this is traced (skip_under_compile), as none of torch's scaler is.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import weakref
from collections import defaultdict

import torch

__all__ = ["BUCKET_NUMEL", "UNSCALABLE_DTYPES", "PerDevice", "skip_under_compile", "non_finite_check_and_unscale_",
           "unscale_grads_", "grads_by_device_and_dtype", "step_fused"]

BUCKET_NUMEL = 1 << 18   # smaller gradients are checked together, in a buffer of this many elements (1 MiB fp32)
UNSCALABLE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})   # as torch's kernel
MAX_CACHED_OPTIMIZERS = 16   # groupings kept (optimizers come and go: the older ones are forgotten)

FP16_GRADS = (
    "Attempting to unscale FP16 gradients. The optimizer holds fp16 parameters (model.half()?), so "
    "their gradients are fp16 too, and unscaling them in fp16 loses what loss scaling saved: "
    "grad * (1/S) underflows again, and fp16 weights lose small updates (w + 1e-4 == w for w = 1). "
    "Keep fp32 master weights instead: leave the model in fp32 and run the forward under autocast, "
    "or give the optimizer fp32 copies of the weights (lesson 3, ampteach.MasterWeights)."
)
_NONE_REF = lambda: None   # stands for a missing gradient among weak references to gradients  # noqa: E731

Grouping = dict[tuple[torch.device, torch.dtype], list[int]]   # (device, dtype) -> positions in the grad list
SCALER_MODULES = ("ampteach.amp.scaler", "ampteach.amp.unscale_kernels", "ampteach.amp.scaler_checks")


@functools.cache
def skip_under_compile() -> None:
    """Put the scaler's modules on dynamo's skip list, beside torch.amp (MOD_SKIPLIST): called by the first
    scaler built (importing dynamo takes about a second, so not at import).

    So torch.compile treats ampteach's scaler as torch's: each call into it from compiled code is a graph
    break and runs eagerly, its own functions are never traced (no lru_cache, weak reference or host read
    reaches dynamo), and what it calls elsewhere (optimizer.step) is compiled as a frame of its own.
    """
    from torch._dynamo import trace_rules

    for name in SCALER_MODULES:
        trace_rules.add(name)


class PerDevice:
    """Copies of one tensor, made lazily, one per device asked for (torch's _MultiDeviceReplicator).

        found = PerDevice(found_inf, own_device=True)
        found.get(torch.device("cuda:1"))          # a copy on cuda:1, made once

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


def unscale_grads_(optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor | None, found_inf: torch.Tensor,
                   allow_fp16: bool, groupings: dict[int, tuple]) -> dict[torch.device, torch.Tensor]:
    """Check (and, given inv_scale, unscale) every gradient the optimizer holds, grouped by device and dtype.

        found_per_device = unscale_grads_(opt, inv_scale, found_inf, False, scaler._groupings)

    Returns {device: found_inf on it}, empty when no parameter has a gradient: found_inf itself on
    its own device (updated in place), copies on the others. fp16 gradients are refused unless
    allow_fp16 (torch's rule: unscaling them in fp16 loses what scaling saved). groupings is the
    caller's cache of grads_by_device_and_dtype, one entry per optimizer.
    """
    inv_scales = None if inv_scale is None else PerDevice(inv_scale, own_device=True)
    found_infs = PerDevice(found_inf, own_device=True)
    with torch.no_grad():
        grouped = grads_by_device_and_dtype(optimizer, allow_fp16, groupings)
        for (device, _), grads in grouped.items():
            non_finite_check_and_unscale_(grads, found_infs.get(device),
                                          None if inv_scales is None else inv_scales.get(device))
    return {device: found_infs.copies[device] for device, _ in grouped}


def grads_by_device_and_dtype(optimizer: torch.optim.Optimizer, allow_fp16: bool, groupings: dict[int, tuple]
                              ) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    """The optimizer's gradients grouped by device and dtype (fp16 ones refused unless allow_fp16).

        grads_by_device_and_dtype(opt, False, {})   # {(device(type='cpu'), torch.float32): [p.grad, ...]}

    The grouping is remembered in groupings[id(optimizer)] as positions in its gradient list, with
    weak references to the gradients it was made from: while they are the same tensors (gradients
    zeroed in place, or accumulated), the next step reuses it instead of asking every gradient
    its device and dtype again. New gradient tensors (zero_grad(set_to_none=True)) group afresh.
    """
    params = [param for group in optimizer.param_groups for param in group["params"]]
    grads = [param.grad for param in params]
    refs, positions = groupings.get(id(optimizer), ((), {}))
    if len(refs) != len(grads) or not all(map(operator.is_, grads, [ref() for ref in refs])):
        refs, positions = _group(params, grads, allow_fp16)
        if refs:
            if len(groupings) >= MAX_CACHED_OPTIMIZERS:
                groupings.clear()
            groupings[id(optimizer)] = refs, positions
    if not allow_fp16 and any(dtype is torch.float16 for _, dtype in positions):
        raise ValueError(FP16_GRADS)
    return {key: [grads[i] for i in where] for key, where in positions.items()}


def _group(params: list[torch.Tensor], grads: list[torch.Tensor | None], allow_fp16: bool
           ) -> tuple[list | tuple, Grouping]:
    """(weak references to grads, or () when the grouping must not be reused; {(device, dtype): positions}).

    A sparse gradient is checked through its values, which replace it in grads; an fp16 one is
    coalesced first (in .grad): duplicate entries may overflow only once summed. Its values are a
    new tensor every time, so a grouping with a sparse gradient is not reused.
    """
    kinds = [None if grad is None else (grad.device, grad.dtype, grad.is_sparse) for grad in grads]
    distinct = set(kinds) - {None}
    if not allow_fp16 and any(dtype is torch.float16 for _, dtype, _ in distinct):
        raise ValueError(FP16_GRADS)
    reusable = not any(sparse for _, _, sparse in distinct)
    if len(distinct) == 1 and reusable:   # the usual case: one device, one dtype, all dense
        (device, dtype, _), = distinct
        return ([_NONE_REF if grad is None else weakref.ref(grad) for grad in grads],
                {(device, dtype): [i for i, kind in enumerate(kinds) if kind is not None]})
    positions: Grouping = defaultdict(list)
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


def step_fused(optimizer: torch.optim.Optimizer, scale: torch.Tensor, found_inf_per_device: dict,
               already_unscaled: bool, args: tuple, kwargs: dict) -> tuple[object, torch.Tensor]:
    """optimizer.step() for an optimizer whose own kernel unscales and skips (_step_supports_amp_scaling).

        result, found_inf = step_fused(Adam(params, fused=True), scale, {cpu: found_inf}, False, (), {})

    The optimizer reads optimizer.grad_scale (S, times any grad_scale the user set on it; only the
    user's when unscale_ already ran) and optimizer.found_inf (the flags summed over devices) during
    step(): its kernel divides the gradients by S and skips the update where found_inf != 0.
    """
    found = [t.to(scale.device, non_blocking=True) for t in found_inf_per_device.values()]
    found_inf = functools.reduce(torch.add, found) if found else torch.zeros((), device=scale.device)
    if already_unscaled:   # grads already true: pass on only a scale the user set
        optimizer.grad_scale = getattr(optimizer, "grad_scale", None)
    else:
        optimizer.grad_scale = scale * getattr(optimizer, "grad_scale", 1)
    optimizer.found_inf = found_inf
    try:
        return optimizer.step(*args, **kwargs), found_inf
    finally:
        del optimizer.grad_scale, optimizer.found_inf
