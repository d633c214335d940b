"""Which SDPA kernel ran: each backend forced in turn, a refusal reported with torch's reason."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ampteach.lab import sdpa_backends
from ampteach.lab.attention_overflow import sweep, variants_for
from ampteach.lab.sdpa_backends import CUDA_BACKENDS, Refused, attempt, backends_for, each_backend


def test_a_gpu_tries_every_cuda_backend_and_a_cpu_keeps_torchs_choice():
    assert backends_for("cuda") == CUDA_BACKENDS and set(CUDA_BACKENDS) == {"flash", "efficient", "math"}
    assert backends_for("cpu") == {"default": None}


def test_each_backend_reports_the_one_that_cannot_run(monkeypatch):
    monkeypatch.setattr(sdpa_backends, "backends_for", lambda device: dict(CUDA_BACKENDS))   # forced, on the CPU
    q = torch.randn(1, 1, 4, 8)
    out = each_backend(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), "cpu")
    reference = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert isinstance(out["efficient"], Refused) and "refused" in str(out["efficient"])   # no CPU kernel
    torch.testing.assert_close(out["math"], reference)
    torch.testing.assert_close(out["flash"], reference)                                   # the CPU flash kernel


def test_attempt_returns_the_result_or_the_refusal():
    assert attempt(lambda: 3) == 3
    refused = attempt(lambda: (_ for _ in ()).throw(RuntimeError("No available kernel.\nmore")))
    assert refused == Refused("No available kernel.")


def test_the_overflow_sweep_names_one_sdpa_variant_per_cuda_backend():
    assert [n for n in variants_for("cuda") if "SDPA" in n] == [f"fp16, SDPA {b}" for b in CUDA_BACKENDS]
    assert "fp16, F.scaled_dot_product_attention" in variants_for("cpu")
    results = sweep([1.0, 1000.0], variants=["fp16, SDPA math", "fp16, SDPA efficient"])   # CPU: efficient refused
    assert all(p.finite and p.refused is None for p in results["fp16, SDPA math"])
    assert all(not p.finite and p.refused for p in results["fp16, SDPA efficient"])
