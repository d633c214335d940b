"""Drop-in means drop-in: the odd inputs real training code has, through torch.amp.GradScaler and ampteach's.

One test (or a few) per point of issue 11, each comparing with torch: what torch accepts runs and gives
the same values, bit for bit; what torch refuses raises the same exception type (with ampteach's
clearer message). Memory stays bounded: no per-step tensors kept, no full-size temporaries.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scaler import one_thread  # noqa: F401 (autouse: tiny tensors run faster on one intra-op thread)
from torch import nn

from ampteach.amp.scaler import FLOAT32_MAX, GradScaler
from ampteach.amp.unscale_kernels import BUCKET_NUMEL, non_finite_check_and_unscale_

INF, NAN = math.inf, math.nan


def outcome(fn):
    """fn()'s result, or ("raised", the exception's type): what two implementations must agree on."""
    try:
        return fn()
    except Exception as error:   # noqa: BLE001 (the type is the result)
        return ("raised", type(error))


def both(run):
    """run(GradScaler class) for ampteach's class and torch's; returns (ours, torch's)."""
    return run(GradScaler), run(torch.amp.GradScaler)


def bits(t: torch.Tensor) -> list[int]:
    """A float tensor's exact bit patterns (so NaN == NaN, and -0.0 != 0.0)."""
    t = t.detach().float().reshape(-1)
    return t.view(torch.int32).tolist()


def scale_bits(x: float) -> int:
    return bits(torch.tensor([x], dtype=torch.float32))[0]


# -- parameters with zero elements ---------------------------------------------------------------------


def train_with_empty_parameters(cls):
    torch.manual_seed(0)
    model = nn.ModuleDict({"empty_in": nn.Linear(0, 3), "main": nn.Linear(4, 3)})
    extra = nn.Parameter(torch.zeros(0))
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1, momentum=0.9)
    scaler = cls("cpu", init_scale=2.0**10, growth_interval=2)
    for step in range(6):
        opt.zero_grad()
        x, e = torch.randn(5, 4), torch.randn(5, 0)
        loss = (model["main"](x) + model["empty_in"](e)).pow(2).mean() + extra.sum()
        scaler.scale(loss).backward()
        if step == 3:
            model["main"].weight.grad[0, 0] = INF
        scaler.step(opt)
        scaler.update()
    return [bits(p) for p in model.parameters()], scaler.get_scale()


def test_parameters_with_zero_elements_train_like_torch():
    ours, ref = both(train_with_empty_parameters)
    assert ours == ref
    assert ours[1] != 2.0**10   # the scale moved both ways


def test_an_optimizer_holding_only_an_empty_gradient_steps_like_torch():
    def run(cls):
        p = nn.Parameter(torch.zeros(0))
        p.grad = torch.zeros(0)
        scaler = cls("cpu")
        scaler.scale(torch.ones(()))
        scaler.step(torch.optim.SGD([p], lr=1.0))
        scaler.update()
        return scaler.get_scale(), scaler._get_growth_tracker()

    ours, ref = both(run)
    assert ours == ref == (2.0**16, 1)


# -- a fused optimizer without gradients this iteration ----------------------------------------------------


def two_optimizers_one_idle_fused(cls):
    torch.manual_seed(0)
    used, idle = nn.Linear(3, 3), nn.Linear(3, 3)
    opts = [torch.optim.SGD(used.parameters(), lr=0.1), torch.optim.Adam(idle.parameters(), lr=0.1, fused=True)]
    scaler = cls("cpu", init_scale=2.0**8, growth_interval=1)
    for _ in range(3):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        scaler.scale(used(torch.randn(2, 3)).sum()).backward()   # no gradient reaches `idle`
        for opt in opts:
            scaler.step(opt)
        scaler.update()
    return [bits(p) for p in (*used.parameters(), *idle.parameters())], scaler.get_scale()


def test_a_fused_optimizer_without_gradients_is_stepped_like_torch():
    ours, ref = both(two_optimizers_one_idle_fused)
    assert ours == ref
    assert ours[1] == 2.0**11


def test_update_after_only_an_idle_fused_optimizer_fails_like_torch():
    def run(cls):
        p = nn.Parameter(torch.ones(2))
        scaler = cls("cpu")
        scaler.scale(torch.ones(()))
        scaler.step(torch.optim.Adam([p], fused=True))
        return outcome(scaler.update)

    ours, ref = both(run)
    assert ours == ref == ("raised", AssertionError)


# -- scale() of several outputs multiplies by a copy of S ------------------------------------------------------


def backward_after_update(cls, as_list: bool):
    w = torch.ones((), requires_grad=True)
    scaler = cls("cpu", init_scale=4.0)
    p = nn.Parameter(torch.ones(1))
    p.grad = torch.ones(1)
    if as_list:
        _, l2 = scaler.scale([w * 2, w * 3])
    else:
        l2 = scaler.scale(w * 3)
    scaler.step(torch.optim.SGD([p], lr=0.0))
    scaler.update(new_scale=8.0)                   # writes into S in place
    return outcome(lambda: (l2.backward(), w.grad.item())[1])


def test_scaled_list_still_backpropagates_after_update_like_torch():
    ours, ref = both(lambda cls: backward_after_update(cls, as_list=True))
    assert ours == ref == 12.0                     # d(3w * S)/dw with the S used in scale(): 3 * 4


def test_a_single_scaled_tensor_after_update_fails_like_torch():
    ours, ref = both(lambda cls: backward_after_update(cls, as_list=False))
    assert ours == ref == ("raised", RuntimeError)  # torch multiplies one tensor by S itself, not a copy


# -- memory: bounded history, no full-size temporaries -------------------------------------------------------


def live_tensors() -> int:
    gc.collect()
    return sum(issubclass(type(obj), torch.Tensor) for obj in gc.get_objects())


def replay_update_rule(found: list[bool], scale: float, growth: float, backoff: float, interval: int) -> list[float]:
    """The dynamic update rule in plain Python (float64 products rounded once to float32): the scale after each step."""
    def f32(x: float) -> float:
        return float(np.float32(x)) if abs(x) <= FLOAT32_MAX else math.copysign(INF, x)   # no overflow warning

    tracker, history = 0, []
    for bad in found:
        if bad:
            scale, tracker = f32(scale * backoff), 0
        else:
            tracker += 1
            if tracker == interval:
                grown = f32(scale * growth)
                scale, tracker = (grown if math.isfinite(grown) else scale), 0
        history.append(scale)
    return history


def test_the_python_replay_of_the_update_rule_is_torchs_rule():
    found = [step % 7 == 6 for step in range(3000)]     # grows x2.25 every 7 steps: reaches float32's top and stays
    scale, tracker, expected = torch.full((), 3.0), torch.zeros((), dtype=torch.int32), []
    for bad in found:
        torch._amp_update_scale_(scale, tracker, torch.full((), float(bad)), 3.0, 0.25, 3)
        expected.append(scale.item())
    assert replay_update_rule(found, 3.0, 3.0, 0.25, 3) == expected
    assert max(expected) * 3.0 > FLOAT32_MAX            # growing further would overflow: "never to inf" was taken


@pytest.mark.slow
def test_100k_updates_hold_a_bounded_number_of_tensors_and_keep_every_scale():
    """100,000 update() calls, driven as step() leaves them (a found_inf per optimizer, here precomputed: no
    gradients, so the loop costs only update()): the tensor count stays flat and scale_history has every scale."""
    steps, every = 100_000, 7                        # an inf every 7th step: the scale saws up to float32's top
    settings = dict(init_scale=3.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=3)
    scaler = GradScaler("cpu", **settings)
    scaler.scale(torch.ones(()))
    found = [step % every == every - 1 for step in range(steps)]
    flags = {False: torch.zeros(()), True: torch.ones(())}
    counts = []
    for step, bad in enumerate(found):
        if step in (1_000, 10_000, 50_000, steps - 1):
            counts.append(live_tensors())
        # as step() leaves it:
        scaler._per_optimizer_states["opt"]["found_inf_per_device"] = {flags[bad].device: flags[bad]}
        scaler.update()
    assert max(counts) - counts[0] <= 2, f"update() must not keep a tensor per step: {counts} live tensors"
    assert scaler._history.numel() <= 2 * steps and scaler._history.dtype == torch.float32
    history = scaler.scale_history
    assert history == replay_update_rule(found, settings["init_scale"], 3.0, 0.25, 3)
    assert len(history) == steps and len(set(history)) > 2 and max(history) * 3.0 > FLOAT32_MAX


MEASURE_PEAK = textwrap.dedent("""
    import json, resource, sys, torch
    from ampteach.amp.scaler import GradScaler
    impl, n_tensors, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    params = [torch.nn.Parameter(torch.empty(numel)) for _ in range(n_tensors)]   # never touched: not resident
    for p in params:
        p.grad = torch.ones(numel)                  # fresh pages, all touched: resident
    opt = torch.optim.SGD(params, lr=0.0)
    cls = GradScaler if impl == "ampteach" else torch.amp.GradScaler
    warm = [torch.nn.Parameter(torch.empty(1000)) for _ in range(4)]   # small gradients: pages in the code first
    for p in warm:
        p.grad = torch.ones(1000)
    warm_up = cls("cpu")
    warm_up.scale(torch.ones(()))
    warm_up.unscale_(torch.optim.SGD(warm, lr=0.0))
    scaler = cls("cpu")
    scaler.scale(torch.ones(()))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scaler.unscale_(opt)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rise_mib": (after - before) / 1024}))
""")


def peak_rise_mib(impl: str, n_tensors: int, numel: int) -> float:
    """How much unscale_ raises the process's peak resident memory, in MiB (a fresh process per measurement)."""
    out = subprocess.run([sys.executable, "-c", MEASURE_PEAK, impl, str(n_tensors), str(numel)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rise_mib"]


@pytest.mark.parametrize("n_tensors, numel", [(50, 1 << 20), (400, 1 << 17)], ids=["50x4MiB", "400x512KiB"])
def test_unscale_needs_no_full_size_temporary(n_tensors, numel):
    """200 MiB of fp32 gradients: unscale_ may add a bucket's worth (2 MiB here), not a copy of the gradients."""
    bucket_mib = BUCKET_NUMEL * 4 / 2**20
    ours = peak_rise_mib("ampteach", n_tensors, numel)
    ref = peak_rise_mib("torch", n_tensors, numel)
    assert ours <= ref + bucket_mib + 4, (ours, ref)   # 4 MiB: allocator and page-rounding slack


# -- the check-and-unscale kernel, against torch's -----------------------------------------------------------


def kernel_both(make_grads, inv_scale):
    """(found_inf, bits of every grad) after ampteach's kernel and after torch's, on equal copies."""
    results = []
    for kernel in (non_finite_check_and_unscale_, torch._amp_foreach_non_finite_check_and_unscale_):
        grads, found = make_grads(), torch.zeros(())
        kernel(grads, found, torch.tensor(inv_scale))
        results.append((found.item(), [bits(g) for g in grads]))
    return results


@settings(max_examples=120, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3 * BUCKET_NUMEL // 2), max_size=10),   # small ones share buckets, big ones not
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    strided=st.booleans(),
    bad=st.lists(st.tuples(st.integers(0, 9), st.floats(0, 1, exclude_max=True), st.sampled_from([INF, -INF, NAN])),
                 max_size=3),
    inv_scale=st.sampled_from([1.0, 0.25, 2.0**-16, 3.0, 2.0**-126, INF, 0.0]),
    seed=st.integers(0, 2**16),
)
def test_check_and_unscale_kernel_matches_torchs_bit_for_bit(sizes, dtype, strided, bad, inv_scale, seed):
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(2 * n if strided else n, generator=gen).mul(2.0**8).to(dtype) for n in sizes]
    for index, where, value in bad:
        if index < len(base) and base[index].numel():
            base[index][int(where * base[index].numel())] = value

    def make_grads():
        return [b.clone()[::2] if strided else b.clone() for b in base]   # strided: not contiguous

    ours, ref = kernel_both(make_grads, inv_scale)
    assert ours == ref


@pytest.mark.parametrize("make_grads", [
    lambda: [], lambda: [torch.zeros(0), torch.zeros(0, 3)], lambda: [torch.tensor(2.0), torch.tensor(-INF)],
    lambda: [torch.arange(60000.0).reshape(300, 200).t(), torch.ones(5)],
    lambda: [torch.ones(3), torch.ones(3, dtype=torch.float16)],
], ids=["empty list", "empty tensors", "0-d", "big transposed", "mixed dtypes"])
def test_check_and_unscale_kernel_takes_torchs_odd_lists(make_grads):
    ours, ref = kernel_both(make_grads, 0.5)
    assert ours == ref


# -- sparse fp16 gradients are coalesced before the check ------------------------------------------------------


class CheckOnlyOptimizer(torch.optim.SGD):
    """An optimizer on torch's new protocol: the scaler hands it grad_scale and found_inf (like fused=True)."""

    _step_supports_amp_scaling = True

    def step(self, closure=None):
        self.seen = (self.grad_scale.item(), self.found_inf.item())


def sparse_fp16_check(cls, values):
    p = nn.Parameter(torch.zeros(2, 3, dtype=torch.float16))
    i = torch.tensor([[0, 1, 0], [2, 0, 2]])                     # (0, 2) twice: summed by coalesce()
    p.grad = torch.sparse_coo_tensor(i, torch.tensor(values), (2, 3), dtype=torch.float16)
    opt = CheckOnlyOptimizer([p], lr=1.0)
    scaler = cls("cpu", init_scale=1.0)
    scaler.scale(torch.ones(()))
    scaler.step(opt)
    return opt.seen, p.grad.is_coalesced(), bits(p.grad.to_dense())


@pytest.mark.parametrize("values, overflows", [([64000.0, 32.0, 64000.0], True), ([6.0, 32.0, 7.0], False)])
def test_sparse_fp16_gradients_are_coalesced_before_the_inf_check_like_torch(values, overflows):
    ours, ref = both(lambda cls: sparse_fp16_check(cls, values))
    assert ours == ref
    assert ours[0] == (1.0, float(overflows)) and ours[1]   # 64000 + 64000 overflows fp16 only once summed


# -- the deprecated grad_scaler= keyword protocol ----------------------------------------------------------------


class SelfUnscalingSGD(torch.optim.Optimizer):
    """A third-party optimizer on torch's old protocol: step() takes the scaler and unscales/skips itself."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self._step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None, *, grad_scaler=None):
        if grad_scaler is not None:
            grad_scaler.unscale_(self)
            if sum(v.item() for v in grad_scaler._found_inf_per_device(self).values()):
                return "skipped"
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])
        return "stepped"


class CheckingAdamLikeSGD(SelfUnscalingSGD):
    """The same protocol as torch 1.13's fused Adam used it: _get_scale_async and _check_inf_per_device."""

    @torch.no_grad()
    def step(self, closure=None, *, grad_scaler=None):
        found = grad_scaler._check_inf_per_device(self)
        if sum(v.item() for v in found.values()):
            return "skipped"
        inv = grad_scaler._get_scale_async().double().reciprocal().float()
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(p.grad * inv, alpha=-group["lr"])
        return "stepped"


@pytest.mark.parametrize("optimizer_cls", [SelfUnscalingSGD, CheckingAdamLikeSGD])
def test_grad_scaler_keyword_protocol_is_supported_like_torch(optimizer_cls):
    def run(cls):
        p = nn.Parameter(torch.ones(()))
        opt = optimizer_cls([p], lr=0.1)
        scaler = cls("cpu")
        results = []
        for grad_value in (None, INF):
            scaler.scale(3 * p).backward()               # loss = 3p: the true gradient is 3
            if grad_value is not None:
                p.grad.fill_(grad_value)
            with pytest.warns(FutureWarning, match="keyword argument"):
                results.append(scaler.step(opt))
            scaler.update()
            p.grad = None
        return p.item(), results, scaler.get_scale()

    ours, ref = both(run)
    assert ours == ref
    assert ours[1] == ["stepped", "skipped"] and abs(ours[0] - 0.7) < 1e-6   # 1 - 0.1 * 3, never the scaled grad


# -- growth_interval: numpy ints --------------------------------------------------------------------------------


def trajectory(cls, kwargs, grads, set_interval=None):
    """Construct, then train on one parameter through `grads` (values of one gradient element): what happened."""
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = cls("cpu", **kwargs)
            if set_interval is not None:
                scaler.set_growth_interval(set_interval)
        p = nn.Parameter(torch.zeros(2))
        opt = torch.optim.SGD([p], lr=1.0)
        seen = []
        for value in grads:
            scaler.scale(torch.ones(()))
            p.grad = torch.tensor([value, 1.0])
            scaler.step(opt)
            scaler.update()
            seen.append((scale_bits(scaler.get_scale()), scaler._get_growth_tracker(), bits(p)))
        return seen
    return outcome(run)


@pytest.mark.parametrize("interval", [np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3)], ids=repr)
def test_numpy_and_tensor_growth_intervals_work_like_torch(interval):
    grads = [1.0, 1.0, 1.0, INF, 1.0, 1.0, 1.0, 1.0]
    assert trajectory(GradScaler, {"growth_interval": interval}, grads) == \
        trajectory(torch.amp.GradScaler, {"growth_interval": interval}, grads)
    assert trajectory(GradScaler, {}, grads, set_interval=interval) == \
        trajectory(torch.amp.GradScaler, {}, grads, set_interval=interval)


# -- configurations: accept what torch accepts, refuse what it refuses ---------------------------------------------


ODD_VALUES = {
    "init_scale": [0.0, -1.0, NAN, INF, 1e39, FLOAT32_MAX, 3, np.float32(8.0), True, "8", None],
    "growth_factor": [1.0, 0.5, 1.0000001, INF, NAN, np.float32(2.0), 3, "2", None],
    "backoff_factor": [1.0, 1.5, 0.0, -0.5, NAN, np.float64(0.25), "0.5"],
    "growth_interval": [0, -1, 2**40, 2**70, 2.5, True, "3", None],
}
GRADS = [1.0, 1.0, INF, 1.0, NAN, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("name, value", [(k, v) for k, vs in ODD_VALUES.items() for v in vs],
                         ids=lambda x: repr(x) if not isinstance(x, str) or len(x) > 3 else x)
def test_odd_configuration_is_accepted_or_refused_like_torch(name, value):
    """Same steps, scales, trackers and weights, or the same exception type (possibly raised earlier by us)."""
    ours = trajectory(GradScaler, {name: value}, GRADS)
    ref = trajectory(torch.amp.GradScaler, {name: value}, GRADS)
    assert ours == ref


@settings(max_examples=200, deadline=None)
@given(
    init_scale=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-4, 2**20)),
    growth_factor=st.floats(allow_nan=True, allow_infinity=True),
    backoff_factor=st.floats(allow_nan=True, allow_infinity=True),
    growth_interval=st.integers(-3, 6),
    grads=st.lists(st.sampled_from([0.0, 1.0, -2.5, INF, -INF, NAN]), min_size=1, max_size=10),
)
def test_any_numeric_configuration_behaves_like_torch(init_scale, growth_factor, backoff_factor, growth_interval,
                                                      grads):
    kwargs = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                  growth_interval=growth_interval)
    assert trajectory(GradScaler, kwargs, grads) == trajectory(torch.amp.GradScaler, kwargs, grads)


@pytest.mark.parametrize("kwargs", [
    dict(init_scale=0.0), dict(init_scale=-1.0), dict(init_scale=NAN), dict(init_scale=INF), dict(init_scale=1e39),
    dict(growth_factor=INF), dict(growth_factor=NAN), dict(backoff_factor=0.0), dict(backoff_factor=-0.5),
    dict(backoff_factor=NAN), dict(growth_interval=0), dict(growth_interval=-1),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_configuration_that_cannot_be_meant_is_accepted_with_a_warning_naming_it(kwargs):
    (name, value), = kwargs.items()
    with pytest.warns(UserWarning, match=name):
        GradScaler("cpu", **kwargs)


def test_usual_configurations_and_setters_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler = GradScaler("cpu", init_scale=2.0**24, growth_factor=1.5, backoff_factor=0.9, growth_interval=1)
        scaler.set_growth_interval(np.int64(100))
        scaler.set_growth_factor(4.0)
        scaler.set_backoff_factor(0.25)
        scaler.load_state_dict(torch.amp.GradScaler("cpu").state_dict())


@pytest.mark.parametrize("setter, value", [("set_growth_factor", 1.0), ("set_growth_factor", 0.5),
                                           ("set_backoff_factor", 1.0), ("set_backoff_factor", 0.0),
                                           ("set_growth_interval", 0)])
def test_setters_take_what_torchs_take_and_warn_when_it_cannot_be_meant(setter, value):
    grads = [1.0, 1.0, INF, 1.0, 1.0]

    def run(cls):
        def with_setter():
            scaler = cls("cpu", growth_interval=1)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                getattr(scaler, setter)(value)
            p = nn.Parameter(torch.zeros(1))
            opt = torch.optim.SGD([p], lr=1.0)
            scales = []
            for g in grads:
                scaler.scale(torch.ones(()))
                p.grad = torch.tensor([g])
                scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
            return scales, [str(w.message) for w in caught]
        return outcome(with_setter)

    (ours, our_warnings), (ref, _) = both(run)
    assert ours == ref
    assert len(our_warnings) == 1 and setter.removeprefix("set_") in our_warnings[0]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_disabled_scaler_ignores_the_other_arguments_like_torch(device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("checks the no-CUDA fallback")
    odd = dict(init_scale=-1.0, growth_factor=0.5, backoff_factor=2.0, growth_interval="never")

    def run(cls, enabled):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler = outcome(lambda: cls(device, enabled=enabled, **odd))
        if isinstance(scaler, tuple):
            return scaler
        loss = torch.ones(())
        return scaler.is_enabled(), scaler.scale(loss) is loss, scaler.get_scale(), len(caught)

    expected_warnings = 1 if device == "cuda" else 0   # "CUDA is not available. Disabling."
    for enabled in ([False] if device == "cpu" else [True, False]):
        ours, ref = both(functools.partial(run, enabled=enabled))
        assert ours == ref == (False, True, 1.0, expected_warnings if enabled else 0)


DISABLED_CALLS = {   # every getter, hook and state call, on a disabled scaler whose optimizer has a gradient
    "get_scale": lambda s, opt: s.get_scale(),
    "get_growth_factor": lambda s, opt: s.get_growth_factor(),
    "get_backoff_factor": lambda s, opt: s.get_backoff_factor(),
    "get_growth_interval": lambda s, opt: s.get_growth_interval(),
    "_get_growth_tracker": lambda s, opt: s._get_growth_tracker(),
    "_get_scale_async": lambda s, opt: s._get_scale_async(),
    "is_enabled": lambda s, opt: s.is_enabled(),
    "state_dict": lambda s, opt: s.state_dict(),
    "load_state_dict": lambda s, opt: s.load_state_dict({"scale": 4.0}),
    "_check_inf_per_device": lambda s, opt: s._check_inf_per_device(opt),
    "_found_inf_per_device": lambda s, opt: s._found_inf_per_device(opt),
    "unscale_": lambda s, opt: s.unscale_(opt),
    "step": lambda s, opt: (s.step(opt), opt.param_groups[0]["params"][0].tolist()),
    "step with a closure": lambda s, opt: s.step(opt, closure=lambda: 7.0),
    "update": lambda s, opt: s.update(),
    "update(new_scale)": lambda s, opt: s.update(new_scale=2.0),
    "set, then get, each factor": lambda s, opt: (s.set_growth_factor(3.0), s.set_backoff_factor(0.25),
                                                  s.set_growth_interval("never"), s.get_growth_factor(),
                                                  s.get_backoff_factor(), s.get_growth_interval()),
    "pickled and back": lambda s, opt: (lambda t: (t.is_enabled(), t.get_scale(), t.state_dict()))(
        pickle.loads(pickle.dumps(s))),
}


@pytest.mark.parametrize("call", DISABLED_CALLS)
@pytest.mark.parametrize("how", ["enabled=False", "cuda without CUDA"])
def test_disabled_scaler_answers_every_call_like_torch(how, call):
    """torch's disabled GradScaler keeps no scale, factors or interval: reading one is an AttributeError
    until a setter stores it; get_scale is 1.0, the tracker 0, state_dict {}; step is optimizer.step()."""
    if how == "cuda without CUDA" and torch.cuda.is_available():
        pytest.skip("checks the no-CUDA fallback")

    def run(cls):
        p = nn.Parameter(torch.ones(2))
        p.grad = torch.full((2,), INF)
        opt = torch.optim.SGD([p], lr=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = cls("cpu", enabled=False) if how == "enabled=False" else cls("cuda")
        return outcome(lambda: DISABLED_CALLS[call](scaler, opt))

    ours, ref = both(run)
    assert ours == ref
    if call == "get_growth_factor":
        assert ours == ("raised", AttributeError)
        with pytest.raises(AttributeError, match="disabled .*is_enabled"):
            GradScaler("cpu", enabled=False).get_growth_factor()


# -- the exception types of misuse ------------------------------------------------------------------------------


def misuse(cls, steps):
    p = nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    scaler = cls("cpu")
    return outcome(lambda: steps(scaler, torch.optim.SGD([p], lr=0.1), p))


def scaled(s):
    s.scale(torch.ones(()))


MISUSES = {
    "step before scale": lambda s, o, p: s.step(o),
    "unscale_ before scale": lambda s, o, p: s.unscale_(o),
    "update before scale": lambda s, o, p: s.update(),
    "step without backward": lambda s, o, p: (scaled(s), setattr(p, "grad", None), s.step(o)),
    "update without a step": lambda s, o, p: (scaled(s), s.update()),
    "new_scale int": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=3)),
    "new_scale bool": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=True)),
    "new_scale np.float32": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=np.float32(3.0))),
    "new_scale str": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale="3.0")),
    "new_scale shape (1,)": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=torch.tensor([3.0]))),
    "new_scale two elements": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=torch.ones(2))),
    "new_scale requires_grad": lambda s, o, p: (scaled(s), s.step(o),
                                                s.update(new_scale=torch.ones((), requires_grad=True))),
    "new_scale on meta": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=torch.ones((), device="meta"))),
    "new_scale overflows float32": lambda s, o, p: (scaled(s), s.step(o), s.update(new_scale=1e39)),
    "unscale_ twice": lambda s, o, p: (scaled(s), s.unscale_(o), s.unscale_(o)),
    "step twice": lambda s, o, p: (scaled(s), s.step(o), s.step(o)),
    "fp16 gradients": lambda s, o, p: (scaled(s), setattr(p, "data", p.data.half()),
                                       setattr(p, "grad", torch.ones(2, dtype=torch.float16)), s.step(o)),
    "load an empty state dict": lambda s, o, p: s.load_state_dict({}),
    "load a partial state dict": lambda s, o, p: s.load_state_dict({"scale": 2.0}),
}


@pytest.mark.parametrize("name", MISUSES)
def test_misuse_raises_the_exception_type_torch_raises(name):
    ours, ref = both(lambda cls: misuse(cls, MISUSES[name]))
    assert isinstance(ref, tuple) and ref[0] == "raised", "torch refuses it"
    assert ours == ref


def test_our_messages_say_what_to_do():
    def message(steps):
        p = nn.Parameter(torch.ones(2))
        p.grad = torch.ones(2)
        with pytest.raises(Exception) as info:
            steps(GradScaler("cpu"), torch.optim.SGD([p], lr=0.1), p)
        return str(info.value)

    assert "scaler.scale(loss or outputs)" in message(MISUSES["step before scale"])
    assert "call scaler.scale(loss).backward() before step()" in message(MISUSES["step without backward"])
    assert "Call scaler.step(optimizer)" in message(MISUSES["update without a step"])
    assert "Python float" in message(MISUSES["new_scale int"])
    assert "reshape(())" in message(MISUSES["new_scale shape (1,)"])


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.float8_e4m3fn], ids=str)
def test_gradients_torch_cannot_unscale_are_refused_like_torch(dtype):
    def run(cls):
        p = nn.Parameter(torch.ones(2).to(dtype), requires_grad=dtype.is_complex)
        p.grad = torch.ones(2).to(dtype)
        scaler = cls("cpu")
        scaler.scale(torch.ones(()))
        return outcome(lambda: scaler.unscale_(torch.optim.SGD([p], lr=0.1)))

    ours, ref = both(run)
    assert ours == ref == ("raised", NotImplementedError)


def test_new_scale_float_subclasses_and_tensors_are_accepted_like_torch():
    def run(cls):
        p = nn.Parameter(torch.ones(1))
        p.grad = torch.ones(1)
        scaler = cls("cpu")
        opt = torch.optim.SGD([p], lr=0.0)
        seen = []
        for new_scale in (np.float64(3.0), torch.tensor(5, dtype=torch.int32), torch.tensor(7.0, dtype=torch.float64)):
            scaler.scale(torch.ones(()))
            scaler.step(opt)
            scaler.update(new_scale=new_scale)
            seen.append(scaler.get_scale())
        return seen

    ours, ref = both(run)
    assert ours == ref == [3.0, 5.0, 7.0]


# -- under torch.compile: dynamo traces neither scaler (issue 34) --------------------------------------------


def compiled_training(cls, backend: str, whole_step: bool) -> tuple[list, list[str]]:
    """Four bf16 steps (an inf gradient on the third), compiled: the whole step, or the optimizer half
    (unscale_, clipping, step, update) with forward and backward eager. Returns (losses, scales, weights
    after each step) and the warnings the run raised (category: message)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = cls("cpu", init_scale=2.0**8, growth_interval=2)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.nn.functional.cross_entropy(model(x), y)

    def optimizer_half():
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    def whole(overflow: bool):
        opt.zero_grad(set_to_none=True)
        loss = forward()
        scaler.scale(loss).backward()
        if overflow:
            model[0].weight.grad[0, 0] = INF
        optimizer_half()
        return loss.detach()

    compiled_whole = torch.compile(whole, backend=backend)
    compiled_half = torch.compile(optimizer_half, backend=backend)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always" if whole_step else "error")
        for i in range(4):
            if whole_step:
                loss = compiled_whole(i == 2)
            else:
                opt.zero_grad(set_to_none=True)
                loss = forward()
                scaler.scale(loss).backward()
                if i == 2:
                    model[0].weight.grad[0, 0] = INF
                compiled_half()
            results.append((loss, scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
    return results, sorted({f"{w.category.__name__}: {w.message}" for w in caught})


@pytest.fixture(scope="module")
def torch_compile_imported():
    """torch.compile's first use imports inductor, whose imports warn (torch.jit deprecations): done before."""
    import torch._inductor.compile_fx  # noqa: F401


def same_results(a, b) -> bool:
    return len(a) == len(b) and all(
        la.dtype == lb.dtype and bits(la) == bits(lb) and sa == sb and all(bits(p) == bits(q) for p, q in zip(pa, pb))
        for (la, sa, pa), (lb, sb, pb) in zip(a, b))


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_a_compiled_optimizer_step_raises_no_warning_and_matches_torch(backend, torch_compile_imported):
    """With warnings as errors: dynamo skips torch's scaler (torch.amp is on its skip list) and ampteach's (put
    there beside it), so it never traces the unscale machinery's lru_caches; optimizer.step is compiled in both."""
    from ampteach.lab.autocast_compile import has_c_compiler
    if backend == "inductor" and not has_c_compiler():
        pytest.skip("inductor's CPU kernels need a C++ compiler")
    (ours, our_warnings), (ref, ref_warnings) = both(lambda cls: compiled_training(cls, backend, whole_step=False))
    assert our_warnings == ref_warnings == []
    assert same_results(ours, ref) and ours[2][1] == ours[1][1] / 2     # the inf step backed the scale off


def test_a_compiled_whole_step_warns_only_what_torch_warns(torch_compile_imported):
    """Forward, backward, unscale_, clipping, step and update in one compiled function: the same warnings as
    with torch's scaler (dynamo's own, about the non-leaf loss at each graph break), none from ampteach."""
    (ours, our_warnings), (ref, ref_warnings) = both(lambda cls: compiled_training(cls, "eager", whole_step=True))
    assert our_warnings == ref_warnings
    assert not any("lru_cache" in w for w in our_warnings)
    assert same_results(ours, ref)
