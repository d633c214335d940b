"""Exercise E.6.1: one AMP training step graded against torch.amp's recipe, and the measured table.

    from ampteach.grading.checks import check_amp_step, check_e6_1_table
    check_amp_step(amp_step)                  # fp32, fp16 + GradScaler, bf16: bit-identical to torch.amp
    check_e6_1_table(rows, device)            # complete, plausible rows beside the textbook's expectations
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed


def tiny_problem(seed: int = 0, batch: int = 64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP and one FashionMNIST-shaped batch (random pixels, fixed by seed)."""
    from ampteach.training.models import mlp

    torch.manual_seed(seed)
    model = mlp((64,))
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    return model, x, y


def _reference_step(model, x, y, optimizer, scaler, precision: str, clip_norm: float | None = None):
    from ampteach.training.train import TrainConfig, train_step

    config = TrainConfig(precision=precision, impl="torch", clip_norm=clip_norm, progress=False)
    return train_step(model, x, y, optimizer, scaler, config)


def compare_models(case: str, mine: nn.Module, ref: nn.Module) -> None:
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        if not torch.equal(p, q):
            diff = (p.detach().float() - q.detach().float()).abs().max().item()
            raise CheckFailed(f"{case}: parameter {name} differs from torch.amp's recipe (max |difference| {diff:.3g}); "
                              f"expected the same values bit for bit")


def check_amp_step(amp_step: Callable) -> None:
    """amp_step(model, x, y, optimizer, scaler, precision) does one training step with autocast and a
    GradScaler; graded against torch.amp's recipe for fp32, fp16 and bf16, three steps each."""
    for precision in ("fp32", "fp16", "bf16"):
        model, x, y = tiny_problem()
        ref = copy.deepcopy(model)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=precision == "fp16") for _ in range(2)]
        for step in range(3):
            amp_step(model, x, y, opts[0], scalers[0], precision)
            _reference_step(ref, x, y, opts[1], scalers[1], precision)
            compare_models(f"{precision}, step {step}", model, ref)
            if scalers[0].get_scale() != scalers[1].get_scale():
                raise CheckFailed(f"{precision}, step {step}: expected loss scale {scalers[1].get_scale()}, got "
                                  f"{scalers[0].get_scale()} (did you call scaler.update()?)")
    _passed("check_amp_step", "fp32, fp16 + GradScaler and bf16, 3 steps each, bit-identical to torch.amp's recipe")


def check_e6_1_table(rows: dict[str, dict], device: str = "cpu") -> None:
    """rows[precision] = {"samples_per_s", "peak_mem_bytes", "accuracy"} for fp32, fp16 and bf16 (as
    measured by your `measure`); checks they are complete and plausible and prints them side by side
    against the textbook's expectations (1.5-3x faster on a GPU, activation memory about halved,
    accuracy within 0.5 points)."""
    missing = [p for p in ("fp32", "fp16", "bf16") if p not in rows]
    if missing:
        raise CheckFailed(f"expected rows for fp32, fp16 and bf16, missing {missing}")
    for precision, row in rows.items():
        for key in ("samples_per_s", "peak_mem_bytes", "accuracy"):
            value = row.get(key) if isinstance(row, dict) else None
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise CheckFailed(f"{precision}: expected a positive number for {key!r}, got {value!r}")
        if row["accuracy"] <= 1:
            raise CheckFailed(f"{precision}: expected accuracy in percent (0-100), got {row['accuracy']!r}")
    base = rows["fp32"]
    print(f"{'config':7s} {'samples/s':>10s} {'vs fp32':>8s} {'memory MB':>10s} {'vs fp32':>8s} {'accuracy':>9s} {'vs fp32':>8s}")
    for precision, row in rows.items():
        print(f"{precision:7s} {row['samples_per_s']:10,.0f} {row['samples_per_s'] / base['samples_per_s']:7.2f}x "
              f"{row['peak_mem_bytes'] / 2**20:10.2f} {row['peak_mem_bytes'] / base['peak_mem_bytes']:7.2f}x "
              f"{row['accuracy']:8.1f}% {row['accuracy'] - base['accuracy']:+7.1f}")
    for precision in ("fp16", "bf16"):
        gap = rows[precision]["accuracy"] - base["accuracy"]
        if abs(gap) > 2.0:
            raise CheckFailed(f"{precision}: accuracy {rows[precision]['accuracy']:.1f}% is {gap:+.1f} points from fp32's "
                              f"{base['accuracy']:.1f}%; expected within 2 points (the textbook: 0.5 at convergence). "
                              f"Same model, seed, data order and epochs for every config?")
        if device == "cpu" and rows[precision]["peak_mem_bytes"] >= base["peak_mem_bytes"]:
            raise CheckFailed(f"{precision}: expected fewer activation bytes than fp32 "
                              f"({base['peak_mem_bytes']:,}), got {rows[precision]['peak_mem_bytes']:,}: "
                              f"was the forward pass under autocast when you measured?")
    speed = max(rows["fp16"]["samples_per_s"], rows["bf16"]["samples_per_s"]) / base["samples_per_s"]
    print(f"\ntextbook: 1.5-3x faster on a GPU; here the faster AMP config ran {speed:.2f}x fp32 on {device}")
    _passed("check_e6_1_table", "three complete rows; accuracies within 2 points of fp32"
            + ("; less activation memory than fp32" if device == "cpu" else ""))

