"""PyTorch's own autocast tests, ported: every test runs under torch.autocast (the control) and ampteach.autocast.

Sources (public): the cases are torch/testing/_internal/autocast_test_lists.py, which ships inside the
installed torch (AutocastCPUTestLists for CPU, AutocastTestLists for CUDA); the tests are
test/test_autocast.py of pytorch/pytorch (TestAutocastOps and TestAutocastDeviceType instantiated
for CPU, TestTorchAutocast). Each test takes `impl`; torch's run checks that the port itself is
right, ampteach's must pass the same assertions. On top of torch's assertions:

- every CPU case gives ampteach the same outputs as torch, bit for bit (values and dtypes);
- a case of an op on ampteach's lists is recorded by ampteach's kernel (torch's wrapper did not run
  it), and a case of an unlisted op (eq, add, ...) records nothing: it fell through the key;
- every CUDA case, on fake CUDA tensors, gives ampteach torch's output dtypes (or torch's error).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import sys
import types
import unittest

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import ampteach
from ampteach.lab.compare_torch import TorchAutocast, torch_autocast

pytestmark = [   # torch's own cases include deprecated ops
    pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*is deprecated:UserWarning"),
]

IMPLS = ("torch", "ampteach")


def load_torch_lists() -> types.ModuleType:
    """torch.testing._internal.autocast_test_lists, imported with a stand-in for common_utils.

    The lists use two names from common_utils (TEST_WITH_ROCM, TestCase), whose module imports the
    test-only package expecttest, which torch does not install. The stand-in gives those two.
    """
    name = "torch.testing._internal.common_utils"
    stand_in = types.ModuleType(name)
    stand_in.TEST_WITH_ROCM, stand_in.TestCase = False, unittest.TestCase
    saved = sys.modules.get(name)
    sys.modules[name] = stand_in
    try:
        sys.modules.pop("torch.testing._internal.autocast_test_lists", None)
        return importlib.import_module("torch.testing._internal.autocast_test_lists")
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


LISTS = load_torch_lists()


def region(impl: str, device: str = "cpu", dtype: torch.dtype | None = None, enabled: bool = True, **kwargs):
    if impl == "torch":   # torch's own kernels: ampteach's, once registered, would serve torch.autocast too
        return TorchAutocast(device_type=device, dtype=dtype, enabled=enabled, **kwargs)
    return ampteach.autocast(device_type=device, dtype=dtype, enabled=enabled, **kwargs)


# ---------------------------------------------------------------------------------------------------
# TestAutocast._run_autocast_outofplace (autocast_test_lists.py), with the region as a parameter

def cast(val, to_type):
    if isinstance(val, torch.Tensor):
        return val.to(to_type) if val.is_floating_point() else val
    if isinstance(val, collections.abc.Iterable):
        return type(val)(cast(v, to_type) for v in val)
    return val


def compare(first, second) -> bool:
    if isinstance(first, torch.Tensor):
        return torch.equal(first, second)
    if isinstance(first, collections.abc.Iterable) and not isinstance(first, str):
        return all(compare(f, s) for f, s in zip(first, second, strict=False))
    return first == second


def run_autocast_outofplace(impl, op, args, run_as_type, device="cpu", out_type=None, module=torch,
                            add_kwargs=None, amp_dtype=torch.bfloat16, records=None):
    """torch's helper, line for line, with `impl`'s region; returns what it compared (for torch vs ampteach)."""
    add_kwargs = add_kwargs or {}
    assert not torch.is_autocast_enabled(device_type=device)
    extra = {"record": True} if impl == "ampteach" else {}
    with region(impl, device, amp_dtype, **extra) as ctx:
        assert torch.is_autocast_enabled(device_type=device)
        out_type = out_type if out_type is not None else run_as_type
        output = output_method = None
        if module is not None and hasattr(module, op):
            output = getattr(module, op)(*args, **add_kwargs)
            if isinstance(output, torch.Tensor):
                assert out_type == output.dtype, \
                    f"autocast for torch.{op} produced {output.dtype}, should produce {out_type}"
        if hasattr(torch.Tensor, op):
            output_method = getattr(args[0], op)(*args[1:], **add_kwargs)
            if isinstance(output_method, torch.Tensor):
                assert out_type == output_method.dtype, \
                    f"autocast for torch.{op} produced {output_method.dtype}, should produce torch.{out_type}"
        assert (output is not None) or (output_method is not None), f"{op} not found on Tensor or {module}"
        if (output is not None) and (output_method is not None):
            assert type(output) is type(output_method)
            assert compare(output, output_method), f"torch.{op} result did not match Tensor.{op} result"
        output_to_compare = output if output is not None else output_method
        with region(impl, device, enabled=False):
            assert not torch.is_autocast_enabled(device_type=device)
            if module is not None and hasattr(module, op):
                control = getattr(module, op)(*cast(args, run_as_type), **add_kwargs)
            else:
                control = getattr(args[0].to(run_as_type), op)(*cast(args[1:], run_as_type), **add_kwargs)
            assert type(output_to_compare) is type(control)
            assert compare(output_to_compare, control), f"torch.{op} result did not match control"
        assert torch.is_autocast_enabled(device_type=device)
    assert not torch.is_autocast_enabled(device_type=device)
    if records is not None and impl == "ampteach":
        records.extend(ctx.records)
    return output_to_compare


def args_maybe_kwargs(op_with_args):
    if len(op_with_args) == 2:
        return op_with_args[0], op_with_args[1], {}
    return op_with_args[0], op_with_args[1], op_with_args[2]


# ---------------------------------------------------------------------------------------------------
# TestAutocastOps on CPU: every AutocastCPUTestLists case

CPU = LISTS.AutocastCPUTestLists(torch.device("cpu"))
AMP_DTYPE = torch.get_autocast_dtype("cpu")


def cpu_runs() -> dict[str, tuple]:
    """test id -> (list, one call of _run_autocast_outofplace as kwargs, whether the op is on ampteach's lists)."""
    from ampteach.amp.cast_lists import policy_of

    runs = {}

    def add(list_name, i, op, listed, **kwargs):
        runs[f"{list_name}-{i}-{op}"] = (kwargs | {"op": op}, listed)

    for i, (op, args1, args2, out_type) in enumerate(CPU.torch_expect_builtin_promote):
        add("torch_expect_builtin_promote", f"{i}a", op, False, args=args1, run_as_type=torch.float32,
            out_type=out_type)
        add("torch_expect_builtin_promote", f"{i}b", op, False, args=args2, run_as_type=torch.float32,
            out_type=out_type,
            amp_dtype=torch.float16)
    for i, (op, args1, args2, out_type) in enumerate(CPU.methods_expect_builtin_promote):
        add("methods_expect_builtin_promote", f"{i}a", op, False, args=args1, run_as_type=torch.float32, module=None,
            out_type=out_type)
        add("methods_expect_builtin_promote", f"{i}b", op, False, args=args2, run_as_type=torch.float32, module=None,
            out_type=out_type, amp_dtype=torch.float16)
    for list_name, run_as, module in (("torch_16", AMP_DTYPE, torch), ("nn_16", AMP_DTYPE, torch._C._nn),
                                      ("torch_fp32", torch.float32, torch), ("nn_fp32", torch.float32, torch._C._nn)):
        for i, op_with_args in enumerate(getattr(CPU, list_name)):
            op, args, kwargs = args_maybe_kwargs(op_with_args)
            add(list_name, i, op, policy_of(op, "cpu") is not None, args=args, run_as_type=run_as, module=module,
                add_kwargs=kwargs, amp_dtype=AMP_DTYPE)
    for i, (op, args1, args2) in enumerate(CPU.torch_need_autocast_promote):
        add("torch_need_autocast_promote", f"{i}a", op, True, args=args1, run_as_type=torch.float32)
        add("torch_need_autocast_promote", f"{i}b", op, True, args=args2, run_as_type=torch.float32,
            amp_dtype=torch.float16)
    return runs


CPU_RUNS = cpu_runs()


def test_every_cpu_list_is_ported():
    lists = {"torch_expect_builtin_promote", "methods_expect_builtin_promote", "torch_16", "nn_16", "torch_fp32",
             "nn_fp32", "torch_need_autocast_promote"}
    assert {name for name in vars(CPU) if isinstance(getattr(CPU, name), list)} == lists
    total = sum(len(getattr(CPU, name)) * (2 if "promote" in name else 1) for name in lists)
    assert len(CPU_RUNS) == total


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("run", sorted(CPU_RUNS))
def test_autocast_cpu_lists(impl, run):
    kwargs, listed = CPU_RUNS[run]
    records: list = []
    output = run_autocast_outofplace(impl, records=records, **kwargs)
    if impl == "ampteach":
        control = run_autocast_outofplace("torch", **kwargs)
        assert type(output) is type(control) and compare(output, control), "ampteach's result differs from torch's"
        assert _dtypes(output) == _dtypes(control)
        # a listed op was served by ampteach's kernel (each call recorded); an unlisted one fell through
        assert {r.op for r in records} == ({kwargs["op"]} if listed else set())


def _dtypes(value):
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, (list, tuple)):
        return [_dtypes(v) for v in value]
    return type(value)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_rnn(impl):
    """torch skips this where oneDNN has no bf16 LSTM; here it runs either way: the region's outcome
    (outputs, or the error oneDNN raises) must be torch's."""
    torch.manual_seed(0)
    x, hx, cx = torch.randn(1, 2, 1), torch.randn(2, 2, 1), torch.randn(2, 2, 1)
    m = torch.nn.LSTM(1, 1, 2).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"RNN input dtype .* does not match weight dtype"):
        m(x, (hx, cx))
    outcomes = []
    for name in (impl, "torch"):
        try:
            with region(name, "cpu"):
                outcomes.append(m(x, (hx, cx)))
        except RuntimeError as exc:   # oneDNN without bf16 support: "could not create a primitive descriptor"
            outcomes.append(str(exc))
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not isinstance(outcomes[0], str)   # torch's own test: the region runs
    assert type(outcomes[0]) is type(outcomes[1]) and compare(outcomes[0], outcomes[1])


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_disabled_with_fp32_dtype(impl):
    with region(impl, "cpu", dtype=torch.float32, enabled=False):
        _ = torch.ones(10)


@pytest.mark.parametrize("impl", IMPLS)
def test_generic_autocast(impl):
    for op_with_args in CPU.torch_16:
        op, args, maybe_kwargs = args_maybe_kwargs(op_with_args)
        with region(impl, "cpu"):
            output1 = getattr(torch, op)(*args, **maybe_kwargs)
        with region(impl, "cpu"):
            output2 = getattr(torch, op)(*args, **maybe_kwargs)
        assert compare(output1, output2)


def test_cpu_autocast_deprecated_warning():
    """torch only: torch.cpu.amp.autocast is torch's deprecated spelling; ampteach has no such alias."""
    with pytest.warns(FutureWarning, match=r"`torch.cpu.amp.autocast\(args...\)` is deprecated. "
                                           r"Please use `torch.amp.autocast\('cpu', args...\)` instead."):
        with torch.cpu.amp.autocast():
            _ = torch.ones(10)


# ---------------------------------------------------------------------------------------------------
# TestAutocastDeviceType, instantiated for CPU (the accelerator-only tests run on CPU here too)

class CustomLinear(torch.autograd.Function):
    impl = "torch"

    @staticmethod
    def forward(ctx, x, w_t):
        ctx.save_for_backward(x, w_t)
        ctx.device_type = x.device.type
        return torch.nn.functional.linear(x, w_t)

    @staticmethod
    def backward(ctx, grad_output):
        x, w_t = ctx.saved_tensors
        with region(CustomLinear.impl, ctx.device_type):
            dL_dX = torch.matmul(grad_output, w_t)
            dL_dW = torch.matmul(x.transpose(0, 1), grad_output).transpose(0, 1)
        return dL_dX, dL_dW


class WeightDTypeCastCounterMode(TorchDispatchMode):
    """torch's: counts casts of one weight, with the cache-clearing at region exit mocked out."""

    def __init__(self, weight, target_dtype, impl):
        super().__init__()
        self.dtype_cast_counter = 0
        self.weight, self.target_dtype, self.impl = weight, target_dtype, impl

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0] is self.weight and kwargs["dtype"] is self.target_dtype:
            self.dtype_cast_counter += 1
        return func(*args, **kwargs)

    def __enter__(self):   # torch's: ampteach's regions also empty the cache through torch.clear_autocast_cache
        self.old_clear_cache = torch.clear_autocast_cache
        torch.clear_autocast_cache = lambda: None
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        torch.clear_autocast_cache = self.old_clear_cache
        torch.clear_autocast_cache()
        return super().__exit__(exc_type, exc_val, exc_tb)


@pytest.mark.parametrize("impl", IMPLS)
def test_cast_cache_is_global(impl, monkeypatch):
    amp_dtype = torch.get_autocast_dtype("cpu")
    data = torch.randn(2, 3)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    monkeypatch.setattr(CustomLinear, "impl", impl)
    with WeightDTypeCastCounterMode(weight, amp_dtype, impl) as mode:
        with region(impl, "cpu"):
            output = CustomLinear.apply(data, weight)
            s = output.sum()
        s.backward()
    assert mode.dtype_cast_counter == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_cache_disabled(impl, monkeypatch):
    amp_dtype = torch.get_autocast_dtype("cpu")
    data = torch.randn(2, 3)
    weight = torch.nn.Parameter(torch.randn(4, 3))
    monkeypatch.setattr(CustomLinear, "impl", impl)
    try:
        torch._C._set_cached_tensors_enabled(True)
        torch._C._add_cached_tensor(weight)
        with WeightDTypeCastCounterMode(weight, amp_dtype, impl) as mode:
            with region(impl, "cpu"):
                output = CustomLinear.apply(data, weight)
                s = output.sum()
            s.backward()
        assert mode.dtype_cast_counter == 2
    finally:
        torch._C._set_cached_tensors_enabled(False)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_prioritize(impl):
    dtype = torch.get_autocast_dtype("cpu")
    with region(impl, "cpu", dtype=dtype):
        t = torch.randn([3, 4, 5], dtype=dtype, requires_grad=True)
        index = torch.randint(low=0, high=3, size=[3, 4, 5], dtype=torch.int64)
        val = torch.randn(1, dtype=dtype)
        res = torch.index_put(t, [index], val)
        loss = res.mean()
        loss.backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_fast_dtype(impl):
    fast_dtype = region(impl, "cpu").fast_dtype
    assert fast_dtype in [torch.float16, torch.bfloat16]
    fast_dtypes = (region(impl, "cpu").fast_dtype, region(impl, "cuda", enabled=False).fast_dtype)
    assert fast_dtypes == (torch.bfloat16, torch.half)


def linear_setup():
    """The setup torch's grad-mode tests share: the device's autocast dtype, a Linear(2, 2) and 8 inputs."""
    return torch.get_autocast_dtype("cpu"), torch.nn.Linear(2, 2), torch.randn(8, 2)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_nograd_caching_issue_158232(impl):
    dtype, model, inp = linear_setup()
    with region(impl, "cpu", dtype=dtype):
        with torch.no_grad():
            out1 = model(inp)
            assert not out1.requires_grad
        out2 = model(inp)
        assert out2.requires_grad and out2.grad_fn is not None
        out2.mean().backward()
    assert model.weight.grad is not None and model.bias.grad is not None


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_inference_mode_interaction(impl):
    dtype, model, inp = linear_setup()
    with region(impl, "cpu", dtype=dtype):
        torch.clear_autocast_cache()
        with torch.inference_mode():
            out1 = model(inp)
            assert not out1.requires_grad and out1.dtype == dtype
        out2 = model(inp)
        assert out2.requires_grad
        out2.mean().backward()
    with torch.inference_mode():
        with region(impl, "cpu", dtype=dtype):
            out = model(inp)
            assert not out.requires_grad and out.dtype == dtype


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_caching_still_works_with_gradients(impl):
    dtype, model, inp = linear_setup()
    with region(impl, "cpu", dtype=dtype):
        out1, out2, out3 = model(inp), model(inp), model(inp)
        assert all(o.requires_grad and o.grad_fn is not None for o in (out1, out2, out3))
        out1.mean().backward(retain_graph=True)
        out2.mean().backward(retain_graph=True)
        out3.mean().backward()


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_mixed_grad_contexts(impl):
    dtype, model, inp = linear_setup()
    with region(impl, "cpu", dtype=dtype):
        with torch.no_grad():
            out1 = model(inp)
            assert not out1.requires_grad
        out2 = model(inp)
        assert out2.requires_grad
        with torch.no_grad():
            out3 = model(inp)
            assert not out3.requires_grad
        out4 = model(inp)
        assert out4.requires_grad
        (out2.mean() + out4.mean()).backward()


# ---------------------------------------------------------------------------------------------------
# TestTorchAutocast

@pytest.mark.parametrize("impl", IMPLS)
def test_invalid_device(impl):
    dev = "not a real device"
    with pytest.raises(RuntimeError, match=f"Invalid device string: '{dev}'"):
        with region(impl, dev):
            _ = torch.tensor(1)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_string_device(impl):
    dev = torch.device("cpu")
    with pytest.raises(ValueError, match=f"Expected `device_type` of type `str`, got: `{type(dev)}`"):
        region(impl, dev)


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_called_with_non_callable(impl):
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"autocast\(\)\(func\) requires a callable, but got Tensor"):
        region(impl, "cpu")(x)


# ---------------------------------------------------------------------------------------------------
# AutocastTestLists (CUDA), on fake CUDA tensors: output dtypes and errors, torch as the control

FAKE = FakeTensorMode()   # one mode: fake tensors are used under the mode that made them


@contextlib.contextmanager
def fake_cuda():
    with FAKE, torch.no_grad():   # autograd must not touch fake CUDA tensors on a CPU-only build
        yield


def cuda_cases() -> dict[str, tuple]:
    """test id -> (module or None, op, args, kwargs, expected dtype or 'error'), built on fake CUDA tensors."""
    with fake_cuda():
        lists = LISTS.AutocastTestLists(torch.device("cuda"))
    cases = {}
    for i, (op, args, out_type) in enumerate(lists.torch_expect_builtin_promote):
        cases[f"torch_expect_builtin_promote-{i}-{op}"] = (torch, op, args, {}, out_type)
    for i, (op, args, out_type) in enumerate(lists.methods_expect_builtin_promote):
        cases[f"methods_expect_builtin_promote-{i}-{op}"] = (None, op, args, {}, out_type)
    for list_name, module, out_type in (("torch_fp16", torch, torch.float16), ("torch_fp32", torch, torch.float32),
                                        ("nn_fp16", torch._C._nn, torch.float16),
                                        ("nn_fp32", torch._C._nn, torch.float32),
                                        ("linalg_fp16", torch._C._linalg, torch.float16),
                                        ("methods_fp16", None, torch.float16), ("methods_fp32", None, torch.float32)):
        for i, item in enumerate(getattr(lists, list_name)):
            op, args = item[0], item[1]
            kwargs = item[2] if len(item) > 2 and isinstance(item[2], dict) else {}
            cases[f"{list_name}-{i}-{op}"] = (module, op, args, kwargs, out_type)
    for i, (op, args) in enumerate(lists.torch_need_autocast_promote):
        cases[f"torch_need_autocast_promote-{i}-{op}"] = (torch, op, args, {}, torch.float32)
    for i, (op, args, module) in enumerate(lists.banned):
        cases[f"banned-{i}-{op}"] = (module, op, args, {}, "error")
    return cases


CUDA_CASES = cuda_cases()
# Cases fake CUDA tensors cannot run on a CPU-only build (cuDNN and CUDA-only kernels, data-dependent
# outputs) and the list's einsum entry, whose equation sits where the test's helper expects arguments:
# both implementations must raise the same error type there.
NOT_RUNNABLE_ON_FAKE_CUDA = {"torch_fp16-10-cudnn_convolution", "torch_fp16-11-cudnn_convolution_transpose",
                             "torch_fp16-17-einsum", "torch_fp16-25-gru_cell", "torch_expect_builtin_promote-10-equal",
                             "torch_need_autocast_promote-7-grid_sampler"}


def run_cuda_case(impl: str, case_id: str):
    module, op, args, kwargs, _ = CUDA_CASES[case_id]
    with fake_cuda():
        ctx = torch_autocast("cuda", torch.float16) if impl == "torch" else ampteach.autocast("cuda", fake_cuda=True)
        try:
            with ctx:
                fn = getattr(module, op) if module is not None else getattr(args[0], op)
                out = fn(*args, **kwargs) if module is not None else fn(*args[1:], **kwargs)
        except Exception as exc:   # the outcome compared: torch's error, raised by both
            return type(exc)
    return _dtypes(out)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case_id", sorted(CUDA_CASES))
def test_autocast_cuda_lists_on_fake_cuda(impl, case_id):
    expected = CUDA_CASES[case_id][-1]
    got = run_cuda_case(impl, case_id)
    if expected == "error":
        assert got is RuntimeError
    elif case_id in NOT_RUNNABLE_ON_FAKE_CUDA:
        assert isinstance(got, type) and issubclass(got, Exception), f"{case_id} runs now: check its dtype"
    else:
        first = got[0] if isinstance(got, list) else got
        assert first == expected, f"{case_id}: {got}, expected {expected}"
    if impl == "ampteach":
        assert got == run_cuda_case("torch", case_id)
