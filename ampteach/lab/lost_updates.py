"""Updates that rounding loses: measure them on real weights, count them during training, draw them.

    lost = lost_fraction(weights, ratios, torch.bfloat16)   # per w/u ratio: share of updates with round(w + u) == w
    first, every = loss_thresholds(ratios, lost)            # bf16: 256.0 and 512.0; fp16: 2048.0 and 4096.0
    counter = LostUpdates(lr=3e-4)                          # train(..., after_backward=counter); counter.per_step
    trace = sgd_trace("kahan", start=1.0, update=2**-10, steps=1000)   # a bf16 weight, step by step
    fig = plot_lost_fraction(ratios, {"fp16": lost16, "bf16": lost_bf16})
    fig = plot_update_on_grid(w, u, torch.float16)          # the number grid around one weight

round(w + u) == w exactly when |u| is below half the gap from w to its neighbour (at a tie, when
w's last bit is even). With M mantissa bits the gap at w is between |w| 2^-M and |w| 2^(1-M), so
updates start to be lost at w/u = 2^(M+1) and all of them are from 2^(M+2): fp16 (M = 10) from
2048 and 4096, bf16 (M = 7) from 256 and 512. Only normal numbers follow this rule; below the
smallest normal number the gap is fixed, so lost_fraction leaves subnormal weights out.
"""

from __future__ import annotations

from typing import Callable, Mapping

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from ampteach.lab.plots import FORMAT_COLORS, course_style

__all__ = ["lost_fraction", "loss_thresholds", "LostUpdates", "plot_lost_fraction", "plot_update_on_grid",
           "plot_traces", "sgd_trace", "plot_loss_gap"]

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def lost_fraction(weights: Tensor, ratios: Tensor, dtype: torch.dtype) -> Tensor:
    """For each ratio r: the share of updates u = +-w/r (fp32) that leave w unchanged once w + u is rounded to dtype.

    weights: any float tensor; each is rounded to dtype first (the weight a dtype model holds), and
    only normal numbers of dtype are used. Each weight is nudged once away from zero and once towards
    it; the sum is computed in fp32 and rounded once, as an optimizer's w.add_(update) on a dtype
    weight does. Returns a float tensor of len(ratios) values in [0, 1].
    """
    w = weights.detach().flatten().to(dtype)
    w = w[w.abs() >= torch.finfo(dtype).tiny]
    lost = []
    for r in ratios.tolist():
        u = w.float() / r
        kept_away = (w.float() + u).to(dtype) == w
        kept_toward = (w.float() - u).to(dtype) == w
        lost.append(torch.cat([kept_away, kept_toward]).float().mean())
    return torch.stack(lost)


def loss_thresholds(ratios: Tensor, lost: Tensor) -> tuple[float, float]:
    """(the smallest ratio at which some update was lost, the smallest from which every update was)."""
    return ratios[lost > 0].min().item(), ratios[lost == 1].min().item()


class LostUpdates:
    """after_backward hook for train(): per step, the share of one layer's SGD updates that round away.

        counter = LostUpdates(lr=3e-4)
        train(model, data, TrainConfig(recipe="half", optimizer="sgd", momentum=0.0, lr=3e-4, ...),
              after_backward=counter)
        counter.per_step                     # one value per step, in [0, 1]

    Counts weights with a non-zero gradient whose update -lr * grad, added in the weight's own dtype
    (what SGD without momentum does), leaves them unchanged: lost <- round(w - lr * g) == w.

    Args:
        lr (float): the SGD learning rate the run uses (the update is -lr * grad).
        layer (callable, optional): model -> the weight to watch (default: the model's first 2-D
            parameter, the first Linear's weight).
    """

    def __init__(self, lr: float, layer: Callable[[nn.Module], Tensor] | None = None):
        self.lr = lr
        self.layer = layer or (lambda model: next(p for p in model.parameters() if p.dim() == 2))
        self.per_step: list[float] = []

    def __call__(self, step: int, model: nn.Module) -> None:
        param = self.layer(model)
        w, grad = param.detach(), param.grad
        unchanged = (w.add(grad, alpha=-self.lr) == w) & (grad != 0)      # rounded once, in w's dtype
        self.per_step.append(unchanged.float().mean().item())

    @property
    def mean(self) -> float:
        return sum(self.per_step) / len(self.per_step)


def plot_lost_fraction(ratios: Tensor, lost: Mapping[str, Tensor], ax=None) -> Figure:
    """% of updates lost against weight/update (log2 axis), one line per format, thresholds dashed."""
    with course_style():
        fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7.5, 3.2))
        for label, values in lost.items():
            ax.semilogx(ratios, 100 * values, base=2, marker=".", label=label, color=FORMAT_COLORS.get(label))
            first, every = loss_thresholds(ratios, values)
            for r in (first, every):
                ax.axvline(r, color=FORMAT_COLORS.get(label, "grey"), ls="--", lw=0.8)
        ax.set(xlabel="weight / update", ylabel="% of updates lost",
               title="A rounded weight ignores updates smaller than half the gap to its neighbour")
        ax.legend()
    return fig


def plot_update_on_grid(w: Tensor, u: float, dtype: torch.dtype, neighbours: int = 3) -> Figure:
    """The dtype numbers around w (black), the halfway points where rounding switches (dotted) and w + u."""
    w = w.detach().to(dtype)
    grid = [w]
    for direction in (float("inf"), float("-inf")):
        v = w
        for _ in range(neighbours):
            v = torch.nextafter(v, torch.tensor(direction, dtype=dtype))
            grid.append(v)
    grid = torch.stack(grid).float().sort().values.tolist()
    exact = w.float().item() + u
    with course_style():
        fig, ax = plt.subplots(figsize=(8, 2.4))
        for g in grid:
            ax.axvline(g, color="black", lw=1.5)
        for a, b in zip(grid[:-1], grid[1:]):
            ax.axvline((a + b) / 2, color="grey", ls=":", lw=1)
        ax.plot([w.float().item()], [0.6], "o", color="C0", label=f"w ({_NAMES.get(dtype, dtype)})")
        ax.plot([exact], [0.3], "x", color="C3", ms=9, label="w + u (exact)")
        ax.annotate("", xy=(w.float().item(), 0.25), xytext=(exact, 0.25), arrowprops=dict(arrowstyle="->", color="C3"))
        ax.set(yticks=[], ylim=(0, 1), xlabel="value (black: numbers of the format, dotted: halfway points)",
               title=f"The {_NAMES.get(dtype, dtype)} grid around one weight: w + u rounds back to w")
        ax.legend(loc="upper right")
        fig.tight_layout()
    return fig


def plot_traces(traces: Mapping[str, list[float] | Tensor], title: str, ylabel: str = "weight value",
                exact: list[float] | None = None) -> Figure:
    """One line per trace against the step (a staircase for labels containing 'round'), and the exact sum dashed."""
    with course_style():
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        if exact is not None:
            ax.plot(exact, color="black", ls="--", lw=1, label="exact")
        for label, values in traces.items():
            ax.plot(values, label=label, drawstyle="steps-post" if "round" in label else "default")
        ax.set(xlabel="step", ylabel=ylabel, title=title)
        ax.legend()
        fig.tight_layout()
    return fig


def sgd_trace(rounding: str, start: float, update: float, steps: int, dtype: torch.dtype = torch.bfloat16,
              n: int = 1) -> Tensor:
    """n dtype weights, all starting at `start`, given `steps` SGD steps that each add `update`: (steps, n) values.

    rounding: "plain" (a torch optimizer stepping the dtype weights), "master" (MasterWeights),
    "nearest", "kahan" or "stochastic" (HalfWeights). Row k holds the weights after step k + 1, as the
    forward pass uses them (for "kahan" without their compensation), in float64.
    """
    from ampteach.amp.half_weights import HalfWeights
    from ampteach.amp.master import MasterWeights

    model = nn.Linear(n, 1, bias=False).to(dtype)
    nn.init.constant_(model.weight, start)
    holders = {"plain": lambda m: None, "master": MasterWeights}
    holder = holders.get(rounding, lambda m: HalfWeights(m, rounding))(model)
    opt = torch.optim.SGD(holder.params if holder else model.parameters(), lr=update)
    trace = []
    for _ in range(steps):
        model.weight.grad = torch.full_like(model.weight, -1.0)    # SGD: w <- w - lr * grad = w + update
        if holder:
            holder.grads_to_master()
        opt.step()
        if holder:
            holder.master_to_model()
        trace.append(model.weight.detach().double().flatten())
    return torch.stack(trace)


def plot_loss_gap(histories: Mapping[str, object], reference: str, lost: LostUpdates | None = None,
                  smooth: int = 10, held_out: bool = False) -> Figure:
    """Left: each run's training loss minus the reference run's, step by step (running mean over `smooth`
    steps); with held_out, next: each run's held-out loss after every epoch (History.val_loss), the same
    held-out images for every run; right, with lost: the share of updates that LostUpdates counted as
    rounded away, per step.

    histories: {label: ampteach.History} of runs over the same batches, so that their per-step
    losses differ only by what the runs learned differently.
    """
    base = torch.tensor(histories[reference].step_loss, dtype=torch.float64)
    panels = 1 + held_out + (lost is not None)
    with course_style():
        fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels if panels > 1 else 7, 3.4), squeeze=False)
        axes = list(axes[0])
        ax = axes.pop(0)
        ax.axhline(0, color="black", lw=1, label=reference)
        for label, h in histories.items():
            if label != reference:
                gap = torch.tensor(h.step_loss, dtype=torch.float64) - base
                ax.plot(_running_mean(gap, smooth), label=label)
        ax.set(xlabel="step", ylabel=f"loss - {reference}'s (mean of {smooth} steps)",
               title=f"Training loss compared with {reference}, batch by batch")
        ax.legend()
        if held_out:
            ax = axes.pop(0)
            others = [label for label in histories if label != reference]   # colours as in the left panel
            for label, h in histories.items():
                style = dict(color="black", lw=4, alpha=0.35) if label == reference else \
                    dict(color=f"C{others.index(label)}")
                ax.plot(range(1, len(h.val_loss) + 1), h.val_loss, marker="o", ms=3, label=label, **style)
            ax.set(xlabel="epoch", ylabel="held-out loss (nats)", title="Held-out loss after each epoch")
            ax.legend()
        if lost is not None:
            ax = axes.pop(0)
            ax.plot([100 * v for v in lost.per_step], color="C2")
            ax.set(xlabel="step", ylabel="% of first-layer updates lost", ylim=(0, 100),
                   title="Updates rounded away in the half run")
        fig.tight_layout()
    return fig


def _running_mean(values: Tensor, k: int) -> list[float]:
    sums = torch.cat([torch.zeros(1, dtype=values.dtype), values.cumsum(0)])
    end = torch.arange(1, len(values) + 1)
    start = (end - k).clamp(min=0)
    return ((sums[end] - sums[start]) / (end - start)).tolist()
