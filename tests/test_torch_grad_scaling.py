"""PyTorch's own GradScaler tests, ported to pytest and run twice: on torch.amp.GradScaler (the control,
which must pass) and on ampteach.GradScaler.

Sources, pytorch/pytorch (the versions that ship with torch 2.13):
- test/test_torch.py, class TestTorchDeviceType: every test_grad_scaling_* test (parametrized by
  device, run on CPU since torch 2.3), the _run_scaling_case helper, test_grad_scale_will_not_overflow,
  test_grad_scaler_pass_itself, test_pickle_gradscaler and
  test_params_invalidated_with_grads_invalidated_between_unscale_and_step.
- test/test_optim.py, class TestOptimRenewed: test_grad_scaling_autocast_fused_optimizers.
- test/test_cuda_multigpu.py: test_grad_scaling_scale and test_grad_scaling_multigpu (two GPUs: they
  exercise the per-device copies of the scale and of found_inf, which one device cannot).
- helpers from torch/testing/_internal: common_cuda.py (_create_scaling_models_optimizers,
  _create_scaling_case) and common_optimizers.py (the optimizer configurations of Adagrad, Adam,
  AdamW and SGD, _get_optim_inputs_including_global_cliquey_kwargs, TensorTracker). They are copied
  here because importing torch.testing._internal needs the `expecttest` package.

What changed in the port: unittest methods became pytest functions; `self.assertEqual` became
assert_equal below (torch's TestCase.assertEqual for tensors and numbers: assert_close with NaN equal
to NaN and exact dtypes); `torch.GradScaler`, `torch._amp_foreach_non_finite_check_and_unscale_`,
`torch._amp_update_scale_` and `torch.amp.grad_scaler` became the fields of `impl`, the implementation
under test; the device comes from a fixture (CPU, and CUDA when present). Everything else is torch's.
"""

from __future__ import annotations

import contextlib
import pickle
from copy import deepcopy
from functools import partial
from itertools import chain
from types import SimpleNamespace

import pytest
import torch

import ampteach.amp.scaler
import ampteach.amp.unscale_kernels

IMPLS = {
    "torch": SimpleNamespace(
        GradScaler=torch.amp.GradScaler, module=torch.amp.grad_scaler,
        non_finite_check_and_unscale_=torch._amp_foreach_non_finite_check_and_unscale_,
        update_scale_=torch._amp_update_scale_,
    ),
    "ampteach": SimpleNamespace(
        GradScaler=ampteach.amp.scaler.GradScaler, module=ampteach.amp.scaler,
        non_finite_check_and_unscale_=ampteach.amp.unscale_kernels.non_finite_check_and_unscale_,
        update_scale_=ampteach.amp.scaler.update_scale_,
    ),
}
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                           reason="needs a CUDA GPU")])
TWO_GPUS = [pytest.mark.cuda, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


@pytest.fixture(params=IMPLS)
def impl(request) -> SimpleNamespace:
    return IMPLS[request.param]


@pytest.fixture(params=["cpu", CUDA])
def device(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def torch_test_seed():
    """torch's TestCase seeds every test (common_utils.SEED = 1234)."""
    torch.manual_seed(1234)


def assert_equal(actual, expected, atol=None, rtol=None, msg=None) -> None:
    """torch's TestCase.assertEqual for what these tests compare: tensors or numbers, NaN == NaN, exact dtypes."""
    if isinstance(actual, torch.Tensor) and not isinstance(expected, torch.Tensor):
        expected = torch.full_like(actual, expected)
    if isinstance(expected, torch.Tensor) and not isinstance(actual, torch.Tensor):
        actual = torch.full_like(expected, actual)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=True, msg=msg)


# -- helpers from torch/testing/_internal/common_cuda.py -------------------------------------------------


def _create_scaling_models_optimizers(device="cuda", optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    # Create a module+optimizer that will use scaling, and a control module+optimizer
    # that will not use scaling, against which the scaling-enabled module+optimizer can be compared.
    mod_control = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    mod_scaling = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(device=device)
    with torch.no_grad():
        for c, s in zip(mod_control.parameters(), mod_scaling.parameters(), strict=True):
            s.copy_(c)

    kwargs = {"lr": 1.0}
    if optimizer_kwargs is not None:
        kwargs.update(optimizer_kwargs)
    opt_control = optimizer_ctor(mod_control.parameters(), **kwargs)
    opt_scaling = optimizer_ctor(mod_scaling.parameters(), **kwargs)

    return mod_control, mod_scaling, opt_control, opt_scaling


def _create_scaling_case(device="cuda", dtype=torch.float, optimizer_ctor=torch.optim.SGD, optimizer_kwargs=None):
    data = [(torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device)),
            (torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device)),
            (torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device)),
            (torch.randn((8, 8), dtype=dtype, device=device), torch.randn((8, 8), dtype=dtype, device=device))]

    loss_fn = torch.nn.MSELoss().to(device)

    skip_iter = 2

    return _create_scaling_models_optimizers(
        device=device, optimizer_ctor=optimizer_ctor, optimizer_kwargs=optimizer_kwargs,
    ) + (data, loss_fn, skip_iter)


# -- helpers from torch/testing/_internal/common_optimizers.py (the four optimizers with fused kernels) ----


def optim_inputs_func_adagrad(device, dtype=None):
    return [
        {},
        {"weight_decay": 0.1},
        {"weight_decay": 0.1, "maximize": True},
        {"lr": 0.1},
        {"initial_accumulator_value": 0.1, "weight_decay": 0.1},
        {"lr": 0.1, "lr_decay": 0.5, "weight_decay": 0.1},
        {"lr": torch.tensor(0.001)},
    ]


def optim_inputs_func_adam(device, dtype=None):
    cuda_supported_configs = [
        {"capturable": True},
        {"weight_decay": 0.1, "amsgrad": True, "capturable": True},
        {"lr": torch.tensor(0.001), "amsgrad": True, "capturable": True},
        {"lr": torch.tensor(0.001), "betas": (torch.tensor([[[0.9]]]), torch.tensor([[0.99]])), "amsgrad": True,
         "capturable": True},
        {"lr": torch.tensor(0.001), "betas": (torch.tensor(0.9), torch.tensor(0.99)), "amsgrad": False,
         "capturable": True},
    ]
    return [
        {},
        {"lr": 0.01},
        {"weight_decay": 0.1},
        {"weight_decay": 0.1, "maximize": True},
        {"weight_decay": 0.1, "amsgrad": True},
    ] + (cuda_supported_configs if torch.device(device).type == "cuda" else [])


def optim_inputs_func_sgd(device, dtype=None):
    return [
        {},
        {"lr": 1e-2},
        {"lr": torch.tensor(0.001)},
        {"weight_decay": 0.5},
        {"momentum": 0.9},
        {"weight_decay": 0.1, "maximize": True},
        {"momentum": 0.9, "dampening": 0.5},
        {"momentum": 0.9, "weight_decay": 0.1},
        {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
    ]


# optim_db's entries with supports_fused_on containing "cpu" (all four also support "cuda")
OPTIM_INFOS = {
    "Adagrad": SimpleNamespace(optim_cls=torch.optim.Adagrad, optim_inputs_func=optim_inputs_func_adagrad,
                               supported_impls=("foreach", "differentiable", "fused")),
    "Adam": SimpleNamespace(optim_cls=torch.optim.Adam, optim_inputs_func=optim_inputs_func_adam,
                            supported_impls=("foreach", "differentiable", "fused")),
    "AdamW": SimpleNamespace(optim_cls=torch.optim.AdamW, optim_inputs_func=optim_inputs_func_adam,
                             supported_impls=("foreach", "differentiable", "fused")),
    "SGD": SimpleNamespace(optim_cls=torch.optim.SGD, optim_inputs_func=optim_inputs_func_sgd,
                           supported_impls=("foreach", "differentiable", "fused")),
}


def _get_optim_inputs_including_global_cliquey_kwargs(device, dtype, optim_info, skip=()):
    """The optimizer's configurations with every global flag off, plus one with each flag on (fused, foreach...)."""
    supported_impls = tuple(
        x for x in optim_info.supported_impls
        if x not in skip and (x != "foreach" or torch.device(device).type == "cuda")
    )
    all_optim_inputs = []
    for kwargs in optim_info.optim_inputs_func(device):
        base_kwargs = deepcopy(kwargs)
        for flag in supported_impls:
            base_kwargs[flag] = False
        all_optim_inputs.append(base_kwargs)
        for flag in supported_impls:
            new_kwargs = deepcopy(base_kwargs)
            new_kwargs[flag] = True
            all_optim_inputs.append(new_kwargs)
    return all_optim_inputs


class TensorTracker:
    """Clones of tensors, popped in order to compare two computations milestone by milestone (torch's helper)."""

    def __init__(self, assert_eq_kwargs=None):
        self.assert_eq_kwargs = assert_eq_kwargs or {}
        self.tensors = []

    def add(self, tensor):
        self.tensors.append(tensor.detach().clone())

    def pop_check_set(self, tensor_to_set, override_assert_eq_kwargs=None):
        assert len(self.tensors) > 0, "no tensors to pop"
        ref = self.tensors.pop(0)
        assert_equal(tensor_to_set, ref, **(override_assert_eq_kwargs if override_assert_eq_kwargs is not None
                                            else self.assert_eq_kwargs))
        with torch.no_grad():
            tensor_to_set.copy_(ref)


# -- test/test_torch.py ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float, torch.double])
def test_grad_scaling_unscale(impl, device, dtype):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_unscale."""
    device = torch.device(device)
    device0 = "cuda:0" if device.type == "cuda" else "cpu"
    inv_scale = torch.full((1,), 0.25, dtype=torch.float, device=device0)
    found_inf = torch.full((1,), 0.0, dtype=torch.float, device=device0)

    size = 20
    g = torch.full((size, size), 4.0, dtype=dtype, device=device0)
    ginf = g.clone()
    ginf[2, 2] = float('inf')
    gnan = g.clone()
    gnan[2, 2] = float('nan')

    # Tries selected combinations of
    #  - contiguous grads
    #  - g.clone().t() which is not contiguous but still non overlapping and dense
    #  - variants of g.clone()[:, :5] which are not non overlapping and dense
    # Non overlapping and dense grads route into a multi tensor apply kernel,
    # others use a fallback per-tensor kernel, so we should try both.
    cases = (
        ([g.clone(), g.clone()], False),
        ([g.clone(), g.clone().t()], False),
        ([g.clone(), g.clone()[:, :5]], False),
        ([g.clone()[:, :5], g.clone()[:, :5]], False),
        ([g.clone(), ginf.clone()], True),
        ([g.clone(), gnan.clone()], True),
        ([g.clone(), ginf.clone()[:, :5]], True),
        ([g.clone(), gnan.clone()[:, :5]], True),
        ([ginf.clone(), g.clone()[:, :5]], True),
        ([ginf.clone()[:, :5], g.clone()[:, :5]], True),
    )

    for grads, has_inf in cases:
        found_inf.zero_()
        impl.non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        if has_inf:
            assert_equal(found_inf, 1.0)
        else:
            assert_equal(found_inf, 0.0)
            for grad in grads:
                assert_equal(grad, torch.ones_like(grad), rtol=1e-5, atol=1e-7)

    # When passing lists with mismatched dtypes to a raw
    # _amp_foreach_non_finite_check_and_unscale_ call on CUDA,
    # it's expected to fall back to single-tensor TensorIterator kernel.
    grads = [g.clone(), g.to(dtype=torch.float16)]
    impl.non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    for grad in grads:
        assert_equal(grad, torch.ones_like(grad), rtol=1e-5, atol=1e-7)

    # Passing lists with mismatched devices to a raw
    # _amp_foreach_non_finite_check_and_unscale_ call should raise errors.
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device"):
            impl.non_finite_check_and_unscale_([g.clone(), g.to(device="cuda:1")], found_inf, inv_scale)

    # Creates a list of grads with mismatched dtypes and devices, to ensure
    # scaler._unscale_grads_ organizes grads by dtype and device before calling
    # _amp_foreach_non_finite_check_and_unscale_ on each set.
    # If inject_inf >= 0, writes an inf into one grad for _unscale_grads_ to find.
    def perfect_storm_grads(inject_inf):
        grads = [g.clone(), g.clone()[:, :5], g.to(dtype=torch.float16), g.to(dtype=torch.float16)]
        if device.type == "cuda" and torch.cuda.device_count() > 1:
            grads += [g.to(device="cuda:1"),
                      g.to(device="cuda:1")[:, :5],
                      g.to(device="cuda:1", dtype=torch.float16),
                      g.to(device="cuda:1", dtype=torch.float16)]
        if inject_inf >= 0:
            grads[inject_inf][2, 2] = float('inf')
        return grads

    GradScaler = partial(impl.GradScaler, device=device.type)
    scaler = GradScaler()
    dummy_params = [torch.empty_like(g) for g in perfect_storm_grads(-1)]
    dummy_opt = torch.optim.SGD(dummy_params, lr=1.)

    # Ensures the inf/nan checking can find an inf injected onto any grad in the perfect storm.
    for inject_inf in range(-1, len(dummy_params)):
        found_inf = torch.full((1,), 0.0, dtype=torch.float, device=device0)
        grads = perfect_storm_grads(inject_inf)
        for i, p in enumerate(dummy_params):
            p.grad = grads[i]
        found_inf_per_device = scaler._unscale_grads_(dummy_opt, inv_scale, found_inf, True)
        if inject_inf < 0:
            # No inf was injected, ensures unscaling worked normally.
            assert sum(v.item() for v in found_inf_per_device.values()) == 0
            for grad in grads:
                assert_equal(grad, torch.ones_like(grad), rtol=1e-5, atol=1e-7)
        else:
            # inf was injected, ensures inf was found.
            assert sum(v.item() for v in found_inf_per_device.values()) == 1


def test_grad_scaling_update_scale(impl, device, dtype=torch.float):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_update_scale."""
    growth = 2.0
    backoff = 0.25
    growth_interval = 2
    scale = torch.full((1,), 4.0, dtype=dtype, device=device)
    growth_tracker = torch.full((1,), 0.0, dtype=torch.int32, device=device)
    found_inf = torch.full((1,), 0.0, dtype=torch.float, device=device)

    # Simulates 2 consecutive unskipped iterations
    impl.update_scale_(scale, growth_tracker, found_inf, growth, backoff, growth_interval)
    assert_equal(growth_tracker, 1)
    assert_equal(scale, 4.0)
    impl.update_scale_(scale, growth_tracker, found_inf, growth, backoff, growth_interval)
    assert_equal(growth_tracker, 0)
    assert_equal(scale, 8.0)

    # Simulates a skipped iteration
    found_inf.fill_(1.0)
    impl.update_scale_(scale, growth_tracker, found_inf, growth, backoff, growth_interval)
    assert_equal(growth_tracker, 0)
    assert_equal(scale, 2.0)


def test_grad_scaling_unscale_sparse(impl, device, dtype=torch.float):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_unscale_sparse."""
    device = torch.device(device)
    scaler = impl.GradScaler(device=device.type)

    inv_scale = torch.full((1,), 0.25, dtype=dtype, device=device)
    found_inf = torch.empty((1,), dtype=dtype, device=device)
    cur = found_inf.device

    i = torch.tensor([[0, 1, 1],
                      [2, 0, 2]], device=device, dtype=torch.int64)
    v = torch.tensor([16., 32., 64.], device=device, dtype=torch.float)
    s = torch.sparse_coo_tensor(i, v, torch.Size([2, 3]), device=device, dtype=dtype)

    p = s.clone()
    assert p.is_sparse
    opt = torch.optim.SGD([p], lr=1.)

    p.grad = s.clone()
    found_inf.zero_()
    found_inf = scaler._unscale_grads_(opt, inv_scale, found_inf, False)[cur]
    assert_equal(found_inf, 0.0)
    assert_equal(p.grad.to_dense(), (s / 4).to_dense())

    v = torch.FloatTensor([16., 32., float('inf')])
    p.grad = torch.sparse_coo_tensor(i, v, torch.Size([2, 3]), device=device, dtype=dtype)
    found_inf.zero_()
    found_inf = scaler._unscale_grads_(opt, inv_scale, found_inf, False)[cur]
    assert_equal(found_inf, 1.0)

    v = torch.FloatTensor([16., 32., float('nan')])
    p.grad = torch.sparse_coo_tensor(i, v, torch.Size([2, 3]), device=device, dtype=dtype)
    found_inf.zero_()
    found_inf = scaler._unscale_grads_(opt, inv_scale, found_inf, False)[cur]
    assert_equal(found_inf, 1.0)

    p = s.clone().half()
    assert p.is_sparse
    opt = torch.optim.SGD([p], lr=1.)

    p.grad = s.clone().half()
    found_inf.zero_()
    found_inf = scaler._unscale_grads_(opt, inv_scale, found_inf, True)[cur]
    assert_equal(found_inf, 0.0)
    assert_equal(p.grad.to_dense(), (s.half() / 4).to_dense())

    # Creates fp16 sparse tensor with duplicated indices (uncoalesced).  The uncoalesced representation
    # does not overflow in fp16, but the coalesced representation would, because 64000 + 64000 > fp16 max.
    # _amp_non_finite_check_and_unscale_ should report an overflow here.
    i = torch.LongTensor([[0, 1, 0],
                          [2, 0, 2]])
    v = torch.FloatTensor([64000., 32., 64000.])
    p.grad = torch.sparse_coo_tensor(i, v, torch.Size([2, 3]), device=device, dtype=torch.float16)
    found_inf.zero_()
    found_inf = scaler._unscale_grads_(opt, inv_scale, found_inf, True)[cur]
    assert_equal(found_inf, 1.0)


def test_grad_scaling_state_dict(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_state_dict."""
    device = torch.device(device)
    GradScaler = partial(impl.GradScaler, device=device.type)
    for lazy_init_scale in True, False:
        s0 = GradScaler(init_scale=3., growth_factor=4., backoff_factor=.5, growth_interval=2)
        s1 = GradScaler(init_scale=6., growth_factor=7., backoff_factor=.8, growth_interval=1)

        # sets a random value for load_state_dict to overwrite
        s1._init_growth_tracker = 7

        if lazy_init_scale:
            # Dummy scale() call to ensure the scale tensor is lazily initialized.
            s1.scale(torch.full((1,), 4.0, dtype=torch.float32, device=device))
            if "cuda" == device.type:
                assert isinstance(s1._scale, torch.cuda.FloatTensor)
            else:
                assert isinstance(s1._scale, torch.FloatTensor)

        s1.load_state_dict(s0.state_dict())

        assert_equal(s1.get_scale(), 3.)
        assert_equal(s1.get_growth_factor(), 4.)
        assert_equal(s1.get_backoff_factor(), .5)
        assert_equal(s1.get_growth_interval(), 2)
        assert_equal(s1._init_growth_tracker, 0)


# _run_scaling_case generalizes some single-optimizer test logic to avoid too much copy-pasting below.
def _run_scaling_case(impl, device, run, unskipped, skipped, atol=1e-7, optimizer_ctor=torch.optim.SGD,
                      optimizer_kwargs=None):
    """test/test_torch.py, TestTorchDeviceType._run_scaling_case."""
    # Ensure scaling can be disabled without changing user control flow.
    for enabled in True, False:
        (
            mod_control, mod_scaling, opt_control, opt_scaling, data, loss_fn, skip_iter,
        ) = _create_scaling_case(device=device, optimizer_ctor=optimizer_ctor, optimizer_kwargs=optimizer_kwargs)

        # For functionality, test with a modest initial scale, and an unrealistically-large growth factor
        # so any potential errors with the growth factor handling will be magnified.
        GradScaler = partial(impl.GradScaler, device=device)
        scaler = GradScaler(init_scale=128., growth_factor=2.0, enabled=enabled, growth_interval=1)

        _ = run(device, data, mod_control, opt_control, scaler, loss_fn, skip_iter, False)
        ret = run(device, data, mod_scaling, opt_scaling, scaler, loss_fn, skip_iter, True)

        # Allows run() to optionally return a different scaler instance.
        scaler = ret if ret else scaler

        # If scaling was enabled, the scale factor should have been multiplied by the growth factor
        # len(data) - skipped times and the backoff factor "skipped" times.
        if enabled:
            net_growth = scaler.get_growth_factor()**unskipped if unskipped > 0 else 1.0
            net_backoff = scaler.get_backoff_factor()**skipped if skipped > 0 else 1.0
            assert scaler.get_scale() == (128. * net_growth * net_backoff)
        else:
            assert scaler.get_scale() == 1.0

        for c, s in zip(mod_control.parameters(), mod_scaling.parameters()):
            assert_equal(c.grad, s.grad, atol=atol, rtol=1e-05)

            c_state, s_state = opt_control.state[c], opt_scaling.state[s]
            for k in c_state:
                assert_equal(c_state[k], s_state[k], atol=atol, rtol=1e-05, msg=k)

            assert_equal(c, s, atol=atol, rtol=1e-05)


@pytest.mark.parametrize("foreach, fused", [(None, None), (True, None), (None, True)])
@pytest.mark.parametrize("optimizer_ctor", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD],
                         ids=lambda cls: cls.__name__)
def test_grad_scaling_autocast(impl, device, optimizer_ctor, foreach, fused):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_autocast (optims: AdamW, Adam, SGD)."""
    try_pickle = False

    def run(device, data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
        for i, (input, target) in enumerate(data):
            optimizer.zero_grad()
            with torch.autocast(device_type=device, dtype=torch.half, enabled=try_scaling_api):
                output = model(input)
                loss = loss_fn(output, target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == skip_iter and scaler.is_enabled():
                    with torch.no_grad():
                        model[1].weight.grad.fill_(float('inf'))
                scaler.step(optimizer)
                scaler.update()
                if try_pickle:
                    scaler = pickle.loads(pickle.dumps(scaler))
            else:
                loss.backward()
                if (not scaler.is_enabled()) or (i != skip_iter):
                    optimizer.step()
        return scaler

    # Compares no scaling + no autocasting against scaling + autocasting.
    # NOTE(mkozuki): With current way of testing, `torch.optim.Adam` is failing in spite of `foreach` and `fused`.
    #   Giving some flexibility to this test might help.
    context = contextlib.nullcontext
    if optimizer_ctor in (torch.optim.Adam, torch.optim.AdamW):
        # (torch: self.assertRaises(AssertionError); the port also checks it is the comparison that failed)
        context = partial(pytest.raises, AssertionError, match="not close")
    with context():
        # sets atol=1e-3 because we're comparing pure fp32 arithmetic vs a mixture of fp16 and fp32
        _run_scaling_case(
            impl, device, run, unskipped=3, skipped=1, atol=1e-3,
            optimizer_ctor=optimizer_ctor, optimizer_kwargs={"foreach": foreach, "fused": fused},
        )
        # this will be picked up by try_pickle within run():
        try_pickle = True
        _run_scaling_case(
            impl, device, run, unskipped=3, skipped=1, atol=1e-3,
            optimizer_ctor=optimizer_ctor, optimizer_kwargs={"foreach": foreach, "fused": fused},
        )


@pytest.mark.parametrize("optim_name", ["AdamW", "Adam", "SGD"])
def test_params_invalidated_with_grads_invalidated_between_unscale_and_step(impl, device, optim_name):
    """test/test_torch.py, TestTorchDeviceType.test_params_invalidated_with_grads_invalidated_between_unscale_and_step.

    Make sure that the parameters become nonsense when scaled gradients are finite
    but they get invalidated before `optimizer.step`, after `GradScaler.unscale_`.
    """
    dtype = torch.float32
    optim_info = OPTIM_INFOS[optim_name]
    optimizer_ctor = optim_info.optim_cls
    all_optim_inputs = _get_optim_inputs_including_global_cliquey_kwargs(
        device, dtype, optim_info, skip=("differentiable",))

    for optim_input in all_optim_inputs:
        model, _, optimizer, _, data, loss_fn, _ = _create_scaling_case(
            device, optimizer_ctor=optimizer_ctor, optimizer_kwargs=optim_input,
        )
        scaler = impl.GradScaler(device=device, init_scale=128.0)

        for input, target in data:
            optimizer.zero_grad()
            with torch.autocast(device_type=device, dtype=torch.half):
                output = model(input)
                loss = loss_fn(output, target)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)

            # deliberately break grads
            for j, param in enumerate(model.parameters()):
                param.grad.copy_(torch.inf if j % 2 else torch.nan)

            scaler.step(optimizer)
            scaler.update()

        assert all((p.isnan().any() or p.isinf().any()) for p in model.parameters())


def test_grad_scale_will_not_overflow(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scale_will_not_overflow."""
    device = torch.device(device)
    model = torch.nn.Linear(5, 1).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    scaler = impl.GradScaler(device=device.type, growth_interval=1, growth_factor=2**4, init_scale=1e38)
    optimizer.zero_grad()
    x = torch.randn(1, 5).to(device)
    y = 1e-30 * torch.randn(1, 1).to(device)
    l = ((model(x) - y) ** 2).mean()  # noqa: E741 (torch's name)
    scaler.scale(l).backward()
    scaler.step(optimizer)
    scaler.update()
    assert not (scaler._scale == float("inf") or scaler._scale != scaler._scale), \
        f"scaler._scale should not be inf or nan, got {scaler._scale}"


def test_grad_scaling_clipping(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_clipping."""
    device = torch.device(device)

    def run(device, data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
        max_norm = 0.2  # A reasonable value that actually has an effect, based on printouts of grads
        for i, (input, target) in enumerate(data):
            optimizer.zero_grad()
            output = model(input)
            loss = loss_fn(output, target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * scaler.get_scale())
                if i == skip_iter and scaler.is_enabled():
                    model[1].weight.grad.data.fill_(float('inf'))
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if (not scaler.is_enabled()) or (i != skip_iter):
                    optimizer.step()

    _run_scaling_case(impl, device.type, run, unskipped=3, skipped=1, atol=1e-5)


def test_grad_scaling_clipping_separate_unscale(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_clipping_separate_unscale."""
    device = torch.device(device)

    def run(device, data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
        max_norm = 0.2  # A reasonable value that actually has an effect, based on printouts of grads
        for i, (input, target) in enumerate(data):
            optimizer.zero_grad()
            output = model(input)
            loss = loss_fn(output, target)
            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == skip_iter and scaler.is_enabled():
                    model[1].weight.grad.data.fill_(float('inf'))
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, error_if_nonfinite=False)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if (not scaler.is_enabled()) or (i != skip_iter):
                    optimizer.step()

    _run_scaling_case(impl, device.type, run, unskipped=3, skipped=1)


def test_grad_scaling_penalty(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_penalty."""
    device = torch.device(device)

    def run(device, data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
        for i, (input, target) in enumerate(data):
            optimizer.zero_grad()
            output = model(input)
            loss = loss_fn(output, target)

            if try_scaling_api:
                grad_params = torch.autograd.grad(scaler.scale(loss),
                                                  model.parameters(), create_graph=True)
                inv_scale = 1. / scaler.get_scale()
                grad_params = [p * inv_scale for p in grad_params]
            else:
                grad_params = torch.autograd.grad(loss, model.parameters(), create_graph=True)

            grad_norm = 0
            for grad in grad_params:
                grad_norm += grad.pow(2).sum()
            grad_norm = grad_norm.sqrt()
            loss = loss + grad_norm

            if try_scaling_api:
                scaler.scale(loss).backward()
                if i == skip_iter and scaler.is_enabled():
                    model[1].weight.grad.data.fill_(float('inf'))
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                if (not scaler.is_enabled()) or (i != skip_iter):
                    optimizer.step()

    _run_scaling_case(impl, device.type, run, unskipped=3, skipped=1)


def test_grad_scaling_accumulation(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_accumulation."""
    device = torch.device(device)

    def run(device, data, model, optimizer, scaler, loss_fn, skip_iter, try_scaling_api):
        iters_to_accumulate = 2
        for i, (input, target) in enumerate(data):
            output = model(input)
            loss = loss_fn(output, target)
            loss = loss / iters_to_accumulate
            if try_scaling_api:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if (i + 1) % iters_to_accumulate == 0:
                if try_scaling_api:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
                else:
                    optimizer.step()
                    optimizer.zero_grad()

    _run_scaling_case(impl, device.type, run, unskipped=2, skipped=0)


def test_grad_scaling_multiple(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaling_multiple."""
    device = torch.device(device)
    # Tests gradient scaling with 2 models and 2 optimizers that both receive gradients from 2 losses.
    # Some of the logic here cannot reuse the generic helper functions created for the 1-optimizer cases.
    for enabled in True, False:
        mod_control0, mod_scaling0, opt_control0, opt_scaling0, data, loss_fn, skip_iter = \
            _create_scaling_case(device.type)
        mod_control1, mod_scaling1, opt_control1, opt_scaling1 = \
            _create_scaling_models_optimizers(device.type)

        GradScaler = partial(impl.GradScaler, device=device.type)
        scaler = GradScaler(init_scale=128., growth_factor=2.0, enabled=enabled, growth_interval=1)

        def run(model0, model1, optimizer0, optimizer1, try_scaling_api,
                data=data, loss_fn=loss_fn, scaler=scaler, skip_iter=skip_iter):   # (bound: B023)
            for i, (input, target) in enumerate(data):
                optimizer0.zero_grad()
                optimizer1.zero_grad()
                output0 = model0(input)
                output1 = model1(input)
                loss0 = loss_fn(0.3 * output0 + 0.7 * output1, target)
                loss1 = loss_fn(0.6 * output0 - 0.4 * output1, target)

                if try_scaling_api:
                    scaler.scale(loss0).backward(retain_graph=True)
                    scaler.scale(loss1).backward()
                    if i == skip_iter and scaler.is_enabled():
                        model1[1].weight.grad.data.fill_(float('inf'))

                    # As an additional stress test, separately unscale for one of the optimizers.
                    scaler.unscale_(optimizer0)

                    scaler.step(optimizer0)
                    scaler.step(optimizer1)
                    scaler.update()
                else:
                    loss0.backward(retain_graph=True)
                    loss1.backward()
                    optimizer0.step()
                    if (not scaler.is_enabled()) or (i != skip_iter):
                        optimizer1.step()

        run(mod_control0, mod_control1, opt_control0, opt_control1, False)
        run(mod_scaling0, mod_scaling1, opt_scaling0, opt_scaling1, True)

        # The loss scale should have been multiplied by the growth factor 3 times and the backoff factor once.
        assert (scaler.get_scale() == (128. * scaler.get_growth_factor()**3 *
                                       scaler.get_backoff_factor()**1) if enabled else 1.0)

        for c, s in zip(chain(mod_control0.parameters(), mod_control1.parameters()),
                        chain(mod_scaling0.parameters(), mod_scaling1.parameters())):
            assert_equal(c, s, rtol=1e-5, atol=1e-7)


def test_grad_scaler_pass_itself(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_grad_scaler_pass_itself: both _step_supports_amp_scaling
    protocols."""
    device = torch.device(device)
    GradScaler = partial(impl.GradScaler, device=device.type)

    class _PlaceHolderOptimizer(torch.optim.Optimizer):
        def __init__(self, params, defaults=None):
            if defaults is None:
                defaults = {}
            super().__init__(params, defaults)
            self._step_supports_amp_scaling = True

    class Optimizer1(_PlaceHolderOptimizer):
        def step(self, closure=None, *, grad_scaler=None):
            assert isinstance(grad_scaler, impl.GradScaler)
            assert not hasattr(self, "grad_scale")
            assert not hasattr(self, "found_inf")

    class Optimizer2(_PlaceHolderOptimizer):
        def step(self, closure=None):
            assert isinstance(self.grad_scale, torch.Tensor)
            assert isinstance(self.found_inf, torch.Tensor)

    x = torch.randn(4, 4).to(device)
    m = torch.nn.Linear(4, 1).to(device)
    o1 = Optimizer1(m.parameters())
    o2 = Optimizer2(m.parameters())
    scaler = GradScaler(init_scale=2.0)

    with torch.autocast(device_type=device.type, dtype=torch.half):
        y = m(x)
        loss = y.mean()
    scaler.scale(loss).backward()
    with pytest.warns(FutureWarning):
        scaler.step(o1)
    scaler.step(o2)
    scaler.update()


def test_pickle_gradscaler(impl, device):
    """test/test_torch.py, TestTorchDeviceType.test_pickle_gradscaler."""
    # This test should pass in 3 cases for cuda:
    #  1. cuda is not available.
    #  2. cuda is available but device is not cuda.
    #  3. cuda is available and device is cuda.
    # In case 1, a and b disable themselves on construction and shouldn't try to pickle workhorse attributes.
    # In case 2, a and b are enabled.  Workhorse attributes participate in pickling, but none are lazy-inited
    # to cuda Tensors, because I don't want to do cuda things if device is not cuda.
    # In case 3, a and b are enabled and we may also try lazy-initing _scale to a cuda tensor.
    device = torch.device(device)
    try_lazy_inits = (True, False)
    GradScaler = partial(impl.GradScaler, device=device.type)
    for lazy_init_scale in try_lazy_inits:
        a = GradScaler(init_scale=3., growth_factor=4., backoff_factor=.5, growth_interval=2)
        assert a.is_enabled()
        if lazy_init_scale:
            # Dummy a.scale() call lazy-inits a._scale Tensor.
            a.scale(torch.tensor([4.0], dtype=torch.float32, device=device))
            assert a._scale.device.type == device.type
        # The following three lines should work whether or not cuda is available.
        serialized = pickle.dumps(a)
        b = pickle.loads(serialized)
        assert b.is_enabled() == a.is_enabled()
        if a.is_enabled():
            assert_equal(b.get_scale(), 3.)
            assert_equal(b.get_growth_factor(), 4.)
            assert_equal(b.get_backoff_factor(), .5)
            assert_equal(b.get_growth_interval(), 2)
            assert_equal(b._init_growth_tracker, 0)
            # supplies a dummy key to test the defaultdict's default_factory
            assert b._per_optimizer_states["fdsa"] == impl.module._refresh_per_optimizer_state()
            if lazy_init_scale:
                assert_equal(b.scale(torch.tensor([4.0], dtype=torch.float32, device=device)),
                             torch.tensor([12.0], device=device))


# -- test/test_optim.py -------------------------------------------------------------------------------------


@pytest.mark.parametrize("optim_name", OPTIM_INFOS)
def test_grad_scaling_autocast_fused_optimizers(impl, device, optim_name):
    """test/test_optim.py, TestOptimRenewed.test_grad_scaling_autocast_fused_optimizers.

    Compares a fused optimizer (it unscales and skips inside its kernel: the grad_scale/found_inf
    protocol) with the same optimizer unfused (the scaler unscales), step by step.
    """
    optim_info = OPTIM_INFOS[optim_name]
    optim_inputs = optim_info.optim_inputs_func(device=device)
    optim_cls = optim_info.optim_cls
    for optim_input in optim_inputs:
        for _separate_unscale in (True, False):
            kwargs = optim_input
            kwargs["fused"] = True
            torch.manual_seed(20)
            (
                mod_control,
                mod_scaling,
                opt_control,
                opt_scaling,
                data,
                loss_fn,
                _,
            ) = _create_scaling_case(
                optimizer_ctor=optim_cls, optimizer_kwargs=kwargs, device=device
            )
            optimizer_kwargs = deepcopy(kwargs)
            optimizer_kwargs["fused"] = False
            if "lr" not in kwargs:
                # _create_scaling_case will set lr = 1.0 if optimizer_kwargs do not set lr
                optimizer_kwargs["lr"] = 1.0
            opt_control = optim_cls(mod_control.parameters(), **optimizer_kwargs)
            scaler_scaling = impl.GradScaler(device, init_scale=128.0)
            scaler_control = impl.GradScaler(device, init_scale=128.0)

            tracker = TensorTracker()
            # Increase the tolerance for param and (max_)exp_avg_sq when betas aren't tensors
            # cuz the discrepancy between double vs float betas becomes too big. When Tensor
            # betas are used, fused and forloop both would have float betas and the default
            # tolerances are fine.
            assert_eq_kwargs = {}
            if "betas" in opt_control.param_groups[0] and not torch.is_tensor(
                opt_control.param_groups[0]["betas"][0]
            ):
                assert_eq_kwargs = {"atol": 2e-5, "rtol": 2e-5}
            for input, target in data:
                opt_control.zero_grad()
                with torch.autocast(device_type=device, dtype=torch.half):
                    output_control = mod_control(input)
                    loss_control = loss_fn(output_control, target)
                scaler_control.scale(loss_control).backward()
                scaler_control.step(opt_control)
                scaler_control.update()

                opt_scaling.zero_grad()
                with torch.autocast(device_type=device, dtype=torch.half):
                    output_scaling = mod_scaling(input)
                    loss_scaling = loss_fn(output_scaling, target)
                scaler_scaling.scale(loss_scaling).backward()
                if _separate_unscale:
                    scaler_scaling.unscale_(opt_scaling)
                scaler_scaling.step(opt_scaling)
                scaler_scaling.update()

                tracker.add(loss_control)
                tracker.pop_check_set(loss_scaling)
                for param_control, param_scaling in zip(
                    mod_control.parameters(), mod_scaling.parameters()
                ):
                    tracker.add(param_control.grad)
                    tracker.pop_check_set(param_scaling.grad)
                    tracker.add(param_control)
                    tracker.pop_check_set(param_scaling, assert_eq_kwargs)

                    state_control, state_scaling = (
                        opt_control.state[param_control],
                        opt_scaling.state[param_scaling],
                    )

                    for k in state_control:
                        actual = state_scaling[k]
                        if k == "step":
                            actual = actual.squeeze()
                        tracker.add(state_control[k])
                        tracker.pop_check_set(
                            actual,
                            assert_eq_kwargs
                            if k == "exp_avg_sq" or k == "max_exp_avg_sq"
                            else {},
                        )


# -- test/test_cuda_multigpu.py (two GPUs) ------------------------------------------------------------------


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=TWO_GPUS)])
def test_grad_scaling_scale(impl, device):
    """test/test_cuda_multigpu.py, TestCudaMultiGPU.test_grad_scaling_scale: one call scales outputs on two GPUs."""
    scaler = impl.GradScaler(device="cuda", init_scale=2.0)
    t0 = torch.full((1,), 4.0, dtype=torch.float32, device="cuda:0")
    t1 = torch.full((1,), 4.0, dtype=torch.float32, device="cuda:1")
    # Create some nested iterables of tensors on different devices.
    outputs = (
        t1.clone(),
        (t0.clone(), t1.clone()),
        [t0.clone(), (t1.clone(), t0.clone())],
    )
    outputs = scaler.scale(outputs)
    assert (
        outputs[0] == 8.0
        and outputs[1][0] == 8.0
        and outputs[1][1] == 8.0
        and outputs[2][0] == 8.0
        and outputs[2][1][0] == 8.0
        and outputs[2][1][1] == 8.0
    )
    assert scaler._scale.device == t1.device


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=TWO_GPUS)])
def test_grad_scaling_multigpu(impl, device):
    """test/test_cuda_multigpu.py, TestCudaMultiGPU.test_grad_scaling_multigpu: losses and gradients on two GPUs."""
    # Same as above, but runs some of the models on device 1.
    # GradScaler should transparently handle losses and gradients on multiple devices.
    # This test could be combined with the test above, but I think it makes sense to treat
    # multi-GPU operations separately.
    dev0 = torch.device("cuda:0")
    dev1 = torch.device("cuda:1")

    for enabled in True, False:
        (
            mod_control0,
            mod_scaling0,
            opt_control0,
            opt_scaling0,
            data,
            loss_fn,
            skip_iter,
        ) = _create_scaling_case()
        (
            mod_control1,
            mod_scaling1,
            opt_control1,
            opt_scaling1,
        ) = _create_scaling_models_optimizers(device=dev1)

        scaler = impl.GradScaler(
            device="cuda",
            init_scale=128.0,
            growth_factor=2.0,
            enabled=enabled,
            growth_interval=1,
        )

        def run(model0, model1, optimizer0, optimizer1, try_scaling_api,
                data=data, loss_fn=loss_fn, scaler=scaler, skip_iter=skip_iter):   # (bound: B023)
            for i, (input, target) in enumerate(data):
                optimizer0.zero_grad()
                optimizer1.zero_grad()
                output0 = model0(input)
                output1 = model1(input.to(dev1))
                loss0 = loss_fn(0.3 * output0 + 0.7 * output1.to(dev0), target)
                loss1 = loss_fn(
                    0.6 * output0.to(dev1) - 0.4 * output1, target.to(dev1)
                )

                if try_scaling_api:
                    scaler.scale(loss0).backward(retain_graph=True)
                    scaler.scale(loss1).backward()
                    if i == skip_iter and scaler.is_enabled():
                        model1[1].weight.grad.data.fill_(float("inf"))

                    # As an additional stress test, separately unscale for one of the optimizers.
                    scaler.unscale_(optimizer0)

                    scaler.step(optimizer0)
                    scaler.step(optimizer1)

                    # Make sure the found_infs were collected properly across optimizers and devices.
                    if scaler.is_enabled():
                        assert len(scaler._found_inf_per_device(optimizer0)) == 1
                        assert len(scaler._found_inf_per_device(optimizer1)) == 1
                        assert scaler._found_inf_per_device(optimizer0)[dev0].item() == 0.0
                        assert scaler._found_inf_per_device(optimizer1)[dev1].item() == float(i == skip_iter)

                    scaler.update()
                else:
                    loss0.backward(retain_graph=True)
                    loss1.backward()
                    optimizer0.step()
                    if (not scaler.is_enabled()) or (i != skip_iter):
                        optimizer1.step()

        run(mod_control0, mod_control1, opt_control0, opt_control1, False)
        run(mod_scaling0, mod_scaling1, opt_scaling0, opt_scaling1, True)

        # The loss scale should have been multiplied by the growth factor 3 times and the backoff factor once.
        assert (
            scaler.get_scale()
            == (
                128.0
                * scaler.get_growth_factor() ** 3
                * scaler.get_backoff_factor() ** 1
            )
            if enabled
            else 1.0
        )

        # Copy mod_control1 and mod_scaling1 back the device 0 for comparison
        mod_control1.to(dev0)
        mod_scaling1.to(dev0)

        for c, s in zip(
            chain(mod_control0.parameters(), mod_control1.parameters()),
            chain(mod_scaling0.parameters(), mod_scaling1.parameters()),
        ):
            assert_equal(c, s, rtol=1e-5, atol=1e-7)

