"""The fp8 ablation: casts without a scale, and the scale and e5m2 gradients that each fix them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ampteach.amp.fp8 import Float8Linear, convert_to_float8_training
from ampteach.lab.fp8_ablation import CASES, CastRecipe, fp8_model
from ampteach.training.models import mlp


def grads(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_both_elements_together_are_torchaos_tensorwise_bit_for_bit():
    torch.manual_seed(0)
    x, y = torch.randn(16, 784), torch.randint(10, (16,))
    torch.manual_seed(1)
    ours = fp8_model("HYBRID, scale per tensor", hidden=(32,))
    torch.manual_seed(1)
    reference = convert_to_float8_training(mlp((32,)), recipe="tensorwise")
    assert all(torch.equal(a, b) for a, b in zip(grads(ours, x, y), grads(reference, x, y)))


def test_unscaled_e4m3_flushes_small_gradients_and_e5m2_keeps_them():
    g = torch.tensor([2.0**-12, 2.0**-8, 1.0])
    assert CastRecipe(*CASES["e4m3 everywhere, no scale"]).cast("grad_output", g).tolist() == [0.0, 2.0**-8, 1.0]
    assert CastRecipe(*CASES["HYBRID, no scale"]).cast("grad_output", g).tolist() == g.tolist()
    scaled = CastRecipe(*CASES["e4m3 everywhere, scale per tensor"]).cast("grad_output", g * 2.0**-10)
    assert torch.equal(scaled, g * 2.0**-10)                        # the scale lifts them into range first


def test_every_linear_gets_the_case_and_bad_names_say_what_to_do():
    model = fp8_model("HYBRID, no scale")
    layers = [m for m in model.modules() if isinstance(m, Float8Linear)]
    assert len(layers) == 2 and all(m.recipe_name == "HYBRID, no scale" for m in layers)
    with pytest.raises(ValueError, match="case must be one of"):
        fp8_model("e4m3")
    with pytest.raises(ValueError, match="formats maps the roles"):
        CastRecipe({"input": "fp8_e4m3"}, False)
