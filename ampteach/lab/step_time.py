"""Where a training step's time goes: samples/s by width and precision, and a torch.profiler breakdown.

    from ampteach.lab.step_time import width_sweep, profile_step, amdahl
    rows = width_sweep((256, 1024), data)                   # course MLP 784-W-W-10, batch 256, AdamW
    ms = profile_step(mlp((1024, 1024)), data, "bf16")      # {"matmul": ..., "casts": ..., "optimizer": ..., ...}

A step is ampteach.training.train.train_step: forward + loss under autocast, backward, AdamW on fp32 weights.
Only the matmuls get faster in bf16, so with p the matmul share of the fp32 step and s the matmul's
speed-up (Amdahl's law):
    step speed-up = 1 / ((1 - p) + p / s)  <  1 / (1 - p)     however large s is
and autocast adds work of its own (the casts), which the fp32 step never had.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Callable

import torch
from torch import nn

from ampteach.training.data import Preloaded
from ampteach.training.machine import best_seconds
from ampteach.training.models import mlp
from ampteach.training.seeding import seed_everything
from ampteach.training.train import TrainConfig, prepare, train_step

__all__ = [
    "CAST_OPS", "CATEGORIES", "COLORS", "MATMUL_OPS", "amdahl", "breakdown", "categorize", "make_step",
    "plot_breakdown", "plot_sweep", "profile_step", "shares", "step_throughput", "width_sweep",
]

CATEGORIES = ("matmul", "casts", "optimizer", "elementwise & other")
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::addmv", "aten::mv"})
CAST_OPS = frozenset({"aten::_to_copy"})  # a real dtype conversion (aten::to alone may return its input)
COLORS = {"matmul": "tab:blue", "casts": "tab:red", "optimizer": "tab:green", "elementwise & other": "tab:grey"}


def make_step(model: nn.Module, data: Preloaded, precision: str = "fp32", batch_size: int = 256,
              optimizer: torch.optim.Optimizer | None = None, seed: int = 0) -> Callable[[int | None], None]:
    """step(n=None): one training step of model on the next full batch of the course data (the first n samples
    of it when n is given); AdamW at the course's settings unless optimizer is given."""
    config = TrainConfig(precision=precision, batch_size=batch_size, progress=False, record_steps=False, seed=seed)
    model.to(data.device).train()
    _, opt, scaler = prepare(model, config, optimizer=optimizer)
    full = list(data.batches(batch_size, shuffle=True, seed=seed, drop_last=True))
    if not full:
        raise ValueError(f"batch_size={batch_size} is larger than the {len(data.train_x)} training images: "
                         f"choose a batch_size of at most {len(data.train_x)}")
    batches = itertools.cycle(full)

    def step(n: int | None = None) -> None:
        x, y = next(batches)
        train_step(model, x[:n], y[:n], opt, scaler, config)

    return step


def step_throughput(model: nn.Module, data: Preloaded, precision: str = "fp32", batch_size: int = 256,
                    min_seconds: float = 0.3, optimizer: torch.optim.Optimizer | None = None,
                    warmup_batch: int | None = 8, clock: str = "auto") -> float:
    """Training samples per second: batch_size / the fastest step (machine.best_seconds).

    A first step on warmup_batch samples creates the optimizer's state and the kernels; pass None to warm up
    on a full batch (torch.compile compiles for the shapes it sees first). clock: see machine.best_seconds."""
    step = make_step(model, data, precision, batch_size, optimizer)
    step(warmup_batch)
    return batch_size / best_seconds(step, data.device.type, min_seconds, clock)


def width_sweep(widths: tuple[int, ...], data: Preloaded, precisions: tuple[str, ...] = ("fp32", "bf16"),
                batch_size: int = 256, min_seconds: float = 0.3, seed: int = 0, clock: str = "auto") -> list[dict]:
    """Rows {width, precision, samples_per_s, speedup_vs_fp32} for the course MLP 784-W-W-10 at each width."""
    rows = []
    for w in widths:
        for precision in precisions:
            seed_everything(seed)
            speed = step_throughput(mlp((w, w)), data, precision, batch_size, min_seconds, clock=clock)
            rows.append({"width": w, "precision": precision, "samples_per_s": speed})
    for row in rows:
        base = next((r for r in rows if r["width"] == row["width"] and r["precision"] == "fp32"), None)
        row["speedup_vs_fp32"] = row["samples_per_s"] / base["samples_per_s"] if base else None
    return rows


def categorize(name: str, ancestors: list[str]) -> str:
    """The category of a profiler event from its op name and its callers' (innermost first): anything inside
    the optimizer's step is "optimizer"; otherwise the nearest matmul or cast op decides (the copy_ inside
    addmm is the matmul's, the copy_ inside _to_copy a cast's); the rest is "elementwise & other"."""
    chain = [name, *ancestors]
    if any(a.startswith("Optimizer.") for a in chain):
        return "optimizer"
    for op in chain:
        if op in MATMUL_OPS:
            return "matmul"
        if op in CAST_OPS:
            return "casts"
    return "elementwise & other"


def _self_device_us(e) -> float:
    """A CPU op's own GPU time: its kernels' durations, less its children's (torch renamed the attribute)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, name):
            return getattr(e, name)
    return 0.0


def breakdown(events, device: str = "cpu") -> dict[str, float]:
    """Milliseconds of self time per category, summed over profiler events (FunctionEvent: name, cpu_parent,
    self_cpu_time_total in microseconds). Self time counts each moment once, in the innermost op. device
    "cuda": the GPU time of the kernels each op launched (self_device_time_total), not the CPU's launch time."""
    ms = dict.fromkeys(CATEGORIES, 0.0)
    for e in events:
        ancestors, parent = [], e.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        us = _self_device_us(e) if device == "cuda" else e.self_cpu_time_total
        ms[categorize(e.name, ancestors)] += us / 1000
    return ms


def profile_step(model: nn.Module, data: Preloaded, precision: str = "fp32", batch_size: int = 256,
                 steps: int = 3, min_seconds: float = 0.3,
                 optimizer: torch.optim.Optimizer | None = None) -> dict[str, float]:
    """Where one training step's time goes, in ms per category (CATEGORIES), plus "total".

    Profiles up to `steps` steps after a warm-up step (fewer once min_seconds have passed) and returns the
    fastest of them: on a shared machine the others were slowed down by someone else's work. On a GPU (data on
    cuda) the profiler records the kernels too and each category gets its kernels' GPU time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    # the profiler's backend (kineto) writes a dated line to stderr at every start and stop unless its
    # log level is above them; it reads the variable when it first starts, and a value you set wins
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    device = data.device.type
    step = make_step(model, data, precision, batch_size, optimizer)
    step(None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"ampteach.step{i}"):
                step(None)
            if time.perf_counter() - start >= min_seconds:
                break
    per_step: dict[str, list] = {}
    for e in prof.events():
        top = e
        while top.cpu_parent is not None:
            top = top.cpu_parent
        if top.name.startswith("ampteach.step"):
            per_step.setdefault(top.name, []).append(e)
    best = min((breakdown(events, device) for events in per_step.values()), key=lambda ms: sum(ms.values()))
    best["total"] = sum(best[c] for c in CATEGORIES)
    return best


def shares(ms: dict[str, float]) -> dict[str, float]:
    """Each category's fraction of the step."""
    total = sum(ms[c] for c in CATEGORIES)
    return {c: ms[c] / total for c in CATEGORIES}


def amdahl(fraction: float, factor: float) -> float:
    """Speed-up of the whole when `fraction` of its time gets `factor` times faster: 1 / ((1 - f) + f / s)."""
    return 1.0 / ((1.0 - fraction) + fraction / factor)


def plot_breakdown(breakdowns: dict[str, dict[str, float]], ax=None, title: str = "Where a training step's time goes"):
    """Stacked bars, one per label (e.g. "W=1024 fp32"): each category's share of that step. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.45 * len(breakdowns) + 1.2))
    labels = list(breakdowns)
    left = [0.0] * len(labels)
    for c in CATEGORIES:
        widths = [shares(breakdowns[k])[c] for k in labels]
        ax.barh(labels, widths, left=left, color=COLORS[c], label=c)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the step's op time")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(labels) < 5 else -0.15))
    return ax


def plot_sweep(rows: list[dict], matmul_speedup: float | None = None, ax=None):
    """Half-precision samples/s / fp32's against hidden width (log-log); matmul_speedup draws a matmul's own
    ratio (from the roofline) for comparison. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.5))
    half = [r for r in rows if r["precision"] != "fp32"]
    for precision in dict.fromkeys(r["precision"] for r in half):
        pts = [(r["width"], r["speedup_vs_fp32"]) for r in half if r["precision"] == precision]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{precision} autocast training step")
    if matmul_speedup is not None:
        ax.axhline(matmul_speedup, color="tab:orange", ls="--", label=f"bf16 matmul alone: {matmul_speedup:.2f}x")
    ax.axhline(1.0, color="black", lw=0.8, label="as fast as fp32")
    widths = sorted({r["width"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.set_yscale("log")
    ax.set_xlabel("hidden width W (784-W-W-10)")
    ax.set_ylabel("speed vs fp32 (x)")
    ax.legend(fontsize=8)
    return ax
