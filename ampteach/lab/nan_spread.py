"""How one NaN spreads through a model's weights, step by step, when nothing checks for it.

    spread = trace_nan_spread(mlp(), data, TrainConfig(precision="bf16"), poison_step=5, steps=10)
    spread.fraction["1.weight"]        # share of that tensor's elements that are inf/NaN after each step
    plot_nan_spread(spread)

One NaN written into one gradient element reaches the weights through the optimizer (AdamW updates
element by element: one weight), the next forward pass multiplies that weight into every sample's
hidden unit (x * NaN = NaN, even for x = 0), the loss becomes NaN, backward makes every gradient NaN,
and the following step writes NaN into (nearly) every weight:

    after step k: 1 weight;  after step k+1: nearly all of them
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from ampteach.training.data import Preloaded
from ampteach.training.train import TrainConfig, prepare, train_step

__all__ = ["NanSpread", "non_finite_fraction", "plot_nan_spread", "poison_gradient", "trace_nan_spread"]


@dataclass
class NanSpread:
    """What trace_nan_spread recorded: per parameter tensor, its non-finite share after each step."""

    poison_step: int
    names: list[str]
    numel: dict[str, int]
    fraction: dict[str, list[float]] = field(default_factory=dict)   # name -> share inf/NaN after step s
    loss: list[float] = field(default_factory=list)                  # the loss each step computed
    skipped: list[bool] = field(default_factory=list)

    def count(self, step: int) -> int:
        """How many weights (all tensors together) were inf/NaN after `step`."""
        return sum(round(self.fraction[n][step] * self.numel[n]) for n in self.names)

    @property
    def total(self) -> int:
        return sum(self.numel.values())


def poison_gradient(step: int, index: int = 0, value: float = math.nan):
    """An after_backward hook: at `step`, element `index` of the first weight's gradient becomes `value`."""
    def hook(s: int, model: nn.Module) -> None:
        if s == step:
            grad = next(p.grad for p in model.parameters() if p.grad is not None)
            grad.view(-1)[index] = value
    return hook


def non_finite_fraction(tensors: Iterable[torch.Tensor]) -> list[float]:
    return [(~torch.isfinite(t)).float().mean().item() for t in tensors]


def trace_nan_spread(model: nn.Module, data: Preloaded, config: TrainConfig, *, poison_step: int,
                     steps: int, index: int = 0) -> NanSpread:
    """Train `steps` steps of config's recipe with one NaN put into one gradient at poison_step; record the spread."""
    names = [n for n, _ in model.named_parameters()]
    _, opt, scaler = prepare(model, config)
    spread = NanSpread(poison_step, names, {n: p.numel() for n, p in model.named_parameters()},
                       {n: [] for n in names})
    hook = poison_gradient(poison_step, index)
    batches = itertools.chain.from_iterable(data.batches(config.batch_size, shuffle=True, seed=config.seed + epoch)
                                            for epoch in itertools.count())      # epochs as train() draws them
    for step, (x, y) in zip(range(steps), batches):
        result = train_step(model, x, y, opt, scaler, config, step=step, after_backward=hook)
        spread.loss.append(result.loss.item())
        spread.skipped.append(result.skipped)
        for name, share in zip(names, non_finite_fraction(p.detach() for p in model.parameters())):
            spread.fraction[name].append(share)
    return spread


def plot_nan_spread(spreads: dict[str, NanSpread], ax=None):
    """A heat map per run: rows are parameter tensors, columns steps; colour (log scale) and number: inf/NaN weights."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    from ampteach.lab.plots import course_style

    with course_style():
        runs = list(spreads.items())
        if ax is None:
            _, ax = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 2.8), squeeze=False)
            ax = ax[0]
        for a, (title, spread) in zip(ax, runs):
            grid = torch.tensor([spread.fraction[n] for n in spread.names])
            shown = grid.masked_fill(grid == 0, float("nan")).numpy()        # no colour where nothing is NaN
            image = a.imshow(shown, aspect="auto", cmap="Reds", norm=LogNorm(1e-5, 1), interpolation="nearest")
            for row, name in enumerate(spread.names):
                for step, share in enumerate(spread.fraction[name]):
                    if share > 0:
                        count = round(share * spread.numel[name])
                        a.text(step, row, f"{count:,}", ha="center", va="center", fontsize=6,
                               color="white" if share > 0.1 else "black")
            for step, skipped in enumerate(spread.skipped):
                if skipped:
                    a.text(step, -0.6, "skipped", ha="center", va="bottom", fontsize=7, color="tab:blue")
            a.axvline(spread.poison_step - 0.5, color="k", lw=0.8, ls=":")
            a.set(yticks=range(len(spread.names)), yticklabels=spread.names, xticks=range(len(spread.loss)),
                  xlabel=f"after step (NaN put into a gradient at step {spread.poison_step})",
                  ylim=(len(spread.names) - 0.5, -1))
            a.tick_params(labelsize=7)
            a.set_title(title, fontsize=9)
        plt.colorbar(image, ax=list(ax), label="share of inf/NaN weights", fraction=0.03)
        return ax
