"""ampteach.training.checkpoint: what goes into the file, what comes back, and what is refused.

The end-to-end property (a killed run resumes bit-identical) is in tests/test_faults.py; here each
piece is checked on a few hand-written O2 steps with torch.amp.GradScaler as the reference scaler.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

import ampteach
from ampteach.amp.master import MasterWeights, to_half
from ampteach.training.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from ampteach.training.train import History, TrainConfig, train

X = torch.randn(32, 1, 28, 28, generator=torch.Generator().manual_seed(0))
Y = torch.arange(32) % 10


def o2_run(steps: int, seed: int = 0, scaler_cls=torch.amp.GradScaler):
    """model (fp16), its masters, AdamW over them and a scaler after `steps` O2 steps on (X, Y)."""
    torch.manual_seed(seed)
    model = to_half(ampteach.mlp((8,)))
    master = MasterWeights(model)
    opt = torch.optim.AdamW(master.params, lr=1e-2)
    scaler = scaler_cls("cpu", init_scale=2.0**10, growth_interval=2)
    for _ in range(steps):
        o2_step(model, master, opt, scaler)
    return model, master, opt, scaler


def o2_step(model, master, opt, scaler) -> None:
    opt.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    scaler.scale(F.cross_entropy(model(X), Y)).backward()
    master.grads_to_master()
    scaler.step(opt)
    scaler.update()
    master.master_to_model()


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("scaler_cls", [torch.amp.GradScaler, ampteach.GradScaler], ids=["torch", "ampteach"])
def test_load_restores_masters_model_optimizer_and_scaler_exactly(tmp_path, scaler_cls):
    model, master, opt, scaler = o2_run(3, scaler_cls=scaler_cls)
    save_checkpoint(tmp_path / "c.pt", model, opt, scaler, master=master, step=3)
    model2, master2, opt2, scaler2 = o2_run(0, seed=1, scaler_cls=scaler_cls)   # different weights, fresh state
    ckpt = load_checkpoint(tmp_path / "c.pt", model2, opt2, scaler2, master=master2)

    assert ckpt.step == 3 and ckpt.history is None and ckpt.extra == {}
    assert same_tensors(model.state_dict(), model2.state_dict())          # fp16 = round(masters)
    assert all(torch.equal(m, m2) for m, m2 in zip(master.params, master2.params))
    assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
    for i, s in opt.state_dict()["state"].items():
        assert same_tensors(s, opt2.state_dict()["state"][i])
    assert scaler2.state_dict() == scaler.state_dict() and scaler.get_scale() != 2.0**10
    o2_step(model, master, opt, scaler)                                   # and both go on identically
    o2_step(model2, master2, opt2, scaler2)
    assert same_tensors(model.state_dict(), model2.state_dict())


def test_the_file_is_plain_data_with_fp32_weights(tmp_path):
    model, master, opt, scaler = o2_run(2)
    history = History(TrainConfig(precision="fp16", recipe="master"), step_loss=[2.3, 2.2], scales=[1024.0, 1024.0],
                      skipped=[False, False], samples_per_s=1000.0)   # (nan would not compare equal)
    save_checkpoint(tmp_path / "c.pt", model, opt, scaler, master=master, step=2, history=history,
                    extra={"note": "two steps", "sum": torch.tensor(4.5)})
    state = torch.load(tmp_path / "c.pt", weights_only=True)   # would raise on anything but plain data
    assert state["format"] == FORMAT and state["master"] is True
    assert all(t.dtype == torch.float32 for t in state["model"].values())      # masters, not the fp16 model
    assert same_tensors(state["model"], master.state_dict())
    assert state["scaler"] == scaler.state_dict()
    assert state["history"]["config"]["recipe"] == "master"
    back = load_checkpoint(tmp_path / "c.pt", *o2_run(0)[:1]).history      # model only; history comes back whole
    assert back == history


def test_an_fp32_master_checkpoint_loads_into_a_plain_fp32_model(tmp_path):
    model, master, opt, scaler = o2_run(2)
    save_checkpoint(tmp_path / "c.pt", model, opt, scaler, master=master)
    fp32 = ampteach.mlp((8,))
    load_checkpoint(tmp_path / "c.pt", fp32)
    assert all(torch.equal(p, m) for p, m in zip(fp32.parameters(), master.params))


def test_a_half_checkpoint_is_refused_where_fp32_weights_are_expected(tmp_path):
    model, _, opt, scaler = o2_run(2)
    save_checkpoint(tmp_path / "half.pt", model, opt, scaler)                 # no master=: fp16 weights saved
    with pytest.raises(ValueError, match="lost its master weights' low bits"):
        load_checkpoint(tmp_path / "half.pt", ampteach.mlp((8,)))
    model2, master2, opt2, scaler2 = o2_run(0)
    with pytest.raises(ValueError, match="half checkpoint"):
        load_checkpoint(tmp_path / "half.pt", model2, opt2, scaler2, master=master2)


def test_a_missing_scaler_state_is_refused_when_a_scaler_is_passed(tmp_path):
    model, master, opt, _ = o2_run(1)
    save_checkpoint(tmp_path / "c.pt", model, opt, master=master)
    model2, master2, opt2, scaler2 = o2_run(0)
    with pytest.raises(ValueError, match="no loss-scaler state"):
        load_checkpoint(tmp_path / "c.pt", model2, opt2, scaler2, master=master2)
    load_checkpoint(tmp_path / "c.pt", model2, opt2, torch.amp.GradScaler("cpu", enabled=False), master=master2)


def test_files_that_are_not_plain_data_or_not_checkpoints_are_refused(tmp_path):
    model = ampteach.mlp((8,))
    torch.save({"format": FORMAT, "config": TrainConfig()}, tmp_path / "pickled.pt")   # a pickled object
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(tmp_path / "pickled.pt", model)
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by ampteach.save_checkpoint"):
        load_checkpoint(tmp_path / "bare.pt", model)


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path):
    model, master, opt, scaler = o2_run(1)
    save_checkpoint(tmp_path / "c.pt", model, opt, scaler, master=master, step=1)
    with pytest.raises((AttributeError, pickle.PicklingError)):   # a local lambda cannot be pickled
        save_checkpoint(tmp_path / "c.pt", model, opt, scaler, master=master, step=2, extra={"f": lambda: 0})
    assert torch.load(tmp_path / "c.pt", weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_the_random_number_generator_comes_back(tmp_path):
    model = ampteach.mlp((8,))
    torch.manual_seed(5)
    save_checkpoint(tmp_path / "c.pt", model)
    expected = torch.rand(4)
    torch.manual_seed(6)
    load_checkpoint(tmp_path / "c.pt", model)
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(6)
    other = torch.rand(4)
    torch.manual_seed(6)
    load_checkpoint(tmp_path / "c.pt", model, restore_rng=False)
    assert torch.equal(torch.rand(4), other)


def test_master_from_another_model_is_refused(tmp_path):
    model, master, opt, scaler = o2_run(0)
    with pytest.raises(ValueError, match="different model"):
        save_checkpoint(tmp_path / "c.pt", to_half(ampteach.mlp((8,))), opt, scaler, master=master)


# -- train()'s hooks ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    return ampteach.training.data.Preloaded(d.train_x[:256], d.train_y[:256], d.test_x[:64], d.test_y[:64],
                                            d.mean, d.std)


@pytest.mark.parametrize("kwargs", [dict(checkpoint_path="x.pt"), dict(checkpoint_every=2),
                                    dict(checkpoint_path="x.pt", checkpoint_every=0)])
def test_train_needs_both_a_path_and_an_interval(tiny, kwargs):
    with pytest.raises(ValueError, match="checkpoint_path and checkpoint_every"):
        train(ampteach.mlp((8,)), tiny, TrainConfig(progress=False), **kwargs)


def test_train_refuses_to_resume_with_another_config_or_a_foreign_checkpoint(tiny, tmp_path):
    config = TrainConfig(precision="bf16", epochs=1, batch_size=64, progress=False)
    train(ampteach.mlp((8,)), tiny, config, checkpoint_path=tmp_path / "c.pt", checkpoint_every=2)
    with pytest.raises(ValueError, match=r"had lr=0\.001 but you passed lr=0\.01"):
        train(ampteach.mlp((8,)), tiny, TrainConfig(precision="bf16", epochs=1, batch_size=64, lr=1e-2,
                                                     progress=False), resume_from=tmp_path / "c.pt")
    model = ampteach.mlp((8,))
    save_checkpoint(tmp_path / "hand.pt", model, torch.optim.AdamW(model.parameters()))
    with pytest.raises(ValueError, match="was not written by train"):
        train(ampteach.mlp((8,)), tiny, config, resume_from=tmp_path / "hand.pt")


def test_a_finished_run_resumed_with_more_epochs_equals_the_longer_run(tiny, tmp_path):
    config = TrainConfig(precision="bf16", epochs=1, batch_size=64, progress=False)
    torch.manual_seed(0)
    longer = ampteach.mlp((8,))
    ref = train(longer, tiny, TrainConfig(**{**config.__dict__, "epochs": 2}))
    torch.manual_seed(0)
    train(ampteach.mlp((8,)), tiny, config, checkpoint_path=tmp_path / "c.pt", checkpoint_every=3)
    assert torch.load(tmp_path / "c.pt", weights_only=True)["step"] == 4, "the final state is saved too"
    extended = ampteach.mlp((8,))
    history = train(extended, tiny, TrainConfig(**{**config.__dict__, "epochs": 2}), resume_from=tmp_path / "c.pt")
    assert all(torch.equal(p, q) for p, q in zip(longer.parameters(), extended.parameters()))
    assert history.step_loss == ref.step_loss and history.test_accuracy == ref.test_accuracy
