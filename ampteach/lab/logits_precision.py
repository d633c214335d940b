"""Why the loss stays fp32: the error of a half-precision log-softmax over a vocabulary, against exact arithmetic.

    from ampteach.lab.logits_precision import vocab_logits, loss_errors, plot_loss_errors
    logits, targets = vocab_logits(vocab=32768, rows=64)     # float64, the same on every CPU
    loss_errors(logits, targets)                             # way -> (max per-token error, error of the mean loss)

A language model's loss is -log p(target) = logsumexp(z) - z_target over the V logits z of a position.
Two places can round it to a half dtype, emulated here exactly (float64 arithmetic, one rounding):
    "logits in bf16"            z rounded to bf16 (an lm_head run under autocast returns them so), then an
                                exact log-softmax: what autocast's fp32 loss receives. The target's logit is
                                among the largest, and rounding moves it by up to half its ulp: 2^-5 = 0.03
                                for a logit between 8 and 16
    "log-softmax out in bf16"   the exact log-probabilities rounded to bf16: -log p(target) is the token's loss,
                                a few nats, so one rounding costs up to that times 2^-8 (half a bf16 ulp,
                                relative to a number just above a power of two)
and the same for fp16 (3 more bits: 8x smaller). The mean loss over many tokens averages the rounding
errors (they have either sign), so it moves far less than one token's loss: the per-token error is what
a gradient sees. CUDA autocast computes log_softmax and nll_loss (what cross_entropy runs) in fp32; CPU
autocast has cross_entropy on its fp32 list. Neither undoes the rounding of the logits themselves, which
happened in the matmul's output.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from ampteach.lab.plots import FORMAT_COLORS, course_style

__all__ = ["WAYS", "loss_errors", "plot_loss_errors", "vocab_logits"]

WAYS = {   # name -> (dtype, where the rounding happens)
    "logits in bf16": (torch.bfloat16, "logits"),
    "log-softmax out in bf16": (torch.bfloat16, "output"),
    "logits in fp16": (torch.float16, "logits"),
    "log-softmax out in fp16": (torch.float16, "output"),
}


def vocab_logits(vocab: int, rows: int = 64, std: float = 3.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (rows, vocab) float64, targets (rows,)): normal logits of std `std`, each row's target among its
    larger logits (a model that has learned something). Built from torch.rand and float64 arithmetic only."""
    gen = torch.Generator().manual_seed(seed)
    u1, u2 = torch.rand(2, rows, vocab, generator=gen, dtype=torch.float64)
    z = std * torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)      # Box-Muller
    targets = torch.randint(vocab, (rows,), generator=gen)
    z[torch.arange(rows), targets] = z.max(dim=1).values          # the target is the model's top guess
    return z, targets


def _loss(logits: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype | None, where: str) -> torch.Tensor:
    if where == "logits" and dtype is not None:
        logits = logits.to(dtype).double()
    logp = F.log_softmax(logits, dim=-1)
    if where == "output" and dtype is not None:
        logp = logp.to(dtype).double()
    return -logp[torch.arange(len(targets)), targets]


def loss_errors(logits: torch.Tensor, targets: torch.Tensor,
                ways: Sequence[str] = tuple(WAYS)) -> dict[str, tuple[float, float]]:
    """way -> (largest |per-token loss error|, |error of the mean loss|) in nats, against exact float64."""
    exact = _loss(logits, targets, None, "")
    out = {}
    for way in ways:
        per_token = _loss(logits, targets, *WAYS[way]) - exact
        out[way] = (per_token.abs().max().item(), per_token.mean().abs().item())
    return out


def plot_loss_errors(vocabs: Sequence[int], errors: dict[int, dict[str, tuple[float, float]]]) -> Figure:
    """The largest per-token loss error against the vocabulary size, one line per way of rounding."""
    styles = {"logits in bf16": dict(color=FORMAT_COLORS["bf16"], ls="-"),
              "log-softmax out in bf16": dict(color=FORMAT_COLORS["bf16"], ls="--"),
              "logits in fp16": dict(color=FORMAT_COLORS["fp16"], ls="-"),
              "log-softmax out in fp16": dict(color=FORMAT_COLORS["fp16"], ls="--")}
    with course_style():
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for way in WAYS:
            ax.plot(vocabs, [errors[v][way][0] for v in vocabs], marker=".", label=way, **styles[way])
        ax.set(xscale="log", yscale="log", xlabel="vocabulary size V", ylabel="largest per-token loss error (nats)",
               title="-log p(target) with one rounding to half precision")
        ax.legend(fontsize=7, handlelength=3.5)
        fig.tight_layout()
    return fig
