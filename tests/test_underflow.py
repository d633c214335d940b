"""ampteach.lab.underflow: gradient collection against a hand-written backward, zones against the format's
definition."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ampteach.amp.formats import FORMATS
from ampteach.lab.underflow import (
    ZONES,
    ShrinkGradients,
    collect_gradients,
    plot_gradient_histogram,
    store,
    zone_counts,
    zone_edges,
    zone_fractions,
)

matplotlib.use("Agg")
FP16 = FORMATS["fp16"]


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 3))


def batches(n: int = 3):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 3, 4, generator=gen), torch.randint(0, 3, (5,), generator=gen)) for _ in range(n)]


def test_collect_gradients_matches_a_hand_written_backward():
    model = small_model()
    data = batches()
    grads = collect_gradients(model, data)
    weights, activations, output = [], [], []
    for x, y in data:
        model.zero_grad()
        h1 = model[1](model[0](x))
        h2 = model[2](h1)
        out = model[3](h2)
        for t in (h1, h2, out):
            t.retain_grad()
        nn.functional.cross_entropy(out, y).backward()
        weights += [p.grad.flatten() for p in model.parameters()]
        activations += [h2.grad.flatten(), h1.grad.flatten()]   # backward order, inside the model
        output.append(out.grad.flatten())                      # what the loss sends back: (softmax - one-hot) / 5
        expected = (out.detach().softmax(1) - nn.functional.one_hot(y, 3)) / len(y)
        assert torch.allclose(out.grad, expected, rtol=0, atol=1e-7)
    assert torch.equal(grads["weights"], torch.cat(weights))
    assert torch.equal(grads["activations"], torch.cat(activations))
    assert torch.equal(grads["output"], torch.cat(output))


def test_collect_gradients_sees_the_loss_gradient_before_shrink_gradients():
    model = small_model()
    plain = collect_gradients(model, batches())
    shrunk = collect_gradients(nn.Sequential(model, ShrinkGradients(2**10)), batches())
    assert torch.equal(shrunk["output"], plain["output"])               # the loss's gradient: not shrunk
    inside = plain["activations"].numel()
    assert torch.equal(shrunk["activations"][: 15], plain["output"][:15] / 2**10)   # the logits, behind the layer
    assert shrunk["activations"].numel() == inside + plain["output"].numel()
    assert torch.equal(shrunk["weights"], plain["weights"] / 2**10)


def test_collect_gradients_leaves_the_model_as_it_found_it():
    model = small_model().eval()
    before = [p.detach().clone() for p in model.parameters()]
    grads = collect_gradients(model, batches(), n_batches=2)
    assert grads["weights"].numel() == 2 * sum(p.numel() for p in model.parameters())
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="no gradients were collected"):
        collect_gradients(model, [])


def test_zones_follow_fp16s_definition():
    tiny, normal, top = FP16.min_subnormal, FP16.min_normal, FP16.max
    by_zone = {
        "zero": [0.0, -0.0],
        "flushed": [tiny / 2, tiny / 4, -tiny / 3],              # tiny/2 is a tie: to even, which is 0
        "subnormal": [tiny, 0.75 * tiny, -3 * tiny, normal / 2],
        "normal": [normal, 1.0, -1.5, top, top + 15],             # top + 15 < top + ulp/2: rounds to max
        "overflow": [top + 16, 1e6, -1e6],                       # top + ulp/2 = 65520 is a tie: to inf
    }
    values = torch.tensor([v for vs in by_zone.values() for v in vs])
    fractions = zone_fractions(values, "fp16")
    assert fractions == {zone: len(by_zone[zone]) / len(values) for zone in ZONES}


def test_a_scale_moves_values_between_zones():
    values = torch.tensor([FP16.min_subnormal / 4, 1.0, 2.0**14])
    assert zone_fractions(values, "fp16", scale=1.0) == dict(zero=0.0, flushed=1 / 3, subnormal=0.0, normal=2 / 3,
                                                             overflow=0.0)
    assert zone_fractions(values, "fp16", scale=8.0) == dict(zero=0.0, flushed=0.0, subnormal=1 / 3, normal=1 / 3,
                                                             overflow=1 / 3)


def test_store_is_the_cast_and_covers_formats_without_a_torch_dtype():
    x = torch.tensor([1e-8, 3e-8, 1.0 + 2.0**-11, 7e4])
    assert torch.equal(store(x, "fp16", 4.0), (x * 4.0).half().float())
    tf32 = store(torch.tensor([1.0 + 2.0**-12, 2.0**-140]), "tf32")   # 10 mantissa bits, fp32's exponents
    assert tf32.tolist() == [1.0, 0.0]


def test_zone_counts_are_the_fractions_times_the_number_of_values():
    values = torch.tensor([0.0, FP16.min_subnormal / 4, 1.0, 2.0**14, 3.0])
    assert zone_counts(values, "fp16", scale=8.0) == dict(zero=1, flushed=0, subnormal=1, normal=2, overflow=1)
    assert zone_fractions(values, "fp16", scale=8.0) == dict(zero=0.2, flushed=0.0, subnormal=0.2, normal=0.4,
                                                             overflow=0.2)
    with pytest.raises(ValueError, match="empty"):
        zone_counts(torch.zeros(0))


def test_saturating_fp8_counts_clipping_as_overflow():
    values = torch.tensor([400.0, 460.0, 470.0, 1e4])   # e4m3: max 448, and 464 is where inf would start
    assert zone_fractions(values, "fp8_e4m3")["overflow"] == 0.5


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), low=st.integers(-40, 0), k=st.integers(0, 30))
def test_zone_fractions_sum_to_one_and_a_larger_scale_never_flushes_more(seed, low, k):
    values = torch.randn(300, generator=torch.Generator().manual_seed(seed)) * 2.0 ** torch.randint(low, 5, (300,))
    small, large = zone_fractions(values, "fp16", 2.0**k), zone_fractions(values, "fp16", 2.0 ** (k + 1))
    assert math.isclose(sum(small.values()), 1.0)
    assert large["flushed"] <= small["flushed"] and large["overflow"] >= small["overflow"]


def test_zone_edges_are_fp16s_powers_of_two():
    assert zone_edges("fp16") == {"flush": -25.0, "normal": -14.0, "max": math.log2(65504)}


def test_shrink_gradients_divides_only_the_gradient():
    x = torch.randn(4, 3, requires_grad=True)
    layer = ShrinkGradients(2**16)
    y = layer(x)
    assert torch.equal(y, x)
    y.pow(2).sum().backward()
    assert torch.equal(x.grad, 2 * x.detach() / 2**16)
    x16 = torch.tensor([1.0, 2.0**-10], dtype=torch.float16, requires_grad=True)
    layer(x16).sum().backward()
    assert x16.grad.dtype == torch.float16 and x16.grad.tolist() == [2.0**-16, 2.0**-16]
    with pytest.raises(ValueError, match="positive"):
        ShrinkGradients(0)


def test_plot_gradient_histogram_shades_four_zones_and_draws_one_line_per_kind():
    grads = collect_gradients(small_model(), batches())
    ax = plot_gradient_histogram(grads, "fp16", scale=2.0**10)
    assert len(ax.patches) >= 4 + len(grads)
    assert "2^10" in ax.get_xlabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fp16 flushed to 0" in labels and any(label.startswith("weights (non-zero: ") for label in labels)


def test_plot_gradient_histogram_takes_gradients_that_still_need_grad():
    """Gradients handed over straight from a model (requires_grad, or on a GPU) are drawn, not refused."""
    grads = {"weights": torch.tensor([2.0**-20, 2.0**-3, 0.0], requires_grad=True)}
    ax = plot_gradient_histogram(grads, "fp16")
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "weights (non-zero: 2)"
