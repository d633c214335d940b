"""ampteach.lab.clipping: what clip_trace records, checked against the arithmetic of clip_grad_norm_ and the scaler."""

from __future__ import annotations

import math

import pytest
import torch

import ampteach
from ampteach.lab.clipping import ClipTrace, clip_trace, grad_norm, plot_clip_trace

GEN = torch.Generator().manual_seed(0)
BATCHES = [(torch.randn(32, 1, 28, 28, generator=GEN), torch.randint(0, 10, (32,), generator=GEN)) for _ in range(12)]


def run(unscale_first: bool, max_norm: float = 0.5, GradScaler=torch.amp.GradScaler, optimizer="sgd", steps=12):
    torch.manual_seed(0)
    model = ampteach.mlp((16,))
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    scaler = GradScaler("cpu", growth_interval=3)
    return clip_trace(model, iter(BATCHES), opt, scaler, max_norm=max_norm, unscale_first=unscale_first, steps=steps)


def test_grad_norm_is_clip_grad_norm_s_total_norm():
    torch.manual_seed(0)
    model = ampteach.mlp((8,))
    model(BATCHES[0][0]).pow(2).mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf).item()
    assert grad_norm(model.parameters()) == pytest.approx(expected, rel=1e-6)


def test_unscale_first_applies_min_of_true_norm_and_max_norm():
    trace = run(unscale_first=True)
    assert len(trace.scale) == 12 and trace.threshold == [0.5] * 12
    for true, seen, applied, skipped in zip(trace.true_norm, trace.seen_norm, trace.applied_norm, trace.skipped):
        if not skipped:
            assert seen == pytest.approx(true, rel=1e-3), "clip measured the true norm"
            assert applied == pytest.approx(min(true, 0.5), rel=1e-3)


@pytest.mark.parametrize("GradScaler", [torch.amp.GradScaler, ampteach.GradScaler], ids=["torch", "ampteach"])
def test_without_unscale_the_threshold_is_max_norm_over_the_scale(GradScaler):
    trace = run(unscale_first=False, GradScaler=GradScaler)
    assert len(set(trace.scale)) > 1, "the scale moved, so the threshold did"
    for scale, true, seen, applied, threshold, skipped in zip(trace.scale, trace.true_norm, trace.seen_norm,
                                                              trace.applied_norm, trace.threshold, trace.skipped):
        assert threshold == 0.5 / scale
        if not skipped:
            assert seen == pytest.approx(scale * true, rel=1e-3), "clip measured S times the true norm"
            assert applied == pytest.approx(threshold, rel=1e-3), "and left max_norm / S"


def test_with_sgd_the_wrong_order_makes_steps_s_times_too_small():
    right, wrong = run(unscale_first=True), run(unscale_first=False)
    # step 0 starts from the same weights and the same scale 2**16; plain SGD's step is lr * gradient
    assert right.update_norm[0] == pytest.approx(0.1 * right.applied_norm[0], rel=1e-3)
    # (to 5%: steps of ~1e-9 per weight are themselves rounded by fp32 weights of size ~0.03)
    assert wrong.update_norm[0] == pytest.approx(0.1 * 0.5 / 2.0**16, rel=5e-2)
    assert right.update_norm[0] / wrong.update_norm[0] == pytest.approx(2.0**16 * min(right.true_norm[0], 0.5) / 0.5,
                                                                        rel=5e-2)


def test_max_norm_inf_measures_without_clipping_and_bad_thresholds_are_refused():
    trace = run(unscale_first=True, max_norm=math.inf)
    assert all(a == pytest.approx(t, rel=1e-3) for a, t, k in zip(trace.applied_norm, trace.true_norm, trace.skipped)
               if not k)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        run(unscale_first=True, max_norm=0.0)


def test_plot_draws_the_true_norm_max_norm_the_threshold_and_each_order():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = {"right": run(True, steps=4), "wrong": run(False, steps=4)}
    ax = plot_clip_trace(traces)
    labels = [line.get_label() for line in ax.get_lines()]
    assert len(labels) == 5 and any("max_norm / S" in label for label in labels)
    plt.close(ax.figure)
    assert isinstance(traces["right"], ClipTrace)
