"""The tiny GPT: shapes, causality, the two attention paths against each other, generation, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ampteach.amp.master import to_half
from ampteach.training.gpt import explicit_attention, gpt


def small(**kw):
    torch.manual_seed(0)
    return gpt(11, **{"block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16, **kw})


def test_logits_shape_and_parameter_count():
    V, T, L, C = 11, 8, 2, 16
    model = small()
    assert model(torch.randint(V, (3, 5))).shape == (3, 5, V)
    per_block = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * per_block + 2 * C                 # lm_head shares wte's weight
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.lm_head.weight is model.wte.weight


def test_the_course_shape_has_about_0_8m_parameters():
    n = sum(p.numel() for p in gpt(65).parameters())
    assert 0.75e6 < n < 0.85e6


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_causal_a_position_never_sees_the_future(attention):
    model = small(attention=attention)
    idx = torch.randint(11, (2, 8))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    a, b = model(idx), model(changed)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.equal(a[:, 5:], b[:, 5:])


def test_the_explicit_path_is_sdpa_written_out():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(explicit_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    model = small()
    idx = torch.randint(11, (2, 8))
    sdpa = model(idx)
    model.attention = "explicit"
    torch.testing.assert_close(model(idx), sdpa, atol=1e-5, rtol=1e-5)
    assert all(b.attn.attention == "explicit" for b in model.blocks)


def test_initialisation_follows_gpt2():
    torch.manual_seed(0)
    model = gpt(65, n_layer=4)
    assert abs(model.blocks[0].mlp[0].weight.std().item() - 0.02) < 0.002
    assert abs(model.blocks[0].attn.c_proj.weight.std().item() - 0.02 / math.sqrt(8)) < 0.001
    assert all((m.bias == 0).all() for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None)


def test_generate_continues_the_prompt_reproducibly():
    model = small()
    prompt = torch.tensor([1, 2, 3])
    a = model.generate(prompt, 12, generator=torch.Generator().manual_seed(0))
    b = model.generate(prompt, 12, generator=torch.Generator().manual_seed(0))
    assert a.shape == (15,) and torch.equal(a[:3], prompt) and torch.equal(a, b)
    assert model.generate(prompt[None].repeat(2, 1), 3).shape == (2, 6)
    long = model.generate(torch.randint(11, (20,)), 2)                # longer than the context: cropped
    assert long.shape == (22,)
    assert model.training                                              # generate leaves the mode as it found it


def test_top_k_1_is_greedy():
    model = small()
    prompt = torch.tensor([[4, 5]])
    out = model.generate(prompt, 1, top_k=1)
    assert out[0, -1].item() == model(prompt)[0, -1].argmax().item()


def test_a_pure_bf16_model_runs_and_returns_fp32_logits():
    model = to_half(small(), torch.bfloat16)
    logits = model(torch.randint(11, (2, 8)))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert model.blocks[0].attn.c_attn.weight.dtype == torch.bfloat16
    assert model.blocks[0].ln_1.weight.dtype == torch.float32          # norms stay fp32 (to_half's rule)


@pytest.mark.parametrize("bad, message", [
    (lambda m: m(torch.zeros(2, 3)), "int64 token ids"),
    (lambda m: m(torch.zeros(9, dtype=torch.int64)), "int64 token ids"),
    (lambda m: m(torch.zeros(1, 9, dtype=torch.int64)), "longer than the model's context"),
    (lambda m: gpt(11, n_embd=10, n_head=4), "multiple of n_head"),
    (lambda m: gpt(11, attention="flash"), "attention must be one of"),
    (lambda m: setattr(m, "attention", "flash"), "attention must be one of"),
    (lambda m: gpt(0), ">= 1"),
])
def test_errors_say_what_to_do(bad, message):
    with pytest.raises(ValueError, match=message):
        bad(small())
