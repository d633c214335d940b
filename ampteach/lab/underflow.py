"""Where a model's gradients fall on a format's number line, and what a loss scale S does to them.

    grads = collect_gradients(model, data.batches(128), n_batches=8)   # {"weights", "activations", "output"}
    zone_fractions(grads["activations"], "fp16", scale=8)    # {"zero", "flushed", "subnormal", "normal", "overflow"}
    plot_gradient_histogram(grads, "fp16", scale=2**10)      # the 2018 paper's histogram, on your model

A value g stored in a format at loss scale S is round(S * g). With fp16 (max 65504, smallest normal
2^-14, smallest subnormal 2^-24) the number line has four zones for S * g: below 2^-25 it flushes
to zero (the update it carried is gone), in [2^-25, 2^-14) it becomes subnormal (fewer significant
bits), up to 65504 it is normal, and from 65520 on it overflows to inf. Multiplying by S slides the
whole histogram of log2|g| right by log2(S) against these fixed zones.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.amp.formats import FloatFormat, as_format, round_to_format

__all__ = ["ZONES", "ShrinkGradients", "collect_gradients", "store", "zone_fractions", "zone_counts", "zone_edges",
           "plot_gradient_histogram"]

ZONES = ("zero", "flushed", "subnormal", "normal", "overflow")


class _Shrink(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (grad.float() * ctx.factor).to(grad.dtype), None   # in fp32, rounded once, as a loss's own mean would


class ShrinkGradients(nn.Module):
    """Identity forward; backward divides the gradient by n. A synthetic knob, not a model of any workload.

        model = nn.Sequential(mlp((256,)), ShrinkGradients(2**16))   # put it after the last layer
        TrainConfig(optimizer="sgd", lr=0.05 * 2**16)                  # and multiply SGD's lr by n

    Every gradient behind the layer (weights and activations alike) becomes n times smaller, which
    slides the model's gradient histogram log2(n) octaves to the left. The course's small model has
    gradients that fit fp16; this moves them to where deeper or larger models have theirs, so that a
    lesson can show what fp16 does there. (Real gradients do not shrink by one factor: a loss averaged
    over n terms makes each activation gradient about n times smaller, but a weight gradient sums
    those terms again and keeps its size.) With n a power of two and SGD's learning rate multiplied
    by n, fp32 training is bit-for-bit unchanged, so any difference in fp16 comes from the size of
    the gradients alone. The gradient arriving at the layer (the loss's gradient) is not shrunk.
    grad <- float32(grad) / n, cast back to the gradient's dtype.

    Args:
        n (float): the factor every gradient behind the layer is divided by; positive (a power of two
            keeps fp32 training bit for bit unchanged, with SGD's lr multiplied by n).
    """

    def __init__(self, n: float) -> None:
        super().__init__()
        if not n > 0:
            raise ValueError(f"n must be positive (gradients are divided by it), got {n!r}")
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Shrink.apply(x, 1.0 / self.n)

    def extra_repr(self) -> str:
        return f"n={self.n:g}"


def collect_gradients(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                      n_batches: int | None = None, loss_fn=F.cross_entropy) -> dict[str, torch.Tensor]:
    """Every gradient value backward produces on n_batches batches, in fp32, flattened (no optimizer step).

    "weights": d loss / d parameter (what the optimizer uses); "activations": d loss / d output of every
    leaf module inside the model (what backward carries from layer to layer, the paper's "activation
    gradients"), in backward order; "output": d loss / d model(x), what the loss function sends into
    the model's backward (for a classifier: the logits' gradient, (softmax - one-hot) / batch size).
    """
    weights: list[torch.Tensor] = []
    activations: list[torch.Tensor] = []
    output: list[torch.Tensor] = []
    produced: list[torch.Tensor] = []

    def keep(into: list[torch.Tensor]):
        return lambda grad: into.append(grad.detach().flatten().float())

    def remember_output(module, inputs, out):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            produced.append(out)

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(remember_output) for m in leaves]
    was_training = model.training
    model.train()
    try:
        for i, (x, y) in enumerate(batches):
            if n_batches is not None and i >= n_batches:
                break
            model.zero_grad(set_to_none=True)
            produced.clear()
            prediction = model(x)
            for t in produced:
                if t is not prediction:        # the model's own output goes to "output", once
                    t.register_hook(keep(activations))
            prediction.register_hook(keep(output))
            loss_fn(prediction, y).backward()
            weights += [p.grad.detach().flatten().float() for p in model.parameters() if p.grad is not None]
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if not weights:
        raise ValueError("no gradients were collected: pass at least one (x, y) batch and a model with parameters")
    produced.clear()
    empty = torch.zeros(0)
    return {"weights": torch.cat(weights), "activations": torch.cat(activations) if activations else empty,
            "output": torch.cat(output)}


def store(values: torch.Tensor, fmt: FloatFormat | str = "fp16", scale: float = 1.0) -> torch.Tensor:
    """round(S * values) in fmt, returned as float32: what a gradient becomes when held in fmt at scale S."""
    fmt = as_format(fmt)
    scaled = values.float() * scale
    if fmt.torch_dtype is not None:
        return scaled.to(fmt.torch_dtype).float()
    return round_to_format(scaled, fmt)


def zone_fractions(values: torch.Tensor, fmt: FloatFormat | str = "fp16", scale: float = 1.0) -> dict[str, float]:
    """Fractions of values (summing to 1) by what storing S * value in fmt does to it: zone_counts / numel."""
    n = values.numel()
    return {name: count / n for name, count in zone_counts(values, fmt, scale).items()}


def zone_counts(values: torch.Tensor, fmt: FloatFormat | str = "fp16", scale: float = 1.0) -> dict[str, int]:
    """How many of values land in each zone when S * value is stored in fmt (the counts sum to numel).

    zero: already 0 (e.g. behind a ReLU); flushed: non-zero, becomes 0; subnormal: kept with fewer
    bits; normal: kept with full precision; overflow: becomes inf (or NaN/max in fp8 formats).
    """
    fmt = as_format(fmt)
    if values.numel() == 0:
        raise ValueError("values is empty: collect some gradients first")
    stored = store(values, fmt, scale).abs()
    zero = values == 0
    flushed = ~zero & (stored == 0)
    overflow = ~torch.isfinite(stored)
    if fmt.overflow == "saturate":   # fp8_e4m3 clips to max where an IEEE format would give inf
        overflow |= values.float().abs() * scale >= fmt.max + 2.0 ** (fmt.emax - fmt.man_bits - 1)
    subnormal = ~zero & ~flushed & ~overflow & (stored < fmt.min_normal)
    normal = ~zero & ~flushed & ~overflow & ~subnormal
    masks = dict(zero=zero, flushed=flushed, subnormal=subnormal, normal=normal, overflow=overflow)
    return {name: int(masks[name].sum()) for name in ZONES}


def zone_edges(fmt: FloatFormat | str = "fp16") -> dict[str, float]:
    """log2 of the zone boundaries: flush below min_subnormal/2, subnormal below min_normal, overflow above max."""
    fmt = as_format(fmt)
    return {"flush": math.log2(fmt.min_subnormal) - 1, "normal": math.log2(fmt.min_normal), "max": math.log2(fmt.max)}


def plot_gradient_histogram(grads: dict[str, torch.Tensor], fmt: FloatFormat | str = "fp16", scale: float = 1.0,
                            ax=None, xlim: tuple[float, float] = (-50.0, 25.0), bin_width: float = 0.5):
    """Histogram of log2|S * g| for the non-zero values of each entry of grads, over fmt's shaded zones.

    Heights are percentages of each entry's non-zero values; values beyond xlim pile up in the edge bins.
    The legend sits to the right of the axes, off the data. Returns the Axes.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from ampteach.lab.plots import course_style

    fmt = as_format(fmt)
    edges = zone_edges(fmt)
    lo, hi = xlim
    shading = [(lo, edges["flush"], "tab:red", "flushed to 0"),
               (edges["flush"], edges["normal"], "tab:orange", "subnormal"),
               (edges["normal"], edges["max"], "tab:green", "normal"),
               (edges["max"], hi, "tab:purple", "overflow")]
    shift = math.log2(scale)
    with course_style():
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 3.4))
        for left, right, color, label in shading:
            ax.axvspan(left, right, color=color, alpha=0.12, label=f"{fmt.name} {label}")
        bins = np.arange(lo, hi + bin_width, bin_width)
        for name, values in grads.items():
            nonzero = values[values != 0].detach().float()
            log2 = (nonzero.abs().log2() + shift).clamp(lo, hi - 1e-6).cpu().numpy()   # gradients from any device
            ax.hist(log2, bins=bins, weights=np.full(len(log2), 100.0 / max(len(log2), 1)), histtype="step",
                    linewidth=1.5, label=f"{name} (non-zero: {len(log2):,})")
        ax.set_xlim(lo, hi)
        s_text = f"2^{shift:g}" if shift == round(shift) else f"{scale:g}"
        ax.set_xlabel(f"log2 |S * gradient|   (S = {s_text})")
        ax.set_ylabel("% of non-zero values")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.figure.tight_layout()
    return ax
