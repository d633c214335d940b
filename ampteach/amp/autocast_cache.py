"""The weight-cast cache of ampteach's autocast kernels, and their cast: torch's at::autocast::cached_cast.

    cast = caster("cpu")
    w16 = cast(weight, torch.bfloat16, cache_usable())   # an fp32 parameter: cast once per region, then reused
    cached_casts()                                       # 1
    torch.clear_autocast_cache()                         # empties torch's cache and this one (while hooked)

Per tensor t and target dtype: t unchanged if it is not floating, float64, on another device, or
already the target; else t.to(dtype), where an fp32 leaf that requires grad (a parameter, not a view
of one) is cast once and the cast reused while the cache lives (only when the target is the region's
dtype and the region's cache_enabled is on, outside inference mode).

One cache, process-wide as torch's, keyed by the tensor alone. It lives as long as torch's own: the
exit of a thread's outermost autocast region (torch's or ampteach's) calls torch.clear_autocast_cache(),
and so may a user. While ampteach's kernels are registered, that name is this module's
clear_autocast_cache (hook_clear), which empties torch's cache and this one.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["CACHE", "CONVERTERS", "cache_usable", "cached_cast", "cached_casts", "caster", "clear_autocast_cache",
           "converter", "hook_clear", "hooked", "lookup", "on_device", "unhook_clear"]

_F32, _F64 = torch.float32, torch.float64
_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(fp32 leaf) -> (leaf, cast): process-wide, as torch's
_torch_clear_autocast_cache = torch._C.clear_autocast_cache
_is_cached = torch._C._is_cached_tensor
CACHE = _cache           # the generated kernels' handle on it (ampteach.amp.autocast_fast): _cache is never rebound
lookup = _cache.get      # id(t) -> (t, cast) or None: how the kernels look a weight up
CONVERTERS = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half,   # t.to(dtype), fastest
              torch.float32: torch.Tensor.float}


def cached_casts() -> int:
    """How many weight casts the cache holds now."""
    return len(_cache)


def clear_autocast_cache() -> None:
    """torch.clear_autocast_cache while hooked: empties torch's cache and ampteach's."""
    _torch_clear_autocast_cache()
    _cache.clear()


def cache_usable() -> bool:
    """Whether the weight-cast cache may serve now: the region's cache_enabled, and not in inference mode."""
    return torch.is_autocast_cache_enabled() and not torch.is_inference_mode_enabled()


def hook_clear() -> None:
    """Make torch.clear_autocast_cache (what torch.autocast.__exit__ calls, by that name) empty both caches.

    Only in place of torch's own function: one replaced by something else (a test's mock) is left alone.
    """
    if torch.clear_autocast_cache is _torch_clear_autocast_cache:
        torch.clear_autocast_cache = clear_autocast_cache


def unhook_clear() -> None:
    """Give torch.clear_autocast_cache back to torch, and empty this cache."""
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
