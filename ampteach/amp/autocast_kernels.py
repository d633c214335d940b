"""The machinery behind ampteach.amp.autocast: Python kernels at the dispatcher's Autocast keys.

    install()            # register a kernel for every op in ampteach.amp.cast_lists (the first region does this)
    installed()          # True: from now on they serve every autocast region, torch.autocast's included
    cached_casts()       # how many weight casts the weight-cast cache holds
    uninstall()          # torch's C++ kernels serve again (a reference run); the next ampteach region re-installs

One kernel per (device, op.overload) that torch registers at AutocastCPU or AutocastCUDA, built from
the op's schema and its policy in cast_lists. A kernel casts the op's tensor arguments as torch's
C++ wrapper does (aten/src/ATen/autocast_mode.h: cached_cast, prioritize, set_opt_dtype), then
calls the op again with its own Autocast key switched off. The op's arguments are read from its
schema (ampteach.amp.autocast_schema); the ops that only cast get a kernel written out per op
(ampteach.amp.autocast_fast), the others one built per policy here.

The kernels stay installed once registered, and they read only the autocast state torch keeps
(enabled, dtype, cache_enabled, inference mode): so they serve a torch.autocast region exactly as
torch's kernels would, and switching between the two implementations re-registers nothing. Their
weight-cast cache lives exactly as long as torch's (ampteach.amp.autocast_cache); while they are
registered, torch.clear_autocast_cache is that module's, which empties both.

Registering (about 250 kernels) changes the process-wide dispatch table: like any torch.library
registration, it must not race with op calls in other threads. The first ampteach region entered
outside any other region installs (ampteach.amp.autocast says why not inside one); call install()
yourself before starting threads that will run autocast regions.
"""

from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ampteach.amp import autocast_schema as schema
from ampteach.amp import cast_lists
from ampteach.amp.autocast_cache import cache_usable, cached_casts, caster, hook_clear, hooked, unhook_clear
from ampteach.amp.autocast_cache import on_device as device_test
from ampteach.amp.autocast_fast import fast_cast_kernel

__all__ = ["BANNED_MESSAGE", "DEVICE_KEYS", "NOT_SERVED", "CastRecord", "cached_casts", "ensure_installed",
           "install", "installed", "start_recording", "stop_recording", "uninstall"]

DEVICE_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
NOT_SERVED = {("cuda", "_cudnn_rnn")}   # registered by CUDA builds only; torch's kernel re-flattens cuDNN weights
_F32, _F64 = torch.float32, torch.float64

BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "You called aten::binary_cross_entropy inside a CUDA autocast region. In float16 a sigmoid output close to 1 "
    "rounds to exactly 1 (and a tiny one to 0), so log(1 - p) or log(p) becomes -inf.\n"
    "Use torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss on the "
    "logits (drop the sigmoid): they are safe to autocast (fp32 policy). Or compute this loss after the "
    "region, on outputs cast to float32."
)


@dataclass(frozen=True)
class CastRecord:
    """One call of a listed op in a recording region: its dtypes going in (before casts) and out."""

    op: str
    policy: str
    inputs: tuple[torch.dtype, ...]
    output: torch.dtype | None

    def __str__(self) -> str:
        ins = ", ".join(_short(d) for d in self.inputs)
        return f"{self.op}({ins}) -> {_short(self.output)}  [{self.policy}]"


def _short(dtype: torch.dtype | None) -> str:
    return "-" if dtype is None else str(dtype).removeprefix("torch.")


class _Thread(threading.local):
    def __init__(self) -> None:
        self.recorders: list[list[CastRecord]] = []     # the record lists of this thread's recording regions


_thread = _Thread()
_lock = threading.Lock()
_library: torch.library.Library | None = None


def installed() -> bool:
    """Whether ampteach's kernels are registered at the Autocast keys now."""
    return _library is not None


def start_recording(records: list[CastRecord]) -> None:
    """Append a CastRecord to `records` for every kernel call in this thread, until stop_recording(records)."""
    _thread.recorders.append(records)


def stop_recording(records: list[CastRecord]) -> None:
    """Stop appending to `records` (found by identity: two regions' lists may be equal, both empty)."""
    _thread.recorders[:] = [r for r in _thread.recorders if r is not records]


def _prioritize(current: torch.dtype, t: torch.Tensor, low: torch.dtype, on_device: Callable, op: str) -> torch.dtype:
    """promote: float32 once any eligible input is float32, else the region's dtype; float64 ignored."""
    if t is None or not t.is_floating_point() or not on_device(t) or t.dtype is _F64:
        return current
    if current is _F32 or t.dtype is _F32:
        return _F32
    if current is low and t.dtype is low:
        return low
    raise RuntimeError(
        f"Unexpected floating ScalarType in at::autocast::prioritize: {op} (promote) got a {t.dtype} input "
        f"inside a {low} autocast region. Cast that input to {low} or torch.float32 before calling {op}.")


@functools.lru_cache(maxsize=None)
def _casts_last_argument_first() -> bool:
    """Whether torch's C++ wrappers cast an op's last argument first, probed once on torch's own mm.

    The wrapper casts each argument inside one function call, and C++ leaves the order of
    evaluating call arguments to the compiler (GCC on x86-64: right to left). The order matters:
    it numbers the casts' autograd nodes, and that decides the order in which backward adds up
    gradient contributions. ampteach casts in the order torch's build does.
    """
    if _library is not None:
        raise RuntimeError("probe torch's cast order before installing ampteach's kernels")
    from torch.utils._python_dispatch import TorchDispatchMode

    first, second, seen = torch.zeros(1, 1), torch.ones(1, 1), []

    class Casts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                seen.append(args[0] is second)
            return func(*args, **(kwargs or {}))

    with Casts(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        torch.mm(first, second)
    return seen[0]


# ---------------------------------------------------------------------------------------------------
# Kernel bodies, one builder per policy: body(args, kwargs) -> the op's result, cast as torch casts

def _cast_body(device: str, name: str, policy: str) -> Callable:
    """lower_precision_fp: eligible inputs -> the region's dtype (cached); fp32: -> float32."""
    op = schema.overload(name)
    cast, (call, pad, keywords) = caster(device), schema.call_of(name, op)
    slots = schema.slots(op)
    order = slots[::-1] if _casts_last_argument_first() else slots
    fp32 = policy == "fp32"
    get_dtype, cache_enabled, inference = torch.get_autocast_dtype, torch.is_autocast_cache_enabled, \
        torch.is_inference_mode_enabled
    no_autocast = torch._C._DisableAutocast

    def body(args, kwargs):
        to = _F32 if fp32 else get_dtype(device)
        with no_autocast():
            args, kwargs = _cast_slots(order, cast, args, kwargs, to, not fp32 and cache_enabled() and not inference())
            return call(*args, *pad[len(args):], **(keywords | kwargs))

    return body


def _cast_slots(order: list[schema.Slot], cast: Callable, args: tuple, kwargs: dict, to: torch.dtype, cache: bool):
    """(args, kwargs) with every tensor slot cast, keyword-only and Tensor[] arguments included."""
    args, kwargs, n = list(args), dict(kwargs), len(args)
    for slot in order:
        where, key = (kwargs, slot.name) if slot.keyword else (args, slot.index)
        if (slot.name in kwargs) if slot.keyword else slot.index < n:
            value = where[key]
            if slot.is_list:
                where[key] = [cast(t, to, cache) if t is not None else t for t in value]
            elif value is not None:
                where[key] = cast(value, to, cache)
    return args, kwargs


def _set_opt_dtype_body(device: str, name: str, policy: str) -> Callable:
    """fp32_set_opt_dtype: op(x) -> op(x, dtype=float32) for an eligible x and no dtype given."""
    op = schema.overload(name)
    on_device, (call, pad, keywords) = device_test(device), schema.call_of(name, op)
    no_autocast = torch._C._DisableAutocast
    index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype" and not a.kwarg_only), None)
    defaults = [a.default_value for a in op._schema.arguments]

    def body(args, kwargs):
        first = args[0]
        if first.is_floating_point() and first.dtype is not _F64 and on_device(first):
            if index is not None:           # a positional dtype argument (softmax.int): fill it in
                args = [*args, *defaults[len(args):index + 1]]
                if args[index] is None:
                    args[index] = _F32
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": _F32}
        with no_autocast():
            return call(*args, *pad[len(args):], **(keywords | kwargs))

    return body


def _append_dtype_body(device: str, name: str, policy: str) -> Callable:
    """fp32_append_dtype: norm(x) -> the overload with a dtype argument, norm(x, ..., dtype=float32)."""
    op = schema.overload(name)
    target, on_device = schema.overload(cast_lists.APPEND_DTYPE_TARGETS[name]), device_test(device)
    defaults, no_autocast = [a.default_value for a in op._schema.arguments], torch._C._DisableAutocast

    def body(args, kwargs):
        first = args[0]
        eligible = first.is_floating_point() and first.dtype is not _F64 and on_device(first)
        with no_autocast():
            return target(*args, *defaults[len(args):], dtype=_F32 if eligible else first.dtype)

    return body


def _promote_body(device: str, name: str, policy: str) -> Callable:
    """promote: every input -> the widest floating type among them (float64 and Tensor? ignored)."""
    op = schema.overload(name)
    cast, on_device, (call, pad, keywords) = caster(device), device_test(device), schema.call_of(name, op)
    slots = schema.slots(op)
    order = slots[::-1] if _casts_last_argument_first() else slots
    chosen_by = [slot for slot in slots if not slot.optional]   # left to right, as torch's promote_type
    get_dtype, no_autocast = torch.get_autocast_dtype, torch._C._DisableAutocast

    def body(args, kwargs):
        low = to = get_dtype(device)
        for slot in chosen_by:
            value = kwargs.get(slot.name) if slot.keyword else args[slot.index] if slot.index < len(args) else None
            for t in (value if slot.is_list else (value,)):
                to = _prioritize(to, t, low, on_device, name)
        with no_autocast():
            args, kwargs = _cast_slots(order, cast, args, kwargs, to, to is low and cache_usable())
            return call(*args, *pad[len(args):], **(keywords | kwargs))

    return body


def _banned_body(device: str, name: str, policy: str) -> Callable:
    def body(args, kwargs):
        raise RuntimeError(BANNED_MESSAGE)

    return body


_BODIES = {"lower_precision_fp": _cast_body, "fp32": _cast_body, "fp32_set_opt_dtype": _set_opt_dtype_body,
           "fp32_append_dtype": _append_dtype_body, "promote": _promote_body, "banned": _banned_body}


# ---------------------------------------------------------------------------------------------------
# Kernels, and their registration

def _kernel(device: str, name: str, policy: str) -> Callable:
    """The function registered for `name` at the device's Autocast key."""
    if policy not in _BODIES:
        raise ValueError(f"{name}: unknown policy {policy!r}")
    body = _BODIES[policy](device, name, policy)
    label = cast_lists.base_name(name)
    thread, modes_on = _thread, torch._C._is_torch_function_mode_enabled
    no_torch_function = torch._C.DisableTorchFunction

    def special(args, kwargs):
        run = body if not thread.recorders else functools.partial(_recorded, label, policy, body)
        if modes_on():                      # torch's C++ wrapper reaches no torch function mode: nor do our casts
            with no_torch_function():
                return run(args, kwargs)
        return run(args, kwargs)

    order = schema.slots(schema.overload(name))
    if _casts_last_argument_first():
        order = order[::-1]
    kernel = fast_cast_kernel(device, name, policy, order, special, thread)
    if kernel is None:
        def kernel(*args, **kwargs):
            return special(args, kwargs)

    kernel.__name__ = kernel.__qualname__ = f"ampteach_autocast_{device}_{name.replace('.', '_')}"
    return kernel


def _recorded(label: str, policy: str, body: Callable, args: tuple, kwargs: dict):
    inputs = tuple(t.dtype for t in _tensors(args, kwargs))
    out = body(args, kwargs)
    record = CastRecord(label, policy, inputs, _first_dtype(out))
    for records in _thread.recorders:
        records.append(record)
    return out


def _tensors(args: tuple, kwargs: dict):
    """The tensor arguments of a call, one level into lists (aten's Tensor[] arguments)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


def _first_dtype(out: Any) -> torch.dtype | None:
    if isinstance(out, torch.Tensor):
        return out.dtype
    if isinstance(out, (list, tuple)):
        return next((d for d in map(_first_dtype, out) if d is not None), None)
    return None


@functools.lru_cache(maxsize=None)
def _kernels(device: str) -> dict[str, Callable]:
    """name -> kernel for every table entry torch registers at the device's key (built once)."""
    key = DEVICE_KEYS[device]
    kernels = {}
    for policy, names in cast_lists.TABLES[device].items():
        for name in names:
            base = cast_lists.base_name(name)
            if (device, base) in NOT_SERVED or not hasattr(torch.ops.aten, base):
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
                kernels[name] = _kernel(device, name, policy)
    return kernels


def install() -> None:
    """Register ampteach's kernels at AutocastCPU and AutocastCUDA, in place of torch's (idempotent)."""
    global _library
    with _lock:
        if _library is not None:
            return
        kernels = {device: _kernels(device) for device in DEVICE_KEYS}   # built (and torch probed) before registering
        lib = torch.library.Library("aten", "IMPL")
        register = lib.m.impl   # what Library.impl calls, without its per-call bookkeeping (lib._destroy undoes both)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Warning only once for all operators")   # overriding is the point
            for device, key in DEVICE_KEYS.items():
                for name, kernel in kernels[device].items():
                    register(name, key, kernel, False)
        _library = lib
        hook_clear(_exclusive())


def _exclusive() -> bool:
    """Whether, with ampteach's kernels registered, no kernel of torch's can cache a weight cast: no op is
    left to torch's kernels (NOT_SERVED) and no other autocast device (XPU, MPS, ...) is there to use."""
    left_to_torch = any(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", DEVICE_KEYS[device])
                        for device, name in NOT_SERVED)
    return not left_to_torch and not torch.accelerator.is_available()


def ensure_installed() -> None:
    """install(); when installed, hook torch.clear_autocast_cache again if torch's own is back in its place."""
    if _library is None:
        install()
    elif not hooked():
        hook_clear(_exclusive())


def uninstall() -> None:
    """Remove ampteach's kernels: torch's own serve the Autocast keys again (call it outside any region)."""
    global _library
    with _lock:
        if _library is None:
            return
        _library._destroy()
        _library = None
        unhook_clear()
