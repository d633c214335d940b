"""The one training loop on text: train() trains the GPT on preload_text batches with every precision and recipe."""

from __future__ import annotations

import math

import pytest
import torch

from ampteach.training.config import TrainConfig
from ampteach.training.gpt import gpt
from ampteach.training.text import load_shakespeare, preload_text
from ampteach.training.train import cross_entropy, held_out, prepare, train, train_step


@pytest.fixture(scope="module")
def data():
    return preload_text(load_shakespeare(), block_size=16, steps_per_epoch=4, eval_windows=16)


def small():
    torch.manual_seed(0)
    return gpt(65, block_size=16, n_layer=1, n_head=2, n_embd=32)


def test_train_records_step_losses_and_the_validation_loss_per_epoch(data):
    history = train(small(), data, TrainConfig(epochs=3, batch_size=8, lr=1e-2, progress=False))
    assert len(history.step_loss) == 12 and len(history.val_loss) == len(history.test_accuracy) == 3
    assert history.step_loss[0] == pytest.approx(math.log(65), abs=0.1)    # an untrained model knows nothing
    assert history.val_loss[-1] < history.val_loss[0] < math.log(65)
    assert history.epoch_loss[0] == pytest.approx(sum(history.step_loss[:4]) / 4, rel=1e-6)


def test_train_is_the_plain_step_loop_over_the_datas_batches(data):
    """No second loop hides in train(): a hand-written loop of train_step over the same batches ends identical."""
    config = TrainConfig(precision="bf16", epochs=2, batch_size=8, progress=False)
    trained = small()
    history = train(trained, data, config)
    by_hand = small()
    master, opt, scaler = prepare(by_hand, config)
    losses = []
    for epoch in range(config.epochs):
        for x, y in data.batches(config.batch_size, shuffle=True, seed=config.seed + epoch):
            losses.append(train_step(by_hand, x, y, opt, scaler, config, master=master).loss.item())
    assert losses == history.step_loss
    for a, b in zip(trained.parameters(), by_hand.parameters()):
        assert torch.equal(a, b)


def test_held_out_is_the_mean_cross_entropy_over_every_validation_prediction(data):
    model = small()
    loss, accuracy = held_out(model, data)
    x = torch.cat([x for x, _ in data.batches(5, split="val")])
    y = torch.cat([y for _, y in data.batches(5, split="val")])
    with torch.no_grad():
        logits = model(x)
    assert loss == pytest.approx(cross_entropy(logits, y).item(), rel=1e-5)
    assert accuracy == pytest.approx(100 * (logits.argmax(-1) == y).float().mean().item())


@pytest.mark.parametrize("config", [
    dict(precision="fp16"),
    dict(precision="bf16", recipe="half", loss_scale=None),
    dict(precision="bf16", recipe="half", rounding="stochastic"),
    dict(precision="bf16", recipe="master"),
    dict(precision="fp16", recipe="master"),
], ids=str)
def test_every_recipe_trains_the_gpt(data, config):
    model = small()
    history = train(model, data, TrainConfig(epochs=1, batch_size=8, lr=1e-2, progress=False, **config))
    assert all(math.isfinite(v) for v in history.step_loss) and history.val_loss[-1] < math.log(65)
    if config.get("recipe") in ("half", "master"):
        assert model.blocks[0].mlp[0].weight.dtype == TrainConfig(**config).dtype


def test_a_text_run_resumes_bit_identically(data, tmp_path):
    """Interrupted after 3 of an epoch's 4 steps, then resumed: the next windows are the ones it would have drawn."""
    config = TrainConfig(precision="fp16", epochs=2, batch_size=8, progress=False)
    whole = small()
    expected = train(whole, data, config)

    def interrupt(step, model):
        if step == 3:
            raise KeyboardInterrupt

    ckpt = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        train(small(), data, config, checkpoint_path=ckpt, checkpoint_every=3, after_backward=interrupt)
    resumed = small()
    history = train(resumed, data, config, resume_from=ckpt)
    assert history.step_loss == expected.step_loss and history.val_loss == expected.val_loss
    for a, b in zip(resumed.parameters(), whole.parameters()):
        assert torch.equal(a, b)
