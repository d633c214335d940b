"""ampteach.HalfWeights: torch's own fp32 optimizer step, then each write-back rule exactly as defined.

The reference for the optimizer's arithmetic is the same torch optimizer stepping fp32 copies made by
hand; the reference for each rule is its definition (round to nearest by torch's cast, kahan_add_,
one of the two bf16 neighbours). On one weight, the sum of many small updates is compared with the
exact sum.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ampteach
from ampteach.amp.half_weights import HalfWeights
from ampteach.amp.kahan import kahan_add_
from ampteach.amp.master import to_half
from ampteach.lab.lost_updates import sgd_trace
from ampteach.lab.memory import memory_breakdown
from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig, train

ROUNDINGS_AND_MASTER = ("plain", "master", "nearest", "kahan", "stochastic")


def half_mlp(dtype=torch.bfloat16, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return to_half(ampteach.mlp((16,)), dtype)


def batch(n: int = 32):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def backward(model: nn.Module) -> None:
    x, y = batch()
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


@pytest.mark.parametrize("rounding", ["nearest", "kahan", "stochastic"])
def test_the_step_is_torchs_fp32_step_and_the_write_back_is_the_rule(rounding):
    model = half_mlp()
    half = HalfWeights(model, rounding, generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(half.params, lr=1e-2)
    reference = [nn.Parameter(p.detach().float()) for p, _ in half.pairs]     # the same optimizer on fp32 copies
    ref_opt = torch.optim.AdamW(reference, lr=1e-2)
    for _ in range(3):
        backward(model)
        before = [p.detach().clone() for p, _ in half.pairs]
        compensation = [c.clone() if c is not None else None for c in half.compensations]
        for r, (p, _) in zip(reference, half.pairs):
            r.data = p.detach().float()
            r.grad = p.grad.float()
        ref_opt.step()
        half.grads_to_master()
        opt.step()
        half.master_to_model()
        for (p, _), r, w0, c0, c in zip(half.pairs, reference, before, compensation, half.compensations):
            if rounding == "nearest":
                assert torch.equal(p, r.detach().to(torch.bfloat16))
            elif rounding == "kahan":
                w_expected = w0.clone()
                kahan_add_(w_expected, r.detach() - w0.float(), c0)
                assert torch.equal(p, w_expected) and torch.equal(c, c0)
            else:
                down = r.detach().to(torch.bfloat16)        # nearest, and the neighbour on x's other side
                other = torch.nextafter(down, torch.where(r > down.float(), math.inf, -math.inf).to(torch.bfloat16))
                assert ((p == down) | (p == other)).all()
                assert (p != down).any()                    # not simply rounding to nearest


def test_small_updates_lost_to_nearest_are_kept_by_master_kahan_and_stochastic_rounding():
    """4096 bf16 weights at 1.0, each given 1000 SGD updates of +2^-10 (w/u = 1024 > 2^9)."""
    torch.manual_seed(0)
    exact = 1 + 1000 * 2**-10                               # 1.9765625, a bf16 number
    final = {rule: sgd_trace(rule, 1.0, 2**-10, 1000, n=4096)[-1] for rule in ROUNDINGS_AND_MASTER}
    assert (final["plain"] == 1).all() and (final["nearest"] == 1).all()      # every update lost
    assert (final["master"] == exact).all() and (final["kahan"] == exact).all()
    # each step moves a weight one gap g (2^-7 below 2) with probability 2^-10 / g: per weight the
    # sum has variance below steps * 2^-10 * 2^-6 (g <= 2^-6), so the mean over 4096 weights has
    # standard error below sqrt(1000 * 2^-16 / 4096)
    stochastic = final["stochastic"]
    assert abs(stochastic.mean().item() - exact) < 5 * math.sqrt(1000 * 2**-16 / 4096)
    assert stochastic.std().item() > 0.01                   # but each weight on its own wanders


def test_between_steps_only_the_half_weights_and_compensation_remain():
    for rounding, compensation in (("kahan", 2.0), ("stochastic", 0.0), ("nearest", 0.0)):
        model = half_mlp()
        half = HalfWeights(model, rounding)
        opt = torch.optim.SGD(half.params, lr=0.1)
        backward(model)
        half.grads_to_master()
        opt.step()
        half.master_to_model()
        assert all(m.numel() == 0 and m.grad is None for _, m in half.pairs)
        per = memory_breakdown(model, opt, half).per_param
        assert per == {"weights": 2.0, "grads": 2.0, "master": 0.0, "master_grads": 0.0,
                       "compensation": compensation, "optimizer": 0.0}


def test_fp32_norm_parameters_are_their_own_working_copy_and_missing_grads_are_skipped():
    model = to_half(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)), torch.bfloat16)
    half = HalfWeights(model, "kahan")
    assert half.master_of(model[1].weight) is model[1].weight and half.compensation_of(model[1].weight) is None
    opt = torch.optim.SGD(half.params, lr=0.5)
    model[2].weight.requires_grad_(False)                   # frozen after HalfWeights was built: no grad
    frozen = model[2].weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    half.grads_to_master()
    opt.step()
    half.master_to_model()
    assert torch.equal(model[2].weight, frozen)
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32


def test_state_dict_keeps_the_compensation_and_restores_it():
    model = half_mlp()
    half = HalfWeights(model, "kahan")
    opt = torch.optim.SGD(half.params, lr=1e-3)
    for _ in range(3):
        backward(model)
        half.grads_to_master()
        opt.step()
        half.master_to_model()
    state = half.state_dict()
    assert any(k.startswith("kahan_compensation.") for k in state)
    restored = HalfWeights(half_mlp(seed=1), "kahan")
    restored.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(restored.model.parameters(), model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(restored.compensations, half.compensations))
    with pytest.raises(ValueError, match="kahan_compensation"):
        HalfWeights(half_mlp(), "kahan").load_state_dict(model.state_dict())


def test_mistakes_are_explained():
    with pytest.raises(ValueError, match="rounding must be one of"):
        HalfWeights(half_mlp(), "truncate")
    with pytest.raises(ValueError, match="bf16"):
        HalfWeights(half_mlp(torch.float16), "stochastic")
    with pytest.raises(ValueError, match="recipe='half'"):
        TrainConfig(precision="bf16", recipe="master", rounding="kahan")
    with pytest.raises(ValueError, match="precision='bf16'"):
        TrainConfig(precision="fp16", recipe="half", loss_scale=None, rounding="stochastic")


@pytest.fixture(scope="module")
def small() -> Preloaded:
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    return Preloaded(d.train_x[:256], d.train_y[:256], d.test_x[:128], d.test_y[:128], d.mean, d.std)


@pytest.mark.parametrize("rounding", ["kahan", "stochastic"])
def test_train_runs_half_weights_and_resumes_them_exactly(small, rounding, tmp_path):
    config = TrainConfig(precision="bf16", recipe="half", rounding=rounding, epochs=2, batch_size=64,
                         optimizer="sgd", lr=0.01, progress=False)
    torch.manual_seed(0)
    straight = ampteach.mlp((16,))
    history = train(straight, small, config)
    assert straight[1].weight.dtype == torch.bfloat16 and len(history.test_accuracy) == 2
    torch.manual_seed(0)
    first = ampteach.mlp((16,))
    train(first, small, TrainConfig(**{**config.__dict__, "epochs": 1}), checkpoint_path=tmp_path / "c.pt",
          checkpoint_every=4)
    torch.manual_seed(5)
    resumed = ampteach.mlp((16,))
    train(resumed, small, config, resume_from=tmp_path / "c.pt")
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), straight.parameters()))


def test_a_deep_copy_of_a_trained_fp32_model_can_go_on_in_half(small):
    """The lesson's pattern: pretrain in fp32, then continue copies of it in each bf16 variant."""
    torch.manual_seed(0)
    pretrained = ampteach.mlp((16,))
    train(pretrained, small, TrainConfig(epochs=1, batch_size=64, optimizer="sgd", lr=0.05, progress=False))
    for rounding in ("nearest", "kahan", "stochastic"):
        model = copy.deepcopy(pretrained)
        train(model, small, TrainConfig(precision="bf16", recipe="half", rounding=rounding, epochs=1, batch_size=64,
                                        optimizer="adamw", lr=1e-4, progress=False))
        assert pretrained[1].weight.dtype == torch.float32 and model[1].weight.dtype == torch.bfloat16
