"""Gradient accumulation under AMP: N micro-batches, then one unscale_, clip, step and update; DDP's no_sync.

    micro_batches = [next(batches) for _ in range(4)]           # one optimizer step's worth
    result = accumulation_step(model, micro_batches, opt, scaler,
                               autocast=lambda: torch.autocast("cpu", dtype=torch.float16), max_norm=1.0)
    result.loss, result.skipped

Each micro-batch's loss is divided by N, so what adds up in .grad is the gradient of the mean over all
N micro-batches; every backward uses the same scale S (update() runs once, after the step), so .grad
holds S * sum_i grad(loss_i / N) and one unscale_ recovers it:

    grad = (1 / S) * sum_{i<N} S * grad(loss_i / N)

Under DistributedDataParallel the first N-1 micro-batches run inside model.no_sync(): their gradients
add up locally and only the last backward all-reduces the sum, one all-reduce per step instead of N
(an inf on any rank in any micro-batch still reaches every rank in that one reduction).
Without an enabled scaler (bf16, fp32) nothing checks for inf/NaN: the step is skipped when the
gradients' total norm is not finite, tested once per step (one host sync), never per micro-batch.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AccumulationResult", "accumulation_step", "plot_accumulation_windows", "windows_from_events"]


class AccumulationResult(NamedTuple):
    loss: torch.Tensor          # the mean loss over the micro-batches (a tensor: reading it is up to you)
    skipped: bool               # True where the optimizer step was skipped (inf/NaN in the gradients)


def accumulation_step(model: nn.Module, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                      optimizer: torch.optim.Optimizer, scaler=None, *,
                      autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                      max_norm: float | None = None, no_sync: bool = True,
                      after_backward: Callable[[int, nn.Module], None] | None = None,
                      loss_fn: Callable = F.cross_entropy) -> AccumulationResult:
    """One optimizer step from len(micro_batches) micro-batches (the recipe in the module docstring).

    scaler: a torch.amp or ampteach GradScaler (enabled for fp16), a disabled one, or None.
    autocast: called once per micro-batch for a fresh context, e.g. lambda: torch.autocast("cpu", dtype=...).
    no_sync: under DDP, skip the all-reduce of the first N-1 backwards (False: reduce after each one).
    after_backward(i, model): runs after micro-batch i's backward (to inspect or break the gradients).
    """
    n = len(micro_batches)
    if n < 1:
        raise ValueError("accumulation_step needs at least one micro-batch")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scaling = scaler is not None and scaler.is_enabled()
    total = torch.zeros((), device=params[0].device)
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        quiet = no_sync and not last and hasattr(model, "no_sync")
        with model.no_sync() if quiet else contextlib.nullcontext():     # forward AND backward inside
            with autocast():
                loss = loss_fn(model(x), y) / n                           # the mean over the N micro-batches
            (scaler.scale(loss) if scaling else loss).backward()          # all N with the same S
        total += loss.detach().float()
        if after_backward is not None:
            after_backward(i, model)
    if scaling:
        scale_before = scaler.get_scale()
        scaler.unscale_(optimizer)                                        # once, in the stepping iteration
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        scaler.step(optimizer)                                            # skipped on inf/NaN
        scaler.update()
        skipped = _was_skipped(scaler, scale_before)
    else:
        limit = max_norm if max_norm is not None else math.inf            # inf: measure the norm, clip nothing
        norm = torch.nn.utils.clip_grad_norm_(params, limit)              # inf/NaN if any gradient element is
        skipped = not bool(torch.isfinite(norm))                          # one host sync per step
        if not skipped:
            optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return AccumulationResult(total, skipped)


def _was_skipped(scaler, scale_before: float) -> bool:
    if hasattr(scaler, "last_step_skipped"):                              # ampteach's scalers say so
        return bool(scaler.last_step_skipped)
    return scaler.get_scale() < scale_before                              # torch's show it as a backoff


# -- the accumulation-windows figure ----------------------------------------------------------------

def windows_from_events(events: Sequence[tuple[int, str]]) -> tuple[list[list[int]], list[int]]:
    """Group a loop's events into the micro-batches each optimizer step applied, and those thrown away.

    events: (micro_batch, what) in the order they happened, what in "backward" (its gradient was added
    to .grad), "step" (the optimizer applied .grad) or "zero" (.grad was cleared without a step).
    Returns (windows, dropped): windows[k] lists the micro-batches whose gradients step k applied.
    """
    windows, dropped, pending = [], [], []
    for micro_batch, what in events:
        if what == "backward":
            pending.append(micro_batch)
        elif what == "step":
            windows.append(pending)
            pending = []
        elif what == "zero":
            dropped += pending
            pending = []
        else:
            raise ValueError(f"unknown event {what!r}: use 'backward', 'step' or 'zero'")
    return windows, dropped + pending


def plot_accumulation_windows(loops: dict[str, Sequence[tuple[int, str]]], n_micro: int, every: int,
                              bad: Sequence[int] = (), ax=None):
    """One row per loop: each micro-batch coloured by the optimizer step that applied its gradient.

    Grey: applied by no step. A red edge marks the bad micro-batches; dashed lines the intended windows
    of `every` micro-batches; a triangle each step, at the micro-batch that made it.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from ampteach.lab.plots import course_style

    with course_style():
        if ax is None:
            _, ax = plt.subplots(figsize=(9, 0.8 + 0.7 * len(loops)))
        colours = plt.get_cmap("tab10").colors
        for row, events in enumerate(loops.values()):
            y = len(loops) - 1 - row
            windows, _ = windows_from_events(events)
            owner = {m: k for k, window in enumerate(windows) for m in window}
            for m in range(n_micro):
                face = colours[owner[m] % len(colours)] if m in owner else "0.85"
                ax.add_patch(Rectangle((m + 0.05, y + 0.15), 0.9, 0.6, facecolor=face, alpha=0.75,
                                       edgecolor="red" if m in bad else "none", lw=2.5 if m in bad else 0))
                if m in owner:
                    ax.text(m + 0.5, y + 0.45, str(owner[m]), ha="center", va="center", fontsize=7)
            for m, what in events:
                if what == "step":
                    ax.plot(m + 0.5, y + 0.88, "v", color="k", ms=5)
        for b in range(0, n_micro + 1, every):
            ax.axvline(b, color="0.5", ls="--", lw=0.8)
        ax.set(xlim=(0, n_micro), ylim=(0, len(loops)),
               xlabel="micro-batch (number: the optimizer step that applied its gradient; grey: no step did)",
               yticks=[len(loops) - 1 - r + 0.45 for r in range(len(loops))], yticklabels=list(loops))
        ax.set_title(f"Accumulation windows of {every} micro-batches (triangle: optimizer step; red edge: bad loss)",
                     fontsize=9)
        return ax
