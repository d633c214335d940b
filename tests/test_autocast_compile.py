"""ampteach.autocast under torch.compile: torch.autocast's graphs, graph breaks, dtypes and values.

(1) The compile table: torch.mm in a region with the eager, aot_eager and inductor backends, for
both implementations, with ampteach's kernels registered and not. (2) PyTorch's own dynamo autocast
tests, ported: test/dynamo/test_ctx_manager.py of pytorch/pytorch, the test_autocast* cases (and
test_is_autocast_cpu_enabled, test_graph_break_inlining_autocast) that run on a CPU. Each runs with
`autocast` = torch.autocast (the control, on torch's own kernels) and = ampteach.autocast; torch's
assertions must hold for both, and on top of them the two runs must compile the same number of
graphs, break in the same places and give the same outputs bit for bit. The CUDA-only cases
(test_autocast, test_cuda_amp_autocast, test_autocast_sdpa, test_autocast_float64,
test_autocast_device, and the CUDA halves of test_autocast_arguments_binding and
test_autocast_decorator) need a GPU, as in torch. (3) A small model compiled with inductor, forward
and backward bit for bit against torch.autocast compiled the same way.

Compiling is slow, so each case compiles once per implementation and inductor runs only where it must.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

import ampteach
from ampteach.amp import autocast_kernels
from ampteach.lab.autocast_compile import BACKENDS, compile_table, compiled, has_c_compiler
from ampteach.lab.compare_torch import use_torch_kernels

IMPLS = ("torch", "ampteach")
needs_c_compiler = pytest.mark.skipif(not has_c_compiler(), reason="inductor's CPU kernels need a C++ compiler")


@pytest.fixture(autouse=True, scope="module")
def inductor_cache_of_its_own(tmp_path_factory):
    """Inductor's usual cache may hold code built under other CPU settings (ATEN_CPU_CAPABILITY), which
    computes other bits than a fresh build, for torch.autocast as for ampteach.autocast."""
    with temporary_cache_dir(str(tmp_path_factory.mktemp("inductor"))):
        yield


def region_of(impl: str):
    return torch.autocast if impl == "torch" else ampteach.autocast


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def run_both(make, args, backend="eager", fullgraph=False):
    """make(autocast) compiled for each implementation: {impl: (output, graphs, breaks)}, torch's on its kernels."""
    results = {}
    for impl in IMPLS:
        if impl == "torch":
            use_torch_kernels()
        else:
            autocast_kernels.install()
        torch.manual_seed(0)
        results[impl] = compiled(make(region_of(impl)), args, backend, fullgraph)
    assert same(results["torch"], results["ampteach"]), results
    return results["ampteach"]


# ---------------------------------------------------------------------------------------------------
# (1) the compile table

def mm_in_a_region(autocast):
    def fn(a, b):
        with autocast("cpu", dtype=torch.bfloat16):
            return torch.mm(a, b)
    return fn


@pytest.mark.parametrize("backend", [b if b != "inductor" else pytest.param(b, marks=needs_c_compiler)
                                     for b in BACKENDS])
@pytest.mark.parametrize("kernels", ["registered", "not registered"])
def test_the_compile_table_reads_bfloat16_for_both_implementations(backend, kernels):
    a, b = torch.rand(8, 8), torch.rand(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.mm(a, b)
    use_torch_kernels()
    theirs = compiled(mm_in_a_region(torch.autocast), (a, b), backend)
    if kernels == "registered":
        autocast_kernels.install()
    ours = compiled(mm_in_a_region(ampteach.autocast), (a, b), backend)
    assert same(theirs, ours) and ours[0].dtype == torch.bfloat16 and ours[1:] == (1, 0)
    assert torch.equal(ours[0], expected)
    assert autocast_kernels.installed() == (kernels == "registered")   # a compiled region registers nothing


def test_compile_table_rows():
    rows = compile_table(("eager", "aot_eager"))
    assert rows == [["eager", "bfloat16", "bfloat16", "1 (0) / 1 (0)", "yes"],
                    ["aot_eager", "bfloat16", "bfloat16", "1 (0) / 1 (0)", "yes"]]


def test_dynamo_never_traces_ampteachs_machinery():
    """The region is handed over before __enter__ runs: no frame of ampteach is compiled, nothing recompiles."""
    autocast_kernels.uninstall()
    a = torch.rand(4, 4)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        for dtype in (torch.bfloat16, torch.float16):
            def fn(x, dtype=dtype):
                with ampteach.autocast("cpu", dtype=dtype, record=True):
                    return torch.mm(x, x)
            out, graphs, breaks = compiled(fn, (a,), "eager", fullgraph=True)
            assert out.dtype == dtype and (graphs, breaks) == (1, 0)
    assert not autocast_kernels.installed()


def test_a_region_built_outside_the_compiled_code_is_recognised_as_torch_autocast():
    """An ampteach.autocast is a torch.autocast (a subclass): dynamo reads its arguments from the object."""
    regions = {impl: region_of(impl)("cpu", dtype=torch.float16) for impl in IMPLS}

    def make(autocast):
        region = regions["torch" if autocast is torch.autocast else "ampteach"]

        def fn(a):
            with region:
                return torch.mm(a, a)
        return fn

    out, graphs, breaks = run_both(make, (torch.rand(4, 4),), fullgraph=True)
    assert out.dtype == torch.float16 and graphs == 1


# ---------------------------------------------------------------------------------------------------
# (2) torch's dynamo autocast tests (test/dynamo/test_ctx_manager.py), with `autocast` as a parameter

@pytest.mark.filterwarnings("ignore:torch.is_autocast_cpu_enabled\\(\\) is deprecated")
def test_is_autocast_cpu_enabled():
    def make(autocast):
        def fn(a_float32, b_float32):
            with autocast(device_type="cpu", dtype=torch.bfloat16):
                c_float16 = torch.mm(a_float32, b_float32)
                if torch.is_autocast_cpu_enabled():
                    c_float16 = c_float16 + 1
            return c_float16
        return fn

    a, b = torch.rand((8, 8)), torch.rand((8, 8))
    for impl in IMPLS:
        ref = make(region_of(impl))(a, b)
        res, _, _ = run_both(make, (a, b), fullgraph=True)
        assert same(ref, res)


def cpu_module(autocast):
    class MyModule(nn.Module):
        def forward(self, x):
            a_float32 = torch.rand((8, 8), device="cpu")
            b_float32 = torch.rand((8, 8), device="cpu")
            d_float32 = torch.rand((8, 8), device="cpu")

            with autocast(device_type="cpu", dtype=torch.bfloat16):
                e_float16 = torch.mm(a_float32, b_float32)
                f_float16 = torch.mm(d_float32, e_float16)
            return f_float16
    return MyModule()


@pytest.mark.parametrize("impl", IMPLS)
def test_autocast_cpu(impl):
    """torch's test exports the module with torch._dynamo.export and runs the exported graph."""
    use_torch_kernels() if impl == "torch" else autocast_kernels.install()
    module = cpu_module(region_of(impl))
    real = module(torch.tensor([0.5]))
    graph, _ = torch._dynamo.export(module)(torch.tensor([[0.0, 0], [0, 0]]))
    exported = graph(torch.tensor([0.5]))
    assert exported.device == real.device and exported.dtype == real.dtype
    assert exported.device.type == "cpu" and exported.dtype == torch.bfloat16
    targets = [getattr(n.target, "__name__", n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets.count("_enter_autocast") == targets.count("_exit_autocast") == 1


def test_autocast_cpu_graph_break():
    def make(autocast):
        class MyModule(nn.Module):
            def forward(self, x):
                a_float32 = torch.rand((8, 8), device="cpu")
                b_float32 = torch.rand((8, 8), device="cpu")
                torch._dynamo.graph_break()
                d_float32 = torch.rand((8, 8), device="cpu")

                with autocast(device_type="cpu", dtype=torch.bfloat16):
                    e_float16 = torch.mm(a_float32, b_float32)
                    torch._dynamo.graph_break()
                    f_float16 = torch.mm(d_float32, e_float16)
                return f_float16
        return MyModule()

    real = make(torch.autocast)(torch.tensor([0.5]))
    res, graphs, breaks = run_both(make, (torch.tensor([0.5]),))
    assert res.device == real.device and res.dtype == real.dtype
    assert res.device.type == "cpu" and res.dtype == torch.bfloat16
    assert breaks == 2


def test_autocast_cpu_graph_break_2():
    """Regression for pytorch/pytorch#93890."""
    def make(autocast):
        def fn(x):
            with autocast(device_type="cpu", dtype=torch.bfloat16):
                x = torch.mm(x, x)
                torch._dynamo.graph_break()
                x = torch.relu(x)
            return x
        return fn

    x = torch.rand([4, 4])
    assert x.dtype == torch.float32
    res = make(ampteach.autocast)(x)
    opt_res, graphs, breaks = run_both(make, (x,))
    assert torch.allclose(res, opt_res)
    assert res.dtype == torch.bfloat16 and opt_res.dtype == torch.bfloat16
    assert breaks == 1


def test_autocast_cpu_graph_break_inner_fn():
    def make(autocast):
        class MyModule(nn.Module):
            @staticmethod
            def mm_breaks(x, y):
                torch._dynamo.graph_break()
                return torch.mm(x, y)

            def forward(self, x):
                a_float32 = torch.rand((8, 8), device="cpu")
                b_float32 = torch.rand((8, 8), device="cpu")

                with autocast(device_type="cpu", dtype=torch.bfloat16):
                    torch._dynamo.graph_break()
                    with autocast(device_type="cpu", dtype=torch.bfloat16, enabled=False):
                        torch._dynamo.graph_break()
                        g_float32 = torch.mm(a_float32, b_float32)
                        with autocast(device_type="cpu", dtype=torch.bfloat16):
                            # Check that nested with non-inlineable function with graph break
                            torch._dynamo.graph_break()
                            f_float16_1 = self.mm_breaks(a_float32, b_float32)
                    # We remember to exit the inner autocast correctly to outer
                    # even after graph breaks
                    f_float16 = self.mm_breaks(a_float32, b_float32)
                    assert f_float16.dtype == f_float16_1.dtype
                return f_float16, g_float32
        return MyModule()

    real_16, real_32 = make(ampteach.autocast)(torch.tensor([0.5]))
    (out_16, out_32), graphs, breaks = run_both(make, (torch.tensor([0.5]),))
    assert (out_16.device, out_16.dtype, out_32.device, out_32.dtype) == \
        (real_16.device, real_16.dtype, real_32.device, real_32.dtype)
    assert out_16.dtype == torch.bfloat16 and out_32.dtype == torch.float32


def test_autocast_graph_break_method():
    def make(autocast):
        class MyModule(nn.Module):
            def __init__(self, bias):
                super().__init__()
                self.bias = bias

            def mm_not_break(self, x, y):
                return torch.mm(x, y) + self.bias

            def mm_breaks(self, x, y):
                torch._dynamo.graph_break()
                return torch.mm(x, y) + self.bias

            def forward(self, x):
                a_float32 = torch.rand((8, 8), device="cpu")
                b_float32 = torch.rand((8, 8), device="cpu")

                with autocast(device_type="cpu", dtype=torch.bfloat16):
                    with autocast(device_type="cpu", dtype=torch.bfloat16, enabled=False):
                        g_float32 = torch.mm(a_float32, b_float32)
                    f_float16 = self.mm_breaks(a_float32, b_float32)

                    assert f_float16[0][0] == self.mm_not_break(a_float32, b_float32)[0][0]
                return f_float16, g_float32
        torch.manual_seed(1)
        return MyModule(bias=torch.rand((8, 8), device="cpu", dtype=torch.bfloat16))

    for autocast in (torch.autocast, ampteach.autocast):
        with autocast(device_type="cpu", dtype=torch.bfloat16):
            # Autocast doesn't work on addition, so we need the bias to be `bfloat16`
            res = torch.rand((8, 8), device="cpu", dtype=torch.float32) + torch.rand(
                (8, 8), device="cpu", dtype=torch.bfloat16)
            assert res.dtype == torch.float32

    real_16, real_32 = make(ampteach.autocast)(torch.tensor([0.5]))
    (out_16, out_32), graphs, breaks = run_both(make, (torch.tensor([0.5]),))
    assert (out_16.dtype, out_32.dtype) == (real_16.dtype, real_32.dtype) == (torch.bfloat16, torch.float32)


def test_autocast_arguments_binding():
    """torch runs this on CUDA machines only; both functions run without a GPU (the regions are disabled)."""
    def make(autocast):
        def f1(x):
            with autocast(device_type="cuda", enabled=False):
                x = torch.sin(x + 1)
            return x

        def f2(x):
            with autocast(device_type="cpu", enabled=False):
                x = torch.cos(x + 1)
            return x

        return lambda x: (f1(x), f2(x))

    x = torch.rand([2, 3])
    ref = make(ampteach.autocast)(x)
    res, graphs, breaks = run_both(make, (x,))
    assert same(ref, res)


def test_autocast_decorator_cpu():
    """torch's test_autocast_decorator, its CPU decorator (torch runs the test on CUDA machines only)."""
    def make(autocast):
        def autocast_func_cpu(orig_func):
            @autocast(device_type="cpu", dtype=torch.float16)
            def new_fwd(*args, **kwargs):
                return orig_func(*args, **kwargs)

            return new_fwd

        def mm(a, b):
            return torch.mm(a, b)

        return autocast_func_cpu(mm)

    a_float32, b_float32 = torch.rand((8, 8)), torch.rand((8, 8))
    ref = make(ampteach.autocast)(a_float32, b_float32)
    res, graphs, breaks = run_both(make, (a_float32, b_float32), fullgraph=True)
    assert same(ref, res) and res.dtype == torch.float16


def test_graph_break_inlining_autocast():
    def make(autocast):
        def gn(x, y):
            with autocast(device_type="cpu", dtype=torch.bfloat16):
                z = torch.mm(x, y)
                torch._dynamo.graph_break()
                return torch.sin(z)

        def fn(x, y):
            z = torch.mm(x, y)
            z = z + gn(x, y)
            return z
        return fn

    x, y = torch.rand(3, 3), torch.rand(3, 3)
    ref = make(ampteach.autocast)(x, y)
    res, graphs, breaks = run_both(make, (x, y))
    assert same(ref, res)


# ---------------------------------------------------------------------------------------------------
# (3) a model compiled with inductor, forward and backward

@needs_c_compiler
def test_a_small_model_compiled_with_inductor_gives_torchs_outputs_and_gradients_bit_for_bit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    results = {}
    for impl in IMPLS:
        use_torch_kernels() if impl == "torch" else autocast_kernels.install()
        torch._dynamo.reset()
        net = torch.compile(nn.Sequential(*[layer for layer in model]), backend="inductor")
        for p in model.parameters():
            p.grad = None
        with region_of(impl)("cpu", dtype=torch.bfloat16):
            logits = net(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        results[impl] = [logits, loss, *(p.grad.clone() for p in model.parameters())]
    torch._dynamo.reset()
    assert same(results["torch"], results["ampteach"])
    assert results["ampteach"][0].dtype == torch.bfloat16 and results["ampteach"][1].dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in results["ampteach"][2:])
