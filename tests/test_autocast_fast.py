"""ampteach.amp.autocast_fast: the kernels written out per op give what the generic kernel and torch give.

Inside a recording region every call takes the generic kernel (ampteach.amp.autocast_kernels), outside
one the generated kernel: so the same call is run three ways, torch's C++ kernel, the generated
kernel and the generic one, over the conditions the generated code tests inline (input dtypes, a
parameter or a view or a computed tensor, grad mode, inference mode, the region's cache flag).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ampteach.amp.autocast import autocast
from ampteach.amp.autocast_kernels import _kernels, cached_casts, install
from ampteach.lab.compare_torch import TorchAutocast

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
OPS = {
    "linear": lambda x, w, b: F.linear(x, w, b),
    "mm": lambda x, w, b: torch.mm(x, w.t()),
    "addmm": lambda x, w, b: torch.addmm(b, x, w.t()),
    "addmm, keywords": lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0),
    "matmul": lambda x, w, b: torch.matmul(x, w.t()),
    "cross_entropy": lambda x, w, b: F.cross_entropy(x @ w.t().to(x.dtype), torch.tensor([0, 2, 1])),
}


def run(region, op, x, w, b, *, dtype, cache_enabled, grad, inference, weight_kind, **kwargs):
    """op's output, used twice, ampteach's cache size inside the region, the gradients of w and b (grad on).

    grad="switch": the first use under no_grad, the second with grad (a cast cached under no_grad must
    still carry gradients). weight_kind "detached": a leaf that requires grad and is a view (w.detach()[:]).
    """
    w.grad = b.grad = None
    weight = {"parameter": w, "view": w[:], "computed": w * 1, "detached": w.detach()[:].requires_grad_(not inference)
              }[weight_kind]
    with torch.inference_mode(inference), torch.set_grad_enabled(grad is True), \
            region("cpu", dtype=dtype, cache_enabled=cache_enabled, **kwargs):
        first = op(x, weight, b)
        with torch.set_grad_enabled(grad is not False):
            again = op(x, weight, b)      # a second use: served from the cache where torch's would be
        cached = cached_casts()
    grads = None
    if again.requires_grad:
        (first.float().sum() + again.float().sum()).backward()
        grads = (w.grad, b.grad, weight.grad if weight.is_leaf else None)
    return first, again, cached, grads


def three_ways(op, x, w, b, **conditions) -> None:
    """Run op under torch's kernel, the generated and the generic one: same outputs, gradients, errors."""
    outcomes = {}
    for name, region, kwargs in (("torch", TorchAutocast, {}), ("generated", autocast, {}),
                                 ("generic", autocast, {"record": True})):
        try:
            outcomes[name] = run(region, OPS[op], x, w, b, **conditions, **kwargs)
        except RuntimeError as error:          # e.g. mixed dtypes torch refuses: refused alike
            outcomes[name] = type(error)
    reference = outcomes.pop("torch")
    if not isinstance(outcomes["generated"], type):          # torch's cache cannot be counted from Python
        assert outcomes["generated"][2] == outcomes["generic"][2], "cached casts"
    for name, outcome in outcomes.items():
        if isinstance(reference, type) or isinstance(outcome, type):
            assert outcome == reference, name
            continue
        for mine, torchs in zip(outcome[:2], reference[:2]):
            assert mine.dtype == torchs.dtype and torch.equal(mine, torchs), name
        assert (outcome[3] is None) == (reference[3] is None), name
        if reference[3] is not None:
            for mine, torchs in zip(outcome[3], reference[3]):
                assert (mine is None) == (torchs is None) and (mine is None or torch.equal(mine, torchs)), name


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inference", [False, True])
@pytest.mark.parametrize("cache_enabled", [True, False])
@pytest.mark.parametrize("grad", [True, False, "switch"])
@pytest.mark.parametrize("weight_kind", ["parameter", "view", "computed", "detached"])
def test_every_cache_condition_the_generated_code_tests(weight_kind, grad, cache_enabled, inference, w_dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    w = torch.randn(3, 4, dtype=w_dtype, requires_grad=not inference)
    b = torch.randn(3, dtype=w_dtype, requires_grad=not inference)
    three_ways("linear", x, w, b, dtype=torch.bfloat16, cache_enabled=cache_enabled, grad=grad, inference=inference,
               weight_kind=weight_kind)


@settings(max_examples=80, deadline=None)
@given(op=st.sampled_from(sorted(OPS)), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       x_dtype=st.sampled_from(DTYPES), w_dtype=st.sampled_from(DTYPES), grad=st.sampled_from([True, "switch"]))
def test_every_op_and_dtype_mix(op, dtype, x_dtype, w_dtype, grad):
    if op == "cross_entropy" and x_dtype is torch.float64 and w_dtype is not torch.float64:
        x_dtype = torch.float32       # the test's own matmul before the loss needs one dtype
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=x_dtype)
    w = torch.randn(3, 4, dtype=w_dtype, requires_grad=True)
    b = torch.randn(3, dtype=w_dtype, requires_grad=True)
    three_ways(op, x, w, b, dtype=dtype, cache_enabled=True, grad=grad, inference=False, weight_kind="parameter")


def test_the_hot_ops_get_a_generated_kernel_whose_source_can_be_read():
    install()
    kernels = _kernels("cpu")
    for name in ("linear", "mm", "addmm", "conv2d", "cross_entropy_loss", "matmul"):
        assert "def kernel(" in kernels[name].source, name
    assert not hasattr(kernels["cat"], "source")      # promote, over a Tensor[]: the generic kernel


def test_a_generated_kernel_sends_keywords_and_recording_to_the_generic_kernel():
    install()
    kernel = _kernels("cpu")["addmm"]
    namespace, taken = kernel.__globals__, []
    generic = namespace["special"]
    namespace["special"] = lambda args, kwargs: taken.append(kwargs) or generic(args, kwargs)
    try:
        b, x, w = torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)
        with autocast("cpu"):
            torch.addmm(b, x, w)
            assert taken == []
            torch.addmm(b, x, w, beta=0.5)
            assert taken == [{"beta": 0.5}]
        with autocast("cpu", record=True):
            torch.addmm(b, x, w)
        assert taken == [{"beta": 0.5}, {}]
    finally:
        namespace["special"] = generic
