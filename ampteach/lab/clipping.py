"""Gradient clipping under loss scaling: the norm clip_grad_norm_ sees, the one it applies, the threshold it uses.

    trace = clip_trace(model, batches, opt, scaler, max_norm=1.0, unscale_first=True, steps=40)
    trace.true_norm, trace.scale, trace.applied_norm, trace.update_norm    # one value per step
    plot_clip_trace({"unscale_, clip, step": right, "clip, step (no unscale_)": wrong}, max_norm=1.0)

clip_grad_norm_(params, max_norm) multiplies every gradient by min(1, max_norm / ||.grad||). After
scaler.scale(loss).backward() the .grad tensors hold S * g, so without scaler.unscale_ first it fires
whenever ||g|| > max_norm / S and leaves a gradient of norm max_norm / S once step() divides by S:

    effective threshold on the true gradient = max_norm / S     (max_norm itself after unscale_)

With a dynamic scale S moves in powers of two, and the threshold halves each time S doubles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ClipTrace", "clip_trace", "grad_norm", "plot_clip_trace"]


@dataclass
class ClipTrace:
    """What clip_trace measured, one entry per optimizer step (NaN where a step was skipped)."""

    max_norm: float
    unscale_first: bool
    scale: list[float] = field(default_factory=list)         # the loss scale S the step used
    true_norm: list[float] = field(default_factory=list)     # ||g||: the gradient without the factor S
    seen_norm: list[float] = field(default_factory=list)     # what clip_grad_norm_ measured (S ||g|| without unscale_)
    applied_norm: list[float] = field(default_factory=list)  # the gradient the optimizer applied, unscaled and clipped
    update_norm: list[float] = field(default_factory=list)   # ||w_after - w_before||
    skipped: list[bool] = field(default_factory=list)

    @property
    def threshold(self) -> list[float]:
        """The threshold that acted on the true gradient at each step: max_norm, or max_norm / S."""
        return [self.max_norm if self.unscale_first else self.max_norm / s for s in self.scale]


def grad_norm(params: Iterable[torch.Tensor]) -> float:
    """The 2-norm of all .grad tensors together, as clip_grad_norm_ computes it (inf/NaN if any element is)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item()


def clip_trace(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               optimizer: torch.optim.Optimizer, scaler, *, max_norm: float, unscale_first: bool, steps: int,
               autocast: Callable = torch.autocast, dtype: torch.dtype = torch.float16) -> ClipTrace:
    """Train `steps` steps of the AMP recipe with clipping, in either order, and record the norms of each step.

    unscale_first=True: scale, backward, unscale_, clip, step, update (PyTorch's recipe).
    unscale_first=False: the same without unscale_: clip_grad_norm_ measures S * ||g||.
    autocast is torch.autocast or ampteach.autocast; scaler a torch.amp or ampteach GradScaler.
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = params[0].device.type
    trace = ClipTrace(max_norm, unscale_first)
    for _, (x, y) in zip(range(steps), batches):
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        trace.true_norm.append(grad_norm(params) / scale)
        if unscale_first:
            scaler.unscale_(optimizer)                                       # true gradients from here on
        trace.seen_norm.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
        before = [p.detach().clone() for p in params]
        scaler.step(optimizer)                                               # unscales now if not done before
        scaler.update()
        skipped = scaler.get_scale() < scale
        trace.scale.append(scale)
        trace.skipped.append(skipped)
        trace.applied_norm.append(math.nan if skipped else grad_norm(params))
        trace.update_norm.append(math.sqrt(sum((p.detach() - b).float().pow(2).sum().item()
                                               for p, b in zip(params, before))))
    return trace


def plot_clip_trace(traces: dict[str, ClipTrace], ax=None):
    """One figure: the true gradient norm, max_norm, the effective threshold and the norm each order applied."""
    import matplotlib.pyplot as plt

    from ampteach.lab.plots import course_style

    with course_style():
        if ax is None:
            _, ax = plt.subplots(figsize=(9, 3.6))
        first = next(iter(traces.values()))
        steps = range(len(first.scale))
        ax.plot(steps, first.true_norm, color="0.3", lw=1.5, label="true gradient norm ||g||")
        ax.axhline(first.max_norm, color="tab:green", ls="--", lw=1, label=f"max_norm = {first.max_norm:g}")
        markers = ("o", "x", "s", "^")
        for (name, trace), marker in zip(traces.items(), markers):
            if not trace.unscale_first:
                ax.step(steps, trace.threshold, where="mid", color="tab:red", lw=1,
                        label=f"max_norm / S: the threshold \"{name}\" really uses")
            ax.plot(steps, trace.applied_norm, marker, ms=4, ls="none", label=f"norm applied: {name}")
        ax.set(yscale="log", xlabel="optimizer step", ylabel="gradient norm (true units)",
               title="Clipping before unscale_ compares max_norm with S·||g||")
        ax.legend(fontsize=7, loc="center right")
        return ax
