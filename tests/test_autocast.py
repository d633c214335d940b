"""ampteach.amp.autocast against torch.autocast: the same kernels' work at the same dispatch key, bit for bit.

Sections: (1) the dispatcher: ampteach's kernel serves every op torch registers at the Autocast keys
and nothing else, registered once and kept: it then serves torch.autocast regions too, with the
values, gradients and weight-cast cache of torch's own kernels; (2) each problem of a
Python-level autocast (issue "ampteach.amp.autocast at the dispatcher", its "Why" list) now gives
torch.autocast's values, dtypes and gradients; (3) op by op and on the course's models; (4) region
rules: nesting, decorator, mixing with torch.autocast, out-of-order exit, threads, arguments;
(5) the weight-cast cache, records, custom_fwd/custom_bwd. The torch side of every comparison runs
on torch's own kernels (TorchAutocast, torch_autocast). PyTorch's own autocast tests run against
both implementations in tests/test_torch_autocast_ported.py, its dynamo autocast tests in
tests/test_autocast_compile.py.
"""

from __future__ import annotations

import copy
import pickle
import sys
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import clear_autocast_cache as bound_clear_autocast_cache  # torch's function, as a user takes it
from torch import nn

import ampteach
from ampteach.amp import autocast_cache, cast_lists
from ampteach.amp.autocast import autocast, custom_bwd, custom_fwd
from ampteach.amp.autocast_kernels import (
    BANNED_MESSAGE,
    DEVICE_KEYS,
    NOT_SERVED,
    cached_casts,
    install,
    installed,
    uninstall,
)
from ampteach.lab.compare_torch import (
    OP_CASES,
    TorchAutocast,
    cache_conditions,
    dispatch_trace,
    fake_cuda,
    op_agreement,
    torch_autocast,
)
from ampteach.training.data import course_split, load_fashion_mnist, preload
from ampteach.training.models import cnn, mlp
from ampteach.training.train import autocast_for

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
AUTOCAST = sys.modules["ampteach.amp.autocast"]
AUTOCAST_KERNELS = sys.modules["ampteach.amp.autocast_kernels"]
FAMILIES = {"matmul", "convolution", "attention", "norm", "softmax", "pointwise", "reduction", "loss",
            "promote", "fp64 and integers", "explicit dtype", "out=", "in-place", "pooling and padding",
            "torch.ops.aten"}


def same(a, b) -> bool:
    """Equal structure, dtypes and bits (tensors), or equal values (anything else)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def under_both(make, run, dtype=BF16):
    """run(make(), region) under torch.autocast and under ampteach.autocast, from the same seed.

    Returns both results; an exception is a result too (its type and first line).
    """
    results = []
    for region in (lambda: TorchAutocast("cpu", dtype=dtype), lambda: autocast("cpu", dtype=dtype)):
        torch.manual_seed(0)
        state = make()
        try:
            results.append(run(state, region))
        except Exception as exc:   # compared: torch's error type must be ampteach's (messages may say more)
            results.append(Raised(type(exc).__name__, str(exc).splitlines()[0]))
    return results


class Raised(str):
    """An exception as a result: equal to another of the same type, whatever the message."""

    def __new__(cls, name: str, message: str) -> Raised:
        raised = super().__new__(cls, f"{name}: {message}")
        raised.name = name
        return raised

    def __eq__(self, other) -> bool:
        return isinstance(other, Raised) and self.name == other.name

    __hash__ = str.__hash__


def assert_like_torch(make, run, dtype=BF16, raises=False):
    theirs, ours = under_both(make, run, dtype)
    assert same(theirs, ours), f"torch: {theirs!r:.300}\nampteach: {ours!r:.300}"
    assert isinstance(theirs, str) == raises, theirs
    return theirs


def backward_results(outputs, *tensors):
    """outputs (tensors), then the gradients of every tensor after backward of their float sum."""
    outputs = [o for o in outputs if isinstance(o, torch.Tensor)]
    sum(o.float().sum() for o in outputs).backward()
    return outputs + [t.grad for t in tensors]


# ---------------------------------------------------------------------------------------------------
# (1) the dispatcher

def registrations(key: str) -> set[str]:
    return {name.removeprefix("aten::") for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)}


@pytest.mark.parametrize("device_type", sorted(DEVICE_KEYS))
def test_in_a_region_every_op_torch_registers_runs_ampteachs_kernel_and_torchs_is_inactive(device_type):
    key = DEVICE_KEYS[device_type]
    with autocast("cpu"):
        for name in registrations(key):
            dump = torch._C._dispatch_dump(f"aten::{name}")
            active = [line for line in dump.splitlines() if line.startswith(f"{key}: ")]
            inactive = [line for line in dump.splitlines() if line.startswith(f"{key} (inactive): ")]
            if (device_type, cast_lists.base_name(name)) in NOT_SERVED:
                assert "ampteach" not in active[0], name
                continue
            assert len(active) == 1 and "ampteach/amp/autocast_kernels.py" in active[0], f"{name}: {active}"
            assert inactive and "autocast_mode.cpp" in inactive[0], f"{name}: torch's wrapper should be inactive"


@pytest.mark.parametrize("device_type", sorted(DEVICE_KEYS))
def test_ops_outside_the_lists_are_exactly_those_torch_lets_fall_through(device_type):
    """Installing adds no kernel: the ops with one at the key are torch's, before and after."""
    key = DEVICE_KEYS[device_type]
    uninstall()
    before = registrations(key)
    install()
    assert registrations(key) == before
    build_only = set(cast_lists.CUDA_BUILD_ONLY) if device_type == "cuda" and torch.version.cuda is None else set()
    assert before == set(cast_lists.registered(device_type)) - build_only
    for op in ("relu", "add.Tensor", "batch_norm", "max_pool2d", "gelu"):   # no kernel: falls through
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key)


def test_kernels_stay_installed_between_ampteach_regions():
    a = torch.rand(2, 2)
    with autocast("cpu"):
        a @ a
    assert installed()
    with autocast("cpu"):
        assert installed() and (a @ a).dtype == BF16


def kernel_at_autocast_cpu(op: str) -> str:
    active = [line for line in torch._C._dispatch_dump(f"aten::{op}").splitlines() if line.startswith("AutocastCPU: ")]
    return "ampteach" if "ampteach" in active[0] else "torch"


def test_after_an_ampteach_region_torch_regions_run_ampteachs_kernels_and_nothing_is_registered_again():
    a = torch.rand(8, 8)
    uninstall()
    with autocast("cpu"):
        a @ a
    library = AUTOCAST_KERNELS._library
    for _ in range(3):                              # switching back and forth changes no registration
        with torch.autocast("cpu"):
            assert kernel_at_autocast_cpu("mm") == "ampteach" and (a @ a).dtype == BF16
        with autocast("cpu"):
            assert (a @ a).dtype == BF16
    assert AUTOCAST_KERNELS._library is library
    assert torch.clear_autocast_cache is autocast_cache.clear_autocast_cache   # empties both caches
    uninstall()
    assert kernel_at_autocast_cpu("mm") == "torch" and torch.clear_autocast_cache is torch._C.clear_autocast_cache


def test_an_ampteach_region_inside_a_torch_region_and_after_it_give_torchs_results():
    a = torch.rand(8, 8)
    uninstall()
    with torch.autocast("cpu"):
        before = a @ a                              # torch's kernel (nothing of ampteach's installed)
        with autocast("cpu", record=True) as inner:
            during = a @ a
        after = a @ a                               # ampteach's kernel now serves the torch region
    assert [r.op for r in inner.records] == ["matmul"] and installed()
    assert same(before, during) and same(before, after)


def served_and_native(run):
    """run() under torch.autocast served by torch's own kernels, then by ampteach's (left installed)."""
    uninstall()
    native = run()
    install()
    return native, run()


def outcome(fn):
    """fn()'s result, or the exception it raised (as a Raised)."""
    try:
        return fn()
    except Exception as exc:   # the error is the result: both kernels must raise the same type
        return Raised(type(exc).__name__, str(exc).splitlines()[0])


def same_bits(a, b) -> bool:
    """same(), with NaN equal to NaN in the same places."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point():
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num()) \
            and torch.equal(a.isnan(), b.isnan())
    return same(a, b)


@pytest.mark.parametrize("input_dtype", [FP32, BF16], ids=["fp32-inputs", "bf16-inputs"])
def test_torch_regions_served_by_ampteachs_kernels_give_torchs_values_op_by_op(input_dtype):
    def run():
        results = []
        for case in OP_CASES:
            torch.manual_seed(0)
            with torch.autocast("cpu", dtype=BF16):
                results.append(outcome(lambda case=case: case.call("cpu", input_dtype)))
        return results

    native, served = served_and_native(run)
    differ = [case.label for case, n, s in zip(OP_CASES, native, served) if not same_bits(n, s)]
    assert not differ, differ
    assert sum(isinstance(r, torch.Tensor) for r in native) > len(OP_CASES) // 2


def test_torch_regions_served_by_ampteachs_kernels_give_torchs_dtypes_on_fake_cuda():
    def run():
        results = []
        with fake_cuda():
            for case in OP_CASES:
                for input_dtype in (FP32, FP16):
                    with torch_autocast("cuda", FP16, torch_kernels=False):
                        result = outcome(lambda case=case, t=input_dtype: case.call("cuda", t))
                    results.append(result.dtype if isinstance(result, torch.Tensor) else result)
        return results

    native, served = served_and_native(run)
    assert native == served


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
def test_a_training_step_in_a_torch_region_served_by_ampteachs_kernels_is_torchs(build):
    torch.manual_seed(0)
    model, x, y = build(), torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))

    def run():
        trained = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=BF16), dispatch_trace() as trace:
            loss = F.cross_entropy(trained(x), y)
        loss.backward()
        return [loss, *(p.grad for p in trained.parameters())], trace

    (native, native_trace), (served, served_trace) = served_and_native(run)
    assert same(native, served) and native_trace == served_trace


@pytest.mark.parametrize("what", ["cache on", "cache off", "torch.clear_autocast_cache()", "inner region exits",
                                  "inference mode"])
def test_the_weight_cast_cache_serves_torch_regions_as_torchs_own(what):
    """One cache for both implementations, with torch's lifetime: a torch region served by ampteach's
    kernels caches, goes stale and is emptied exactly where torch's own kernels would."""
    torch.manual_seed(0)
    w, x = torch.randn(16, 16), torch.randn(4, 16)

    def run():
        p = nn.Parameter(w.clone())
        with torch.autocast("cpu", cache_enabled=what != "cache off"):
            first = F.linear(x, p)
            with torch.no_grad():
                p.add_(1.0)                          # a cast served from the cache is now stale: values show it
            if what == "torch.clear_autocast_cache()":
                torch.clear_autocast_cache()
            elif what == "inner region exits":
                with torch.autocast("cpu"):
                    F.linear(x, p)
            if what == "inference mode":
                with torch.inference_mode():
                    return first, F.linear(x, p), None
            second = F.linear(x, p)
        (first.float().sum() + second.float().sum()).backward()   # with the cache: one cast node, one bf16 sum
        return first, second, p.grad

    native, served = served_and_native(run)
    assert same(native, served)
    stale = torch.equal(native[1], F.linear(x.bfloat16(), w.bfloat16()))
    assert stale == (what in ("cache on", "inner region exits"))


def test_a_torch_region_inside_an_ampteach_region_only_changes_what_the_kernels_read():
    a = torch.rand(8, 8)
    with autocast("cpu", record=True) as outer:
        with torch.autocast("cpu", dtype=FP16):
            assert (a @ a).dtype == FP16            # torch's dtype, ampteach's kernel
        with torch.autocast("cpu", enabled=False):
            assert (a @ a).dtype == FP32            # the key is off: no kernel at all
        assert (a @ a).dtype == BF16
        assert installed()
    assert [(r.op, r.output) for r in outer.records] == [("matmul", FP16), ("matmul", BF16)]


# ---------------------------------------------------------------------------------------------------
# (2) what a Python-level autocast got wrong, now as torch

@pytest.mark.parametrize("input_dtype", [FP32, FP16], ids=["fp32-input", "fp16-input"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_activation_checkpointing_gives_torchs_gradients(reentrant, input_dtype):
    """The issue's repro: the recomputed forward runs under the same autocast as the first one (an
    fp16 input too, which a Python-level autocast's fp32 replay fed to an fp32 weight and failed)."""
    def make():
        block = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        return block, torch.randn(4, 8).to(input_dtype).requires_grad_()

    def run(state, region):
        block, x = state
        with region():
            y = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)
        return backward_results([y], x, *block.parameters())

    theirs = assert_like_torch(make, run)
    assert theirs[0].dtype == BF16 and theirs[1].dtype == input_dtype and theirs[2].dtype == FP32


def test_torch_sees_the_region_so_torch_amp_custom_fwd_casts_inputs():
    class Square(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x @ x

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad @ x.t() + x.t() @ grad

    def run(state, region):
        layer, x = state
        with region():
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == BF16
            h = layer(x)
            out = Square.apply(h)
        return backward_results([h, out], *layer.parameters())

    theirs = assert_like_torch(lambda: (nn.Linear(4, 4), torch.randn(4, 4)), run)
    assert theirs[0].dtype == BF16 and theirs[1].dtype == FP32   # forward ran in fp32


@pytest.mark.parametrize("kind", [nn.RNN, nn.GRU, nn.LSTM])
@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "native"])
def test_recurrent_modules_give_torchs_outputs_and_gradients(kind, onednn):
    """nn.RNN/GRU/LSTM run C++ cells that call listed ops: cast inside, exactly as torch (or, where
    oneDNN has no bf16 LSTM on this CPU, the same error as torch)."""
    def run(state, region):
        module, x = state
        with torch.backends.mkldnn.flags(enabled=onednn), region():
            out, hidden = module(x)
        return backward_results([out, *(hidden if isinstance(hidden, tuple) else (hidden,))], x, *module.parameters())

    make = lambda: (kind(3, 5, 2), torch.randn(6, 2, 3, requires_grad=True))   # noqa: E731
    theirs, ours = under_both(make, run)
    assert same(theirs, ours), f"torch: {theirs!r:.200}\nampteach: {ours!r:.200}"
    assert not (isinstance(theirs, str) and kind is not nn.LSTM)


def test_a_bf16_lstm_fed_fp32_input_does_as_torch():
    """Outside a region torch refuses the dtype mismatch; inside, it runs (or oneDNN refuses bf16)."""
    module, x = nn.LSTM(1, 1, 2).to(BF16), torch.randn(1, 2, 1)
    with pytest.raises(ValueError, match="does not match weight dtype"):
        module(x)
    assert_like_torch(lambda: (module, x), lambda state, region: _call_in(region, state[0], state[1]),
                      raises=not torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _call_in(region, fn, *args):
    with region():
        return fn(*args)


@pytest.mark.parametrize("case", ["proj_size", "packed"])
def test_lstm_with_proj_size_or_a_packed_sequence_gives_torchs_results(case):
    from torch.nn.utils.rnn import pack_padded_sequence

    def make():
        return nn.LSTM(3, 5, proj_size=2 if case == "proj_size" else 0), torch.randn(6, 2, 3)

    def run(state, region):
        module, x = state
        with region():
            inputs = pack_padded_sequence(x, [6, 4]) if case == "packed" else x
            out, (h, c) = module(inputs)
        out = out.data if case == "packed" else out
        return backward_results([out, h, c], *module.parameters())

    theirs = assert_like_torch(make, run)
    assert theirs[2].dtype == FP32   # c stays fp32, as in torch


COMPOSITES = {   # C++ composites that do fp32 work around their inner matmul
    "F.bilinear": (lambda: (torch.randn(2, 3), torch.randn(2, 4), torch.randn(5, 3, 4), torch.randn(5)), F.bilinear),
    "torch.cov": (lambda: (torch.randn(4, 6),), torch.cov),
    "torch.corrcoef": (lambda: (torch.randn(4, 6),), torch.corrcoef),
    "F.affine_grid": (lambda: (torch.randn(2, 2, 3),), lambda t: F.affine_grid(t, (2, 1, 4, 4), align_corners=False)),
    "einsum ij,jk->k": (lambda: (torch.randn(3, 4), torch.randn(4, 5)), lambda a, b: torch.einsum("ij,jk->k", a, b)),
    "einsum with a list": (lambda: (torch.randn(3, 4), torch.randn(4, 5)),
                           lambda a, b: torch.einsum("ij,jk->ik", [a, b])),
    "matrix_power(A, -2)": (lambda: (torch.randn(4, 4) + 4 * torch.eye(4),),
                            lambda a: torch.linalg.matrix_power(a, -2)),
    "torch.tensordot": (lambda: (torch.randn(2, 4), torch.randn(4, 3)), lambda a, b: torch.tensordot(a, b, dims=1)),
    "torch.inner": (lambda: (torch.randn(2, 4), torch.randn(3, 4)), torch.inner),
    "F.pad reflect": (lambda: (torch.randn(1, 2, 4, 4),), lambda t: F.pad(t, (1, 1, 1, 1), mode="reflect")),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_cpp_composites_give_torchs_values_and_gradients(name):
    make_inputs, fn = COMPOSITES[name]

    def make():
        return [t.requires_grad_() for t in make_inputs()]

    def run(inputs, region):
        with region():
            out = fn(*inputs)
        return backward_results([out], *inputs)

    assert_like_torch(make, run)


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_torch_sparse_matmuls_do_as_torch(op):
    """torch.sparse.mm/addmm reach the listed mm/addmm: cast as in torch (which then refuses the mix)."""
    def run(state, region):
        a, b, c = state
        with region():
            out = torch.sparse.mm(a.to_sparse(), b) if op == "mm" else torch.sparse.addmm(c, a.to_sparse(), b)
        return backward_results([out], b)

    assert_like_torch(lambda: (torch.randn(3, 4), torch.randn(4, 5, requires_grad=True), torch.randn(3, 5)), run,
                      raises=True)


@pytest.mark.parametrize("compile_", ["script", "trace"])
def test_scripted_and_traced_modules_are_cast(compile_):
    def make():
        module = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        return (torch.jit.script(module) if compile_ == "script" else torch.jit.trace(module, torch.randn(3, 4))), \
            torch.randn(3, 4)

    def run(state, region):
        module, x = state
        with region():
            out = module(x)
        return backward_results([out], *module.parameters())

    theirs = assert_like_torch(make, run)
    assert theirs[0].dtype == BF16


@torch.library.custom_op("ampteach_tests::matmul", mutates_args=())
def custom_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def test_a_custom_op_kernel_is_cast_inside():
    def run(state, region):
        with region():
            return [custom_matmul(*state)]

    theirs = assert_like_torch(lambda: (torch.randn(3, 4), torch.randn(4, 5)), run)
    assert theirs[0].dtype == BF16


def test_convolution_default_overload_is_not_cast_on_cpu():
    """torch registers _convolution.deprecated at AutocastCPU, not _convolution itself."""
    def run(state, region):
        x, w = state
        with region():
            return [torch._convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, False, False, True, True)]

    theirs = assert_like_torch(lambda: (torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)), run)
    assert theirs[0].dtype == FP32


class Logged(torch.Tensor):
    """A tensor subclass whose __torch_function__ logs the Python functions it is handed."""

    calls: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_torch_function_overrides_and_monkeypatches_are_honoured(region, monkeypatch):
    make = {"torch": TorchAutocast, "ampteach": autocast}[region]
    Logged.calls = []
    x = torch.randn(4, 8).as_subclass(Logged)
    with make("cpu"):
        F.embedding(torch.tensor([0, 1]).as_subclass(Logged), torch.randn(3, 4))
        F.layer_norm(x, (8,))
        F.softmin(x, dim=1)
    assert {"embedding", "layer_norm", "softmin"} <= set(Logged.calls)
    calls = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *args, **kwargs: calls.append(1) or linear(*args, **kwargs))
    model = mlp((16, 16))
    with make("cpu"):
        for _ in range(4):
            model(torch.randn(2, 1, 28, 28))
    assert len(calls) == 4 * 3


def test_a_torch_function_mode_sees_the_same_calls_as_under_torch():
    """The region and its kernels add no call a torch function mode sees (the kernels' own casts and
    calls run where every mode is off, or under DisableTorchFunction)."""
    class Log(torch.overrides.TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    seen = []
    for make in (TorchAutocast, autocast):
        torch.manual_seed(0)
        model, log = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), Log()
        with make("cpu"), log:
            F.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0]))
        seen.append(log.calls)
    assert seen[0] == seen[1] and "linear" in seen[0]


@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_out_of_order_exit_leaves_other_modes_alone(region):
    make = {"torch": TorchAutocast, "ampteach": autocast}[region]
    ctx, meta = make("cpu"), torch.device("meta")
    ctx.__enter__()
    meta.__enter__()
    ctx.__exit__(None, None, None)
    try:
        assert torch.empty(1).device.type == "meta" and not torch.is_autocast_enabled("cpu")
    finally:
        meta.__exit__(None, None, None)
    assert torch.empty(1).device.type == "cpu"


# ---------------------------------------------------------------------------------------------------
# (3) op by op, and the course's models

def describe(rows) -> str:
    return "\n".join(f"{r.family} / {r.label} (inputs {r.input_dtype}): torch {r.torch_result!r}, "
                     f"ampteach {r.ampteach_result!r}" for r in rows)


def test_the_cases_cover_every_family():
    assert {case.family for case in OP_CASES} == FAMILIES


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_every_op_case_on_fake_cuda_gives_torchs_dtype_or_error(dtype):
    rows = op_agreement("cuda", dtype, fake=True)
    assert not [r for r in rows if not r.agree], describe(r for r in rows if not r.agree)
    banned = [r for r in rows if r.label == "F.binary_cross_entropy"]
    assert banned and all(r.ampteach_result.startswith("error") for r in banned)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_every_op_case_on_a_real_gpu_gives_torchs_dtype_or_error(dtype):
    if dtype is BF16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    rows = op_agreement("cuda", dtype, fake=False)
    assert not [r for r in rows if not r.agree], describe(r for r in rows if not r.agree)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_every_op_case_on_cpu_gives_torchs_dtype_and_bits_or_error(dtype):
    """CPU kernels are deterministic: not only the dtypes, the values must be identical too."""
    results = {}
    for name, region in (("torch", lambda: torch_autocast("cpu", dtype)),
                         ("ampteach", lambda: autocast("cpu", dtype=dtype))):
        results[name] = []
        for case in OP_CASES:
            for input_dtype in (FP32, dtype):
                torch.manual_seed(0)
                try:
                    with region():
                        results[name].append(case.call("cpu", input_dtype))
                except Exception as exc:   # the error is the result
                    results[name].append(type(exc))
    tensors = sum(isinstance(r, torch.Tensor) for r in results["torch"])
    assert tensors > 1.5 * len(OP_CASES)
    for i, (theirs, ours) in enumerate(zip(results["torch"], results["ampteach"])):
        case = OP_CASES[i // 2]
        assert same(theirs, ours), f"{case.family} / {case.label}: torch {theirs}, ampteach {ours}"


OPS = {   # op -> (call, how many tensor inputs)
    "mm": (torch.mm, 2), "add": (torch.add, 2), "cat": (lambda a, b: torch.cat([a, b]), 2),
    "addcmul": (lambda a, b: torch.addcmul(a, a, b), 2), "atan2": (torch.atan2, 2),
    "linear": (F.linear, 2), "mse_loss": (F.mse_loss, 2), "softmax": (lambda a: torch.softmax(a, 1), 1),
    "exp": (torch.exp, 1), "sum": (torch.sum, 1), "layer_norm": (lambda a: F.layer_norm(a, (4,)), 1),
    "prod": (torch.prod, 1), "log_softmax_dtype": (lambda a: F.log_softmax(a, 1, dtype=FP64), 1),
    "stack": (lambda a, b: torch.stack([a, b]), 2),
    "index_copy": (lambda a, b: a.index_copy(0, torch.tensor([1]), b[:1]), 2),
}
DTYPES = st.sampled_from([FP16, BF16, FP32, FP64, torch.int64])


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(sorted(OPS)), region=st.sampled_from([BF16, FP16]), a=DTYPES, b=DTYPES,
       seed=st.integers(0, 2**16))
def test_any_mix_of_input_dtypes_gives_torchs_result_on_cpu(op, region, a, b, seed):
    """Whatever the inputs' dtypes (half, bf16, fp32, fp64, int): torch's dtype and bits, or torch's error."""
    fn, n = OPS[op]

    def run(_, make_region):
        g = torch.Generator().manual_seed(seed)
        inputs = [(torch.rand(4, 4, generator=g) * 4).to(dtype) for dtype in (a, b)[:n]]
        with make_region():
            return [fn(*inputs)]

    theirs, ours = under_both(lambda: None, run, region)
    assert same(theirs, ours), (theirs, ours)


@pytest.fixture(scope="module")
def batch():
    data = preload(course_split(load_fashion_mnist()))
    x, y = next(data.batches(16, shuffle=True, seed=0))
    return x, y


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
def test_fashion_mnist_models_give_torchs_outputs_gradients_and_dispatch_trace(build, dtype, batch):
    x, y = batch
    torch.manual_seed(0)
    theirs = build()
    ours = copy.deepcopy(theirs)
    results = []
    for model, region in ((theirs, TorchAutocast("cpu", dtype=dtype)), (ours, autocast("cpu", dtype=dtype))):
        with region, dispatch_trace() as trace:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        results.append((logits, loss, trace))
    assert results[0][0].dtype == dtype and same(results[0][0], results[1][0])
    assert results[0][1].dtype == FP32 and same(results[0][1], results[1][1])
    assert results[0][2] == results[1][2], "the same casts and ops, in the same order, below autocast"
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        assert q.grad.dtype == FP32, f"{name}: fp32 parameters get fp32 gradients"
        assert torch.equal(p.grad, q.grad), name


def test_the_training_loop_uses_it():
    region = autocast_for("ampteach", "cpu", "bf16")
    assert isinstance(region, autocast) and region.fast_dtype is BF16
    with autocast_for("ampteach", "cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == FP32


# ---------------------------------------------------------------------------------------------------
# (4) region rules

def mm_dtype() -> torch.dtype:
    return torch.mm(torch.rand(2, 2), torch.rand(2, 2)).dtype


def state(device: str = "cpu") -> tuple:
    return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), torch.is_autocast_cache_enabled()


def nesting() -> int:
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


def reset_torch_state() -> None:
    torch.set_autocast_enabled("cpu", False)
    torch.set_autocast_dtype("cpu", BF16)
    torch.set_autocast_cache_enabled(True)
    for _ in range(nesting()):
        torch.autocast_decrement_nesting()
    torch.clear_autocast_cache()


def test_defaults_are_torchs():
    assert autocast("cpu").fast_dtype == torch.get_autocast_dtype("cpu") == BF16
    assert autocast("cuda", enabled=False).fast_dtype == torch.get_autocast_dtype("cuda") == FP16


@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_nesting_and_enabled_false_restore_the_outer_state(region):
    make = {"torch": TorchAutocast, "ampteach": autocast}[region]
    assert not torch.is_autocast_enabled("cpu")
    with make("cpu"):
        assert torch.is_autocast_enabled("cpu") and mm_dtype() == BF16
        with make("cpu", enabled=False):
            assert not torch.is_autocast_enabled("cpu") and mm_dtype() == FP32
        assert mm_dtype() == BF16
        with make("cpu", dtype=FP16):
            assert mm_dtype() == FP16
            with make("cpu"):                      # dtype=None keeps the enclosing region's dtype
                assert torch.get_autocast_dtype("cpu") == FP16 and mm_dtype() == FP16
            with make("cpu", cache_enabled=False):
                assert not torch.is_autocast_cache_enabled()
            assert torch.is_autocast_cache_enabled()
        assert torch.get_autocast_dtype("cpu") == BF16 and mm_dtype() == BF16
    assert state() == (False, BF16, True) and mm_dtype() == FP32


def test_an_error_inside_a_kernel_leaves_the_region_casting():
    """A listed op that raises (here: shapes that do not match) must not leave its Autocast key switched off."""
    key = torch._C.DispatchKey.AutocastCPU
    with autocast("cpu"):
        with pytest.raises(RuntimeError):
            F.linear(torch.rand(2, 3), torch.rand(4, 5))
        assert not torch._C._dispatch_tls_is_dispatch_key_excluded(key)
        assert mm_dtype() == BF16 and F.linear(torch.rand(2, 3), torch.rand(4, 3)).dtype == BF16


def test_out_of_order_exit_restores_what_torch_restores():
    """Each region restores the state it found on entry: torch's rule, also when exits cross."""
    finals = []
    for make in (TorchAutocast, autocast):
        outer, inner = make("cpu", dtype=FP16), make("cpu", dtype=BF16, cache_enabled=False)
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)
        middle = (state(), mm_dtype())
        inner.__exit__(None, None, None)
        finals.append((middle, state(), mm_dtype(), nesting()))
        reset_torch_state()                            # both leave the outer region's state on, as torch does
    assert finals[0] == finals[1]


def test_an_exception_inside_restores_the_state():
    with pytest.raises(KeyError):
        with autocast("cpu"):
            raise KeyError("boom")
    assert state() == (False, BF16, True) and mm_dtype() == FP32 and cached_casts() == 0


def test_it_is_a_decorator_too_and_recursion_restores_the_state():
    @autocast("cpu")
    def forward(a, depth=0):
        """docstring kept"""
        return forward(a, depth - 1) if depth > 0 else a @ a

    assert forward(torch.rand(2, 2), depth=3).dtype == BF16 and forward.__doc__ == "docstring kept"
    assert state() == (False, BF16, True)
    with pytest.raises(TypeError, match="requires a callable"):
        autocast("cpu")("not a function")


@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_argument_handling_is_torchs(region):
    make = {"torch": TorchAutocast, "ampteach": autocast}[region]
    a = torch.rand(8, 8)
    with make("cpu:0"):                               # a device string with an index is its device type
        assert torch.is_autocast_enabled("cpu") and mm_dtype() == BF16
        indexed = a @ a
    with TorchAutocast("cpu"):
        assert same(indexed, a @ a)
    for bad in ({"enabled": "yes"}, {"enabled": 1}, {"cache_enabled": "no"}, {"cache_enabled": 0}):
        with pytest.raises(TypeError):
            with make("cpu", **bad):
                pass
        if region == "torch":   # torch switches autocast on and counts the region before it checks cache_enabled
            leaked = state() != (False, BF16, True)
            assert leaked == ("cache_enabled" in bad)
            reset_torch_state()
        assert state() == (False, BF16, True) and nesting() == 0
    with pytest.warns(UserWarning, match="not supported"), pytest.raises(TypeError):
        with make("cpu", dtype="bfloat16"):
            pass
    with pytest.warns(UserWarning, match="CPU Autocast only supports dtypes of torch.bfloat16, torch.float16"):
        ctx = make("cpu", dtype=FP64)
    with ctx:
        assert mm_dtype() == FP32
    with pytest.raises(RuntimeError, match="device type at start of device string: gpu"):
        make("gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the machine without a GPU")
@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_cuda_without_a_gpu_warns_and_disables_itself(region):
    make = {"torch": TorchAutocast, "ampteach": autocast}[region]
    with pytest.warns(UserWarning, match="CUDA is not available"):
        ctx = make("cuda")
    with ctx:
        assert not torch.is_autocast_enabled("cuda")


def test_fake_cuda_true_runs_the_cuda_lists_on_fake_cuda_tensors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with fake_cuda(), autocast("cuda", fake_cuda=True, record=True) as region:
            a = torch.empty(4, 4, device="cuda")
            assert torch.mm(a, a).dtype == FP16 and torch.exp(a.half()).dtype == FP32
            assert torch.softmax(a.half(), 1).dtype == FP32
    assert [(r.op, r.policy) for r in region.records] == [
        ("mm", "lower_precision_fp"), ("exp", "fp32"), ("softmax", "fp32_set_opt_dtype")]


def test_banned_binary_cross_entropy_says_what_to_use_instead():
    with fake_cuda():
        p = torch.empty(8, device="cuda").fill_(0.5)
        with pytest.raises(RuntimeError, match="unsafe to autocast") as theirs, torch_autocast("cuda", FP16):
            F.binary_cross_entropy(p, p)
        with pytest.raises(RuntimeError, match="unsafe to autocast") as ours, autocast("cuda", fake_cuda=True):
            F.binary_cross_entropy(p, p)
        with pytest.raises(RuntimeError, match="unsafe to autocast"), autocast("cuda", fake_cuda=True):
            nn.BCELoss()(p.double(), p.double())   # banned whatever the dtype, as in torch
    assert "binary_cross_entropy_with_logits" in str(ours.value) and "BCEWithLogitsLoss" in str(ours.value)
    assert BANNED_MESSAGE.splitlines()[0] == str(theirs.value).splitlines()[0]
    with autocast("cpu"):   # on CPU it is an fp32 op, not banned
        assert F.binary_cross_entropy(torch.full((4,), 0.5), torch.full((4,), 0.5)).dtype == FP32


def test_promote_with_a_foreign_half_type_raises_like_torch():
    a, b = torch.rand(4, dtype=FP16), torch.rand(4, dtype=BF16)
    for region in (TorchAutocast("cpu", dtype=BF16), autocast("cpu", dtype=BF16)):
        with pytest.raises(RuntimeError, match="Unexpected floating ScalarType in at::autocast::prioritize"), region:
            torch.cat([b, a])
    with autocast("cpu", dtype=BF16):   # a float32 input first decides float32, as in torch
        assert torch.cat([torch.rand(4), a, b]).dtype == FP32


def test_another_thread_without_a_region_is_unaffected():
    seen = []
    with autocast("cpu"):
        worker = threading.Thread(target=lambda: seen.append((torch.is_autocast_enabled("cpu"), mm_dtype())))
        worker.start()
        worker.join()
        assert mm_dtype() == BF16
    assert seen == [(False, FP32)]


def test_threads_with_their_own_regions_get_their_own_dtype_and_records():
    results, barrier = {}, threading.Barrier(2)

    def work(dtype):
        with autocast("cpu", dtype=dtype, record=True) as region:
            barrier.wait()
            out = mm_dtype()
            barrier.wait()
        results[dtype] = (out, [r.output for r in region.records])

    threads = [threading.Thread(target=work, args=(dtype,)) for dtype in (BF16, FP16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {BF16: (BF16, [BF16]), FP16: (FP16, [FP16])}


def test_a_torch_region_in_another_thread_is_served_with_torchs_casts_while_an_ampteach_region_is_open():
    a = torch.rand(8, 8)
    with TorchAutocast("cpu"):
        expected = a @ a
    out, opened, done = {}, threading.Event(), threading.Event()

    def torch_thread():
        opened.wait()
        with torch.autocast("cpu"):
            out["value"] = a @ a
        done.set()

    worker = threading.Thread(target=torch_thread)
    worker.start()
    with autocast("cpu"):
        opened.set()
        done.wait(timeout=60)
        assert installed()                       # the table was not changed under the open region
    worker.join()
    assert same(out["value"], expected)


REGION_COPIES = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle round trip": lambda region: pickle.loads(pickle.dumps(region)),
    "deepcopy of a module holding it": lambda region: copy.deepcopy(holder(region)).region,
}


def holder(region) -> nn.Module:
    """A module that keeps a region (an EMA or a wrapper copies such a module with copy.deepcopy)."""
    module = nn.Linear(4, 4)
    module.region = region
    return module


@pytest.mark.parametrize("how", sorted(REGION_COPIES))
@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_a_region_copies_and_pickles_and_the_copy_casts_as_the_original(region, how):
    make = torch.autocast if region == "torch" else autocast
    original = make("cpu", dtype=FP16, cache_enabled=False)
    duplicate = REGION_COPIES[how](original)
    assert type(duplicate) is type(original) and duplicate is not original
    assert (duplicate.device, duplicate.fast_dtype, duplicate._enabled, duplicate._cache_enabled) == \
        ("cpu", FP16, True, False)
    a = torch.rand(4, 4)
    with duplicate:
        assert (a @ a).dtype == FP16 and not torch.is_autocast_cache_enabled()
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("region", ["torch", "ampteach"])
def test_a_subclass_with_its_own_init_works_as_torch_cpu_amp_autocast_does(region):
    """torch.cpu.amp.autocast's pattern: __init__ without device_type, passing "cpu" to the base class."""
    base = torch.autocast if region == "torch" else autocast

    class CPUAutocast(base):
        def __init__(self, enabled=True, dtype=BF16, cache_enabled=True):
            super().__init__("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    a = torch.rand(4, 4)
    with CPUAutocast(dtype=FP16):
        assert (a @ a).dtype == FP16
    with CPUAutocast(enabled=False):
        assert (a @ a).dtype == FP32
    assert (CPUAutocast()(lambda: a @ a))().dtype == BF16
    assert copy.deepcopy(CPUAutocast(dtype=FP16)).fast_dtype == FP16


# ---------------------------------------------------------------------------------------------------
# (5) the weight-cast cache, records, custom_fwd / custom_bwd

def twice(w, x):
    """w used twice in one region: linear(linear(x, w), w)."""
    return F.linear(F.linear(x, w), w).float().sum()


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_a_weight_used_twice_gets_torchs_gradient(cache_enabled):
    """With the cache both uses share one cast, so the two gradients are summed in bf16 before it."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 64), torch.randn(32, 64)
    grads = []
    for region in (TorchAutocast("cpu", cache_enabled=cache_enabled), autocast("cpu", cache_enabled=cache_enabled)):
        p = nn.Parameter(w.clone())
        with region:
            loss = twice(p, x)
            if isinstance(region, autocast):
                assert cached_casts() == (1 if cache_enabled else 0)
        loss.backward()
        grads.append(p.grad)
    assert torch.equal(grads[0], grads[1])


def cast_nodes(t: torch.Tensor) -> set:
    """The autograd nodes of the casts t was computed from."""
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(fn for fn, _ in node.next_functions)
    return {node for node in seen if node.name().startswith("ToCopyBackward")}


@pytest.mark.parametrize("inner", ["cache_enabled=False", "inference_mode", "requires_grad_(False)",
                                   "_add_cached_tensor"])
def test_a_cached_weight_is_not_served_where_torch_would_cast_afresh(inner):
    """ampteach looks the cache up early; an inner no-cache region, inference mode, a weight that no
    longer requires grad or one marked as a cached tensor must still get a fresh cast, as torch's
    cached_cast checks them per call."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 64), torch.randn(32, 64)
    results = []
    for make in (TorchAutocast, autocast):
        p = nn.Parameter(w.clone())
        with make("cpu"):
            first = F.linear(x, p)                       # caches p's bf16 cast
            with torch.no_grad():
                p.add_(1.0)                              # a served cache would now be stale: values show it
            if inner == "cache_enabled=False":
                with make("cpu", cache_enabled=False):
                    second = F.linear(first.detach(), p)
            elif inner == "inference_mode":
                with torch.inference_mode():
                    second = F.linear(first.detach(), p)
            elif inner == "requires_grad_(False)":
                p.requires_grad_(False)
                second = F.linear(first.detach(), p)
                p.requires_grad_(True)
            else:                                        # marked as one of torch's cached tensors (CUDA graph trees)
                torch._C._set_cached_tensors_enabled(True)
                torch._C._add_cached_tensor(p)
                try:
                    second = F.linear(first.detach(), p)
                finally:
                    torch._C._remove_cached_tensor(p)
                    torch._C._set_cached_tensors_enabled(False)
        results.append((first, second, bool(cast_nodes(first) & cast_nodes(second))))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert results[0][2] == results[1][2] is False   # neither hands out the first call's cast node


def test_the_cache_changes_the_gradient_so_it_matters():
    torch.manual_seed(0)
    w, x = torch.randn(64, 64), torch.randn(32, 64)
    grads = []
    for cache_enabled in (True, False):
        p = nn.Parameter(w.clone())
        with autocast("cpu", cache_enabled=cache_enabled):
            loss = twice(p, x)
        loss.backward()
        grads.append(p.grad)
    assert not torch.equal(grads[0], grads[1])


def test_only_fp32_leaf_parameters_are_cached_and_only_until_the_outermost_exit():
    p = nn.Parameter(torch.rand(4, 4))
    x = torch.rand(4, 4)
    with autocast("cpu"):
        x @ x                                            # not a parameter
        p[:2] @ x                                        # a view of one
        (p * 2) @ x                                      # not a leaf
        nn.Parameter(torch.rand(4, 4, dtype=FP64)) @ x.double()   # fp64 is never cast
        assert cached_casts() == 0
        with autocast("cpu"):
            p @ x
            assert cached_casts() == 1
        assert cached_casts() == 1                       # an inner exit keeps the cache
    assert cached_casts() == 0


def test_stale_cast_after_an_in_place_update_inside_a_region_as_in_torch():
    torch.manual_seed(0)
    theirs = nn.Linear(4, 4)
    ours = copy.deepcopy(theirs)
    x = torch.rand(2, 4)
    outputs = []
    for lin, make in ((theirs, TorchAutocast), (ours, autocast)):
        with make("cpu"):
            before = lin(x)
            with torch.no_grad():
                lin.weight.add_(1.0)                     # the cache still holds the old bf16 weight
            stale = lin(x)
        with make("cpu"):
            fresh = lin(x)
        outputs.append((before, stale, fresh))
    assert same(outputs[0], outputs[1])
    before, stale, fresh = outputs[1]
    assert torch.equal(before, stale) and not torch.equal(before, fresh)


def test_an_inner_region_with_another_dtype_gets_the_outer_cast_as_in_torch():
    """The cache is keyed by the tensor alone: torch's quirk, reproduced (a linear of fp16 x and bf16 w)."""
    for region in (TorchAutocast, autocast):
        lin = nn.Linear(4, 4)
        with region("cpu", dtype=BF16):
            lin(torch.rand(2, 4))
            with pytest.raises(RuntimeError), region("cpu", dtype=FP16):
                lin(torch.rand(2, 4))


def test_a_cast_first_made_under_no_grad_still_carries_gradients_and_inference_mode_caches_nothing():
    for region in (TorchAutocast, autocast):
        lin = nn.Linear(4, 4)
        with region("cpu"):
            with torch.no_grad():
                lin(torch.rand(2, 4))
            out = lin(torch.rand(2, 4))
        out.float().sum().backward()
        assert lin.weight.grad is not None and lin.weight.grad.dtype == FP32
        x = torch.rand(2, 4)
        with torch.inference_mode(), region("cpu"):
            before = lin(x)
            lin.weight.add_(1.0)
            assert not torch.equal(before, lin(x))


def test_mixed_regions_share_one_cache_emptied_when_the_outermost_region_of_either_kind_exits():
    """A torch region around an ampteach region: the inner region's cast serves the outer one after it,
    as it would with torch regions only, and the gradient is the all-torch gradient."""
    torch.manual_seed(0)
    w, x = torch.randn(16, 16), torch.randn(4, 16)
    results = []
    for inner_region in (TorchAutocast, autocast):
        p = nn.Parameter(w.clone())
        if inner_region is autocast:
            install()      # (else the ampteach region, inside a region begun on torch's kernels, runs on them)
        with inner_region("cpu") if inner_region is TorchAutocast else torch.autocast("cpu"):
            with autocast("cpu") if inner_region is autocast else torch.autocast("cpu"):
                inner = F.linear(x, p)
            outer = F.linear(x, p)
            shared = bool(cast_nodes(inner) & cast_nodes(outer))
            if inner_region is autocast:
                assert cached_casts() == 1                # not emptied: the torch region is still open
        (inner.float().sum() + outer.float().sum()).backward()
        results.append((inner, outer, shared, p.grad))
    assert cached_casts() == 0
    assert same(results[0], results[1]) and results[1][2] is True


CLEARS = {   # every way a user reaches torch's clear; none of them is ampteach's
    "from torch import clear_autocast_cache": lambda: bound_clear_autocast_cache(),
    "torch._C.clear_autocast_cache": lambda: torch._C.clear_autocast_cache(),
    "torch.clear_autocast_cache": lambda: torch.clear_autocast_cache(),
}


@pytest.mark.parametrize("clear", sorted(CLEARS))
@pytest.mark.parametrize("region", ["ampteach.autocast", "torch.autocast on ampteach's kernels"])
def test_any_way_of_clearing_torchs_cache_clears_the_weight_cast_cache(region, clear):
    """w.data.mul_(2), then torch's clear however it is reached: the weight is cast again, its output
    doubles, in torch and in ampteach (whose cache is emptied with torch's, whichever function did it)."""
    torch.manual_seed(0)
    w, x = torch.randn(8, 8), torch.randn(4, 8)

    def run(p, make):
        with make():
            first = F.linear(x, p)
            p.data.mul_(2)
            CLEARS[clear]()
            second = F.linear(x, p)
        (first.float().sum() + second.float().sum()).backward()
        return first, second, p.grad

    theirs = run(nn.Parameter(w.clone()), lambda: TorchAutocast("cpu"))
    install()
    ours = run(nn.Parameter(w.clone()), lambda: autocast("cpu") if region == "ampteach.autocast"
               else torch.autocast("cpu"))
    assert same(theirs, ours) and torch.equal(ours[1], 2 * ours[0])    # cast again: no stale weight
    assert cached_casts() == 0


def test_the_weight_cast_cache_is_emptied_with_torchs_by_a_clear_from_another_thread():
    """ampteach's cache and torch's live and die together: a bound clear from another thread, mid-region."""
    install()
    p, x = nn.Parameter(torch.rand(4, 4)), torch.rand(4, 4)
    with autocast("cpu"):
        p @ x
        assert cached_casts() == 1 and autocast_cache.ARMED      # torch's cache holds the sentinel's cast
        worker = threading.Thread(target=bound_clear_autocast_cache)
        worker.start()
        worker.join()
        assert cached_casts() == 0 and not autocast_cache.ARMED
        p @ x
        assert cached_casts() == 1 and autocast_cache.ARMED
    assert cached_casts() == 0


def test_the_sentinel_stays_armed_across_region_exits_while_only_ampteachs_kernels_can_cache():
    """Exits call the hooked torch.clear_autocast_cache: it empties ampteach's cache and leaves torch's alone
    when torch's can hold nothing but the sentinel's cast, so a training loop does not arm it at every step."""
    if not AUTOCAST_KERNELS._exclusive():
        pytest.skip("another autocast device or an op left to torch's kernels: every exit empties torch's cache")
    install()
    p, x = nn.Parameter(torch.rand(4, 4)), torch.rand(4, 4)
    with autocast("cpu"):
        p @ x
    with torch.autocast("cpu"):       # the first exit after registering empties torch's cache for real
        p @ x
    sentinel = autocast_cache.ARMED[0]
    for region in (autocast, torch.autocast, autocast):
        with region("cpu"):
            p @ x
            assert cached_casts() == 1
        assert cached_casts() == 0 and autocast_cache.ARMED == [sentinel]


def test_casts_torchs_kernels_made_before_ampteachs_were_registered_are_emptied_at_the_outer_exit():
    """torch's kernels cache a cast in an outer torch region; a recording region inside registers ampteach's
    (and the hooked clear): the outer exit must still empty torch's cache, or torch's kernels would later
    serve the stale cast."""
    torch.manual_seed(0)
    w, x = torch.randn(8, 8), torch.randn(4, 8)
    p = nn.Parameter(w.clone())
    uninstall()
    with torch.autocast("cpu"):
        first = F.linear(x, p)                  # torch's kernel: torch's cache keeps p's bf16 cast
        with autocast("cpu", record=True):
            assert installed()
    p.data.mul_(2)
    uninstall()
    with torch.autocast("cpu"):
        assert torch.equal(F.linear(x, p), 2 * first)     # cast afresh: torch's cache was emptied


@pytest.mark.parametrize("kernels", ["none registered yet", "registered"])
def test_an_fp16_region_inside_a_bf16_torch_region_meets_torchs_cached_bf16_weight(kernels):
    """torch.autocast(bf16) outside caches the bf16 weight; an fp16 region inside gets it and raises, in torch.
    The same with an ampteach region inside, whether its kernels are registered already or not yet (then
    it runs on torch's kernels, whose cached casts Python cannot read, until the outer region exits)."""
    torch.manual_seed(0)
    w, x = torch.randn(8, 8), torch.randn(4, 8)

    def run(inner):
        p = nn.Parameter(w.clone())
        with torch.autocast("cpu", dtype=BF16):
            F.linear(x, p)
            with inner("cpu", dtype=FP16):
                return F.linear(x, p)

    uninstall()
    theirs = outcome(lambda: run(torch.autocast))
    assert isinstance(theirs, Raised) and "same dtype" in theirs
    if kernels == "registered":
        install()
    else:
        uninstall()
    for _ in range(2):                                  # the first nesting and the second
        assert outcome(lambda: run(autocast)) == theirs
        assert installed() == (kernels == "registered")
    with autocast("cpu"):                               # outside any region: the kernels are registered
        assert installed()
    assert outcome(lambda: run(autocast)) == theirs


def test_records_name_each_listed_call():
    a = torch.rand(4, 4)
    with autocast("cpu", record=True) as region:
        h = torch.relu(a @ a)                     # relu is not listed: not recorded
        F.cross_entropy(h, torch.tensor([0, 1, 2, 3]))
    assert [(r.op, r.policy, r.inputs, r.output) for r in region.records] == [
        ("matmul", "lower_precision_fp", (FP32, FP32), BF16),
        ("cross_entropy_loss", "fp32", (BF16, torch.int64), FP32)]
    assert str(region.records[0]) == "matmul(float32, float32) -> bfloat16  [lower_precision_fp]"


def test_nested_recording_regions_each_keep_their_records():
    a = torch.rand(2, 2)
    with autocast("cpu", record=True) as outer:
        with autocast("cpu", record=True) as inner:
            pass                                   # both lists empty (equal) when the inner one exits
        torch.exp(a @ a)
    assert [r.op for r in outer.records] == ["matmul"] and inner.records == []


def make_function(fwd_decorator, bwd_decorator, seen: list):
    class MatMul(torch.autograd.Function):
        @staticmethod
        @fwd_decorator
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            out = a.mm(b)
            seen.append((a.dtype, b.dtype, out.dtype))
            return out

        @staticmethod
        @bwd_decorator
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            ga, gb = grad.mm(b.t()), a.t().mm(grad)
            seen.append((ga.dtype, gb.dtype))
            return ga, gb

    return MatMul


@pytest.mark.parametrize("cast_inputs", [None, torch.float32], ids=["no-cast", "cast-fp32"])
@pytest.mark.parametrize("decorators", ["torch.amp", "ampteach"])
def test_custom_fwd_and_bwd_behave_like_torchs(cast_inputs, decorators):
    """Both decorator pairs, in both regions: the state they read is torch's, set by either region."""
    module = {"torch.amp": torch.amp, "ampteach": ampteach}[decorators]
    results = []
    for region in (TorchAutocast, autocast):
        seen: list = []
        fn = make_function(module.custom_fwd(device_type="cpu", cast_inputs=cast_inputs),
                           module.custom_bwd(device_type="cpu"), seen)
        torch.manual_seed(0)
        a = torch.rand(4, 4, requires_grad=True)
        b = torch.rand(4, 4, dtype=BF16, requires_grad=True)
        with region("cpu"):
            out = fn.apply(a, b)
        out.float().sum().backward()
        results.append((seen, out, a.grad, b.grad))
    assert results[0][0] == results[1][0] and same(results[0][1:], results[1][1:])
    expected = (FP32, FP32, FP32) if cast_inputs is torch.float32 else (FP32, BF16, BF16)
    assert results[1][0][0] == expected


def test_custom_fwd_outside_a_region_is_a_no_op():
    seen: list = []
    fn = make_function(custom_fwd(device_type="cpu", cast_inputs=torch.float32), custom_bwd(device_type="cpu"), seen)
    fn.apply(torch.rand(2, 2, dtype=BF16), torch.rand(2, 2, dtype=BF16))
    assert seen == [(BF16, BF16, BF16)]


def test_custom_fwd_and_bwd_take_device_type_by_keyword_only():
    def f(ctx, x):
        return x

    for fwd in (torch.amp.custom_fwd, custom_fwd):
        with pytest.raises(TypeError):
            fwd(f, "cpu")
        with pytest.raises(TypeError):
            fwd(f)
    for bwd in (torch.amp.custom_bwd, custom_bwd):
        with pytest.raises(TypeError):
            bwd(f)


def test_no_warnings_from_a_plain_region():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with autocast("cpu"), autocast("cuda", fake_cuda=True):
            torch.mm(torch.rand(2, 2), torch.rand(2, 2))


def test_the_cache_conditions_table_is_torchs():
    """The lesson's table of which tensors are cast once per region: the same for both, as torch's cached_cast."""
    rows = cache_conditions({"torch": TorchAutocast, "ampteach": autocast})
    assert [row[1] for row in rows] == [row[2] for row in rows]
    assert {row[0]: row[1] for row in rows} == {
        "an fp32 parameter p": "once", "p in a region with cache_enabled=False": "twice",
        "p inside torch.inference_mode()": "twice", "a view of p (p[:])": "twice",
        "a result computed from p (p * 1)": "twice", "p.detach() (no grad)": "twice", "a float64 parameter": "never"}
