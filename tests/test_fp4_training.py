"""FP4 training through fp8.py's Float8Linear: each switch of the NVFP4 recipe changes what it claims, and only that.

A Linear has three matmuls: the forward (out), dgrad (grad_x) and wgrad (grad_W). weight_2d touches the
quantized W, so the forward and dgrad; rht only wgrad's two inputs; stochastic only the gradient g, in dgrad
and wgrad; keep_high_precision only which Linears convert. With every switch off, MXFP4 is lesson 8's "mx"
recipe with fp4 elements, bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ampteach.amp.fp4 import FP4Recipe, fp4_fake_quantize, keep_high_precision, mxfp4_fake_quantize
from ampteach.amp.fp8 import Float8Linear, convert_to_float8_training
from ampteach.amp.hadamard import random_signs, rht, rht_matrix
from ampteach.amp.mx import mx_fake_quantize
from ampteach.training.gpt import gpt

FP4 = {"input": "fp4_e2m1", "weight": "fp4_e2m1", "grad_output": "fp4_e2m1"}


@pytest.fixture
def case():
    g = torch.Generator().manual_seed(11)
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g) * 0.05)
    x = torch.randn(96, 64, generator=g)
    x[:, 7] *= 30                                              # an outlier feature, as activations have
    return lin, x, torch.randn(96, 48, generator=g) * 1e-3


def run(lin, x, g, seed=0, **recipe):
    layer = Float8Linear.from_float(copy.deepcopy(lin), **recipe)
    torch.manual_seed(seed)                                    # stochastic rounding's generator: torch's global one
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(g)
    return {"out": out.detach(), "grad_x": x.grad, "grad_W": layer.weight.grad, "grad_b": layer.bias.grad}


def changed(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


NAIVE = dict(recipe="nvfp4", weight_2d=False, rht=False, stochastic=False)


def test_the_naive_recipe_is_three_nvfp4_matmuls(case):
    lin, x, g = case
    r = run(lin, x, g, **NAIVE)
    w = lin.weight.detach()
    q = fp4_fake_quantize
    assert torch.equal(r["out"], q(x) @ q(w).T + lin.bias.detach())
    assert torch.equal(r["grad_x"], q(g) @ q(w.T).T)
    assert torch.equal(r["grad_W"], q(g.T) @ q(x.T).T)
    assert torch.equal(r["grad_b"], g.sum(0))


def test_2d_weights_change_the_forward_and_dgrad_only(case):
    lin, x, g = case
    one, two = run(lin, x, g, **NAIVE), run(lin, x, g, **{**NAIVE, "weight_2d": True})
    assert changed(one, two) == {"out", "grad_x"}
    w = lin.weight.detach()
    w_fwd, w_bwd = fp4_fake_quantize(w, tiled=True), fp4_fake_quantize(w.T, tiled=True)
    assert torch.equal(w_fwd.T, w_bwd)                         # the backward sees the forward's weight
    assert not torch.equal(fp4_fake_quantize(w).T, fp4_fake_quantize(w.T))   # 1-D blocks: it does not
    assert torch.equal(two["out"], fp4_fake_quantize(x) @ w_fwd.T + lin.bias.detach())
    assert torch.equal(two["grad_x"], fp4_fake_quantize(g) @ w_fwd)


def test_rht_changes_only_the_weight_gradient(case):
    lin, x, g = case
    off, on = run(lin, x, g, **NAIVE), run(lin, x, g, **{**NAIVE, "rht": True})
    assert changed(off, on) == {"grad_W"}
    H = rht_matrix(random_signs(16, 0))
    expected = fp4_fake_quantize(rht(g.T, H)) @ fp4_fake_quantize(rht(x.T, H)).T
    assert torch.equal(on["grad_W"], expected)
    exact = g.T @ x
    assert (on["grad_W"] - exact).norm() < (off["grad_W"] - exact).norm()   # the outlier feature, spread out


def test_stochastic_rounding_changes_only_the_backward_and_is_unbiased(case):
    lin, x, g = case
    nearest, sr = run(lin, x, g, **NAIVE), run(lin, x, g, **{**NAIVE, "stochastic": True})
    assert changed(nearest, sr) == {"grad_x", "grad_W"}
    assert all(torch.equal(sr[k], run(lin, x, g, **{**NAIVE, "stochastic": True})[k]) for k in sr)  # seeded
    w8 = fp4_fake_quantize(lin.weight.detach().T)
    mean = torch.stack([run(lin, x, g, seed, **{**NAIVE, "stochastic": True})["grad_x"] for seed in range(200)]).mean(0)
    target = g @ w8.T                                          # dgrad with g exact, W as quantized
    assert (mean - target).norm() < (nearest["grad_x"] - target).norm() / 3


def test_a_generator_of_its_own_leaves_the_global_one_alone(case):
    lin, x, g = case
    gen = torch.Generator().manual_seed(5)
    layer = Float8Linear.from_float(copy.deepcopy(lin), recipe="nvfp4", generator=gen)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    layer(x.clone().requires_grad_()).backward(g)
    assert torch.equal(torch.get_rng_state(), before)


def test_the_full_recipe_is_the_formulas(case):
    lin, x, g = case
    layer = Float8Linear.from_float(copy.deepcopy(lin), recipe="nvfp4", stochastic=False)
    assert repr(layer.recipe) == "FP4Recipe('nvfp4', weight_2d=True, rht=True, stochastic=False)"
    r = run(lin, x, g, recipe="nvfp4", stochastic=False)
    q, w, H = fp4_fake_quantize, lin.weight.detach(), rht_matrix(random_signs(16, 0))
    assert torch.equal(r["out"], q(x) @ q(w, tiled=True).T + lin.bias.detach())
    assert torch.equal(r["grad_x"], q(g) @ q(w, tiled=True))
    assert torch.equal(r["grad_W"], q(rht(g.T, H)) @ q(rht(x.T, H)).T)


def test_mxfp4_without_switches_is_lesson_8s_mx_recipe_in_fp4(case):
    lin, x, g = case
    ours = run(lin, x, g, recipe="mxfp4", weight_2d=False, rht=False, stochastic=False)
    theirs = run(lin, x, g, recipe="mx", elements=FP4)
    assert not changed(ours, theirs)
    w = torch.randn(64, 96)
    assert torch.equal(mxfp4_fake_quantize(w, scale_rounding="floor"), mx_fake_quantize(w, "fp4_e2m1", 32, "floor"))
    assert torch.equal(mxfp4_fake_quantize(w, tiled=True).T, mxfp4_fake_quantize(w.T, tiled=True))
    full = run(lin, x, g, recipe="mxfp4")
    assert changed(ours, full) == {"out", "grad_x", "grad_W"}


def test_rht_pads_a_token_count_that_is_not_a_multiple_of_16(case):
    lin, x, g = case
    r = run(lin, x[:90], g[:90], recipe="nvfp4", stochastic=False)
    H = rht_matrix(random_signs(16, 0))
    pad = lambda t: nn.functional.pad(t, (0, 6))              # noqa: E731
    expected = fp4_fake_quantize(rht(pad(g[:90].T), H)) @ fp4_fake_quantize(rht(pad(x[:90].T), H)).T
    assert torch.equal(r["grad_W"], expected)


def test_keep_high_precision_leaves_the_named_linears_alone():
    model = gpt(65)
    convert_to_float8_training(model, recipe="nvfp4", module_filter_fn=keep_high_precision("lm_head", "blocks.3.mlp"))
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert kinds["lm_head"] == "Linear" and kinds["blocks.3.mlp.0"] == kinds["blocks.3.mlp.2"] == "Linear"
    assert kinds["blocks.3.attn.c_attn"] == kinds["blocks.0.mlp.0"] == "Float8Linear"
    assert sum(k == "Float8Linear" for k in kinds.values()) == 14
    assert model.lm_head.weight is model.wte.weight             # the head stays tied to the embedding


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="fmt"):
        FP4Recipe("fp4")
    with pytest.raises(ValueError, match="scale_rounding"):
        FP4Recipe("mxfp4", scale_rounding="ceil")
    with pytest.raises(TypeError):
        convert_to_float8_training(nn.Sequential(nn.Linear(16, 16)), recipe="nvfp4", history_len=4)
