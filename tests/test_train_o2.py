"""train()'s recipes against the loops they stand for, written out with PyTorch calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ampteach
from ampteach.amp.master import MasterWeights, to_half
from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig, evaluate, train

BATCH = 64


@pytest.fixture(scope="module")
def small() -> Preloaded:
    """The first 256 training and 128 held-out images: a few steps, enough to compare loops."""
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    return Preloaded(d.train_x[:256], d.train_y[:256], d.test_x[:128], d.test_y[:128], d.mean, d.std)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return ampteach.mlp((16,))


def run(data: Preloaded, **config) -> tuple[torch.nn.Module, ampteach.History]:
    m = model()
    return m, train(m, data, TrainConfig(epochs=1, batch_size=BATCH, progress=False, **config))


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_default_recipe_is_the_autocast_loop_it_always_was(small, precision):
    trained, _ = run(small, precision=precision)
    assert TrainConfig().recipe == "autocast"
    ref = model()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.0)   # TrainConfig defaults
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    for x, y in small.batches(BATCH, shuffle=True, seed=0):
        with torch.autocast("cpu", dtype=dtype, enabled=precision != "fp32"):
            loss = F.cross_entropy(ref(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert same_parameters(trained, ref)


@pytest.mark.parametrize("clip_norm", [None, 0.05])
def test_recipe_master_is_the_five_step_o2_loop(small, clip_norm):
    trained, history = run(small, precision="fp16", recipe="master", clip_norm=clip_norm)
    ref = to_half(model())
    master = MasterWeights(ref)
    opt = torch.optim.AdamW(master.params, lr=1e-3, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu")
    for x, y in small.batches(BATCH, shuffle=True, seed=0):
        loss = F.cross_entropy(ref(x), y)                           # 1. fp16 forward, fp32 logits and loss
        opt.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()                               # 2. fp16 grads of S * loss
        master.grads_to_master()                                    # 3. to the fp32 copies
        if clip_norm is not None:                                   #    clip the master grads, unscaled
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(master.params, clip_norm)
        scaler.step(opt)                                            # 4. unscale, skip on inf, step
        scaler.update()
        master.master_to_model()                                    # 5. back to fp16
    assert all(p.dtype == torch.float16 for p in trained.parameters())
    assert same_parameters(trained, ref)
    assert history.final_accuracy == evaluate(ref, small)           # evaluated without autocast


def test_recipe_half_updates_the_half_weights_directly(small):
    trained, _ = run(small, precision="fp16", recipe="half", loss_scale=None, optimizer="sgd", lr=0.1)
    ref = to_half(model())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in small.batches(BATCH, shuffle=True, seed=0):
        loss = F.cross_entropy(ref(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert same_parameters(trained, ref)


def test_bf16_master_weights_need_no_scaler(small):
    trained, history = run(small, precision="bf16", recipe="master")
    assert all(p.dtype == torch.bfloat16 for p in trained.parameters())
    assert set(history.scales) == {1.0} and history.skipped_steps == 0


@pytest.mark.parametrize("impl", ["torch", "ampteach"])
def test_an_overflow_in_a_half_gradient_skips_that_step_and_halves_the_scale(small, impl):
    def overflow(step, m):
        assert m[1].weight.grad.dtype == torch.float16                 # after_backward sees the model's grads
        if step == 2:
            m[1].weight.grad[0, 0] = float("inf")

    m = model()
    history = train(m, small, TrainConfig(precision="fp16", recipe="master", impl=impl, epochs=1,
                                          batch_size=BATCH, progress=False), after_backward=overflow)
    assert history.skipped == [False, False, True, False]
    assert history.scales == [2.0**16, 2.0**16, 2.0**16, 2.0**15]
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_train_takes_your_master_and_an_optimizer_over_its_param_groups(small):
    m = to_half(model())
    master = MasterWeights(m)
    frozen_bias = m[3].bias.detach().clone()
    opt = torch.optim.SGD(master.param_groups([{"params": [m[1].weight, m[1].bias, m[3].weight], "lr": 0.1},
                                               {"params": [m[3].bias], "lr": 0.0}]))
    train(m, small, TrainConfig(precision="fp16", recipe="master", epochs=1, batch_size=BATCH, progress=False),
          optimizer=opt, master=master)
    assert torch.equal(m[3].bias, frozen_bias)                     # lr 0 group: unchanged
    assert not torch.equal(m[1].weight, model()[1].weight.half())
    assert all(torch.equal(p, q.half()) for p, q in master.pairs)


def test_train_explains_recipe_mistakes(small):
    with pytest.raises(ValueError, match="recipe must be one of"):
        TrainConfig(recipe="O2")
    with pytest.raises(ValueError, match="needs precision='fp16' or 'bf16'"):
        TrainConfig(recipe="master")
    with pytest.raises(ValueError, match="refuse fp16 gradients"):
        TrainConfig(precision="fp16", recipe="half")
    TrainConfig(precision="fp16", recipe="half", loss_scale=None)  # allowed: nothing to unscale
    master_config = TrainConfig(precision="fp16", recipe="master", progress=False)
    m = model()
    with pytest.raises(ValueError, match="optimizer cannot hold"):
        train(m, small, master_config, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="different model"):
        train(model(), small, master_config, master=MasterWeights(to_half(model())))
    with pytest.raises(ValueError, match="recipe='master' only"):
        train(model(), small, TrainConfig(progress=False), master=MasterWeights(to_half(model())))
