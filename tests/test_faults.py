"""Faults a long run meets: non-finite gradients now and then, and being killed and resumed.

- inf/NaN gradients injected at 5% of the steps: the fp16 run's GradScaler and the bf16 run's
  isfinite check skip exactly those steps; the weights stay finite and the accuracy ends within one
  point of the clean run. Without the check the same faults ruin the bf16 run (the control).
- kill and resume: a run stopped after step k (in-process, and for real with SIGKILL) and resumed
  from its checkpoint ends bit-identical to the run that was never stopped: every weight (fp32
  masters included), the optimizer state, the scaler state and the History.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import asdict

import pytest
import torch

import ampteach
from ampteach.lab.side_by_side import first_difference
from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig, train

FAULT_RATE = 0.05


@pytest.fixture(scope="module")
def data() -> Preloaded:
    return ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))


def subset(data: Preloaded, n_train: int = 640, n_test: int = 256) -> Preloaded:
    """The first images only: enough steps to resume across epochs, fast enough for a unit test."""
    return Preloaded(data.train_x[:n_train], data.train_y[:n_train], data.test_x[:n_test], data.test_y[:n_test],
                     data.mean, data.std)


def fresh_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return ampteach.mlp((hidden,))


# -- non-finite gradients at 5% of the steps ----------------------------------------------------------

def fault_steps(total_steps: int, seed: int = 1) -> set[int]:
    """A seeded 5% of the steps (at least one), none in the first few while nothing has been learnt yet."""
    gen = torch.Generator().manual_seed(seed)
    n = max(1, round(FAULT_RATE * total_steps))
    return {int(s) + 3 for s in torch.randperm(total_steps - 3, generator=gen)[:n]}


def corrupt(steps: set[int]):
    """after_backward hook: at the given steps, one gradient element becomes inf or NaN (alternating)."""
    def hook(step: int, model: torch.nn.Module) -> None:
        if step in steps:
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            grad.view(-1)[step % grad.numel()] = math.inf if step % 2 else math.nan
    return hook


FAULT_CONFIGS = {
    "fp16+GradScaler(torch)": dict(precision="fp16", impl="torch"),
    "fp16+GradScaler(ampteach)": dict(precision="fp16", impl="ampteach"),
    "bf16+isfinite-skip": dict(precision="bf16", skip_nonfinite=True),
}


@pytest.mark.parametrize("name", FAULT_CONFIGS)
def test_faults_at_5_percent_of_steps_are_skipped_and_cost_under_a_point(data, name):
    config = TrainConfig(epochs=1, batch_size=64, progress=False, **FAULT_CONFIGS[name])   # 110 steps
    clean = train(model := fresh_model(32), data, config)
    faults = fault_steps(len(clean.skipped))
    faulty = train(faulty_model := fresh_model(32), data, config, after_backward=corrupt(faults))

    skipped = {s for s, k in enumerate(faulty.skipped) if k}
    assert faults <= skipped, "every corrupted step must be skipped"
    assert len(skipped - faults) <= sum(clean.skipped), "no more steps than the clean run's own overflows"
    assert all(torch.isfinite(p).all() for p in faulty_model.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert abs(faulty.final_accuracy - clean.final_accuracy) <= 1.0, (faulty.final_accuracy, clean.final_accuracy)


def test_control_the_same_faults_ruin_a_bf16_run_that_does_not_check(data):
    config = TrainConfig(precision="bf16", epochs=1, batch_size=64, progress=False)
    n_steps = -(-len(data.train_x) // config.batch_size)
    history = train(model := fresh_model(32), data, config, after_backward=corrupt(fault_steps(n_steps)))
    assert not any(history.skipped)
    assert not all(torch.isfinite(p).all() for p in model.parameters())


# -- kill and resume ------------------------------------------------------------------------------

class Killed(Exception):
    """Stands for the process dying: raised in the middle of a step, after its backward."""


def die_at(kill_at: int):
    def hook(step: int, model: torch.nn.Module) -> None:
        if step == kill_at:
            raise Killed
    return hook


RESUME_CONFIGS = {
    # growth_interval=3: the scale grows and overflows within the run, so its growth tracker matters
    "autocast-fp16-torch": dict(precision="fp16", recipe="autocast", impl="torch"),
    "autocast-fp16-ampteach": dict(precision="fp16", recipe="autocast", impl="ampteach"),
    "master-fp16-torch": dict(precision="fp16", recipe="master", impl="torch"),
    "master-fp16-ampteach": dict(precision="fp16", recipe="master", impl="ampteach"),
}
EVERY = 5          # 640 images / 64 = 10 steps per epoch: checkpoints mid-epoch and at epoch ends
TOTAL = 30         # 3 epochs; the last checkpoint is the final state of the run


def resume_config(name: str) -> TrainConfig:
    return TrainConfig(epochs=3, batch_size=64, growth_interval=3, progress=False, **RESUME_CONFIGS[name])


def uninterrupted(data: Preloaded, config: TrainConfig, path) -> torch.nn.Module:
    model = fresh_model(16)
    train(model, data, config, checkpoint_path=path, checkpoint_every=EVERY)
    return model


def resumed(data: Preloaded, config: TrainConfig, path) -> torch.nn.Module:
    """A new process would start like this: the model built afresh (another seed: the checkpoint decides)."""
    torch.manual_seed(123)
    model = ampteach.mlp((16,))
    train(model, data, config, checkpoint_path=path, checkpoint_every=EVERY, resume_from=path)
    return model


def assert_same(a, b) -> None:
    """a and b equal bit for bit: tensors by torch.equal (and dtype), containers entry by entry."""
    difference = first_difference(a, b, "checkpoint")
    assert difference is None, difference


def assert_same_final_state(model_a, path_a, model_b, path_b) -> None:
    for (name, p), q in zip(model_a.named_parameters(), model_b.parameters()):
        assert p.dtype == q.dtype and torch.equal(p, q), name
    a, b = (torch.load(p, weights_only=True) for p in (path_a, path_b))
    for state in (a, b):
        state["history"]["samples_per_s"] = state["history"]["train_seconds"] = None   # wall-clock, not state
    assert a["step"] == TOTAL
    assert a["scaler"]["scale"] != 2.0**16, "the scale should have moved during the run"
    assert_same(a, b)   # weights (fp32 masters for O2), optimizer, scaler, step, RNG, History


KILLS = [(name, 17) for name in RESUME_CONFIGS] + [("master-fp16-torch", 21)]   # last checkpoint: 15 or 20


@pytest.mark.parametrize(("name", "kill_at"), KILLS, ids=[f"{n}-at-{k}" for n, k in KILLS])
def test_a_run_killed_and_resumed_ends_bit_identical(data, tmp_path, name, kill_at):
    data, config = subset(data), resume_config(name)
    ref = uninterrupted(data, config, tmp_path / "ref.pt")

    path = tmp_path / "run.pt"
    with pytest.raises(Killed):
        train(fresh_model(16), data, config, checkpoint_path=path, checkpoint_every=EVERY,
              after_backward=die_at(kill_at))
    assert torch.load(path, weights_only=True)["step"] == kill_at // EVERY * EVERY
    model = resumed(data, config, path)
    assert_same_final_state(ref, tmp_path / "ref.pt", model, path)


def test_a_resume_without_the_scaler_state_goes_astray(data, tmp_path):
    """The control for the test above: drop the scaler's state and the runs differ."""
    data, config = subset(data), resume_config("autocast-fp16-torch")
    ref = uninterrupted(data, config, tmp_path / "ref.pt")
    path = tmp_path / "run.pt"
    with pytest.raises(Killed):
        train(fresh_model(16), data, config, checkpoint_path=path, checkpoint_every=EVERY, after_backward=die_at(17))
    state = torch.load(path, weights_only=True)
    assert state["scaler"]["scale"] != config.init_scale
    state["scaler"] = {**state["scaler"], "scale": config.init_scale, "_growth_tracker": 0}
    torch.save(state, path)
    model = resumed(data, config, path)
    assert not all(torch.equal(p, q) for p, q in zip(ref.parameters(), model.parameters()))


CHILD = textwrap.dedent("""
    import json, sys, time
    import torch, ampteach
    from ampteach.training.data import Preloaded
    from ampteach.training.train import TrainConfig
    path, kill_at, config = sys.argv[1], int(sys.argv[2]), TrainConfig(**json.loads(sys.argv[3]))
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    data = Preloaded(d.train_x[:640], d.train_y[:640], d.test_x[:256], d.test_y[:256], d.mean, d.std)

    def wait_for_the_kill(step, model):
        if step == kill_at:
            print("ready", flush=True)
            time.sleep(600)

    torch.manual_seed(0)
    ampteach.train(ampteach.mlp((16,)), data, config, checkpoint_path=path, checkpoint_every=%d,
                   after_backward=wait_for_the_kill)
""" % EVERY)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_process_killed_with_sigkill_resumes_bit_identical(data, tmp_path):
    data, config, kill_at = subset(data), resume_config("master-fp16-ampteach"), 23
    path = tmp_path / "run.pt"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(kill_at), json.dumps(asdict(config))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = child.stdout.readline()      # blocks until the child is inside step kill_at (or dies)
        assert line.strip() == "ready", f"the child failed before step {kill_at}: {child.stderr.read()}"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert torch.load(path, weights_only=True)["step"] == 20
    assert not list(tmp_path.glob("*.tmp")), "no half-written checkpoint is left behind"

    ref = uninterrupted(data, config, tmp_path / "ref.pt")
    model = resumed(data, config, path)
    assert_same_final_state(ref, tmp_path / "ref.pt", model, path)
    assert asdict(config) == torch.load(path, weights_only=True)["history"]["config"]
