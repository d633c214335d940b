"""torch.autocast rebuilt in Python: a torch function mode that casts each op's inputs by its cast list.

    with ampteach.autocast("cpu", dtype=torch.bfloat16):      # drop-in for torch.autocast
        loss = F.cross_entropy(model(x), y)                   # linear in bf16, the loss in fp32
    loss.backward()                                           # grads flow back through the casts, fp32 params get fp32 grads

    with ampteach.autocast("cpu", record=True) as region:     # beyond torch: what was cast, op by op
        model(x)
    region.records[0]    # CastRecord(op='linear', policy='lower_precision_fp', inputs=(float32, ...), output=bfloat16)

Each op call in the region is looked up in ampteach.cast_lists and its eligible inputs (floating
point, on the region's device, not float64) are cast before the op runs:
lower_precision_fp: x -> x.to(dtype); fp32: x -> x.float(); fp32_set_opt_dtype: op(x) -> op(x,
dtype=float32); promote: every input -> the widest among them; banned: raise. Everything else runs
as it is, so in-place ops, out= calls and an explicit dtype= are left alone.

It works above autograd (torch.overrides.TorchFunctionMode sees the Python call before autograd
records it), so each cast is an ordinary `.to()` in the graph: backward casts the gradient back, and
an fp32 parameter receives an fp32 gradient. The same fp32 leaf parameter used twice in one region is
cast once (the weight-cast cache), so its two gradient contributions are summed in half precision
before the cast's backward, exactly as in torch. torch.autocast does the same work in C++, below the
Python API, at the dispatcher's Autocast keys; tests/test_autocast.py checks that both produce the
same dtypes op by op, and bit-identical outputs and gradients for the course's models.

Unlike torch.autocast("cuda"), this one does not switch itself off without a GPU, so its CUDA lists
can be exercised on a CPU with fake CUDA tensors (torch._subclasses.fake_tensor.FakeTensorMode).

How calls map to ops: a C++ binding (torch.mm, Tensor.exp, F.linear, torch.ops.aten.mm) names its
aten op; a Python-level function (F.cross_entropy, torch.norm, F.multi_head_attention_forward) runs
its own body under the mode, so the ops it calls are cast one by one; a C++ composite outside the
lists (CUDA cross_entropy_loss, CPU einsum) takes the policy cast_lists.COMPOSITES gives it.

Two CPU composites cast only part of their work (the LSTM and GRU cells' gate linears): for those,
a Python transcription of their ATen body runs under the mode (cast_lists.TRANSCRIBED).

Known differences from torch.autocast, all from C++ code a Python mode cannot enter: CPU
linalg.pinv computes in fp32 then multiplies in bf16 in torch, here all in fp32; an fp16 nn.LSTM on CPU fails in torch's oneDNN kernel and runs here; and
inference fast paths (nn.TransformerEncoderLayer / nn.MultiheadAttention in eval mode without grad)
switch themselves off while any torch function mode is active, so they take the ordinary path.
"""

from __future__ import annotations

import functools
import threading
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .cast_lists import BUILTIN_OPS, COMPOSITES, DEVICE_TYPES, base_name, policies, registered

DEFAULT_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16}
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)

BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "You called {op} inside an ampteach.autocast('cuda') region. In float16 a sigmoid output close to 1 "
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


class _State(threading.local):
    """Per thread, like torch's: which devices autocast, to what, and the weight-cast cache."""

    def __init__(self) -> None:
        self.enabled = {device: False for device in DEVICE_TYPES}
        self.dtype = dict(DEFAULT_DTYPES)
        self.cache_enabled = True
        self.nesting = 0
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # id(fp32 leaf) -> (leaf, its cast)
        self.recorders: list[list[CastRecord]] = []
        self.mode: AutocastMode | None = None   # on the torch function mode stack while any region is enabled


_state = _State()


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether ampteach.autocast is on for device_type here (torch.is_autocast_enabled's twin)."""
    return _state.enabled[_check_device(device_type)]


def get_autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype lower_precision_fp ops run in on device_type (torch.get_autocast_dtype's twin)."""
    return _state.dtype[_check_device(device_type)]


def cached_casts() -> int:
    """How many weight casts the cache holds now (it is emptied when the outermost region exits)."""
    return len(_state.cache)


def _check_device(device_type: Any) -> str:
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"ampteach.autocast has cast lists for 'cpu' and 'cuda' only, got {device_type!r}; "
                         f"use torch.autocast({device_type!r}) for other devices")
    return device_type


# ---------------------------------------------------------------------------------------------------
# Watching ops: a torch function mode that maps each call to an aten op and, for Python-level
# functions, runs their body under the mode so the ops they call are seen one by one.

def _never(*args: Any, **kwargs: Any) -> bool:
    return False


_OVERRIDE_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_BODIES: dict[Callable, Callable] = {}


def _body_of(func: types.FunctionType) -> Callable:
    """func with its own `if has_torch_function(...): return handle_torch_function(...)` switched off.

    Python-level torch functions (F.cross_entropy, torch.norm, F.multi_head_attention_forward) open
    with that check, which hands the call to the active mode. Running this copy instead lets the
    body run with the mode still active, so every op it calls reaches the mode on its own, the way
    torch's dispatcher sees them. The copy shares func's code, defaults and closure.
    """
    body = _BODIES.get(func)
    if body is None:
        namespace = dict(func.__globals__)
        for name in _OVERRIDE_CHECKS:
            if name in namespace:
                namespace[name] = _never
        body = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
        _BODIES[func] = body
    return body


_BOOLEAN_DISPATCHED = getattr(torch._jit_internal, "boolean_dispatched", {})


def _boolean_branch(func: Callable, args: tuple, kwargs: dict) -> Callable | None:
    """F.max_pool2d and friends pick one of two functions by a flag (return_indices): that one."""
    info = _BOOLEAN_DISPATCHED.get(func)
    if info is None:
        return None
    flag = info["default"]
    if info["arg_name"] in kwargs:
        flag = kwargs[info["arg_name"]]
    elif info["index"] < len(args):
        flag = args[info["index"]]
    return info["if_true"] if flag else info["if_false"]


def _lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """ATen's LSTMCell, CPU path (aten/src/ATen/native/RNN.cpp), op for op: its linears get cast."""
    h, c = hx
    gates = F.linear(h, w_hh, b_hh).add_(F.linear(input, w_ih, b_ih))
    ingate, forgetgate, cellgate, outgate = gates.unsafe_chunk(4, 1)
    ingate, forgetgate, cellgate, outgate = ingate.sigmoid_(), forgetgate.sigmoid_(), cellgate.tanh_(), outgate.sigmoid_()
    cy = (forgetgate * c).add_(ingate * cellgate)
    return outgate * cy.tanh(), cy


def _gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """ATen's GRUCell, CPU path (aten/src/ATen/native/RNN.cpp), op for op: its linears get cast."""
    igates = F.linear(input, w_ih, b_ih).unsafe_chunk(3, 1)
    hgates = F.linear(hx, w_hh, b_hh).unsafe_chunk(3, 1)
    reset_gate = hgates[0].add_(igates[0]).sigmoid_()
    input_gate = hgates[1].add_(igates[1]).sigmoid_()
    new_gate = igates[2].add(hgates[2].mul_(reset_gate)).tanh_()
    return (hx - new_gate).mul_(input_gate).add_(new_gate)


_TRANSCRIPTIONS = {("cpu", "lstm_cell"): _lstm_cell, ("cpu", "gru_cell"): _gru_cell}   # cast_lists.TRANSCRIBED


def _tensors(args: tuple, kwargs: dict):
    """The tensor arguments of a call, one level into lists and tuples (aten's Tensor[] arguments)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    yield item


def _aten_op(func: Any) -> str | None:
    """torch.ops.aten.mm -> 'mm'; torch.ops.aten.softmax.int -> 'softmax.int'; anything else -> None."""
    if isinstance(func, torch._ops.OpOverload):
        namespace, _, name = func._schema.name.partition("::")
        overload = func._overloadname
        return None if namespace != "aten" else name if overload == "default" else f"{name}.{overload}"
    if isinstance(func, torch._ops.OpOverloadPacket):
        namespace, _, name = func._qualified_op_name.partition("::")
        return name if namespace == "aten" else None
    return None


def _first_output_dtype(out: Any) -> torch.dtype | None:
    if isinstance(out, torch.Tensor):
        return out.dtype
    if isinstance(out, (list, tuple)):
        for item in out:
            dtype = _first_output_dtype(item)
            if dtype is not None:
                return dtype
    return None


def _eligible(t: torch.Tensor, device_type: str) -> bool:
    """Autocast casts only floating-point, non-float64 tensors on its own device."""
    on_device = t.is_cuda if device_type == "cuda" else t.is_cpu
    return on_device and t.is_floating_point() and t.dtype is not torch.float64


def _explicit_dtype(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)


class OpWatcher(TorchFunctionMode):
    """A torch function mode that hands every call of a listed (or composite) op to `handle`.

    Subclasses say which devices are on (`device_enabled`) and what to do with a call (`handle`):
    ampteach.autocast casts its inputs; reference.TorchAutocastRecorder only records dtypes while
    torch.autocast casts. Both walk the same calls, so their records line up one to one.
    """

    def __init__(self) -> None:
        super().__init__()
        self._running: set[Callable] = set()
        self._policies = {device: policies(device) for device in DEVICE_TYPES}

    def device_enabled(self, device_type: str) -> bool:
        raise NotImplementedError

    def handle(self, op: str, policy: str, device_type: str, func: Callable, args: tuple, kwargs: dict):
        raise NotImplementedError

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = BUILTIN_OPS.get(func)
        if op is None:
            if type(func) is types.FunctionType:
                return self._run_body(func, args, kwargs)
            op = _aten_op(func)
            if op is None:
                return func(*args, **kwargs)
        if kwargs.get("out") is not None:          # out= variants are not autocast
            return func(*args, **kwargs)
        device_type = self._device_of(args, kwargs)
        if device_type is None:
            return func(*args, **kwargs)
        transcription = _TRANSCRIPTIONS.get((device_type, op))
        if transcription is not None:              # casts inside only: run its body where we can see it
            return self._run_under_mode(transcription, args, kwargs)
        policy = self._policy(op, device_type, args, kwargs)
        if policy is None:
            return func(*args, **kwargs)
        if policy == "fp32_append_dtype" and isinstance(func, torch._ops.OpOverload):
            func = func.overloadpacket              # norm.Scalar has no dtype: let torch pick norm.ScalarOpt_dtype
        return self.handle(base_name(op), policy, device_type, func, args, kwargs)

    def _device_of(self, args: tuple, kwargs: dict) -> str | None:
        """The region device an op belongs to: CUDA if it has a CUDA tensor and CUDA is on, else CPU."""
        has_cpu = False
        for t in _tensors(args, kwargs):
            if t.is_cuda:
                if self.device_enabled("cuda"):
                    return "cuda"
            elif t.is_cpu:
                has_cpu = True
        return "cpu" if has_cpu and self.device_enabled("cpu") else None

    def _policy(self, op: str, device_type: str, args: tuple, kwargs: dict) -> str | None:
        """op is a base name ('mm'), or 'name.overload' for a torch.ops.aten overload called directly."""
        name = base_name(op)
        if "." in op and op not in registered(device_type):   # an overload torch does not autocast (e.g. .out)
            return None
        policy = self._policies[device_type].get(name)
        if policy is None and "." not in op:
            composite = COMPOSITES[device_type].get(name)
            if composite is not None and (composite.applies is None or composite.applies(args, kwargs)):
                policy = composite.policy
        return policy

    def _run_body(self, func: types.FunctionType, args: tuple, kwargs: dict):
        target = _boolean_branch(func, args, kwargs) or func
        if target in self._running:            # its body handed the call back under another name
            return func(*args, **kwargs)
        self._running.add(target)
        try:
            return self._run_under_mode(_body_of(target), args, kwargs)
        finally:
            self._running.discard(target)

    def _run_under_mode(self, body: Callable, args: tuple, kwargs: dict):
        """body(*args, **kwargs) with this mode active again, so the calls inside reach it one by one."""
        torch._C._push_on_torch_function_stack(self)     # what `with self:` does, without its overhead
        try:
            return body(*args, **kwargs)
        finally:
            torch._C._pop_torch_function_stack()


class AutocastMode(OpWatcher):
    """The mode behind every ampteach.autocast region of one thread; policies live in `handle`."""

    def device_enabled(self, device_type: str) -> bool:
        return _state.enabled[device_type]

    def handle(self, op, policy, device_type, func, args, kwargs):
        low = _state.dtype[device_type]
        inputs = tuple(t.dtype for t in _tensors(args, kwargs)) if _state.recorders else ()
        if policy == "banned":
            raise RuntimeError(BANNED_MESSAGE.format(op=f"torch.nn.functional.{op} (aten::{op})"))
        if policy == "lower_precision_fp":
            to = low
        elif policy == "fp32":
            to = torch.float32
        elif policy == "promote":
            to = _widest(op, device_type, low, args, kwargs)
        else:   # fp32_set_opt_dtype / fp32_append_dtype: ask the op for a float32 result, cast nothing
            to = None
            first = next(_tensors(args, kwargs), None)
            if first is not None and _eligible(first, device_type) and not _explicit_dtype(args, kwargs):
                kwargs = {**kwargs, "dtype": torch.float32}
                if policy == "fp32_append_dtype" and len(args) == 1 and "p" not in kwargs:
                    args = (args[0], 2)   # norm(x) is norm(x, p=2); the overload with dtype wants p
        if to is not None:
            args = tuple(_cast_arg(a, to, device_type, low) for a in args)
            kwargs = {k: _cast_arg(v, to, device_type, low) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        if _state.recorders:
            record = CastRecord(op, policy, inputs, _first_output_dtype(out))
            for records in _state.recorders:
                records.append(record)
        return out

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        if not (_state.enabled["cpu"] or _state.enabled["cuda"]):   # inside an enabled=False region
            return func(*args, **(kwargs or {}))
        return super().__torch_function__(func, types_, args, kwargs)


def _widest(op: str, device_type: str, low: torch.dtype, args: tuple, kwargs: dict) -> torch.dtype:
    """promote: float32 once any eligible input is float32, else the region's dtype (float64 ignored).

    Inputs are taken in order, as torch does: a float16 input in a bfloat16 region is an error
    unless a float32 input came before it.
    """
    to = low
    for t in _tensors(args, kwargs):
        if not _eligible(t, device_type):
            continue
        if to is torch.float32 or t.dtype is torch.float32:
            to = torch.float32
        elif t.dtype is not low:
            raise RuntimeError(
                f"{op} (promote policy) got a {t.dtype} input inside a {low} autocast region "
                f"(torch.autocast raises 'Unexpected floating ScalarType in at::autocast::prioritize' "
                f"here too). Cast that input to {low} or torch.float32 before calling {op}.")
    return to


def _cast_arg(value: Any, to: torch.dtype, device_type: str, low: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return _cached_cast(value, to, device_type, low)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cached_cast(v, to, device_type, low) if isinstance(v, torch.Tensor) else v
                           for v in value)
    return value


def _cached_cast(t: torch.Tensor, to: torch.dtype, device_type: str, low: torch.dtype) -> torch.Tensor:
    """t.to(to) if t is eligible; fp32 leaf parameters cast to `low` once per region (the cache).

    Cached: float32 leaves that require grad and are not views, cast to the region's lower dtype,
    cache_enabled, outside inference mode. Keyed by the tensor alone (not by target dtype), as in
    torch: an inner region with another dtype gets the outer region's cast back. The cast is made
    with grad enabled, so a cast first made under no_grad still carries gradients later.
    """
    if t.dtype is to or not _eligible(t, device_type):
        return t
    if (to is low and t.dtype is torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
            and _state.cache_enabled and not torch.is_inference_mode_enabled()):
        hit = _state.cache.get(id(t))
        if hit is not None:
            return hit[1]
        with torch.enable_grad():
            cast = t.to(to)
        _state.cache[id(t)] = (t, cast)   # holding t keeps its id from being reused while cached
        return cast
    return t.to(to)


# ---------------------------------------------------------------------------------------------------
# The region

class autocast:
    """Context manager and decorator: ops in the region run in `dtype` or float32 by their cast list.

        with autocast("cuda"):                      # float16 on CUDA, bfloat16 on CPU by default
            out = model(x)
        @autocast("cpu", dtype=torch.float16)       # also a decorator, like torch.autocast
        def forward(x): ...

    Signature and behaviour follow torch.autocast: dtype=None keeps the current dtype for the device
    (bfloat16 on CPU, float16 on CUDA, or the enclosing region's); enabled=False turns it off inside
    an enclosing region; cache_enabled=None keeps the current cache setting (on by default); nested
    regions restore the outer state when they exit, and the weight-cast cache is emptied when the
    outermost region exits. A dtype other than float16/bfloat16 warns and disables the region, as
    torch does. Beyond torch: record=True collects a CastRecord per listed op call in `.records`.
    """

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None, *, record: bool = False) -> None:
        self.device = _check_device(device_type)
        self.fast_dtype = _state.dtype[self.device] if dtype is None else dtype
        self._cache_enabled = cache_enabled
        self.record = record
        self.records: list[CastRecord] = []
        if enabled and self.fast_dtype not in SUPPORTED_DTYPES:
            warnings.warn(
                f"ampteach.autocast({self.device!r}, dtype={self.fast_dtype}): autocast lowers precision to "
                "torch.bfloat16 or torch.float16 only, so this region runs with autocast disabled. "
                "Pass dtype=torch.bfloat16 or dtype=torch.float16.", stacklevel=2)
            enabled = False
        if (enabled and self.device == "cuda" and self.fast_dtype is torch.bfloat16
                and torch.cuda.is_available() and not torch.cuda.is_bf16_supported()):
            raise RuntimeError("Current CUDA Device does not support bfloat16. Please switch dtype to float16.")
        self._enabled = bool(enabled)
        self._saved: list[tuple] = []

    def __enter__(self) -> autocast:
        state = _state
        pushed = False
        if self._enabled and state.mode is None:
            state.mode = AutocastMode()
            state.mode.__enter__()
            pushed = True
        self._saved.append((state.enabled[self.device], state.dtype[self.device], state.cache_enabled, pushed))
        state.enabled[self.device] = self._enabled
        state.dtype[self.device] = self.fast_dtype
        if self._cache_enabled is not None:
            state.cache_enabled = self._cache_enabled
        state.nesting += 1
        if self.record:
            self.records = []
            state.recorders.append(self.records)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        state = _state
        enabled, dtype, cache_enabled, pushed = self._saved.pop()
        state.nesting -= 1
        if state.nesting == 0:
            state.cache.clear()
        state.enabled[self.device] = enabled
        state.dtype[self.device] = dtype
        state.cache_enabled = cache_enabled
        if self.record:   # by identity: two regions' record lists may be equal (both empty)
            state.recorders[:] = [r for r in state.recorders if r is not self.records]
        if pushed:
            state.mode.__exit__(exc_type, exc_value, traceback)
            state.mode = None
        return False

    def __call__(self, func: Callable) -> Callable:
        if not callable(func):
            raise TypeError(f"autocast()(func) requires a callable, but got {type(func).__name__}. "
                            "Did you mean `with ampteach.autocast(device_type=...):`?")

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return decorate_autocast


# ---------------------------------------------------------------------------------------------------
# Custom autograd functions

def _cast_inputs(value: Any, device_type: str, dtype: torch.dtype) -> Any:
    """custom_fwd(cast_inputs=...): floating, on-device, non-fp64 tensors in nested containers -> dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _eligible(value, device_type) else value
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

    cast_inputs=None: forward runs under the current ampteach.autocast state. cast_inputs=dtype: in an
    enabled region, forward runs with autocast off and its floating inputs cast to dtype; outside a
    region it is a no-op. Pair with custom_bwd so backward runs under the state forward used.
    """
    _check_device(device_type)
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        ctx = args[0]
        ctx._dtype = get_autocast_dtype(device_type)
        if cast_inputs is None:
            ctx._fwd_used_autocast = is_autocast_enabled(device_type)
            return fwd(*args, **kwargs)
        ctx._fwd_used_autocast = False
        if not is_autocast_enabled(device_type):
            return fwd(*args, **kwargs)
        with autocast(device_type, enabled=False):
            return fwd(*_cast_inputs(args, device_type, cast_inputs), **_cast_inputs(kwargs, device_type, cast_inputs))

    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str):
    """Decorator for a custom autograd Function's backward: runs it under forward's autocast state."""
    _check_device(device_type)
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        ctx = args[0]
        with autocast(device_type, enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            return bwd(*args, **kwargs)

    return decorate_bwd
