"""The transformer exercises' checks pass every correct answer tried and fail each broken one for its reason."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ampteach.amp.kahan import kahan_add_
from ampteach.amp.stochastic_rounding import round_stochastic
from ampteach.grading.checks import (
    CheckFailed,
    check_decay_is_lost,
    check_decay_is_lost_hidden,
    check_fp16_attention,
    check_fp16_attention_hidden,
    check_keep_decay,
    check_keep_decay_hidden,
)
from ampteach.grading.judges.fp16_attention import hidden_cases, visible_cases

# --- fix_fp16_attention --------------------------------------------------------------------------------


def scale_q_first(q, k, v, mask=None):
    s = (q * (1 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), -1)
    if mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0)
    return p.half() @ v


def scale_both(q, k, v, mask=None):            # SDPA's math path: q and k by d^-1/4 each, softmax in fp16
    f = q.size(-1) ** -0.25
    s = (q * f) @ (k * f).transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def add_dtype_min_then_zero(q, k, v, mask=None):
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    if mask is not None:
        s = s + torch.zeros_like(s).masked_fill(~mask, torch.finfo(s.dtype).min)
    p = torch.softmax(s.float(), -1)
    if mask is not None:
        p = p.masked_fill(~mask.any(-1, keepdim=True), 0)
    return p.half() @ v


def naive(q, k, v, mask=None):                  # nanoGPT's explicit order: the scale after q @ kᵀ
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -1).half() @ v


def upcast(q, k, v, mask=None):               # finite and accurate, but its matmuls run in fp32
    q, k, v = q.float(), k.float(), v.float()
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0) @ v).half()


def sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def fill_dtype_min(q, k, v, mask=None):         # finite, but a fully masked query attends uniformly
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.softmax(s.float(), -1).half() @ v


def wrong_axis(q, k, v, mask=None):
    s = (q / math.sqrt(q.size(-1))) @ k.transpose(-2, -1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -2).nan_to_num(0).half() @ v


@pytest.mark.parametrize("answer", [scale_q_first, scale_both, add_dtype_min_then_zero], ids=lambda f: f.__name__)
def test_correct_attention_passes_visible_and_hidden_checks(answer, capsys):
    check_fp16_attention(answer)
    check_fp16_attention_hidden(answer)
    assert "passed check_fp16_attention_hidden" in capsys.readouterr().out


@pytest.mark.parametrize("answer, check, reason", [
    (naive, check_fp16_attention, "not finite.*where does 1/√d go"),
    (naive, check_fp16_attention_hidden, "not finite"),
    (upcast, check_fp16_attention, "ran on float32"),
    (sdpa, check_fp16_attention, "scaled_dot_product_attention"),
    (fill_dtype_min, check_fp16_attention, "should give zeros"),   # the visible check states every requirement
    (wrong_axis, check_fp16_attention, "relative error"),
], ids=lambda x: getattr(x, "__name__", str(x))[:30])
def test_broken_attention_fails_for_its_reason(answer, check, reason):
    with pytest.raises(CheckFailed, match=reason):
        check(answer)


@pytest.mark.parametrize("seed", range(12))
def test_the_outlier_cases_overflow_q_kT_but_their_scaled_scores_fit(seed):
    """The visible cases, and the hidden ones as the grader draws them (twelve draws): naive overflows, scaled fits."""
    import random

    hidden = hidden_cases(random.Random(seed))
    for name, (q, k, _), _ in visible_cases()[1:] + hidden[1:]:
        scores = q.double() @ k.double().transpose(-2, -1)
        assert scores.abs().max() >= 65520 * 1.1, name                         # the naive order overflows fp16
        assert scores.abs().max() / math.sqrt(q.size(-1)) <= 65504 / 1.1, name  # scaling first fits
    for name, (q, _k, _), mask in (hidden[0], visible_cases()[3]):
        blind = ~mask.any(-1).expand(q.shape[:-1])
        assert blind.any(), name


# --- fix_bf16_weight_decay -------------------------------------------------------------------------------

def lost_by_doing_it(w, lr, wd):
    return w.mul(1 - lr * wd) == w


def lost_by_half_ulp(w, lr, wd):                # forgets the smaller gap below a power of two
    e = torch.floor(torch.log2(w.float().abs()))
    return (w.float().abs() * lr * wd < torch.exp2(e - 8)) | (w == 0)


class FP32Copies:
    def __init__(self, params, lr, weight_decay):
        self.params, self.factor = params, 1 - lr * weight_decay
        self.masters = [p.detach().float() for p in params]

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.masters):
            m.mul_(self.factor)
            p.copy_(m)


class Plain:
    def __init__(self, params, lr, weight_decay):
        self.params, self.factor = params, 1 - lr * weight_decay

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.mul_(self.factor)


class KahanInBF16:                              # a bf16 compensation stops growing at ~2^8 x the update
    def __init__(self, params, lr, weight_decay):
        self.params, self.rate = params, lr * weight_decay
        self.comp = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self):
        for p, c in zip(self.params, self.comp):
            kahan_add_(p, -self.rate * p.float(), c)


class Stochastic:                               # right on average, but each weight wanders
    def __init__(self, params, lr, weight_decay):
        self.params, self.factor = params, 1 - lr * weight_decay

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.copy_(round_stochastic(p.float() * self.factor))


class ReplacesWithFP32:
    def __init__(self, params, lr, weight_decay):
        for p in params:
            p.data = p.data.float()
        self.params, self.factor = params, 1 - lr * weight_decay

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.mul_(self.factor)


def test_correct_decay_answers_pass():
    check_decay_is_lost(lost_by_doing_it)
    check_decay_is_lost_hidden(lost_by_doing_it)
    check_keep_decay(FP32Copies)
    check_keep_decay_hidden(FP32Copies)


@pytest.mark.parametrize("answer, check, reason", [
    (lost_by_half_ulp, check_decay_is_lost, "weights wrong"),
    (Plain, check_keep_decay, "more than one bf16 ulp"),
    (KahanInBF16, check_keep_decay_hidden, "more than one bf16 ulp"),
    (Stochastic, check_keep_decay, "more than one bf16 ulp"),
    (ReplacesWithFP32, check_keep_decay, "same bf16 tensors"),
], ids=lambda x: getattr(x, "__name__", str(x))[:30])
def test_broken_decay_answers_fail_for_their_reason(answer, check, reason):
    with pytest.raises(CheckFailed, match=reason):
        check(answer)
