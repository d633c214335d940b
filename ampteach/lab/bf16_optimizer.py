"""Where bf16 bites an LLM's optimizer: AdamW's weight decay rounds away, and Adam's second moment never decays.

    from ampteach.lab.bf16_optimizer import normal_weights, decay_changes, decay_only_norms, second_moments
    w = normal_weights(4096)                           # 0.02 x normal quantiles, in float64 (the same on every CPU)
    decay_changes(w.bfloat16(), lr=1e-3, weight_decay=0.1).float().mean()   # the fraction one decay step moves
    norms = decay_only_norms(w, lr=1e-3, weight_decay=0.1, steps=1000)    # ||w_t|| / ||w_0|| per variant
    v = second_moments(grads, torch.bfloat16)          # Adam's exp_avg_sq, step by step, in bf16 state
    fig = plot_bf16_optimizer(...)

AdamW decays decoupled from the gradient: torch.optim.AdamW first multiplies every weight by
(1 - lr·wd) in the weight's own dtype, then adds the Adam step. In bf16 (8 significant bits) the product
rounds back to w when lr·wd·|w| is below half a unit in the last place of w, which is at least 2^-9·|w|:
    lr·wd < 2^-9 ≈ 0.00195    no bf16 weight ever decays        (lr 1e-3 x wd 0.1 = 1e-4: far below)
    lr·wd > 2^-8 ≈ 0.0039     every weight decays
(Nerogar/OneTrainer#996: "no weight decay is applied".) Adam's second moment is the same story:
v <- β2·v + (1 - β2)·g² with β2 = 0.999 changes v by 0.001·v < 2^-9·v, so β2·v rounds back to v and a
bf16 v can never decrease; the (1 - β2)·g² term is lost too unless g² is more than about 2v. A v stuck
at an old, large value shrinks every later step (pytorch/torchtune#2254: "Very bad convergence with
bf16"). fp32 master weights (or fp32 working copies with Kahan or stochastic rounding, as
ampteach.HalfWeights does) put both the decay and the moments back in fp32.

Every number here is a cast or an elementwise op on deterministic inputs, so it is the same on every CPU.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from ampteach.amp.half_weights import HalfWeights
from ampteach.amp.master import MasterWeights
from ampteach.lab.plots import FORMAT_COLORS, course_style

__all__ = ["DECAY_VARIANTS", "decay_changes", "decay_only_norms", "normal_weights", "plot_bf16_optimizer",
           "second_moments"]

DECAY_VARIANTS = ("fp32 weights", "bf16 weights", "bf16 + fp32 masters", "bf16 + Kahan", "bf16 + stochastic rounding")
COLORS = {"fp32 weights": FORMAT_COLORS["fp32"], "bf16 weights": FORMAT_COLORS["bf16"],
          "bf16 + fp32 masters": "tab:green", "bf16 + Kahan": "tab:purple", "bf16 + stochastic rounding": "tab:cyan"}


def normal_weights(n: int, std: float = 0.02) -> torch.Tensor:
    """n float64 weights at the normal distribution's quantiles (std 0.02, GPT-2's init): deterministic, no RNG."""
    dist = NormalDist(0.0, std)
    return torch.tensor([dist.inv_cdf((i + 0.5) / n) for i in range(n)], dtype=torch.float64)


def decay_changes(w: torch.Tensor, lr: float, weight_decay: float) -> torch.Tensor:
    """True where one AdamW decay step, w.mul_(1 - lr·weight_decay) in w's dtype (as torch.optim.AdamW), moves w."""
    return w.mul(1 - lr * weight_decay) != w


class _Holder(nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w)


def decay_only_norms(w0: torch.Tensor, lr: float = 1e-3, weight_decay: float = 0.1, steps: int = 1000,
                     variants: Sequence[str] = DECAY_VARIANTS, seed: int = 0) -> dict[str, list[float]]:
    """variant -> ||w_t|| / ||w_0|| after each of `steps` torch.optim.AdamW steps with zero gradients (decay only).

    With a zero gradient Adam's own step is exactly 0, so only the decay acts: in exact arithmetic
    ||w_t|| = (1 - lr·wd)^t ||w_0||. "bf16 + fp32 masters" steps ampteach.MasterWeights' fp32 copies and rounds
    them into the bf16 weights; "bf16 + Kahan" / "+ stochastic rounding" step ampteach.HalfWeights' fp32 working
    copies and write the update back with that rule (stochastic draws from a generator seeded with seed).
    """
    norms: dict[str, list[float]] = {}
    for variant in variants:
        holder = _Holder(w0.to(torch.float32 if variant == "fp32 weights" else torch.bfloat16).clone())
        start = holder.w.detach().double().norm().item()      # the weights as stored, before any step
        keeper = None
        if variant == "bf16 + fp32 masters":
            keeper = MasterWeights(holder)
        elif variant in ("bf16 + Kahan", "bf16 + stochastic rounding"):
            rule = "kahan" if variant == "bf16 + Kahan" else "stochastic"
            keeper = HalfWeights(holder, rule, generator=torch.Generator().manual_seed(seed))
        elif variant not in ("fp32 weights", "bf16 weights"):
            raise ValueError(f"variant must be one of {DECAY_VARIANTS}, got {variant!r}")
        opt = torch.optim.AdamW(keeper.params if keeper else holder.parameters(), lr=lr, weight_decay=weight_decay)
        norms[variant] = []
        for _ in range(steps):
            holder.w.grad = torch.zeros_like(holder.w)
            if keeper:
                keeper.grads_to_master()
            opt.step()
            if keeper:
                keeper.master_to_model()
            norms[variant].append(holder.w.detach().double().norm().item() / start)
    return norms


def second_moments(grads: Sequence[float], dtype: torch.dtype, beta2: float = 0.999, lr: float = 1e-3) -> list[float]:
    """Adam's second moment v (exp_avg_sq) after each step of torch.optim.AdamW fed the gradients `grads`, with the
    parameter (and so the optimizer's state) in dtype."""
    p = nn.Parameter(torch.zeros(1, dtype=dtype))
    opt = torch.optim.AdamW([p], lr=lr, betas=(0.9, beta2), weight_decay=0.0)
    out = []
    for g in grads:
        p.grad = torch.full_like(p, g)
        opt.step()
        out.append(opt.state[p]["exp_avg_sq"].double().item())
    return out


def plot_bf16_optimizer(lr_wd: Sequence[float], fractions: dict[str, list[float]], norms: dict[str, list[float]],
                        grads: Sequence[float], moments: dict[str, list[float]], exact_rate: float) -> Figure:
    """Three panels: the fraction of weights one decay step moves against lr·wd; ||w_t||/||w_0|| under decay only;
    Adam's second moment v over the steps of `grads`, per state dtype."""
    with course_style():
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
        for name, values in fractions.items():
            a.plot(lr_wd, values, marker=".", ms=4, label=name, color=FORMAT_COLORS.get(name, None))
        for x, text in ((2**-9, "2⁻⁹"), (2**-8, "2⁻⁸")):
            a.axvline(x, color="0.6", lw=0.8, ls=":")
            a.text(x, 1.03, text, ha="center", fontsize=8)
        a.axvline(1e-4, color="tab:red", lw=0.8)
        a.text(1e-4, 0.5, " lr 1e-3 × wd 0.1", color="tab:red", fontsize=8)
        a.set(xscale="log", xlabel="lr · weight_decay", ylabel="fraction of weights moved",
              title="One AdamW decay step")
        a.legend(loc="center left")
        steps = range(1, len(next(iter(norms.values()))) + 1)
        b.plot(steps, [exact_rate ** t for t in steps], color="0.7", lw=4, label="exact (1 - lr·wd)^t")
        for name, values in norms.items():
            b.plot(steps, values, label=name, color=COLORS.get(name))
        b.set(xlabel="step", ylabel="||w_t|| / ||w_0||", title="Decay only (zero gradients)")
        b.legend(fontsize=7)
        ax2 = c.twinx()
        ax2.plot(range(1, len(grads) + 1), grads, color="0.8", lw=0.8)
        ax2.set_ylabel("gradient g", color="0.5")
        for name, values in moments.items():
            c.plot(range(1, len(values) + 1), values, label=f"v in {name}", color=FORMAT_COLORS.get(name))
        c.set(xlabel="step", ylabel="Adam's v (exp_avg_sq)", title="Adam's second moment, β2 = 0.999")
        c.legend(loc="center right")
        fig.tight_layout()
    return fig
