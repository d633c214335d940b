"""Lesson 9's measurements: each lab module against an independent computation of what it claims."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ampteach.lab import attention_masks, attention_overflow, bf16_optimizer, logits_precision, norm_overflow
from ampteach.lab.block_dtypes import POINTS, block_dtypes, walk
from ampteach.lab.gpt_training import config_for, plan_steps, samples, step_seconds, train_runs
from ampteach.training.gpt import gpt
from ampteach.training.text import CharText, preload_text

# --- dtypes through a block -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_walk_is_the_models_own_forward_bit_for_bit(dtype):
    torch.manual_seed(0)
    model = gpt(20, block_size=8, n_layer=2, n_head=2, n_embd=16, attention="explicit")
    idx = torch.randint(20, (3, 8))
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        seen, logits, loss = walk(model, idx, idx)
        reference = model(idx)
        reference_loss = F.cross_entropy(reference.flatten(0, 1), idx.flatten())
    assert torch.equal(logits, reference) and set(seen) == set(POINTS)
    assert torch.equal(loss, reference_loss)


def test_without_autocast_every_step_is_fp32_and_with_it_some_are_not():
    torch.manual_seed(0)
    idx = torch.zeros(1, 8, dtype=torch.long)
    seen, _, _ = walk(gpt(20, block_size=8, n_layer=1, n_head=2, n_embd=16), idx, idx)
    assert set(seen.values()) == {torch.float32}
    assert set(block_dtypes("cpu", torch.bfloat16).values()) == {torch.float32, torch.bfloat16}


# --- attention overflow ---------------------------------------------------------------------------------

@pytest.mark.parametrize("scale, factor", [("after", 1.0), ("before", 1 / 8)])
def test_overflow_size_is_where_the_stored_score_rounds_to_inf(scale, factor):
    edge = attention_overflow.overflow_size(2, 64, scale)
    below, above = edge * (1 - 1e-6), edge * (1 + 1e-6)
    assert torch.isfinite(torch.tensor(2 * below**2 * factor).half())
    assert torch.isinf(torch.tensor(2 * above**2 * factor).half())


def test_the_sweep_fails_where_the_arithmetic_says():
    sizes = [100.0, 150.0, 200.0, 400.0, 600.0]
    results = attention_overflow.sweep(sizes, variants=["fp16, scale after", "fp16, scale before", "bf16, scale after"])
    assert [p.finite for p in results["fp16, scale after"]] == [s < 181 for s in sizes]
    assert [p.finite for p in results["fp16, scale before"]] == [s < 512 for s in sizes]
    assert all(p.finite for p in results["bf16, scale after"])
    assert attention_overflow.largest_finite(results["fp16, scale after"], sizes) == 150.0
    small = attention_overflow.sweep([1.0], variants=["fp16, scale after"])["fp16, scale after"][0]
    assert small.finite and small.error < 2e-3                          # fp16 rounding, nothing more
    with pytest.raises(ValueError, match="scale must be"):
        attention_overflow.attention(*attention_overflow.outlier_qkv(1.0), torch.float16, "middle")


# --- masks ----------------------------------------------------------------------------------------------

def test_a_padding_row_goes_nan_exactly_where_the_mask_value_overflows():
    keep = attention_masks.padded_keep(4)
    assert not keep[0].any() and keep[1:].any(-1).all()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        scores = attention_masks.padded_scores(dtype)
        for masking in attention_masks.MASKINGS:
            masked = attention_masks.apply_mask(scores, keep, masking)
            p = attention_masks.masked_softmax(scores, keep, masking)
            assert torch.isnan(p[0]).all() == torch.isinf(masked[0]).all()    # NaN iff the padding row is all -inf
            assert torch.isfinite(p[1:]).all() and torch.allclose(p[1:].sum(-1), torch.ones(3))
    f32_min = torch.tensor(torch.finfo(torch.float32).min)
    assert torch.isinf(f32_min.half()) and torch.isinf(f32_min.bfloat16())


# --- LayerNorm in half ----------------------------------------------------------------------------------

def test_half_layer_norm_is_layer_norm_and_overflows_at_256_in_fp16():
    x = norm_overflow.outlier_row(10.0)
    assert x.mean().item() == 0.0
    torch.testing.assert_close(norm_overflow.half_layer_norm(x.double()), F.layer_norm(x.double(), (128,)))
    edge = next(a for a in range(200, 300) if torch.isinf(torch.tensor(float(a * a)).half()))
    sizes, variances, errors = norm_overflow.variance_sweep([edge - 1.0, float(edge)])
    assert math.isfinite(variances["fp16"][0]) and variances["fp16"][1] == math.inf
    assert errors["fp16"][1] == 1.0 and errors["bf16"][1] < 0.05 and errors["fp32"][1] < 1e-6
    with pytest.raises(ValueError, match="even"):
        norm_overflow.outlier_row(3.0, n_outliers=3)


# --- the optimizer in bf16 ------------------------------------------------------------------------------

def test_decay_changes_is_what_torch_adamw_does():
    w = bf16_optimizer.normal_weights(512).to(torch.bfloat16)
    for lr_wd in (1e-4, 2.5e-3, 5e-3):
        p = torch.nn.Parameter(w.clone())
        p.grad = torch.zeros_like(p)
        torch.optim.AdamW([p], lr=lr_wd, weight_decay=1.0).step()
        assert torch.equal(bf16_optimizer.decay_changes(w, lr_wd, 1.0), p.detach() != w)


def test_decay_only_norms_follow_exact_decay_except_plain_bf16():
    norms = bf16_optimizer.decay_only_norms(bf16_optimizer.normal_weights(256), 1e-3, 0.1, steps=200)
    exact = (1 - 1e-4) ** 200
    assert norms["bf16 weights"][-1] == 1.0
    for name in ("fp32 weights", "bf16 + fp32 masters", "bf16 + Kahan"):
        assert abs(norms[name][-1] - exact) < 1e-3, name
    assert abs(norms["bf16 + stochastic rounding"][-1] - exact) < 5e-3


def test_second_moments_are_adams_and_a_bf16_v_never_decays():
    grads = [1.0] * 5 + [0.01] * 20
    fp32 = bf16_optimizer.second_moments(grads, torch.float32)
    v, expected = 0.0, []
    for g in grads:
        v = 0.999 * v + 0.001 * g * g
        expected.append(v)
    assert fp32 == pytest.approx(expected, rel=1e-5)
    bf16 = bf16_optimizer.second_moments(grads, torch.bfloat16)
    assert all(b >= a for a, b in zip(bf16, bf16[1:])) and bf16[-1] == bf16[4]


# --- the loss in half -----------------------------------------------------------------------------------

def test_loss_errors_are_single_roundings():
    z, t = logits_precision.vocab_logits(300, rows=16)
    assert torch.equal(z[torch.arange(16), t], z.max(1).values)      # each target is its row's top logit
    errors = logits_precision.loss_errors(z, t)
    exact = -F.log_softmax(z, -1)[torch.arange(16), t]
    half_ulp = (exact.abs() * 2.0**-8).max().item()        # |loss| times half a bf16 ulp, at most
    assert 0 < errors["log-softmax out in bf16"][0] <= half_ulp
    assert errors["log-softmax out in fp16"][0] < errors["log-softmax out in bf16"][0]
    assert errors["logits in bf16"][1] <= errors["logits in bf16"][0]


# --- training runs on a budget --------------------------------------------------------------------------

def test_plan_steps_fits_whole_epochs_in_each_budget():
    plan = plan_steps({"fast": 0.01, "slow": 1.0, "slower": 10.0}, budget_s={"fast": 90}, default_budget_s=35,
                      max_steps=300, every=10)
    assert plan == {"fast": 300, "slow": 30, "slower": 30}
    assert "fast" not in plan.why and "fits in its 35 s" in plan.why["slow"]


def test_plan_steps_never_gives_a_run_a_dot_and_says_whom_it_raised():
    plan = plan_steps({"fp32": 0.1, "slow": 10.0}, default_budget_s=30, max_steps=300, every=10, min_epochs=3)
    assert plan["slow"] == 30 and "raised to 30" in plan.why["slow"] and "fit 0" in plan.why["slow"]
    assert all(n >= 30 for n in plan.values())
    assert "slow" in plan.report() and "raised to 30" in plan.report()


def test_plan_steps_alike_shortens_every_run_to_the_fewest():
    plan = plan_steps({"a": 0.01, "b": 0.5, "c": 0.1}, default_budget_s=30, max_steps=300, every=10, alike=True)
    assert plan == {"a": 60, "b": 60, "c": 60}
    assert "like the other runs" in plan.why["a"] and "fits in its 30 s" in plan.why["b"]


def test_plan_steps_keeps_the_reference_run_long_on_a_busy_machine():
    busy = {"fp32": 5.0, "bf16": 3.0}               # fp32's step timed under load: its budget fits one epoch
    assert plan_steps(busy, budget_s={"fp32": 75}, default_budget_s=30, min_steps={"fp32": 95}) == \
        {"fp32": 100, "bf16": 30}                   # rounded up to whole epochs; the others a curve of 3 points
    assert plan_steps({"fp32": 0.1}, budget_s={"fp32": 75}, min_steps={"fp32": 100}) == {"fp32": 300}


def test_train_runs_and_samples_on_a_tiny_text():
    text = CharText("to be or not to be, that is the question. " * 40)
    data = preload_text(text, block_size=8, steps_per_epoch=2, eval_windows=4)
    tiny = lambda: gpt(len(text.vocab), block_size=8, n_layer=1, n_head=2, n_embd=16)
    assert step_seconds("fp32", data, make_model=tiny, batch_size=4, min_seconds=0.01) > 0
    histories, models = train_runs(data, {"fp32": 4, "pure bf16": 2}, make_model=tiny, batch_size=4)
    assert len(histories["fp32"].val_loss) == 2 and len(histories["pure bf16"].val_loss) == 1
    assert histories["pure bf16"].config == config_for("pure bf16", epochs=1, batch_size=4)
    table = samples(models, histories, text, prompt="to", length=30, width=12)
    assert table.splitlines()[0].startswith("fp32") and "pure bf16" in table.splitlines()[0]
    with pytest.raises(ValueError, match="whole number of epochs"):
        train_runs(data, {"fp32": 3}, make_model=tiny)
