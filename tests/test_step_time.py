"""ampteach.lab.step_time: the width sweep's rows, the profiler breakdown's categories, and Amdahl's law (tiny
models)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import matplotlib
import pytest
import torch

from ampteach import mlp
from ampteach.lab import step_time
from ampteach.training.data import Preloaded

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (96,), generator=g)
    return Preloaded(x, y, x[:32], y[:32], 0.0, 1.0)


def event(name, self_us, parent=None):
    return SimpleNamespace(name=name, self_cpu_time_total=self_us, cpu_parent=parent)


def test_categories_come_from_the_op_and_its_callers():
    step = event("Optimizer.step#AdamW.step", 10)
    in_step = event("aten::_to_copy", 5, event("aten::to", 1, step))  # a cast inside AdamW is the optimizer's
    linear = event("aten::linear", 1)
    addmm = event("aten::addmm", 500, linear)
    cast = event("aten::_to_copy", 30, linear)  # autocast's cast of the weight, inside aten::linear
    events = [step, event("aten::mul_", 100, step), in_step, event("aten::copy_", 7, in_step),
              linear, addmm, event("aten::copy_", 9, addmm),  # addmm copies the bias into its output
              cast, event("aten::copy_", 20, cast), event("aten::relu", 40), event("aten::mm", 200),
              event("aten::to", 2)]  # a no-op .to(): not a conversion
    ms = step_time.breakdown(events)
    assert ms == pytest.approx({"matmul": 0.71, "casts": 0.05, "optimizer": 0.122, "elementwise & other": 0.042})
    assert step_time.shares(ms)["matmul"] == pytest.approx(0.71 / 0.924)


def test_on_a_gpu_each_op_counts_its_kernels_time_not_its_launch():
    linear = SimpleNamespace(name="aten::linear", self_cpu_time_total=50, self_device_time_total=0, cpu_parent=None)
    addmm = SimpleNamespace(name="aten::addmm", self_cpu_time_total=20, self_device_time_total=900, cpu_parent=linear)
    step = SimpleNamespace(name="Optimizer.step#AdamW.step", self_cpu_time_total=300, self_device_time_total=0,
                           cpu_parent=None)
    fused = SimpleNamespace(name="aten::_fused_adamw_", self_cpu_time_total=10, self_device_time_total=100,
                            cpu_parent=step)
    old = SimpleNamespace(name="aten::relu", self_cpu_time_total=5, self_cuda_time_total=40, cpu_parent=None)
    ms = step_time.breakdown([linear, addmm, step, fused, old], device="cuda")
    assert ms == pytest.approx({"matmul": 0.9, "casts": 0.0, "optimizer": 0.1, "elementwise & other": 0.04})
    assert step_time.breakdown([linear, addmm], device="cpu")["matmul"] == pytest.approx(0.07)


def test_profile_finds_casts_only_under_autocast(data):
    torch.manual_seed(0)
    fp32 = step_time.profile_step(mlp((16, 16)), data, "fp32", batch_size=32, steps=2, min_seconds=0.0)
    bf16 = step_time.profile_step(mlp((16, 16)), data, "bf16", batch_size=32, steps=2, min_seconds=0.0)
    for ms in (fp32, bf16):
        assert set(ms) == set(step_time.CATEGORIES) | {"total"}
        assert ms["matmul"] > 0 and ms["optimizer"] > 0 and ms["elementwise & other"] > 0
        assert ms["total"] == pytest.approx(sum(ms[c] for c in step_time.CATEGORIES))
    assert fp32["casts"] == 0  # no autocast, no conversions outside the optimizer
    assert bf16["casts"] > 0   # weights and inputs to bf16, weight gradients back to fp32


def test_steps_train_the_model_with_adamw(data):
    torch.manual_seed(0)
    model = mlp((8,))
    before = [p.detach().clone() for p in model.parameters()]
    step = step_time.make_step(model, data, "bf16", batch_size=32)
    step(8)
    step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast leaves the weights fp32
    with pytest.raises(ValueError, match="at most 96"):
        step_time.make_step(model, data, batch_size=97)


def test_width_sweep_rows(data):
    rows = step_time.width_sweep((8, 16), data, batch_size=32, min_seconds=0.001)
    assert [(r["width"], r["precision"]) for r in rows] == [(8, "fp32"), (8, "bf16"), (16, "fp32"), (16, "bf16")]
    for r in rows:
        assert r["samples_per_s"] > 0 and math.isfinite(r["samples_per_s"])
    fp32, bf16 = rows[0], rows[1]
    assert fp32["speedup_vs_fp32"] == 1.0
    assert bf16["speedup_vs_fp32"] == pytest.approx(bf16["samples_per_s"] / fp32["samples_per_s"])
    ax = step_time.plot_sweep(rows, matmul_speedup=0.5)
    assert ax.get_xlabel().startswith("hidden width")
    ax = step_time.plot_breakdown({"a": {c: 1.0 for c in step_time.CATEGORIES}})
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(step_time.CATEGORIES)


def test_amdahl():
    assert step_time.amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert step_time.amdahl(1.0, 6.0) == pytest.approx(6.0)
    assert step_time.amdahl(0.8, 1e12) == pytest.approx(5.0)  # the limit 1 / (1 - p)
    assert step_time.amdahl(0.8, 0.01) == pytest.approx(1 / (0.2 + 80))  # a slow part hurts the same way
