"""ampteach.amp.master against PyTorch's own arithmetic: to_half, MasterWeights, the O2 step, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ampteach
from ampteach.amp.master import MasterWeights, to_half
from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig, train, train_step

O2 = TrainConfig(precision="fp16", recipe="master")  # train_step's scaler is passed in: any impl
SCALERS = {
    "torch": lambda **kw: torch.amp.GradScaler("cpu", **kw),
    "ampteach": lambda **kw: ampteach.GradScaler("cpu", **kw),
}


@pytest.fixture(scope="module")
def data() -> Preloaded:
    return ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))


def batch(n: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def normed_model() -> nn.Sequential:
    """Every kind of layer to_half treats differently: conv, BatchNorm, GroupNorm, Linear, LayerNorm."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2),
        nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4 * 13 * 13, 16), nn.LayerNorm(16), nn.Linear(16, 10),
    )


# -- to_half ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_to_half_computes_what_module_half_computes(dtype):
    model = ampteach.mlp((32,))
    reference = copy.deepcopy(model).to(dtype)
    x, _ = batch()
    assert to_half(model, dtype) is model
    assert all(p.dtype == dtype for p in model.parameters())
    out = model(x)                                    # fp32 input accepted, fp32 logits returned
    assert out.dtype == torch.float32
    assert torch.equal(out, reference(x.to(dtype)).float())


def test_norm_layers_stay_fp32_and_normalise_the_upcast_half_activations():
    model = to_half(normed_model())
    conv1, bn, _, conv2, gn, _, fc1, ln, fc2 = model
    for norm in (bn, gn, ln):
        assert all(t.dtype == torch.float32 for t in [*norm.parameters(), bn.running_mean, bn.running_var])
    assert bn.num_batches_tracked.dtype == torch.int64
    assert all(p.dtype == torch.float16 for layer in (conv1, conv2, fc1, fc2) for p in layer.parameters())

    x, _ = batch()
    running_mean, running_var = bn.running_mean.clone(), bn.running_var.clone()
    out = model(x)
    # The reference, op by op: half convs and linears; each norm runs PyTorch's fp32 kernel on the
    # upcast (exact) half activation, and its output is rounded back to half for the next layer.
    h = F.conv2d(x.half(), conv1.weight, conv1.bias, padding=1)
    h = F.batch_norm(h.float(), running_mean, running_var, bn.weight, bn.bias, training=True).half()
    h = F.conv2d(h.relu(), conv2.weight, conv2.bias, stride=2)
    h = F.group_norm(h.float(), 2, gn.weight, gn.bias).half()
    h = F.linear(h.flatten(1), fc1.weight, fc1.bias)
    h = F.layer_norm(h.float(), (16,), ln.weight, ln.bias).half()
    assert torch.equal(out, F.linear(h, fc2.weight, fc2.bias).float())
    assert torch.equal(bn.running_mean, running_mean) and torch.equal(bn.running_var, running_var)

    out.sum().backward()
    assert all(p.grad.dtype == p.dtype for p in model.parameters())


def test_fp32_norm_layers_agree_with_torch_mixed_dtype_kernels_to_half_precision():
    """PyTorch's CPU norm kernels also take half input with fp32 weights; they round differently, not worse."""
    model = to_half(normed_model())
    bn, gn = model[1], model[4]
    h = torch.randn(16, 4, 13, 13, generator=torch.Generator().manual_seed(0)).half()
    for ours, theirs in [(bn(h), F.batch_norm(h, None, None, bn.weight, bn.bias, training=True)),
                         (gn(h), F.group_norm(h, 2, gn.weight, gn.bias))]:
        assert ours.dtype == theirs.dtype == torch.float16
        torch.testing.assert_close(ours, theirs, rtol=2 * 2.0**-10, atol=2.0**-10)


def test_keep_norm_fp32_false_halves_everything_but_integer_buffers():
    model = to_half(normed_model(), keep_norm_fp32=False)
    assert all(t.dtype == torch.float16 for t in [*model.parameters(), model[1].running_mean, model[1].running_var])
    assert model[1].num_batches_tracked.dtype == torch.int64
    assert model(batch()[0]).dtype == torch.float32


def test_to_half_twice_replaces_its_cast_hooks_instead_of_stacking_them():
    model = to_half(normed_model())
    x, _ = batch()
    model.eval()
    once = model(x)
    to_half(model)
    assert len(model._forward_pre_hooks) == 1 and len(model[1]._forward_pre_hooks) == 1
    assert torch.equal(model(x), once)
    to_half(model, torch.bfloat16)
    assert model[0].weight.dtype == torch.bfloat16 and model(x).dtype == torch.float32


def test_to_half_refuses_a_dtype_that_is_not_16_bit_float():
    with pytest.raises(ValueError, match="16-bit float"):
        to_half(ampteach.mlp((8,)), torch.float32)


# -- MasterWeights: the copies ------------------------------------------------------------------------


def test_master_copies_are_exact_fp32_copies_and_fp32_parameters_are_their_own_master():
    model = to_half(normed_model())
    model[8].bias.requires_grad_(False)
    master = MasterWeights(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(master.params) == len(trainable)
    for p, m in zip(trainable, master.params):
        assert m.dtype == torch.float32 and m.is_leaf and m.requires_grad
        if p.dtype == torch.float32:
            assert m is p                                   # norm layers: no copy, as in Apex
        else:
            assert torch.equal(m, p.float()) and m.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
    assert len(master.pairs) == sum(p.dtype == torch.float16 for p in trainable)


def test_master_weights_refuses_a_model_it_cannot_train():
    with pytest.raises(TypeError, match="nn.Module"):
        MasterWeights([nn.Parameter(torch.ones(2))])
    frozen = ampteach.mlp((8,)).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        MasterWeights(frozen)


def one_weight_model(w: torch.Tensor) -> nn.Module:
    model = nn.Linear(1, 1, bias=False)
    model.weight = nn.Parameter(w.reshape(1, 1))
    return model


@st.composite
def weight_and_small_update(draw):
    """An fp16 weight w and an fp16 update u smaller than half the gap to w's neighbour in u's direction."""
    sign = draw(st.sampled_from([1.0, -1.0]))
    mantissa, exponent = draw(st.integers(0, 1023)), draw(st.integers(-6, 4))
    w = torch.tensor(sign * (1 + mantissa / 1024) * 2.0**exponent, dtype=torch.float16)
    u_sign = draw(st.sampled_from([1.0, -1.0]))
    neighbour = torch.nextafter(w, torch.tensor(-u_sign * float("inf"), dtype=torch.float16))
    half_gap = (neighbour.float() - w.float()).abs() / 2           # exact in fp32
    u = (draw(st.floats(0.05, 0.95)) * half_gap * u_sign).half()
    return w, u, half_gap


@settings(max_examples=60, deadline=None)
@given(weight_and_small_update())
def test_an_update_below_half_an_ulp_is_lost_in_fp16_and_kept_by_the_master_copy(case):
    w, u, half_gap = case
    assert 0 < u.float().abs() < half_gap
    n_steps = int(torch.ceil(3 * half_gap / u.float().abs()))      # enough to move w by over one ulp

    pure = one_weight_model(w.clone())                              # the optimizer updates fp16 directly
    pure_opt = torch.optim.SGD(pure.parameters(), lr=1.0, foreach=False)
    o2 = one_weight_model(w.clone())
    master = MasterWeights(o2)
    o2_opt = torch.optim.SGD(master.params, lr=1.0, foreach=False)
    expected_fp16, expected_fp32 = w.clone(), w.float()
    for _ in range(n_steps):
        pure.weight.grad = u.reshape(1, 1).clone()
        pure_opt.step()
        o2.weight.grad = u.reshape(1, 1).clone()
        master.grads_to_master()
        o2_opt.step()
        master.master_to_model()
        expected_fp16 = expected_fp16.add(u, alpha=-1.0)           # torch's fp16 arithmetic
        expected_fp32 = expected_fp32.add(u.float(), alpha=-1.0)   # torch's fp32 arithmetic

    assert torch.equal(expected_fp16, w)                            # every fp16 update rounded away...
    assert torch.equal(pure.weight.view(()), w)
    assert torch.equal(master.params[0].view(()), expected_fp32)   # ...the fp32 master added them all up
    assert torch.equal(o2.weight.view(()), expected_fp32.half())
    assert not torch.equal(o2.weight.view(()), w)                   # and the fp16 model moved


# -- the O2 step with a loss scaler and several param groups -------------------------------------------


def two_groups(model: nn.Sequential) -> list[dict]:
    return [{"params": [model[1].weight, model[3].weight], "lr": 0.5},
            {"params": [model[1].bias, model[3].bias], "lr": 0.125}]


@pytest.mark.parametrize("impl", SCALERS)
def test_o2_step_with_param_groups_equals_torch_arithmetic_on_the_master_copies(impl):
    model = to_half(ampteach.mlp((16,)))
    master = MasterWeights(model)
    opt = torch.optim.SGD(master.param_groups(two_groups(model)), lr=1.0, foreach=False)
    for group, lr in zip(opt.param_groups, (0.5, 0.125)):
        assert group["lr"] == lr
    assert opt.param_groups[0]["params"][0] is master.master_of(model[1].weight)
    scaler = SCALERS[impl](init_scale=2.0**10)
    before = {id(m): m.detach().clone() for m in master.params}
    seen = {}

    def keep_half_grads(step, model):
        seen.update({id(p): p.grad.clone() for p in model.parameters()})

    x, y = batch()
    result = train_step(model, x, y, opt, scaler, O2, master=master, after_backward=keep_half_grads)
    assert not result.skipped and result.scale == 2.0**10
    inv_scale = torch.tensor(2.0**10, dtype=torch.float64).reciprocal().float()
    for group, lr in zip(two_groups(model), (0.5, 0.125)):
        for p in group["params"]:
            m = master.master_of(p)
            g16 = seen[id(p)]
            assert g16.dtype == torch.float16
            expected = before[id(m)].add(g16.float() * inv_scale, alpha=-lr)
            assert torch.equal(m, expected)
            assert torch.equal(p, expected.half())


@pytest.mark.parametrize("impl", SCALERS)
def test_an_inf_in_one_half_gradient_skips_the_step_on_every_master_copy(impl):
    model = to_half(ampteach.mlp((16,)))
    master = MasterWeights(model)
    opt = torch.optim.AdamW(master.param_groups(two_groups(model)))
    scaler = SCALERS[impl]()
    model_before = [p.detach().clone() for p in model.parameters()]
    master_before = [m.detach().clone() for m in master.params]

    def overflow(step, model):
        model[3].weight.grad[0, 0] = float("inf")

    x, y = batch()
    result = train_step(model, x, y, opt, scaler, O2, master=master, after_backward=overflow)
    assert result.skipped and scaler.get_scale() == 2.0**15
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model_before))
    assert all(torch.equal(a, b) for a, b in zip(master.params, master_before))
    assert opt.state == {}


@pytest.mark.parametrize("impl", SCALERS)
def test_a_scaler_refuses_fp16_gradients_which_is_why_master_copies_exist(impl):
    model = to_half(ampteach.mlp((8,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)             # no master copy: fp16 grads
    scaler = SCALERS[impl]()
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.step(opt)


def short_run(data: Preloaded, **config) -> float:
    ampteach.seed_everything(0)
    history = train(ampteach.mlp((64,)), data, TrainConfig(epochs=1, progress=False, **config))
    return history.final_accuracy


@pytest.fixture(scope="module")
def fp32_accuracy(data) -> float:
    accuracy = short_run(data)
    assert accuracy > 70                                            # a baseline that learned something
    return accuracy


@pytest.mark.parametrize("impl", SCALERS)
def test_fp16_model_with_master_weights_and_scaler_reaches_fp32_accuracy(data, fp32_accuracy, impl):
    assert abs(short_run(data, precision="fp16", recipe="master", impl=impl) - fp32_accuracy) <= 2.0


# -- checkpoints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_norm_fp32", [True, False])
def test_state_dict_holds_fp32_masters_and_loads_into_an_fp32_model(keep_norm_fp32):
    model = to_half(normed_model(), keep_norm_fp32=keep_norm_fp32)
    model[8].bias.requires_grad_(False)                            # frozen: no master, still saved in fp32
    master = MasterWeights(model)
    with torch.no_grad():
        for m in master.params:
            m.add_(1e-4)                                            # below fp16's resolution near 1
    state = master.state_dict()
    assert {k for k, t in state.items() if t.is_floating_point()} == \
        {k for k, t in model.state_dict().items() if t.is_floating_point()}
    assert all(t.dtype == torch.float32 for t in state.values() if t.is_floating_point())
    for name, t in model.state_dict(keep_vars=True).items():
        expected = master.master_of(t) if t.requires_grad else t.float()
        assert torch.equal(state[name], expected)
    fp32_model = normed_model()
    fp32_model.load_state_dict(state)
    assert torch.equal(fp32_model[0].weight, master.master_of(model[0].weight))


def test_load_state_dict_restores_masters_exactly_and_the_model_as_their_rounding():
    source = MasterWeights(to_half(normed_model()))
    with torch.no_grad():
        for m in source.params:
            m.mul_(1.0001)
    torch.manual_seed(1)
    target = MasterWeights(to_half(normed_model()))
    target.load_state_dict(source.state_dict())
    for m_src, m_dst in zip(source.params, target.params):
        assert torch.equal(m_src, m_dst)
    for p, m in target.pairs:
        assert torch.equal(p, m.half())


def test_load_state_dict_refuses_a_half_checkpoint():
    model = to_half(ampteach.mlp((8,)))
    with pytest.raises(ValueError, match="half checkpoint"):
        MasterWeights(model).load_state_dict(model.state_dict())


@pytest.mark.parametrize("impl", SCALERS)
def test_checkpoint_round_trips_through_torch_save_and_resumes_bit_exactly(tmp_path, impl):
    x_all, y_all = batch(n=12 * 32, seed=1)
    batches = list(zip(x_all.split(32), y_all.split(32)))
    inject_inf_at = 8                                               # a skipped step after the resume point

    def overflow(step, model):
        if step == inject_inf_at:
            model[1].weight.grad[0, 0] = float("inf")

    def fresh(seed: int):
        torch.manual_seed(seed)
        model = to_half(ampteach.mlp((16,)))
        master = MasterWeights(model)
        opt = torch.optim.AdamW(master.param_groups(two_groups(model)), weight_decay=0.1)
        return model, master, opt, SCALERS[impl](init_scale=2.0**12, growth_interval=3)

    def run(objects, steps):
        model, master, opt, scaler = objects
        for step in steps:
            x, y = batches[step]
            train_step(model, x, y, opt, scaler, O2, master=master, step=step, after_backward=overflow)

    straight = fresh(0)
    run(straight, range(12))

    first = fresh(0)
    run(first, range(5))
    model, master, opt, scaler = first
    torch.save({"master": master.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict()},
               tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed = fresh(1)                                              # different initial weights: all must load
    resumed[1].load_state_dict(ckpt["master"])
    resumed[2].load_state_dict(ckpt["opt"])
    resumed[3].load_state_dict(ckpt["scaler"])
    run(resumed, range(5, 12))

    assert straight[3].get_scale() == resumed[3].get_scale()
    assert all(torch.equal(a, b) for a, b in zip(straight[0].parameters(), resumed[0].parameters()))
    assert all(torch.equal(a, b) for a, b in zip(straight[1].params, resumed[1].params))
    for state_a, state_b in zip(straight[2].state.values(), resumed[2].state.values()):
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_param_groups_accepts_a_plain_list_and_refuses_a_foreign_parameter():
    model = to_half(ampteach.mlp((8,)))
    master = MasterWeights(model)
    (group,) = master.param_groups(model.parameters())
    assert len(group["params"]) == len(master.params)
    assert all(a is b for a, b in zip(group["params"], master.params))
    with pytest.raises(ValueError, match="not a parameter of the model"):
        master.param_groups([nn.Parameter(torch.ones(2))])


# -- param_groups takes what torch.optim takes, and refuses what it refuses ---------------------------------

GROUP_STRUCTURES = {   # written with the model's own parameters, as for an fp32 model's optimizer
    "parameters": lambda m: m.parameters(),
    "named_parameters": lambda m: m.named_parameters(),
    "named, in groups": lambda m: [{"params": m[1].named_parameters(), "lr": 0.5},
                                   {"params": m[3].named_parameters(), "momentum": 0.9}],
    "a tensor as a group's params": lambda m: [{"params": m[1].weight}, {"params": [m[1].bias]}],
    "mixed list, dict first": lambda m: [{"params": m[1].weight}, m[1].bias],
    "mixed list, tensor first": lambda m: [m[1].bias, {"params": m[1].weight}],
    "a set": lambda m: [{"params": {m[1].weight}}],
    "a tensor alone": lambda m: m[1].weight,
    "empty": lambda m: [],
    "no params key": lambda m: [{"lr": 0.1}],
    "some names missing": lambda m: [("w", m[1].weight), m[1].bias],
    "named and unnamed groups": lambda m: [{"params": m[1].named_parameters()}, {"params": m[3].parameters()}],
    "a number among them": lambda m: [m[1].weight, 3.0],
}


def optimizer_or_error(make):
    try:
        return make()
    except Exception as error:   # noqa: BLE001 (the type is the result)
        return type(error)


@pytest.mark.parametrize("structure", GROUP_STRUCTURES)
def test_param_groups_takes_what_torch_optim_takes_and_refuses_what_it_refuses(structure):
    model = to_half(ampteach.mlp((8, 8)))
    master = MasterWeights(model)
    make = GROUP_STRUCTURES[structure]
    ref = optimizer_or_error(lambda: torch.optim.SGD(make(model), lr=0.1))
    ours = optimizer_or_error(lambda: torch.optim.SGD(master.param_groups(make(model)), lr=0.1))
    if isinstance(ref, type):
        assert ours is ref, f"torch.optim raised {ref.__name__}, param_groups gave {ours}"
        return
    assert len(ours.param_groups) == len(ref.param_groups)
    for group, ref_group in zip(ours.param_groups, ref.param_groups):
        options = {k: v for k, v in group.items() if k != "params"}
        assert options == {k: v for k, v in ref_group.items() if k != "params"}
        assert [id(p) for p in group["params"]] == [id(master.master_of(p)) for p in ref_group["params"]]
        assert all(p.dtype == torch.float32 for p in group["params"])
    assert ours.state_dict()["param_groups"] == ref.state_dict()["param_groups"]   # param_names included


FROZEN = {   # a partly frozen half model, its groups written as for torch.optim over the model itself
    "named_parameters": lambda m: m.named_parameters(),
    "parameters": lambda m: m.parameters(),
    "named, in groups": lambda m: [{"params": m[1].named_parameters(), "lr": 0.5},
                                   {"params": m[3].named_parameters(), "momentum": 0.9}],
}


@pytest.mark.parametrize("structure", FROZEN)
def test_param_groups_keep_a_frozen_parameter_in_its_group_as_torch_optim_does(structure):
    """torch.optim keeps a frozen parameter in its group and never steps it (no gradient): so do the master
    groups, with the frozen parameter itself in its place (it has no master), and training goes on around it."""
    torch.manual_seed(0)
    model = to_half(ampteach.mlp((8, 8)))
    model[1].weight.requires_grad_(False)                          # frozen: fp16, no master copy
    frozen_before = model[1].weight.detach().clone()
    master = MasterWeights(model)
    make = FROZEN[structure]
    ref = optimizer_or_error(lambda: torch.optim.SGD(make(model), lr=0.1))
    ours = optimizer_or_error(lambda: torch.optim.SGD(master.param_groups(make(model)), lr=0.1))
    assert not isinstance(ref, type) and not isinstance(ours, type), (ref, ours)
    assert ours.state_dict()["param_groups"] == ref.state_dict()["param_groups"]   # names and options included
    for group, ref_group in zip(ours.param_groups, ref.param_groups, strict=True):
        assert [id(p) for p in group["params"]] == [id(master.master_of(p)) for p in ref_group["params"]]
        for p, q in zip(group["params"], ref_group["params"]):
            assert (p is q) == (not q.requires_grad) and (p.dtype == torch.float32 or p is q)
    trained_before = master.master_of(model[3].weight).detach().clone()
    x, y = batch(n=16)
    train_step(model, x, y, ours, SCALERS["ampteach"](init_scale=2.0**10), O2, master=master)
    assert torch.equal(model[1].weight, frozen_before) and model[1].weight.grad is None
    assert not torch.equal(master.master_of(model[3].weight), trained_before)      # the others are trained
