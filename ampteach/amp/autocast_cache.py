"""The weight-cast cache of ampteach's autocast kernels, and their cast: torch's at::autocast::cached_cast.

    cast = caster("cpu")
    w16 = cast(weight, torch.bfloat16, cache_usable())   # an fp32 parameter: cast once per region, then reused
    cached_casts()                                       # 1
    torch.clear_autocast_cache()                         # empties torch's cache and this one

Per tensor t and target dtype: t unchanged if it is not floating, float64, on another device, or
already the target; else t.to(dtype), where an fp32 leaf that requires grad (a parameter, not a view
of one) is cast once and the cast reused while the cache lives (only when the target is the region's
dtype and the region's cache_enabled is on, outside inference mode).

One cache, process-wide as torch's, keyed by the tensor alone, and emptied whenever torch's C++ cache
is: by the exit of a thread's outermost autocast region (torch's or ampteach's), and by any call of
torch's clear, however it was reached (torch.clear_autocast_cache, torch._C.clear_autocast_cache, or
the function taken by `from torch import clear_autocast_cache` before ampteach was imported).

How torch's clear reaches this cache (Python can neither read torch's cache nor hook its C++ clear):
while this cache holds a cast, torch's holds one too, a sentinel's (arm). The sentinel is an fp32
tensor without data that claims to live on an XPU; torch's own C++ AutocastXPU kernel of mm casts it
through torch's cache (ampteach replaces only the CPU and CUDA kernels; no XPU is needed, nothing is
computed on one). Emptying torch's cache frees that cast, and a weak reference to it empties this
cache (_torch_cache_emptied); the next cast kept arms again, which takes a few dispatcher calls.

So that a training loop does not pay that at every step: while ampteach's kernels are registered,
torch.clear_autocast_cache (what torch.autocast's exit calls, by that name) is this module's
clear_autocast_cache, which empties this cache and torch's, except when torch's can hold nothing but
the sentinel's cast: then it is left alone, and the sentinel stays armed from step to step.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["ARMED", "CACHE", "CONVERTERS", "arm", "cache_usable", "cached_cast", "cached_casts", "caster",
           "clear_autocast_cache", "converter", "hook_clear", "hooked", "lookup", "on_device", "unhook_clear"]

_F32, _F64 = torch.float32, torch.float64
_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(fp32 leaf) -> (leaf, cast): process-wide, as torch's
_is_cached = torch._C._is_cached_tensor
CACHE = _cache           # the generated kernels' handle on it (ampteach.amp.autocast_fast): _cache is never rebound
lookup = _cache.get      # id(t) -> (t, cast) or None: how the kernels look a weight up
CONVERTERS = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half,   # t.to(dtype), fastest
              torch.float32: torch.Tensor.float}


def cached_casts() -> int:
    """How many weight casts the cache holds now."""
    return len(_cache)


def cache_usable() -> bool:
    """Whether the weight-cast cache may serve now: the region's cache_enabled, and not in inference mode."""
    return torch.is_autocast_cache_enabled() and not torch.is_inference_mode_enabled()


# ---------------------------------------------------------------------------------------------------
# The sentinel in torch's cache: its cast lives exactly as long as torch's cache is not emptied

ARMED: list[weakref.ref] = []    # a weak reference to the sentinel's cast while torch's cache holds it
_XPU = "xpu"                      # a device whose autocast kernels ampteach leaves to torch (no XPU needed)
_Keys, _Key = torch._C.DispatchKeySet, torch._C.DispatchKey
# The thread's keys while arming: none included; excluded: autograd (no grad node, so no XPU is needed) and
# the CPU and CUDA autocast kernels (the cast is a CPU tensor). Autocast for XPU is on: not excluded.
_ARMING_KEYS = (_Keys(_Key.Undefined), _Keys(_Key.AutogradXPU) | _Keys(_Key.ADInplaceOrView)
                | _Keys(_Key.AutocastCPU) | _Keys(_Key.AutocastCUDA))
_arm_lock = threading.Lock()
_cast: list[torch.Tensor] = []    # the cast the sentinel is about to be given


class _Sentinel(torch.Tensor):
    """A tensor without data on the XPU device: cast, it gives a 1x1 CPU tensor made for the purpose."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _cast[0]           # torch's cached_cast casting the sentinel (aten.to): the cast its cache keeps


_LEAF = torch.Tensor._make_wrapper_subclass(_Sentinel, (1, 1), dtype=torch.float32, device=_XPU, requires_grad=True)


def arm() -> None:
    """Put the sentinel's cast in torch's cache, unless it is there: call it after keeping a cast in this cache.

    torch's own AutocastXPU kernel of mm runs on the sentinel (an fp32 leaf that requires grad, which
    torch caches), with no other key and no mode in the way: it casts the sentinel through torch's
    cache, then multiplies the 1x1 CPU cast by itself. When torch's cache is emptied, the cast is freed.
    """
    with _arm_lock:
        if ARMED:
            return
        cache_on, dtype = torch.is_autocast_cache_enabled(), torch.get_autocast_dtype(_XPU)
        half = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
        try:
            torch.set_autocast_cache_enabled(True)
            torch.set_autocast_dtype(_XPU, half)
            with _disable_current_modes() if torch._C._len_torch_dispatch_stack() else contextlib.nullcontext(), \
                    torch._C.DisableTorchFunction():
                _cast.append(torch.empty((1, 1), dtype=half))
                with torch._C._ForceDispatchKeyGuard(*_ARMING_KEYS):
                    torch.mm(_LEAF, _LEAF)
        finally:
            torch.set_autocast_cache_enabled(cache_on)
            torch.set_autocast_dtype(_XPU, dtype)
            cast = _cast.pop() if _cast else None
        ARMED.append(weakref.ref(cast, _torch_cache_emptied))


def _torch_cache_emptied(_: weakref.ref) -> None:
    """torch's cache was emptied (the sentinel's cast is freed): empty this one; the next cast kept arms again."""
    ARMED.clear()     # first: a cast kept from now on arms again
    _cache.clear()


# ---------------------------------------------------------------------------------------------------
# torch.clear_autocast_cache while ampteach's kernels are registered

_torch_clear_autocast_cache = torch._C.clear_autocast_cache
_only_sentinel = [False]   # whether torch's cache can hold nothing but the sentinel's cast
_exclusive = [False]       # whether ampteach's kernels are the only ones that can fill torch's cache


def clear_autocast_cache() -> None:
    """torch.clear_autocast_cache while hooked: empties this cache and torch's; torch's is left alone when it can
    hold nothing but the sentinel's cast (torch's kernels have not run since it was last emptied)."""
    _cache.clear()
    if not _only_sentinel[0]:
        _torch_clear_autocast_cache()
        _only_sentinel[0] = _exclusive[0]


def hook_clear(exclusive: bool) -> None:
    """Make torch.clear_autocast_cache (what torch.autocast.__exit__ calls, by that name) this module's.

    exclusive: no kernel of torch's can cache a cast from now on (ampteach's serve every op torch caches
    for, and no other autocast device is in use). torch's cache may still hold casts from before: the
    first call empties it. Only in place of torch's own function: one replaced by something else (a
    test's mock) is left alone.
    """
    _exclusive[0], _only_sentinel[0] = exclusive, False
    if torch.clear_autocast_cache is _torch_clear_autocast_cache:
        torch.clear_autocast_cache = clear_autocast_cache


def unhook_clear() -> None:
    """Give torch.clear_autocast_cache back to torch (its kernels serve again), and empty this cache."""
    _exclusive[0] = _only_sentinel[0] = False
    if torch.clear_autocast_cache is clear_autocast_cache:
        torch.clear_autocast_cache = _torch_clear_autocast_cache
    _cache.clear()


def hooked() -> bool:
    return torch.clear_autocast_cache is not _torch_clear_autocast_cache


def on_device(device: str) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor is on `device` as autocast counts it (CPU: CPU or oneDNN tensors)."""
    return (lambda t: t.is_cpu or t.is_mkldnn) if device == "cpu" else (lambda t: t.is_cuda)


def cached_cast(t: torch.Tensor, convert: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """convert(t) through the cache, for an fp32 leaf t that requires grad, on the region's device,
    converted to the region's dtype while cache_usable(): torch's cached_cast once it has checked those.

    A cached t is served after one more of torch's checks (is_cached_tensor, which can change for the
    same tensor; the view check cannot). Else a cast is made with grad enabled (a cast first made
    under no_grad still carries gradients later), and kept unless t is a view or a cached tensor.
    """
    hit = _cache.get(id(t))
    if hit is not None and hit[0] is t:          # entered as a non-view (a tensor stays one or the other)
        return hit[1] if not _is_cached(t) else convert(t)
    if t._is_view() or _is_cached(t) or hit is not None:
        return convert(t)
    if torch.is_grad_enabled():
        cast_t = convert(t)
    else:
        with torch.enable_grad():
            cast_t = convert(t)
    _cache[id(t)] = (t, cast_t)                  # holding t keeps its id from being reused while cached
    if not ARMED:
        arm()
    return cast_t


def converter(to: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """t -> t.to(to) by the fastest binding (t.bfloat16() parses no arguments: the same op, faster)."""
    return CONVERTERS.get(to) or (lambda t: t.to(to))


def caster(device: str) -> Callable[[torch.Tensor, torch.dtype, bool], torch.Tensor]:
    """cast(t, to, cache) for one device's kernels: torch's at::autocast::cached_cast.

    t.to(to) if t is eligible (floating, on the device, not float64) and not already `to`; with
    cache=True (`to` is the region's dtype and cache_usable(), read once per op call) an fp32 leaf
    that requires grad goes through the cache (cached_cast). The cache is keyed by the tensor alone:
    an inner region with another dtype gets the outer region's cast, as in torch.
    """
    on_dev = on_device(device)

    def cast(t: torch.Tensor, to: torch.dtype, cache: bool) -> torch.Tensor:
        dtype = t.dtype
        if dtype is to or (dtype is not _F32 and (dtype is _F64 or not dtype.is_floating_point)) or not on_dev(t):
            return t
        if cache and dtype is _F32 and t.requires_grad and t.is_leaf:
            return cached_cast(t, converter(to))
        return converter(to)(t)

    return cast
