"""torch.autocast rebuilt where torch builds it: Python kernels at the dispatcher's Autocast keys.

    with ampteach.autocast("cpu", dtype=torch.bfloat16):      # drop-in for torch.autocast
        loss = F.cross_entropy(model(x), y)                   # linear in bf16, the loss in fp32
    loss.backward()                                           # fp32 parameters get fp32 gradients

    with ampteach.autocast("cpu", record=True) as region:     # beyond torch: what was cast, op by op
        model(x)
    region.records[0]    # CastRecord(op='linear', policy='lower_precision_fp', inputs=(float32, ...), output=bfloat16)

The policy, per listed op and eligible input x (floating, on the region's device, not float64): x -> the
region's dtype, x -> float32, op(x) -> op(x, dtype=float32), all inputs -> the widest, or an error (cast_lists).

How. Every tensor carries its device's Autocast dispatch key, which torch keeps switched off per
thread; a region switches it on. Each op call then meets the key first, above autograd: an op with a
kernel there has its inputs cast and is called again below the key (autograd records the casts, so
backward casts each gradient back); an op without one falls through unchanged. The first ampteach
region registers a Python kernel for every op in ampteach.amp.cast_lists in place of torch's C++
kernels (ampteach.amp.autocast_kernels), and every region sets torch's own autocast state (enabled,
dtype, cache_enabled, nesting) exactly as torch.autocast does. So whatever in torch reads that state
sees a region (checkpointing, custom_fwd, nn.LSTM, TorchScript), and C++ composites decompose into
listed ops as under torch. The kernels stay: they serve torch.autocast regions too, exactly as
torch's would, so mixing the two costs nothing. Their weight-cast cache lives as long as torch's:
whatever empties torch's empties it (ampteach.amp.autocast_cache).

When they are registered. By the first ampteach region entered outside any other region of its
thread. A region entered inside a torch.autocast region that ran on torch's kernels runs on them
too, as torch's inner region would: torch's kernels may have cached weight casts there, which Python
cannot read, and kernels registered then would cast those weights again (an inner fp16 region would
then run where torch's raises on the cached bf16 weight). A recording region (record=True) registers
them at once, wherever it is: records are what it is for.

Under torch.compile. Dynamo does not run a region's __enter__: it records torch.autocast's enter
and exit in the graph (torch.amp._enter_autocast / _exit_autocast), which the backend replays, and
AOTAutograd traces the casts through the Autocast key. An ampteach.autocast is a torch.autocast
(a subclass, so dynamo recognises one built outside the compiled code), and one built while dynamo
traces is handed over as the torch.autocast with the same arguments (__new__ below). The graph, its
breaks and its casts are then torch.autocast's; records are collected in eager mode only.

Beyond torch: record=True; fake_cuda=True keeps a CUDA region on without a GPU so that its lists run
on fake CUDA tensors (ampteach.lab.compare_torch.fake_cuda()): dtypes and errors are real, numbers
are not. Where torch leaves its state behind, ampteach restores it: a non-bool cache_enabled raises
torch's TypeError before anything is switched on, and a region used as a decorator restores its
state per call, also in recursion and across threads; custom_fwd(cast_inputs=...) rebuilds a
namedtuple argument field by field (torch's _cast raises TypeError). Not served: CUDA's _cudnn_rnn
(CUDA builds only; torch's kernel re-flattens cuDNN weights with C++ helpers Python cannot reach).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Callable

import torch

from ampteach.amp import autocast_kernels as kernels
from ampteach.amp.autocast_kernels import DEVICE_KEYS, CastRecord
from ampteach.amp.containers import cast_tensors

__all__ = ["SUPPORTED_DTYPES", "CastRecord", "autocast", "custom_bwd", "custom_fwd"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


class _Regions(threading.local):
    def __init__(self) -> None:
        self.saved: list[tuple[autocast, tuple]] = []    # (region, torch's state before it), innermost last


_regions = _Regions()


class autocast(torch.amp.autocast_mode.autocast):
    """Context manager and decorator: ops in the region run in `dtype` or float32 by their cast list.

        with autocast("cuda"):                      # float16 on CUDA, bfloat16 on CPU by default
            out = model(x)
        @autocast("cpu", dtype=torch.float16)       # also a decorator, like torch.autocast
        def forward(x): ...

    Arguments and behaviour are torch.autocast's, checked the same way and in the same order. Each
    region restores on exit the state it found on entry (also when regions exit out of order).

    Args:
        device_type (str): "cpu" or "cuda" (or "cpu:0"...); other devices have their own lists in torch.
        dtype (torch.dtype, optional): the lower precision, float16 or bfloat16. None keeps the
            device's current autocast dtype (bfloat16 on CPU, float16 on CUDA, unless a region set it).
            A CPU dtype other than these two warns and disables the region.
        enabled (bool): False switches autocast off inside the region (also inside an enclosing one).
        cache_enabled (bool, optional): whether fp32 weights are cast once per region (the weight-cast
            cache). None keeps the current setting.
        record (bool): beyond torch: collect a CastRecord per listed op call in `.records`.
        fake_cuda (bool): beyond torch: keep a "cuda" region on without a GPU, for fake CUDA tensors
            (without it, "cuda" without a GPU warns and disables the region, as in torch).
    """

    def __new__(cls, *args, **kwargs):
        """Any arguments, as torch.autocast's (object's) __new__: copy, deepcopy and pickle call it with none,
        a subclass with its own __init__ (as torch.cpu.amp.autocast) with its own."""
        if cls is autocast and torch.compiler.is_compiling():   # dynamo traces: hand it the torch.autocast it knows
            return torch.amp.autocast_mode.autocast(*_torch_arguments(*args, **kwargs))
        return super().__new__(cls)

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
            raise ValueError(f"ampteach.autocast has cast lists for 'cpu' and 'cuda', got device_type={device_type!r}; "
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
        device = self.device
        before = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
                  torch.is_autocast_cache_enabled())
        try:   # torch's own setters, so a wrong argument type raises torch's TypeError
            torch.set_autocast_enabled(device, self._enabled)
            torch.set_autocast_dtype(device, self.fast_dtype)
            torch.set_autocast_cache_enabled(self._cache_enabled)
        except TypeError:
            _restore(device, before)
            raise
        if torch.autocast_increment_nesting() == 1 or self.record:   # not inside another region: see the docstring
            kernels.ensure_installed()
        _regions.saved.append((self, before))
        if self.record:
            self.records = []
            kernels.start_recording(self.records)
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> bool:
        saved = _regions.saved
        i = len(saved) - 1
        while saved[i][0] is not self:          # the innermost entry of self (regions may exit out of order)
            i -= 1
        _, before = saved.pop(i)
        if torch.autocast_decrement_nesting() == 0:   # as torch.autocast: the outermost region empties the cache
            torch.clear_autocast_cache()
        _restore(self.device, before)
        if self.record:
            kernels.stop_recording(self.records)
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


def _torch_arguments(device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                     cache_enabled: bool | None = None, *, record: bool = False, fake_cuda: bool = False) -> tuple:
    """autocast's arguments -> torch.autocast's four (what dynamo gets in place of an ampteach region)."""
    return device_type, dtype, enabled, cache_enabled


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

def custom_fwd(fwd: Callable | None = None, *, device_type: str, cast_inputs: torch.dtype | None = None):
    """Decorator for a custom autograd Function's forward (torch.amp.custom_fwd's twin).

        class Square(torch.autograd.Function):
            @staticmethod
            @custom_fwd(device_type="cpu", cast_inputs=torch.float32)   # runs in fp32 inside regions
            def forward(ctx, x): ...

    Inside an enabled region with cast_inputs set: forward(*cast(args)) with autocast off, where cast
    takes every floating, on-device, non-float64 tensor to cast_inputs, inside containers too
    (ampteach.amp.containers: lists, tuples, mappings, sets, deques, generators, as torch's _cast).
    Pair with custom_bwd so backward runs under the state forward used. (torch.amp's own decorators
    work inside ampteach regions too: the state they read is the same.)

    Args:
        device_type (str): the device whose autocast state forward reads ("cpu", "cuda").
        cast_inputs (torch.dtype, optional): None: forward runs under the current autocast state.
            A dtype: as above inside an enabled region; outside a region it has no effect.
    """
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)

    def cast(t: torch.Tensor) -> torch.Tensor:
        eligible = t.is_floating_point() and t.device.type == device_type and t.dtype is not torch.float64
        return t.to(cast_inputs) if eligible else t

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
            return fwd(*cast_tensors(args, cast), **cast_tensors(kwargs, cast))

    return decorate_fwd


def custom_bwd(bwd: Callable | None = None, *, device_type: str):
    """Decorator for a custom autograd Function's backward: runs it under forward's autocast state.

        @staticmethod
        @custom_bwd(device_type="cpu")
        def backward(ctx, grad): ...

    Args:
        device_type (str): the device whose autocast state custom_fwd saved.
    """
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
