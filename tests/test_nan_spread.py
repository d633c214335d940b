"""ampteach.lab.nan_spread: one NaN in one gradient, followed step by step; guarded runs stay finite."""

from __future__ import annotations

import math

import pytest
import torch

import ampteach
from ampteach.lab.nan_spread import non_finite_fraction, plot_nan_spread, poison_gradient, trace_nan_spread
from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig


@pytest.fixture(scope="module")
def data() -> Preloaded:
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    return Preloaded(d.train_x[:512], d.train_y[:512], d.test_x[:64], d.test_y[:64], d.mean, d.std)


def fresh() -> torch.nn.Module:
    torch.manual_seed(0)
    return ampteach.mlp((16,))


def test_poison_gradient_writes_one_element_at_one_step():
    model = fresh()
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    hook = poison_gradient(2, index=5, value=math.inf)
    hook(1, model)
    assert torch.isfinite(model[1].weight.grad).all()
    hook(2, model)
    grad = model[1].weight.grad.view(-1)
    assert math.isinf(grad[5].item()) and torch.isfinite(grad[torch.arange(grad.numel()) != 5]).all()


def test_non_finite_fraction():
    assert non_finite_fraction([torch.tensor([1.0, math.nan, math.inf, -math.inf]), torch.ones(3)]) == [0.75, 0.0]


def test_unchecked_one_weight_then_nearly_all(data):
    spread = trace_nan_spread(fresh(), data, TrainConfig(precision="bf16", progress=False), poison_step=2, steps=5)
    assert spread.total == sum(p.numel() for p in ampteach.mlp((16,)).parameters())
    assert [spread.count(s) for s in range(3)] == [0, 0, 1], "AdamW writes the NaN into exactly one weight"
    assert spread.fraction["1.weight"][2] == pytest.approx(1 / spread.numel["1.weight"])
    assert spread.count(3) > 0.9 * spread.total and math.isnan(spread.loss[3])
    assert not any(spread.skipped)


@pytest.mark.parametrize("options", [dict(precision="bf16", skip_nonfinite=True), dict(precision="fp16", impl="torch"),
                                     dict(precision="fp16", impl="ampteach")],
                         ids=["bf16-check", "fp16-torch", "fp16-ampteach"])
def test_a_guarded_run_skips_the_poisoned_step_and_stays_finite(data, options):
    spread = trace_nan_spread(fresh(), data, TrainConfig(progress=False, **options), poison_step=2, steps=5)
    assert spread.skipped == [False, False, True, False, False]
    assert all(spread.count(s) == 0 for s in range(5))


def test_plot_one_panel_per_run(data):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spread = trace_nan_spread(fresh(), data, TrainConfig(precision="bf16", progress=False), poison_step=1, steps=3)
    axes = plot_nan_spread({"a": spread, "b": spread})
    assert len(axes) == 2 and axes[0].get_title() == "a"
    assert any(t.get_text() == "1" for t in axes[0].texts), "the single NaN weight is labelled"
    plt.close(axes[0].figure)
