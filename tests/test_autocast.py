"""ampteach.autocast against torch.autocast: the same dtypes op by op, and the same bits for the course's models.

Per op family (matmuls, convolutions, attention, norms, softmaxes, pointwise math, reductions,
losses, promote ops, fp64/int inputs, explicit dtype, out=, in-place) the output dtype, or the error,
must be torch's: on CPU in bfloat16 and float16 with real tensors, on CUDA in float16 and bfloat16
with fake CUDA tensors, and on a real GPU when there is one. On a CPU torch is deterministic, so
values must be identical too (torch.equal), for single ops and for the FashionMNIST models' outputs
and gradients. Then the region's rules: nesting, enabled=False, the weight-cast cache (and its
stale-cast pitfall), errors, custom_fwd/custom_bwd.
"""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ampteach
from ampteach.autocast import (
    BANNED_MESSAGE,
    autocast,
    cached_casts,
    custom_bwd,
    custom_fwd,
    get_autocast_dtype,
    is_autocast_enabled,
)
from ampteach.data import course_split, load_fashion_mnist, preload
from ampteach.models import cnn, mlp
from ampteach.reference import OP_CASES, fake_cuda, has_cuda, op_agreement, run_case, torch_autocast
from ampteach.train import autocast_for

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
FAMILIES = {"matmul", "convolution", "attention", "norm", "softmax", "pointwise", "reduction", "loss",
            "promote", "fp64 and integers", "explicit dtype", "out=", "in-place", "pooling and padding",
            "torch.ops.aten"}


def describe(rows) -> str:
    return "\n".join(f"{r.family} / {r.label} (inputs {r.input_dtype}): torch {r.torch_result!r}, "
                     f"ampteach {r.ampteach_result!r}" for r in rows)


# ---------------------------------------------------------------------------------------------------
# op by op

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


def _outputs(case, dtype, input_dtype):
    """The case's result under torch.autocast and under ampteach.autocast: a tensor, or the exception."""
    results = []
    for region in (torch_autocast("cpu", dtype), autocast("cpu", dtype=dtype)):
        torch.manual_seed(0)
        try:
            with region:
                results.append(case.call("cpu", input_dtype))
        except Exception as exc:
            results.append(exc)
    return results


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_every_op_case_on_cpu_gives_torchs_dtype_and_bits_or_error(dtype):
    """CPU kernels are deterministic: not only the dtypes, the values must be identical too."""
    tensors = 0
    for case in OP_CASES:
        for input_dtype in (FP32, dtype):
            theirs, ours = _outputs(case, dtype, input_dtype)
            where = f"{case.family} / {case.label} with {input_dtype} inputs"
            if isinstance(theirs, Exception):
                assert isinstance(ours, Exception), f"{where}: torch raised {theirs!r}, ampteach returned {ours.dtype}"
                continue
            assert isinstance(ours, torch.Tensor), f"{where}: ampteach raised {ours!r}, torch returned {theirs.dtype}"
            assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), where
            tensors += 1
    assert tensors > 1.5 * len(OP_CASES)


OPS = {   # op -> (call, how many tensor inputs)
    "mm": (torch.mm, 2), "add": (torch.add, 2), "cat": (lambda a, b: torch.cat([a, b]), 2),
    "addcmul": (lambda a, b: torch.addcmul(a, a, b), 2), "atan2": (torch.atan2, 2),
    "linear": (F.linear, 2), "mse_loss": (F.mse_loss, 2), "softmax": (lambda a: torch.softmax(a, 1), 1),
    "exp": (torch.exp, 1), "sum": (torch.sum, 1), "layer_norm": (lambda a: F.layer_norm(a, (4,)), 1),
    "prod": (torch.prod, 1), "log_softmax_dtype": (lambda a: F.log_softmax(a, 1, dtype=FP64), 1),
}
DTYPES = st.sampled_from([FP16, BF16, FP32, FP64, torch.int64])


@settings(max_examples=150, deadline=None)
@given(op=st.sampled_from(sorted(OPS)), region=st.sampled_from([BF16, FP16]), a=DTYPES, b=DTYPES,
       seed=st.integers(0, 2**16))
def test_any_mix_of_input_dtypes_gives_torchs_result_on_cpu(op, region, a, b, seed):
    """Whatever the inputs' dtypes (half, bf16, fp32, fp64, int): torch's dtype and bits, or both raise."""
    fn, n = OPS[op]

    def call():
        g = torch.Generator().manual_seed(seed)
        inputs = [(torch.rand(4, 4, generator=g) * 4).to(dtype) for dtype in (a, b)[:n]]
        return fn(*inputs)

    results = []
    for ctx in (torch_autocast("cpu", region), autocast("cpu", dtype=region)):
        try:
            with ctx:
                results.append(call())
        except Exception as exc:
            results.append(type(exc))
    theirs, ours = results
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    else:
        assert not isinstance(ours, torch.Tensor), f"torch raised {theirs.__name__}, ampteach returned {ours.dtype}"


# ---------------------------------------------------------------------------------------------------
# the course's models: bit for bit

@pytest.fixture(scope="module")
def batch():
    data = preload(course_split(load_fashion_mnist()))
    x, y = next(data.batches(16, shuffle=True, seed=0))
    return x, y


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
def test_fashion_mnist_models_give_torchs_outputs_and_gradients_bit_for_bit(build, dtype, batch):
    x, y = batch
    torch.manual_seed(0)
    theirs = build()
    ours = copy.deepcopy(theirs)
    results = []
    for model, region in ((theirs, torch.autocast("cpu", dtype=dtype)), (ours, autocast("cpu", dtype=dtype))):
        with region:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        results.append((logits, loss))
    assert results[0][0].dtype == dtype and torch.equal(results[0][0], results[1][0])
    assert results[0][1].dtype == FP32 and torch.equal(results[0][1], results[1][1])
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        assert q.grad.dtype == FP32, f"{name}: fp32 parameters get fp32 gradients"
        assert torch.equal(p.grad, q.grad), name


def test_the_training_loop_uses_it():
    region = autocast_for("ampteach", "cpu", "bf16")
    assert isinstance(region, autocast) and region.fast_dtype is BF16
    with autocast_for("ampteach", "cpu", "fp32"):
        assert not is_autocast_enabled("cpu")
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == FP32


# ---------------------------------------------------------------------------------------------------
# region rules

def mm_dtype() -> torch.dtype:
    return torch.mm(torch.rand(2, 2), torch.rand(2, 2)).dtype


def test_defaults_are_torchs():
    assert autocast("cpu").fast_dtype == torch.get_autocast_dtype("cpu") == BF16
    assert autocast("cuda").fast_dtype == torch.get_autocast_dtype("cuda") == FP16


def test_a_cuda_region_stays_on_without_a_gpu():
    with autocast("cuda"):
        assert is_autocast_enabled("cuda")
        with fake_cuda():
            a = torch.empty(4, 4, device="cuda")
            assert torch.mm(a, a).dtype == FP16 and torch.exp(a.half()).dtype == FP32


def test_nesting_and_enabled_false_restore_the_outer_state():
    assert not is_autocast_enabled("cpu")
    with autocast("cpu"):
        assert is_autocast_enabled("cpu") and mm_dtype() == BF16
        with autocast("cpu", enabled=False):
            assert not is_autocast_enabled("cpu") and mm_dtype() == FP32
        assert is_autocast_enabled("cpu") and mm_dtype() == BF16
        with autocast("cpu", dtype=FP16):
            assert mm_dtype() == FP16
            with autocast("cpu"):                      # dtype=None keeps the enclosing region's dtype
                assert get_autocast_dtype("cpu") == FP16 and mm_dtype() == FP16
        assert get_autocast_dtype("cpu") == BF16 and mm_dtype() == BF16
    assert not is_autocast_enabled("cpu") and mm_dtype() == FP32


def test_torch_inherits_the_enclosing_dtype_the_same_way():
    with torch.autocast("cpu", dtype=FP16):
        with torch.autocast("cpu"):
            assert torch.get_autocast_dtype("cpu") == FP16


def test_an_exception_inside_restores_the_state():
    with pytest.raises(KeyError):
        with autocast("cpu"):
            raise KeyError("boom")
    assert not is_autocast_enabled("cpu") and mm_dtype() == FP32 and cached_casts() == 0


def test_regions_are_per_thread():
    seen = []
    with autocast("cpu"):
        worker = threading.Thread(target=lambda: seen.append((is_autocast_enabled("cpu"), mm_dtype())))
        worker.start()
        worker.join()
        assert mm_dtype() == BF16
    assert seen == [(False, FP32)]


def test_it_is_a_decorator_too():
    @autocast("cpu")
    def forward(a, b):
        """docstring kept"""
        return a @ b

    assert forward(torch.rand(2, 2), torch.rand(2, 2)).dtype == BF16 and forward.__doc__ == "docstring kept"
    with pytest.raises(TypeError, match="requires a callable"):
        autocast("cpu")("not a function")


def test_an_unsupported_dtype_warns_and_disables_like_torch():
    for region in (torch.autocast, autocast):
        with pytest.warns(UserWarning, match="autocast"):
            ctx = region("cpu", dtype=FP64)
        with ctx:
            assert mm_dtype() == FP32


def test_bad_device_types_are_refused():
    with pytest.raises(ValueError, match="'cpu' and 'cuda'"):
        autocast("mps")
    with pytest.raises(ValueError, match="of type `str`"):
        autocast(torch.device("cpu"))
    with pytest.raises(ValueError, match="of type `str`"):
        torch.autocast(torch.device("cpu"))


def test_banned_binary_cross_entropy_says_what_to_use_instead():
    with fake_cuda():
        p = torch.empty(8, device="cuda").fill_(0.5)
        with pytest.raises(RuntimeError, match="unsafe to autocast") as theirs, torch_autocast("cuda", FP16):
            F.binary_cross_entropy(p, p)
        with pytest.raises(RuntimeError, match="unsafe to autocast") as ours, autocast("cuda"):
            F.binary_cross_entropy(p, p)
        with pytest.raises(RuntimeError, match="unsafe to autocast"), autocast("cuda"):
            nn.BCELoss()(p.double(), p.double())   # banned whatever the dtype, as in torch
    assert "binary_cross_entropy_with_logits" in str(ours.value) and "BCEWithLogitsLoss" in str(ours.value)
    assert str(ours.value) != str(theirs.value) and BANNED_MESSAGE.splitlines()[0] in str(ours.value)
    with autocast("cpu"):   # on CPU it is an fp32 op, not banned
        assert F.binary_cross_entropy(torch.full((4,), 0.5), torch.full((4,), 0.5)).dtype == FP32


def test_promote_with_a_foreign_half_type_raises_like_torch():
    a, b = torch.rand(4, dtype=FP16), torch.rand(4, dtype=BF16)
    for region in (torch.autocast("cpu", dtype=BF16), autocast("cpu", dtype=BF16)):
        with pytest.raises(RuntimeError), region:
            torch.cat([a, b])
    with autocast("cpu", dtype=BF16):   # a float32 input first decides float32, as in torch
        assert torch.cat([torch.rand(4), a, b]).dtype == FP32


def test_python_functions_that_forward_their_override_check_still_run():
    """torch.meshgrid's body hands the call to another function under its own name: no endless loop."""
    a, b = torch.rand(3), torch.rand(2)
    with autocast("cpu"):
        x, y = torch.meshgrid(a, b, indexing="ij")
        out, idx = torch.unique(torch.tensor([3, 1, 3]), return_inverse=True)
    assert x.shape == (3, 2) and out.tolist() == [1, 3] and idx.tolist() == [1, 0, 1]


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


# ---------------------------------------------------------------------------------------------------
# the weight-cast cache

def twice(w, x):
    """w used twice in one region: linear(linear(x, w), w)."""
    return F.linear(F.linear(x, w), w).float().sum()


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_a_weight_used_twice_gets_torchs_gradient(cache_enabled):
    """With the cache both uses share one cast, so the two gradients are summed in bf16 before it."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 64), torch.randn(32, 64)
    grads = []
    for region in (torch.autocast("cpu", cache_enabled=cache_enabled), autocast("cpu", cache_enabled=cache_enabled)):
        p = nn.Parameter(w.clone())
        with region:
            loss = twice(p, x)
            if isinstance(region, autocast):
                assert cached_casts() == (1 if cache_enabled else 0)
        loss.backward()
        grads.append(p.grad)
    assert torch.equal(grads[0], grads[1])


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
    for lin, region, again in ((theirs, torch.autocast("cpu"), lambda: torch.autocast("cpu")),
                               (ours, autocast("cpu"), lambda: autocast("cpu"))):
        with region:
            before = lin(x)
            with torch.no_grad():
                lin.weight.add_(1.0)                     # the cache still holds the old bf16 weight
            stale = lin(x)
        with again():
            fresh = lin(x)
        outputs.append((before, stale, fresh))
    for t, o in zip(outputs[0], outputs[1]):
        assert torch.equal(t, o)
    before, stale, fresh = outputs[1]
    assert torch.equal(before, stale) and not torch.equal(before, fresh)


def test_an_inner_region_with_another_dtype_gets_the_outer_cast_as_in_torch():
    """The cache is keyed by the tensor alone: torch's quirk, reproduced (a linear of fp16 x and bf16 w)."""
    for region in (torch.autocast, autocast):
        lin = nn.Linear(4, 4)
        with region("cpu", dtype=BF16):
            lin(torch.rand(2, 4))
            with pytest.raises(RuntimeError), region("cpu", dtype=FP16):
                lin(torch.rand(2, 4))


def test_a_cast_first_made_under_no_grad_still_carries_gradients():
    for region in (torch.autocast, autocast):
        lin = nn.Linear(4, 4)
        with region("cpu"):
            with torch.no_grad():
                lin(torch.rand(2, 4))
            out = lin(torch.rand(2, 4))
        out.float().sum().backward()
        assert lin.weight.grad is not None and lin.weight.grad.dtype == FP32


def test_nothing_is_cached_in_inference_mode():
    for region in (torch.autocast, autocast):
        lin = nn.Linear(4, 4)
        x = torch.rand(2, 4)
        with torch.inference_mode(), region("cpu"):
            before = lin(x)
            lin.weight.add_(1.0)
            assert not torch.equal(before, lin(x))


# ---------------------------------------------------------------------------------------------------
# custom_fwd / custom_bwd

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
def test_custom_fwd_and_bwd_behave_like_torchs(cast_inputs):
    results = []
    for module, region in ((torch.amp, torch.autocast), (ampteach, autocast)):
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
    (seen_t, *tensors_t), (seen_a, *tensors_a) = results
    assert seen_a == seen_t
    for t, o in zip(tensors_t, tensors_a):
        assert t.dtype == o.dtype and torch.equal(t, o)
    if cast_inputs is torch.float32:
        assert seen_a[0] == (FP32, FP32, FP32)   # inputs cast, forward's own ops not autocast
    else:
        assert seen_a[0] == (FP32, BF16, BF16)   # forward's mm autocast to bf16


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
        with autocast("cpu"), autocast("cuda"):
            torch.mm(torch.rand(2, 2), torch.rand(2, 2))
