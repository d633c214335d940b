"""ampteach.lab.fp8_plots: what lesson 8 measures, on tensors small enough to work out by hand."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from matplotlib.figure import Figure

from ampteach import mlp
from ampteach.amp.fp8 import convert_to_float8_training
from ampteach.amp.mx import mx_fake_quantize
from ampteach.lab.fp8_plots import (
    amax_histories,
    block_size_errors,
    cast_losses,
    current_vs_delayed,
    linear_tensors,
    plot_amax_history,
    plot_block_sizes,
    plot_current_vs_delayed,
    plot_ranges,
    relative_error,
)


def test_cast_losses_by_hand():
    # e4m3 at scale 1: 1e-4 is below half the smallest subnormal (2^-10) and flushes, 1000 saturates at 448
    x = torch.tensor([1e-4, 1.0, 0.0, 1000.0])
    losses = cast_losses([x], "fp8_e4m3")
    assert losses["flushed"] == pytest.approx(1 / 3) and losses["saturated"] == pytest.approx(1 / 3)
    assert losses["error"] == pytest.approx(552 / x.double().norm().item(), rel=1e-6)
    scaled = cast_losses([x], "fp8_e4m3", scaled=True)          # scale 0.448: 1000 -> 448 exactly
    assert scaled["saturated"] == 0 and scaled["flushed"] == pytest.approx(1 / 3)


def test_relative_error_with_a_mask():
    x, y = torch.tensor([1.0, 2.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])
    assert relative_error(x, y) == pytest.approx((1 + 100**2) ** 0.5 / (1 + 4 + 100**2) ** 0.5)
    assert relative_error(x, y, torch.tensor([True, True, False])) == pytest.approx(1 / 5**0.5)


def test_linear_tensors_are_what_each_matmul_sees():
    model = mlp((16,))
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,))
    t = linear_tensors(model, [(x, y)] * 3, n_batches=2)
    assert [v.shape for v in t["activations"]] == [(5, 784), (5, 16)] * 2
    assert [v.shape for v in t["weights"]] == [(16, 784), (10, 16)]
    assert sorted(tuple(v.shape) for v in t["gradients"]) == [(5, 10), (5, 10), (5, 16), (5, 16)]
    assert torch.equal(t["activations"][0], x.flatten(1)) and all(p.grad is None for p in model.parameters())


def test_current_vs_delayed_on_a_spike():
    steps = [torch.linspace(-1, 1, 101) * (8 if i == 3 else 1) for i in range(6)]
    r = current_vs_delayed(steps, "fp8_e4m3", history_len=2)
    assert max(r["current saturated"]) == 0
    assert r["delayed saturated"] == [0, 0, 0, pytest.approx(88 / 101), 0, 0]   # |v| > 1/8 of the spike's amax
    assert r["delayed error"][3] > 0.5 > r["current error"][3]


def test_block_size_errors_are_relative_errors_of_mx():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    errs = block_size_errors(x, ["fp4_e2m1"], [8, 64])
    assert errs["fp4_e2m1"][1] == relative_error(x.reshape(1, -1), mx_fake_quantize(x.reshape(1, -1), "fp4_e2m1", 64))


def test_plots_return_figures():
    model = convert_to_float8_training(mlp((16,)), recipe="delayed", history_len=8)
    x, y = torch.randn(5, 1, 28, 28), torch.randint(0, 10, (5,))
    tensors = linear_tensors(model, [(x, y)] * 3, n_batches=3)
    histories = amax_histories(model, 3)
    assert set(histories) == {"1", "3"} and histories["1"]["activations"].shape == (3,)
    steps = [torch.randn(50) for _ in range(4)]
    figures = [plot_ranges(tensors), plot_amax_history(histories, window=8),
               plot_current_vs_delayed(current_vs_delayed(steps), spike=2),
               plot_block_sizes({"a": block_size_errors(steps[0], ["fp8_e4m3"], [2, 8])}, [2, 8], {"a": {"ref": 0.1}})]
    assert all(isinstance(f, Figure) for f in figures)
