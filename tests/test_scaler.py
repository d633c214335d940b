"""ampteach.GradScaler against torch.amp.GradScaler("cpu"), step for step and bit for bit.

The pattern is PyTorch's own: the same model, data and optimizer twice, gradients broken on purpose
(inf, -inf, NaN) by a random plan, one run through torch's scaler and one through ours; after every
step the scale, the growth tracker and every parameter must be identical, bit for bit.
"""

from __future__ import annotations

import copy
import math
import pickle
import random
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from ampteach.amp.scaler import FLOAT32_MAX, GradScaler, OptState, StaticLossScaler, next_scale, update_scale_

INF, NAN = math.inf, math.nan
BAD_VALUES = (INF, -INF, NAN)
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
}
CONFIGS = {   # power-of-two defaults with a short interval, and odd factors that exercise float64 rounding
    "pow2": dict(init_scale=2.0**16, growth_interval=5),
    "odd": dict(init_scale=3.0 * 2**10, growth_factor=1.7, backoff_factor=0.3, growth_interval=3),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only adds contention (and flaky timings on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def make_data(steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(steps, 32, 8, generator=gen), torch.randint(0, 4, (steps, 32), generator=gen)


def make_plan(steps: int, n_params: int, seed: int, rate: float = 0.15) -> list[tuple[int, int, float] | None]:
    """Per step: None, or (parameter index, flat element index, inf/-inf/NaN) to write into that gradient."""
    rng = random.Random(seed)
    return [(rng.randrange(n_params), rng.randrange(4), rng.choice(BAD_VALUES)) if rng.random() < rate else None
            for _ in range(steps)]


def backward(model, scaler, x, y, fault=None) -> None:
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    if fault is not None:
        index, element, value = fault
        list(model.parameters())[index].grad.view(-1)[element] = value


def training_step(model, optimizer, scaler, x, y, fault=None, clip=False) -> None:
    optimizer.zero_grad(set_to_none=True)
    backward(model, scaler, x, y, fault)
    if clip:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()


def tracker(scaler) -> int:
    return scaler.state_dict()["_growth_tracker"]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of float32 tensors: unlike torch.equal, NaN == NaN (same payload) and -0 != 0."""
    return a.dtype == b.dtype == torch.float32 and torch.equal(a.detach().view(torch.int32),
                                                              b.detach().view(torch.int32))


def assert_same_state(ours, ref, model, ref_model, step) -> None:
    assert ours.get_scale() == ref.get_scale(), f"scale differs after step {step}"
    assert tracker(ours) == tracker(ref), f"growth tracker differs after step {step}"
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert same_bits(p, q), f"parameters differ after step {step}"


def assert_same_grads(params, ref_params) -> None:
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, equal_nan=True)


# -- training runs, step for step ----------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale+clip"])
@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_training_matches_torch_every_step(opt_name, clip, config):
    steps, seed = 200, 7
    model = make_model()
    ref_model = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[opt_name](model.parameters()), OPTIMIZERS[opt_name](ref_model.parameters())
    ours, ref = GradScaler("cpu", **CONFIGS[config]), torch.amp.GradScaler("cpu", **CONFIGS[config])
    xs, ys = make_data(steps, seed)
    plan = make_plan(steps, len(list(model.parameters())), seed)
    for step, fault in enumerate(plan):
        training_step(model, opt, ours, xs[step], ys[step], fault, clip)
        training_step(ref_model, ref_opt, ref, xs[step], ys[step], fault, clip)
        assert_same_state(ours, ref, model, ref_model, step)
        assert ours.last_step_skipped == (fault is not None)
    assert len(set(ours.scale_history)) > 3, "the plan should move the scale both ways"


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale+clip"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_power_of_two_scaling_equals_unscaled_control(opt_name, clip):
    """PyTorch's control-vs-scaled test: with S a power of two, scaling is exact, so a scaled run equals
    a plain fp32 run that skips the same steps."""
    steps, seed = 150, 3
    model = make_model()
    control = copy.deepcopy(model)
    opt, control_opt = OPTIMIZERS[opt_name](model.parameters()), OPTIMIZERS[opt_name](control.parameters())
    scaler = GradScaler("cpu", init_scale=2.0**12, growth_interval=4)
    no_scaling = GradScaler("cpu", enabled=False)
    xs, ys = make_data(steps, seed)
    for step, fault in enumerate(make_plan(steps, 4, seed)):
        training_step(model, opt, scaler, xs[step], ys[step], fault, clip)
        if fault is None:
            training_step(control, control_opt, no_scaling, xs[step], ys[step], None, clip)
        for p, q in zip(model.parameters(), control.parameters()):
            assert torch.equal(p, q), f"step {step}"
    assert scaler.get_scale() != 2.0**12


def test_several_optimizers_share_one_scale_and_skip_independently():
    steps, seed = 120, 11
    model = make_model()
    ref_model = copy.deepcopy(model)

    def optimizers(m):
        return [torch.optim.SGD(m[0].parameters(), lr=0.05, momentum=0.9), torch.optim.Adam(m[2].parameters(), lr=1e-2)]

    opts, ref_opts = optimizers(model), optimizers(ref_model)
    settings = dict(init_scale=2.0**8, growth_interval=3)
    ours, ref = GradScaler("cpu", **settings), torch.amp.GradScaler("cpu", **settings)
    xs, ys = make_data(steps, seed)
    rng = random.Random(seed)
    saw_one_skip = False
    for step, fault in enumerate(make_plan(steps, 4, seed, rate=0.3)):
        unscale_first = rng.random() < 0.5   # unscale_ one optimizer explicitly, let step() unscale the other
        for m, os_, s in ((model, opts, ours), (ref_model, ref_opts, ref)):
            for o in os_:
                o.zero_grad()
            backward(m, s, xs[step], ys[step], fault)
            if unscale_first:
                s.unscale_(os_[0])
            before = [p.detach().clone() for p in m.parameters()]
            for o in os_:
                s.step(o)
            s.update()
        assert_same_state(ours, ref, model, ref_model, step)
        assert ours.last_step_skipped == (fault is not None)
        if fault is not None:
            faulty_layer = fault[0] // 2   # params 0, 1 belong to optimizer 0; 2, 3 to optimizer 1
            other = [1, 0][faulty_layer]
            after = list(model.parameters())
            assert all(torch.equal(before[i], after[i]) for i in (2 * faulty_layer, 2 * faulty_layer + 1))
            saw_one_skip |= not torch.equal(before[2 * other], after[2 * other])
    assert saw_one_skip, "an optimizer without bad grads steps while the other one skips"


def test_fused_optimizer_protocol_matches_torch():
    """Adam(fused=True) unscales and skips inside its own kernel; the scaler hands it grad_scale and found_inf."""
    steps, seed = 60, 5
    model = make_model()
    ref_model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2, fused=True)
    ours, ref = GradScaler("cpu", **CONFIGS["odd"]), torch.amp.GradScaler("cpu", **CONFIGS["odd"])
    xs, ys = make_data(steps, seed)
    for step, fault in enumerate(make_plan(steps, 4, seed, rate=0.3)):
        clip = step % 2 == 0
        training_step(model, opt, ours, xs[step], ys[step], fault, clip)
        training_step(ref_model, ref_opt, ref, xs[step], ys[step], fault, clip)
        assert_same_state(ours, ref, model, ref_model, step)
        assert ours.last_step_skipped == (fault is not None)
        assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")


def test_sparse_gradients_match_torch():
    def run(scaler_cls):
        torch.manual_seed(0)
        emb = nn.Embedding(20, 4, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        scaler = scaler_cls("cpu", init_scale=3.0)
        idx = torch.tensor([1, 2, 2, 5])
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(emb(idx).pow(2).sum()).backward()
            scaler.step(opt)
            scaler.update()
        return emb.weight.detach()

    assert torch.equal(run(GradScaler), run(torch.amp.GradScaler))


# -- the numerics of one call ----------------------------------------------------------------------------


def scalers_with_grads(init_scale: float, grad: torch.Tensor):
    """(our scaler, our optimizer, torch's scaler, torch's optimizer), each optimizer holding a copy of grad."""
    out = []
    for cls in (GradScaler, torch.amp.GradScaler):
        p = nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype))
        p.grad = grad.clone()
        scaler = cls("cpu", init_scale=init_scale)
        scaler.scale(torch.ones(()))
        out += [scaler, torch.optim.SGD([p], lr=0.0)]
    return out


def torch_found_inf(scaler, optimizer) -> bool:
    return bool(sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()))


@settings(max_examples=150, deadline=None)
@given(
    init_scale=st.floats(min_value=2.0**-60, max_value=FLOAT32_MAX),
    exponent=st.integers(min_value=-45, max_value=38),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    bad=st.sampled_from([None, *BAD_VALUES]),
    seed=st.integers(0, 2**16),
)
def test_unscale_matches_torch(init_scale, exponent, dtype, bad, seed):
    grad = torch.randn(257, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 10.0**exponent
    grad = grad.to(dtype)
    if bad is not None:
        grad[seed % 257] = bad
    ours, opt, ref, ref_opt = scalers_with_grads(init_scale, grad)
    ours.unscale_(opt)
    ref.unscale_(ref_opt)
    assert_same_grads(opt.param_groups[0]["params"], ref_opt.param_groups[0]["params"])
    ours.step(opt)
    assert ours.last_step_skipped == torch_found_inf(ref, ref_opt)


def test_unscale_multiplies_by_the_float32_reciprocal_instead_of_dividing():
    grad = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    ours, opt, ref, ref_opt = scalers_with_grads(3.0, grad * 3)
    ours.unscale_(opt)
    ref.unscale_(ref_opt)
    unscaled = opt.param_groups[0]["params"][0].grad
    assert torch.equal(unscaled, ref_opt.param_groups[0]["params"][0].grad)
    assert torch.equal(unscaled, (grad * 3) * torch.tensor(1 / 3, dtype=torch.float32))
    assert not torch.equal(unscaled, (grad * 3) / 3), "dividing would round differently for some elements"


def test_finite_check_reads_gradients_before_they_are_unscaled():
    """A finite gradient that overflows only when unscaled (S < 1) does not skip the step, in torch or here."""
    grad = torch.tensor([3e38, 1.0])
    ours, opt, ref, ref_opt = scalers_with_grads(2.0**-10, grad)
    ours.step(opt)
    ref.step(ref_opt)
    assert not ours.last_step_skipped and not torch_found_inf(ref, ref_opt)
    assert_same_grads(opt.param_groups[0]["params"], ref_opt.param_groups[0]["params"])
    assert opt.param_groups[0]["params"][0].grad[0] == INF


@pytest.mark.parametrize("outputs", [
    torch.tensor(2.5), torch.tensor(2.5, dtype=torch.float16), torch.full((3,), 7.0, dtype=torch.float16),
    torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor(3.0, dtype=torch.float64),
], ids=["fp32", "fp16-0d", "fp16-vector", "bf16", "fp64"])
def test_scale_matches_torch_including_type_promotion(outputs):
    ours, ref = GradScaler("cpu", init_scale=3.0 * 2**14), torch.amp.GradScaler("cpu", init_scale=3.0 * 2**14)
    a, b = ours.scale(outputs), ref.scale(outputs)
    assert a.dtype == b.dtype and torch.equal(a, b)


def test_scale_handles_nested_lists_tuples_and_iterables_like_torch():
    ours, ref = GradScaler("cpu"), torch.amp.GradScaler("cpu")
    outputs = [torch.tensor(1.0), (torch.tensor(2.0), [torch.tensor(3.0)])]
    a, b = ours.scale(outputs), ref.scale(outputs)
    assert isinstance(a, list) and isinstance(a[1], tuple) and isinstance(a[1][1], list)
    assert torch.equal(a[1][1][0], b[1][1][0]) and torch.equal(a[0], b[0])
    assert [t.item() for t in ours.scale(t for t in [torch.tensor(1.0), torch.tensor(4.0)])] == [2.0**16, 2.0**18]
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        ours.scale(3.0)


def test_update_with_new_scale_matches_torch_and_keeps_the_tracker():
    ours, opt, ref, ref_opt = scalers_with_grads(2.0**10, torch.ones(3))
    for scaler, optimizer in ((ours, opt), (ref, ref_opt)):
        scaler.step(optimizer)
        scaler.update()                                 # tracker 1
        scaler.step(optimizer)
        scaler.update(new_scale=3.0)
        scaler.step(optimizer)
        scaler.update(new_scale=torch.tensor(5.0))
    assert ours.get_scale() == ref.get_scale() == 5.0
    assert tracker(ours) == tracker(ref) == 1
    assert ours.scale_history == [2.0**10, 3.0, 5.0]


# -- the update rule: property tests -------------------------------------------------------------------


def next_scale_in_place(scale, tracker, found, growth_factor, backoff_factor, growth_interval):
    """next_scale (the rule on Python numbers, GradScaler's CPU path) applied to update_scale_'s tensors."""
    s, t = next_scale(scale.item(), int(tracker.item()), found.item() != 0, growth_factor, backoff_factor,
                      growth_interval)
    scale.fill_(s)
    tracker.fill_(t)


@pytest.mark.parametrize("rule", [update_scale_, next_scale_in_place], ids=["tensor ops", "python numbers"])
@settings(max_examples=300, deadline=None)
@given(
    scale=st.one_of(st.floats(min_value=0.0, max_value=FLOAT32_MAX, width=32),
                    st.sampled_from([FLOAT32_MAX, 2.0**127, 1.5 * 2**127, 2.0**-149, 0.0])),
    tracker_start=st.one_of(st.integers(0, 12), st.just(2**31 - 1)),   # int32's top: the tracker wraps around
    found_inf=st.sampled_from([0.0, 1.0, 2.0, NAN]),
    growth_factor=st.floats(min_value=1.0, max_value=1e6, exclude_min=True),
    backoff_factor=st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True),
    growth_interval=st.integers(1, 10),
)
def test_update_scale_matches_torch_kernel(rule, scale, tracker_start, found_inf, growth_factor, backoff_factor,
                                           growth_interval):
    """update_scale_ and next_scale against torch._amp_update_scale_ (the kernel torch.amp.GradScaler.update calls)."""
    s, t = torch.tensor(scale, dtype=torch.float32), torch.tensor(tracker_start, dtype=torch.int32)
    s_ref, t_ref = s.clone(), t.clone()
    found = torch.tensor(found_inf)
    rule(s, t, found, growth_factor, backoff_factor, growth_interval)
    torch._amp_update_scale_(s_ref, t_ref, found, growth_factor, backoff_factor, growth_interval)
    assert torch.equal(s, s_ref) and torch.equal(t, t_ref)
    assert torch.isfinite(s)   # never grows to inf


@settings(max_examples=120, deadline=None)
@given(
    init_scale=st.one_of(st.floats(min_value=2.0**-126, max_value=FLOAT32_MAX),
                         st.sampled_from([FLOAT32_MAX, 2.0**127, 2.0**126, 1.0])),
    growth_factor=st.floats(min_value=1.0, max_value=64.0, exclude_min=True),
    backoff_factor=st.floats(min_value=1e-3, max_value=1.0, exclude_max=True),
    growth_interval=st.integers(1, 6),
    grads=st.lists(st.sampled_from([0.0, 1.0, -2.5, *BAD_VALUES]), min_size=1, max_size=40),
)
# Found by CI: backing off from 2^-126 to 2^-128 makes the float32 reciprocal inf, so a clean step
# writes NaN and -inf into the weights, identically in both scalers.
@example(init_scale=2.0**-126, growth_factor=2.0, backoff_factor=0.25, growth_interval=1, grads=[INF, 0.0])
def test_scale_trajectory_matches_torch(init_scale, growth_factor, backoff_factor, growth_interval, grads):
    """Random sequences of clean and inf/NaN steps through the whole API: scale, tracker, skips, history."""
    kwargs = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                  growth_interval=growth_interval)
    ours, ref = GradScaler("cpu", **kwargs), torch.amp.GradScaler("cpu", **kwargs)
    rigs = []
    for scaler in (ours, ref):
        p = nn.Parameter(torch.zeros(2))
        rigs.append((scaler, p, torch.optim.SGD([p], lr=1.0)))
    ref_history = []
    for value in grads:
        for scaler, p, opt in rigs:
            scaler.scale(torch.ones(()))
            p.grad = torch.tensor([value, 1.0])
            scaler.step(opt)
            scaler.update()
        assert ours.get_scale() == ref.get_scale()
        assert tracker(ours) == tracker(ref)
        assert ours.last_step_skipped == (not math.isfinite(value))
        assert same_bits(rigs[0][1], rigs[1][1])   # a tiny scale's inf reciprocal makes NaN weights in both
        ref_history.append(ref.get_scale())
    assert ours.scale_history == ref_history
    assert all(math.isfinite(s) for s in ours.scale_history)


def test_update_rule_worked_example():
    """interval 3: ok, ok, ok, ok, inf, ok, ok, ok from 8 -> 8, 8, 16, 16, 8, 8, 8, 16 (the reference sheet's
    example)."""
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=3)
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    for value in [1.0, 1.0, 1.0, 1.0, INF, 1.0, 1.0, 1.0]:
        scaler.scale(torch.ones(()))
        p.grad = torch.tensor([value])
        scaler.step(opt)
        scaler.update()
    assert scaler.scale_history == [8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0, 16.0]


# -- state dicts ---------------------------------------------------------------------------------------------


def run_some_steps(scaler, model, opt, xs, ys, plan, start, stop):
    for step in range(start, stop):
        training_step(model, opt, scaler, xs[step], ys[step], plan[step])


@pytest.mark.parametrize("direction", ["torch->ampteach", "ampteach->torch"])
@pytest.mark.parametrize("load_after_first_scale", [False, True])
def test_state_dict_interchanges_with_torch(direction, load_after_first_scale):
    steps, seed = 60, 2
    xs, ys = make_data(steps, seed)
    plan = make_plan(steps, 4, seed, rate=0.2)
    source_cls, target_cls = ((torch.amp.GradScaler, GradScaler) if direction == "torch->ampteach"
                              else (GradScaler, torch.amp.GradScaler))
    model = make_model()
    opt = OPTIMIZERS["sgd"](model.parameters())
    source = source_cls("cpu", **CONFIGS["odd"])
    run_some_steps(source, model, opt, xs, ys, plan, 0, 20)
    state = source.state_dict()
    assert list(state) == list(torch.amp.GradScaler("cpu").state_dict())
    assert [type(v) for v in state.values()] == [float, float, float, int, int]

    target = target_cls("cpu")   # default config: everything must come from the state dict
    if load_after_first_scale:
        target.scale(torch.ones(()))
    target.load_state_dict(state)
    assert target.state_dict() == state
    twin = copy.deepcopy(model)
    twin_opt = OPTIMIZERS["sgd"](twin.parameters())
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))   # load_state_dict would share the buffers
    for step in range(20, steps):
        training_step(model, opt, source, xs[step], ys[step], plan[step])
        training_step(twin, twin_opt, target, xs[step], ys[step], plan[step])
        assert_same_state(target, source, twin, model, step)


def test_disabled_state_dict_is_empty_and_loading_it_fails_like_torch():
    assert GradScaler("cpu", enabled=False).state_dict() == {} == \
        torch.amp.GradScaler("cpu", enabled=False).state_dict()
    message = "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
    for cls in (GradScaler, torch.amp.GradScaler):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            cls("cpu").load_state_dict({})
    for cls in (GradScaler, torch.amp.GradScaler):
        with pytest.raises(KeyError):
            cls("cpu").load_state_dict({"scale": 2.0})
    odd = {**GradScaler("cpu").state_dict(), "growth_factor": 0.5}   # torch loads it without a word; we warn
    ours, ref = GradScaler("cpu"), torch.amp.GradScaler("cpu")
    with pytest.warns(UserWarning, match="growth_factor=0.5"):
        ours.load_state_dict(odd)
    ref.load_state_dict(odd)
    assert ours.state_dict() == ref.state_dict() == odd


def test_getters_and_setters_like_torch():
    ours = GradScaler("cpu", init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    ref = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    for scaler in (ours, ref):
        scaler.set_growth_factor(4.0)
        scaler.set_backoff_factor(0.125)
        scaler.set_growth_interval(9)
    for getter in ("get_scale", "get_growth_factor", "get_backoff_factor", "get_growth_interval", "is_enabled",
                   "state_dict"):
        assert getattr(ours, getter)() == getattr(ref, getter)(), getter
    for setter, value in (("set_growth_factor", 1.0), ("set_backoff_factor", 1.5), ("set_growth_interval", 0)):
        getattr(ref, setter)(value)                    # torch's setters take anything; ours too, with a warning
        with pytest.warns(UserWarning, match=setter.removeprefix("set_")):
            getattr(ours, setter)(value)
    assert ours.state_dict() == ref.state_dict()


# -- misuse: the errors torch raises, of torch's types and starting with torch's words ----------------------


def error_of(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def misuse_both(steps):
    """Run the same misuse on torch's scaler and ours; return (our error, torch's error)."""
    errors = []
    for cls in (GradScaler, torch.amp.GradScaler):
        p = nn.Parameter(torch.ones(2))
        p.grad = torch.ones(2)
        errors.append(error_of(lambda cls=cls, p=p: steps(cls("cpu"), torch.optim.SGD([p], lr=0.1), p)))
    return errors


def scale_(s, o, p):
    s.scale(torch.ones(()))


MISUSES = {
    "unscale_ twice": lambda s, o, p: (scale_(s, o, p), s.unscale_(o), s.unscale_(o)),
    "unscale_ after step": lambda s, o, p: (scale_(s, o, p), s.step(o), s.unscale_(o)),
    "step twice": lambda s, o, p: (scale_(s, o, p), s.step(o), s.step(o)),
    "closure": lambda s, o, p: (scale_(s, o, p), s.step(o, closure=lambda: 0.0)),
    "no grads": lambda s, o, p: (scale_(s, o, p), setattr(p, "grad", None), s.step(o)),
    "unscale_ before scale": lambda s, o, p: s.unscale_(o),
    "step before scale": lambda s, o, p: s.step(o),
    "update before scale": lambda s, o, p: s.update(),
    "update without a step": lambda s, o, p: (scale_(s, o, p), s.update()),
    "pickle mid-iteration": lambda s, o, p: (scale_(s, o, p), s.step(o), pickle.dumps(s)),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_misuse_raises_torchs_exception_type_and_starts_with_torchs_words(misuse):
    ours, ref = misuse_both(MISUSES[misuse])
    assert type(ours) is type(ref), (ours, ref)
    assert str(ours).startswith(str(ref).rstrip(".")), (str(ours), str(ref))


def test_fp16_gradients_explain_master_weights():
    p = nn.Parameter(torch.ones(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients") as info:
        scaler.step(opt)
    assert "master weights" in str(info.value) and "ampteach.MasterWeights" in str(info.value)
    assert torch.equal(p.grad, torch.ones(2, dtype=torch.float16)), "nothing was unscaled"
    assert scaler._per_optimizer_states[id(opt)]["stage"] is OptState.READY


# -- enabled=False, the device, and what torch does not have ----------------------------------------------------


def test_disabled_scaler_is_a_pure_pass_through():
    scaler = GradScaler("cpu", enabled=False)
    loss = torch.tensor(2.0, requires_grad=True)
    assert scaler.scale(loss) is loss
    p = nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), INF)
    opt = torch.optim.SGD([p], lr=1.0)
    scaler.unscale_(opt)
    assert scaler.step(opt) is None and torch.equal(p.detach(), torch.full((2,), -INF)), "steps even on inf"
    scaler.update()
    assert scaler.get_scale() == 1.0 and not scaler.is_enabled()
    assert scaler.state_dict() == {} and scaler.scale_history == [] and not scaler.last_step_skipped
    scaler.load_state_dict({})   # a no-op, as in torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA fallback")
def test_cuda_scaler_without_cuda_warns_and_disables_like_torch():
    with pytest.warns(UserWarning, match="CUDA is not available"):
        ours = GradScaler()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = torch.amp.GradScaler()
    assert ours.is_enabled() is ref.is_enabled() is False


def test_last_step_skipped_survives_update_and_resets_at_the_next_step():
    ours, opt, _, _ = scalers_with_grads(2.0**4, torch.tensor([INF]))
    ours.step(opt)
    assert ours.last_step_skipped
    ours.update()
    assert ours.last_step_skipped, "still readable after update(), where training loops look"
    opt.param_groups[0]["params"][0].grad = torch.ones(1)
    ours.scale(torch.ones(()))
    ours.step(opt)
    assert not ours.last_step_skipped
    ours.update()
    assert ours.scale_history == [8.0, 8.0]


def test_get_scale_before_first_scale_is_init_scale_like_torch():
    assert GradScaler("cpu", init_scale=1024).get_scale() == 1024 == \
        torch.amp.GradScaler("cpu", init_scale=1024).get_scale()


# -- StaticLossScaler --------------------------------------------------------------------------------------------


def static_run(skip_nonfinite: bool, values):
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = StaticLossScaler(512.0, skip_nonfinite=skip_nonfinite)
    skipped = []
    for value in values:
        loss = scaler.scale(torch.tensor(1.0, dtype=torch.float16))
        assert loss.dtype == torch.float32 and loss.item() == 512.0
        p.grad = torch.tensor([value, 512.0])
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.last_step_skipped)
    return p.detach(), scaler, skipped


def test_static_scaler_keeps_its_scale_and_skips_nonfinite_steps_by_default():
    p, scaler, skipped = static_run(True, [512.0, INF, 1024.0])
    assert skipped == [False, True, False]
    assert torch.equal(p, torch.tensor([-3.0, -2.0]))
    assert scaler.scale_history == [512.0] * 3 and scaler.get_scale() == 512.0 and scaler.is_enabled()


def test_static_scaler_without_skipping_lets_an_overflow_into_the_weights():
    p, _, skipped = static_run(False, [512.0, INF, 1024.0])
    assert skipped == [False, False, False]
    assert p[0] == -INF, "the paper's plain recipe: one overflow poisons the weights"


def test_static_scaler_unscales_exactly_like_torch():
    grad = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 100
    for skip in (True, False):
        p, q = nn.Parameter(torch.zeros(500)), nn.Parameter(torch.zeros(500))
        p.grad, q.grad = grad.clone(), grad.clone()
        ours = StaticLossScaler(3.0 * 2**9, skip_nonfinite=skip)
        ref = torch.amp.GradScaler("cpu", init_scale=3.0 * 2**9)
        for scaler, param in ((ours, p), (ref, q)):
            scaler.scale(torch.ones(()))
            scaler.unscale_(torch.optim.SGD([param], lr=0.1))
        assert torch.equal(p.grad, q.grad)


def test_static_scaler_errors():
    with pytest.raises(ValueError, match="scale must be a positive"):
        StaticLossScaler(0.0)
    scaler = StaticLossScaler(8.0)
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="use GradScaler"):
        scaler.update(new_scale=4.0)
    disabled = StaticLossScaler(8.0, enabled=False)
    loss = torch.ones(())
    assert disabled.scale(loss) is loss and disabled.get_scale() == 1.0
