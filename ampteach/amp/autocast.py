"""torch.autocast rebuilt where torch builds it: Python kernels at the dispatcher's Autocast keys.

    with ampteach.autocast("cpu", dtype=torch.bfloat16):      # drop-in for torch.autocast
        loss = F.cross_entropy(model(x), y)                   # linear in bf16, the loss in fp32
    loss.backward()                                           # fp32 parameters get fp32 gradients

    with ampteach.autocast("cpu", record=True) as region:     # beyond torch: what was cast, op by op
        model(x)
    region.records[0]    # CastRecord(op='linear', policy='lower_precision_fp', inputs=(float32, ...), output=bfloat16)

Per listed op call, each eligible input x (floating point, on the region's device, not float64):
lower_precision_fp x -> x.to(dtype); fp32 x -> x.float(); fp32_set_opt_dtype op(x) -> op(x,
dtype=float32); fp32_append_dtype norm(x) -> norm(x, dtype=float32); promote: every input -> the
widest of them; banned: raise.

How. Every tensor carries its device's Autocast dispatch key, which torch keeps switched off per
thread; an autocast region switches it on. Then each op call meets the key first, above autograd:
an op with a kernel there has its inputs cast and is called again below the key (so autograd
records the casts: backward casts each gradient back); an op without one falls through unchanged.
ampteach registers its own Python kernel for every op in ampteach.amp.cast_lists at AutocastCPU and
AutocastCUDA (torch.library), in place of torch's C++ kernels, and sets torch's autocast state
(enabled, dtype, cache_enabled, nesting) exactly as torch.autocast does. So whatever in torch reads
that state sees a region (checkpointing, custom_fwd, nn.LSTM, scripted modules, custom ops), C++
composites decompose into listed ops exactly as under torch, and only listed ops enter Python.

Installing ~250 kernels costs more than a training step, so the first region installs them and
they stay while only ampteach regions run. A kernel reached in a thread with no ampteach region
open was reached from a torch.autocast region: it removes ampteach's library and calls the op
again, so torch's kernels serve from then on; the next ampteach region installs again.

Mixing with torch.autocast, in one thread: inside an ampteach region ampteach's kernels serve every
autocast op, also in a torch.autocast region nested in it (that region only changes the state
the kernels read: dtype, enabled, cache_enabled). A torch.autocast region around an ampteach region
runs ampteach's kernels while the inner region is open and torch's after it. Each implementation
keeps its own weight-cast cache; ampteach's is emptied when the thread's outermost ampteach region
exits (torch's when its nesting count returns to 0).

Threads: regions and torch's autocast state are per thread; the kernels are process-wide. A thread
with no region never reaches them (its Autocast keys are off). A thread in its own ampteach region
is served with its own dtype and records. A thread in a torch.autocast region while another thread
has an ampteach region open is served by ampteach's kernels with torch's casts but without the
weight-cast cache (the dispatch table is not changed under a running region). Installing and
removing kernels changes the process-wide dispatch table: like any torch.library registration it
must not race with op calls in other threads, so open the first ampteach region before starting
threads that run torch.autocast.

Beyond torch: record=True; fake_cuda=True keeps a CUDA region on without a GPU so that its lists
run on fake CUDA tensors (reference.fake_cuda()): dtypes and errors are real, numbers are not.

Known differences from torch.autocast. Not served by ampteach: CUDA's _cudnn_rnn (registered by
CUDA builds only; its kernel re-flattens cuDNN weight buffers with C++ helpers Python cannot reach),
so torch's kernel runs for it. Where torch leaves its state behind, ampteach restores it: a
non-bool cache_enabled raises torch's TypeError before anything is switched on (torch's region has
by then switched autocast on and counted itself), and a region used as a decorator restores its
state per call, also in recursion and across threads (torch keeps one saved state per instance, so
a recursive decorated call leaves autocast on). Errors are torch's types; ampteach's messages say
more (promote with a foreign half type, banned binary_cross_entropy).
"""

from __future__ import annotations

import functools
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from ampteach.amp import cast_lists

DEVICE_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
NOT_SERVED = {("cuda", "_cudnn_rnn")}
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


# ---------------------------------------------------------------------------------------------------
# State: torch keeps enabled/dtype/cache_enabled/nesting; ampteach adds which regions are its own.

class _Thread(threading.local):
    def __init__(self) -> None:
        self.depth = 0                                   # ampteach regions open in this thread
        self.saved: list[tuple[autocast, tuple]] = []    # (region, torch's state before it), innermost last
        self.recorders: list[list[CastRecord]] = []


_thread = _Thread()
_lock = threading.RLock()
_open = 0                                                # ampteach regions open in all threads
_library: torch.library.Library | None = None
_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(fp32 leaf) -> (leaf, cast): process-wide, as torch's


def cached_casts() -> int:
    """How many weight casts ampteach's cache holds now (emptied when the outermost region exits)."""
    return len(_cache)


def clear_autocast_cache() -> None:
    """Empty ampteach's weight-cast cache (torch.clear_autocast_cache's twin; regions call it on exit)."""
    _cache.clear()


def installed() -> bool:
    """Whether ampteach's kernels are registered at the Autocast keys now."""
    return _library is not None


# ---------------------------------------------------------------------------------------------------
# Casting, as torch's at::autocast::cached_cast

def _on_device(device: str) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor is on `device` as autocast counts it (CPU: CPU or oneDNN tensors)."""
    return (lambda t: t.is_cpu or t.is_mkldnn) if device == "cpu" else (lambda t: t.is_cuda)


_CONVERT = {torch.bfloat16: torch.Tensor.bfloat16, torch.float16: torch.Tensor.half, torch.float32: torch.Tensor.float}


def _converter(to: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """t -> t.to(to), by the fastest binding (t.bfloat16() parses no arguments; same op, same graph)."""
    return _CONVERT.get(to) or (lambda t: t.to(to))


def cache_usable() -> bool:
    """Whether the weight-cast cache may serve now: the region's cache_enabled, and not in inference mode."""
    return torch.is_autocast_cache_enabled() and not torch.is_inference_mode_enabled()


def _caster(device: str) -> Callable:
    """cast(t, to, convert, cache) for one device's kernels: torch's at::autocast::cached_cast."""
    cpu = device == "cpu"
    is_cached, grad_enabled = torch._C._is_cached_tensor, torch.is_grad_enabled

    def cast(t: torch.Tensor, to: torch.dtype, convert: Callable, cache: bool) -> torch.Tensor:
        """t.to(to) if t is eligible (floating, on the device, not float64) and not already `to`.

        cache=True (`to` is the region's dtype and cache_usable(), checked once per op call): an fp32
        leaf that requires grad and is not a view is cast once per region, the weight-cast cache. The
        cast is made with grad enabled (a cast first made under no_grad still carries gradients
        later) and keyed by the tensor alone (an inner region with another dtype gets the outer
        region's cast, as in torch). A weight already in the cache is looked up before the view check,
        which cannot change for it.
        """
        dtype = t.dtype
        if dtype is to:
            return t
        if dtype is not _F32 and (dtype is _F64 or not dtype.is_floating_point):
            return t
        if not ((t.is_cpu or t.is_mkldnn) if cpu else t.is_cuda):
            return t
        if cache and dtype is _F32 and t.requires_grad and t.is_leaf:
            hit = _cache.get(id(t))
            if hit is not None and hit[0] is t:     # entered as a non-view (a tensor stays one or the other)
                if not is_cached(t):
                    return hit[1]
            elif not t._is_view() and not is_cached(t):
                if grad_enabled():
                    cast_t = convert(t)
                else:
                    with torch.enable_grad():
                        cast_t = convert(t)
                _cache[id(t)] = (t, cast_t)      # holding t keeps its id from being reused while cached
                return cast_t
        return convert(t)

    return cast


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


# ---------------------------------------------------------------------------------------------------
# Kernels: one per (device, op.overload), built from the op's schema and its policy

def _overload(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


class _Slot(NamedTuple):
    """An argument torch's wrapper casts: a Tensor, a Tensor? or a Tensor[] (not a Tensor?[])."""

    index: int              # in the schema
    name: str
    keyword: bool           # keyword-only: the kernel receives it in kwargs
    is_list: bool
    optional: bool          # Tensor?: cast, but left out of promote's choice of dtype (as in torch)


def _slots(op: torch._ops.OpOverload) -> list[_Slot]:
    slots = []
    for i, arg in enumerate(op._schema.arguments):
        kind = inner = arg.type
        optional = isinstance(kind, torch._C.OptionalType)
        if optional:
            inner = kind.getElementType()
        is_list = isinstance(inner, torch._C.ListType) and not optional
        if is_list:
            inner = inner.getElementType()
        if isinstance(inner, torch._C.TensorType):
            slots.append(_Slot(i, arg.name, arg.kwarg_only, is_list, optional))
    return slots


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


# The course's hot ops, called through their Python bindings, which parse arguments faster than the
# generic torch.ops call. A binding may have other defaults than the schema (torch._C._nn.
# cross_entropy_loss defaults to no reduction), and a Python kernel receives its arguments with the
# trailing defaults left out, so every argument is passed explicitly. With all arguments given, each
# binding resolves to the overload registered (tests compare dispatch traces and bits with torch's).
_BINDINGS: dict[str, Callable] = {
    "linear": torch._C._nn.linear, "mm": torch._C._VariableFunctions.mm, "addmm": torch._C._VariableFunctions.addmm,
    "bmm": torch._C._VariableFunctions.bmm, "baddbmm": torch._C._VariableFunctions.baddbmm,
    "matmul": torch._C._VariableFunctions.matmul, "conv1d": torch._C._VariableFunctions.conv1d,
    "conv2d": torch._C._VariableFunctions.conv2d, "conv3d": torch._C._VariableFunctions.conv3d,
    "cross_entropy_loss": torch._C._nn.cross_entropy_loss, "nll_loss": torch._C._nn.nll_loss,
    "softmax.int": torch._C._VariableFunctions.softmax, "log_softmax.int": torch._C._VariableFunctions.log_softmax,
    "layer_norm": torch._C._VariableFunctions.layer_norm,
}


def _binding_call(name: str, op: torch._ops.OpOverload) -> Callable | None:
    """call(*args, **kwargs) through the op's binding, with the schema's defaults filled in; None if none."""
    binding = _BINDINGS.get(name)
    if binding is None:
        return None
    arguments = op._schema.arguments
    positional = [a.default_value for a in arguments if not a.kwarg_only]
    index = {a.name: i for i, a in enumerate(arguments) if not a.kwarg_only}
    keyword = {a.name: a.default_value for a in arguments if a.kwarg_only}

    def call(*args, **kwargs):
        if kwargs and any(k in index for k in kwargs):   # a positional argument by name (fp32_set_opt_dtype's dtype=)
            args = [*args, *positional[len(args):]]
            for k in [k for k in kwargs if k in index]:
                args[index[k]] = kwargs.pop(k)
        return binding(*args, *positional[len(args):], **(keyword | kwargs if keyword else kwargs))

    return call


def _body(device: str, name: str, policy: str) -> Callable:
    """body(args, kwargs, use_cache) -> the op's result, cast by `policy` as torch's wrapper casts."""
    op = _overload(name)
    on_device, cast = _on_device(device), _caster(device)
    call = _binding_call(name, op) or op._op   # op._op: what OpOverload.__call__ calls, one Python frame less
    slots = _slots(op)
    order = slots[::-1] if _casts_last_argument_first() else slots
    no_autocast = torch._C._DisableAutocast
    get_dtype = torch.get_autocast_dtype
    plain = tuple(slot.index for slot in order if not slot.keyword and not slot.is_list)

    def cast_all(args: tuple, kwargs: dict, to: torch.dtype, cache: bool):
        convert = _converter(to)
        args = list(args)
        n = len(args)
        if len(plain) == len(order):           # the usual op: positional Tensor / Tensor? arguments only
            for i in plain:
                if i < n and args[i] is not None:
                    args[i] = cast(args[i], to, convert, cache)
            return args, kwargs
        kwargs = dict(kwargs)
        for slot in order:
            where, key = (kwargs, slot.name) if slot.keyword else (args, slot.index)
            if (slot.name in kwargs) if slot.keyword else slot.index < n:
                value = where[key]
                if slot.is_list:
                    where[key] = [cast(t, to, convert, cache) if t is not None else t for t in value]
                elif value is not None:
                    where[key] = cast(value, to, convert, cache)
        return args, kwargs

    if policy in ("lower_precision_fp", "fp32") and len(plain) == len(order):   # the hot path, flat
        fp32 = policy == "fp32"
        key = getattr(torch._C.DispatchKey, DEVICE_KEYS[device])
        exclude = torch._C._dispatch_tls_set_dispatch_key_excluded

        def body(args, kwargs, use_cache):
            to = _F32 if fp32 else get_dtype(device)
            convert, cache, args, n = _CONVERT.get(to) or _converter(to), use_cache and not fp32 and cache_usable(), list(args), len(args)
            # Run below the Autocast key, as torch's wrapper does. Its guard excludes every Autocast key; the
            # kernel's own key is the one this op and the ops inside it meet (their tensors are on its device),
            # and switching it costs a third of the guard. It was on when the op reached this kernel.
            exclude(key, True)
            try:
                for i in plain:
                    if i < n:
                        t = args[i]
                        if t is not None and t.dtype is not to:
                            args[i] = cast(t, to, convert, cache)
                return call(*args, **kwargs)
            finally:
                exclude(key, False)
    elif policy == "lower_precision_fp":
        def body(args, kwargs, use_cache):
            with no_autocast():
                args, kwargs = cast_all(args, kwargs, get_dtype(device), use_cache and cache_usable())
                return call(*args, **kwargs)
    elif policy == "fp32":
        def body(args, kwargs, use_cache):
            with no_autocast():
                args, kwargs = cast_all(args, kwargs, _F32, False)
                return call(*args, **kwargs)
    elif policy == "fp32_set_opt_dtype":
        index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype" and not a.kwarg_only), None)

        def body(args, kwargs, use_cache):
            with no_autocast():
                first = args[0]
                if first.is_floating_point() and first.dtype is not _F64 and on_device(first):
                    if index is not None and len(args) > index:
                        if args[index] is None:
                            args = (*args[:index], _F32, *args[index + 1:])
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": _F32}
                return call(*args, **kwargs)
    elif policy == "fp32_append_dtype":
        target = _overload(cast_lists.APPEND_DTYPE_TARGETS[name])
        defaults = [a.default_value for a in op._schema.arguments]

        def body(args, kwargs, use_cache):
            first = args[0]
            eligible = first.is_floating_point() and first.dtype is not _F64 and on_device(first)
            with no_autocast():
                return target(*args, *defaults[len(args):], dtype=_F32 if eligible else first.dtype)
    elif policy == "promote":
        chosen_by = [slot for slot in slots if not slot.optional]   # left to right, as torch's promote_type

        def body(args, kwargs, use_cache):
            low = to = get_dtype(device)
            for slot in chosen_by:
                value = kwargs.get(slot.name) if slot.keyword else args[slot.index] if slot.index < len(args) else None
                for t in (value if slot.is_list else (value,)):
                    to = _prioritize(to, t, low, on_device, name)
            with no_autocast():
                args, kwargs = cast_all(args, kwargs, to, use_cache and to is low and cache_usable())
                return call(*args, **kwargs)
    elif policy == "banned":
        def body(args, kwargs, use_cache):
            raise RuntimeError(BANNED_MESSAGE)
    else:
        raise ValueError(f"{name}: unknown policy {policy!r}")
    return body


def _kernel(device: str, name: str, policy: str) -> Callable:
    """The function registered for `name` at the device's Autocast key."""
    body = _body(device, name, policy)
    op = _overload(name)
    label = cast_lists.base_name(name)
    no_torch_function, modes_on = torch._C.DisableTorchFunction, torch._C._is_torch_function_mode_enabled

    def kernel(*args, **kwargs):
        thread = _thread
        if not thread.depth:
            return _outside_ampteach(op, body, args, kwargs)
        if modes_on():                      # torch's C++ wrapper reaches no torch function mode: nor do our casts
            with no_torch_function():
                return _recorded(label, policy, body, args, kwargs) if thread.recorders else body(args, kwargs, True)
        return _recorded(label, policy, body, args, kwargs) if thread.recorders else body(args, kwargs, True)

    kernel.__name__ = kernel.__qualname__ = f"ampteach_autocast_{device}_{name.replace('.', '_')}"
    return kernel


def _recorded(label: str, policy: str, body: Callable, args: tuple, kwargs: dict):
    inputs = tuple(t.dtype for t in _tensors(args, kwargs))
    out = body(args, kwargs, True)
    record = CastRecord(label, policy, inputs, _first_dtype(out))
    for records in _thread.recorders:
        records.append(record)
    return out


def _outside_ampteach(op: torch._ops.OpOverload, body: Callable, args: tuple, kwargs: dict):
    """A kernel reached with no ampteach region open in this thread: from a torch.autocast region."""
    with _lock:
        others = _open
        if not others:
            uninstall()
    if others:      # another thread's ampteach region runs on these kernels: serve, without the cache
        with torch._C.DisableTorchFunction():
            return body(args, kwargs, False)
    return op(*args, **kwargs)      # dispatched again from the top: torch's own kernel now


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
    """Register ampteach's kernels at AutocastCPU and AutocastCUDA (regions call this; idempotent)."""
    global _library
    with _lock:
        if _library is not None:
            return
        kernels = {device: _kernels(device) for device in DEVICE_KEYS}   # looked up before registering
        lib = torch.library.Library("aten", "IMPL")
        register = lib.m.impl   # what Library.impl calls, without its per-call bookkeeping (lib._destroy undoes both)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Warning only once for all operators")   # overriding is the point
            for device, key in DEVICE_KEYS.items():
                for name, kernel in kernels[device].items():
                    register(name, key, kernel, False)
        _library = lib


def uninstall() -> None:
    """Remove ampteach's kernels: torch's own serve the Autocast keys again."""
    global _library
    with _lock:
        if _library is not None:
            _library._destroy()
            _library = None


# ---------------------------------------------------------------------------------------------------
# The region

class autocast:
    """Context manager and decorator: ops in the region run in `dtype` or float32 by their cast list.

        with autocast("cuda"):                      # float16 on CUDA, bfloat16 on CPU by default
            out = model(x)
        @autocast("cpu", dtype=torch.float16)       # also a decorator, like torch.autocast
        def forward(x): ...

    Arguments and behaviour are torch.autocast's, checked the same way and in the same order: dtype=None
    keeps the device's current dtype; enabled=False switches autocast off inside an enclosing region;
    cache_enabled=None keeps the current cache setting; each region restores on exit the state it found
    on entry (also when regions exit out of order); a CPU dtype other than float16/bfloat16 warns and
    disables the region; "cuda" without a GPU warns and disables it. Devices: "cpu", "cuda" (and
    "cpu:0"...); other devices have their own lists in torch. Beyond torch: record=True collects a
    CastRecord per listed op call in `.records`; fake_cuda=True keeps a CUDA region on without a GPU,
    for fake CUDA tensors (ampteach.lab.compare_torch.fake_cuda()).
    """

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None, *, record: bool = False, fake_cuda: bool = False) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        self.fast_dtype = torch.get_autocast_dtype(device_type) if dtype is None else dtype
        self.device = device_type
        if not torch._C._is_autocast_available(device_type):
            raise RuntimeError(f"User specified an unsupported autocast device_type '{device_type}'")
        lists = _device_type(device_type)
        if lists not in DEVICE_KEYS:
            raise ValueError(f"ampteach.amp.autocast has cast lists for 'cpu' and 'cuda', got device_type={device_type!r}; "
                             f"use torch.autocast({device_type!r}) for that device")
        self._cache_enabled = torch.is_autocast_cache_enabled() if cache_enabled is None else cache_enabled
        self.record = record
        self.records: list[CastRecord] = []
        if enabled:
            if lists == "cuda":
                if not fake_cuda and torch.cuda.amp.common.amp_definitely_not_available():
                    warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast. (To run the "
                                  "CUDA lists on fake CUDA tensors without a GPU, pass fake_cuda=True.)", stacklevel=2)
                    enabled = False
                elif (self.fast_dtype == torch.bfloat16 and torch.cuda.is_available()
                      and not torch.cuda.is_bf16_supported()):
                    raise RuntimeError("Current CUDA Device does not support bfloat16. Please switch dtype to float16.")
            elif self.fast_dtype not in SUPPORTED_DTYPES:
                warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling autocast.\n"
                              "CPU Autocast only supports dtypes of torch.bfloat16, torch.float16 currently. "
                              "Pass dtype=torch.bfloat16 or dtype=torch.float16.", stacklevel=2)
                enabled = False
        self._enabled = enabled

    def __enter__(self) -> autocast:
        global _open
        device = self.device
        before = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), torch.is_autocast_cache_enabled())
        try:   # torch's own setters, so a wrong argument type raises torch's TypeError
            torch.set_autocast_enabled(device, self._enabled)
            torch.set_autocast_dtype(device, self.fast_dtype)
            torch.set_autocast_cache_enabled(self._cache_enabled)
        except TypeError:
            _restore(device, before)
            raise
        torch.autocast_increment_nesting()
        with _lock:
            _open += 1
            if _library is None:
                install()
        thread = _thread
        thread.depth += 1
        thread.saved.append((self, before))
        if self.record:
            self.records = []
            thread.recorders.append(self.records)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        global _open
        thread = _thread
        saved = thread.saved
        i = len(saved) - 1
        while saved[i][0] is not self:          # the innermost entry of self (regions may exit out of order)
            i -= 1
        _, before = saved.pop(i)
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        _restore(self.device, before)
        thread.depth -= 1
        with _lock:
            _open -= 1
        if thread.depth == 0:
            clear_autocast_cache()
        if self.record:   # by identity: two regions' record lists may be equal (both empty)
            thread.recorders[:] = [r for r in thread.recorders if r is not self.records]
        return False

    def __call__(self, func: Callable) -> Callable:
        if not callable(func):
            raise TypeError(f"autocast()(func) requires a callable, but got {type(func).__name__}. "
                            "Did you mean to use autocast as a context manager? For example:\n"
                            "    with ampteach.autocast(device_type=...):\n"
                            "        output = model(input)")

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        decorate_autocast.__script_unsupported = "@autocast() decorator is not supported in script mode"
        return decorate_autocast


@functools.lru_cache(maxsize=64)
def _device_type(device: str) -> str:
    """'cpu:0' -> 'cpu' (a device string's type, as torch.device parses it)."""
    return torch.device(device).type


def _restore(device: str, state: tuple) -> None:
    enabled, dtype, cache_enabled = state
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)


# ---------------------------------------------------------------------------------------------------
# Custom autograd functions

def _cast_inputs(value: Any, device_type: str, dtype: torch.dtype) -> Any:
    """custom_fwd(cast_inputs=...): floating, on-device, non-fp64 tensors in nested containers -> dtype."""
    if isinstance(value, torch.Tensor):
        eligible = value.is_floating_point() and value.device.type == device_type and value.dtype is not _F64
        return value.to(dtype) if eligible else value
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, dict):
        return {_cast_inputs(k, device_type, dtype): _cast_inputs(v, device_type, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_inputs(v, device_type, dtype) for v in value)
    return value


def custom_fwd(fwd: Callable | None = None, *, device_type: str, cast_inputs: torch.dtype | None = None):
    """Decorator for a custom autograd Function's forward (torch.amp.custom_fwd's twin).

        class Square(torch.autograd.Function):
            @staticmethod
            @custom_fwd(device_type="cpu", cast_inputs=torch.float32)   # runs in fp32 inside regions
            def forward(ctx, x): ...

    cast_inputs=None: forward runs under the current autocast state. cast_inputs=dtype: in an enabled
    region, forward runs with autocast off and its floating inputs cast to dtype; outside a region it
    is a no-op. Pair with custom_bwd so backward runs under the state forward used. (torch.amp's own
    decorators work inside ampteach regions too: the state they read is the same.)
    """
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        ctx = args[0]
        ctx._dtype = torch.get_autocast_dtype(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = torch.is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        ctx._fwd_used_autocast = False
        if not torch.is_autocast_enabled(device_type):
            return fwd(*args, **kwargs)
        with autocast(device_type, enabled=False):
            return fwd(*_cast_inputs(args, device_type, cast_inputs), **_cast_inputs(kwargs, device_type, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str):
    """Decorator for a custom autograd Function's backward: runs it under forward's autocast state."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        ctx = args[0]
        with autocast(device_type, enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
