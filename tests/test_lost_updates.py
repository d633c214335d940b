"""ampteach.lab.lost_updates against the rounding rule worked out exactly: lost iff |u| < half the gap, or a tie
to even."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from torch import nn

from ampteach.lab.lost_updates import LostUpdates, loss_thresholds, lost_fraction, plot_loss_gap, plot_lost_fraction

MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}


def exactly_lost(w: float, u: float, dtype: torch.dtype) -> bool:
    """Is round(w + u) == w? From the gaps on either side of w (torch.nextafter) and the tie rule, in rationals."""
    t = torch.tensor(w, dtype=dtype)
    toward = torch.tensor(float("inf") if u > 0 else float("-inf"), dtype=dtype)
    half_gap = abs(Fraction(torch.nextafter(t, toward).item()) - Fraction(w)) / 2
    even = (t.view(torch.int16).item() & 1) == 0
    return abs(Fraction(u)) < half_gap or (abs(Fraction(u)) == half_gap and even)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lost_fraction_is_the_share_the_exact_rule_predicts(dtype):
    gen = torch.Generator().manual_seed(0)
    weights = (torch.rand(100, generator=gen) * 4 - 2).to(dtype).float()
    ratios = 2.0 ** torch.arange(MANTISSA_BITS[dtype], MANTISSA_BITS[dtype] + 3.01, 0.25)
    lost = lost_fraction(weights, ratios, dtype)
    for r, share in zip(ratios.tolist(), lost.tolist()):
        us = (weights / r).tolist()                                # the update, computed in fp32
        expected = [exactly_lost(w, s * u, dtype) for w, u in zip(weights.tolist(), us) for s in (1, -1)]
        assert share == pytest.approx(sum(expected) / len(expected), abs=1e-6)   # counts of 200: exact


@pytest.mark.parametrize("dtype, first, every", [(torch.float16, 2048.0, 4096.0), (torch.bfloat16, 256.0, 512.0)])
def test_losses_start_at_2_to_the_m_plus_1_and_are_total_from_2_to_the_m_plus_2(dtype, first, every):
    torch.manual_seed(0)
    weights = nn.Linear(784, 256).weight                           # the course MLP's first layer, at init
    ratios = 2.0 ** torch.arange(6.0, 13.01, 1 / 4)               # every power of two, and between them
    assert loss_thresholds(ratios, lost_fraction(weights, ratios, dtype)) == (first, every)


def test_subnormal_weights_are_left_out():
    lost = lost_fraction(torch.tensor([2.0**-20, 1.0]), torch.tensor([4096.0]), torch.float16)
    assert lost.tolist() == [1.0]                                  # only w = 1.0 counted: its update is lost


def test_lost_updates_counts_sgd_updates_that_leave_a_weight_unchanged():
    layer = nn.Linear(4, 1, bias=False).half()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 1.0, 1.0, 1.0]]))
    layer.weight.grad = torch.tensor([[1.0, 2.0**-12, -(2.0**-12), 0.0]], dtype=torch.float16)
    counter = LostUpdates(lr=2.0**-1, layer=lambda model: model.weight)
    counter(0, layer)                                              # 1 - 2^-13: lost in fp16; zero grads don't count
    assert counter.per_step == [0.5] and counter.mean == 0.5       # lost: the two 2^-13 updates; kept: 1 - 0.5


def test_the_plots_draw_what_they_are_given():
    ratios = torch.tensor([1024.0, 2048.0, 4096.0])
    fig = plot_lost_fraction(ratios, {"fp16": torch.tensor([0.0, 0.5, 1.0])})
    assert [list(line.get_ydata()) for line in fig.axes[0].lines][0] == [0.0, 50.0, 100.0]

    class Run:
        def __init__(self, losses):
            self.step_loss = losses

    fig = plot_loss_gap({"fp32": Run([1.0, 1.0]), "half": Run([1.5, 2.0])}, "fp32", smooth=1)
    assert list(fig.axes[0].lines[1].get_ydata()) == [0.5, 1.0]


def test_plot_loss_gap_adds_the_held_out_loss_of_every_run_between_its_two_panels():
    class Run:
        def __init__(self, losses, val_loss):
            self.step_loss, self.val_loss = losses, val_loss

    runs = {"fp32": Run([1.0, 1.0], [0.6, 0.5]), "half": Run([1.5, 2.0], [0.7, 0.69])}
    lost = LostUpdates(0.1)
    lost.per_step = [0.25, 0.5]
    fig = plot_loss_gap(runs, "fp32", lost, smooth=1, held_out=True)
    assert len(fig.axes) == 3
    assert [list(line.get_ydata()) for line in fig.axes[1].lines] == [[0.6, 0.5], [0.7, 0.69]]
    assert list(fig.axes[2].lines[0].get_ydata()) == [25.0, 50.0]
    assert len(plot_loss_gap(runs, "fp32", smooth=1).axes) == 1
