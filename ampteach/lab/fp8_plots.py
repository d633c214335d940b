"""What lesson 8 measures and draws: the tensors fp8 must hold, what each scaling recipe does to them.

    from ampteach.lab.fp8_plots import linear_tensors, cast_losses, plot_ranges, plot_block_sizes
    tensors = linear_tensors(model, data.batches(128, seed=1), n_batches=4)  # {"activations": [...], ...}
    cast_losses(tensors["gradients"], "fp8_e5m2", scaled=True)   # {"flushed": ..., "saturated": ..., "error": ...}
    fig = plot_ranges(tensors)                                   # log2|v| histograms over e4m3's and e5m2's ranges

Every tensor is kept as the matmul sees it (one per layer and batch), so a per-tensor scale is the one
that tensor would get. Plot functions return the Figure (`fig = ...` shows it once), in the course's style.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor, nn

from ampteach.amp.formats import ELEMENT_FORMATS, FORMATS
from ampteach.amp.fp8 import DelayedScaling, cast_to_fp8, dequantize, quantize_tensorwise
from ampteach.amp.mx import mx_fake_quantize
from ampteach.lab.plots import course_style

__all__ = ["ROLES", "ROLE_COLORS", "FP8_COLORS", "linear_tensors", "cast_losses", "relative_error", "plot_ranges",
           "amax_histories", "plot_amax_history", "current_vs_delayed", "plot_current_vs_delayed",
           "block_size_errors", "plot_block_sizes"]

ROLES = ("activations", "weights", "gradients")
ROLE_COLORS = {"activations": "tab:blue", "weights": "tab:orange", "gradients": "tab:purple"}
FP8_COLORS = {"fp8_e4m3": "tab:green", "fp8_e5m2": "tab:red"}


def linear_tensors(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], n_batches: int = 4,
                   include: Callable[[str], bool] | None = None) -> dict[str, list[Tensor]]:
    """The three tensors of every nn.Linear's matmuls on n_batches batches (backward, no step), in float32, on
    the CPU (a model on a GPU hands its tensors over there: the casts and plots that read them are arithmetic).

    "activations": each Linear's input; "weights": each Linear's weight (once); "gradients": the gradient
    arriving at each Linear's output (grad_output, what backward multiplies with). include(name) picks
    the Linears by name (all by default); a model with a sequence dimension (the GPT) takes the
    cross-entropy over every position.
    """
    out: dict[str, list[Tensor]] = {role: [] for role in ROLES}

    def hook(module, inputs, output):
        out["activations"].append(inputs[0].detach().float().flatten(1).cpu())
        output.register_hook(lambda grad: out["gradients"].append(grad.detach().float().cpu()))

    linears = [m for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and (include is None or include(name))]
    handles = [m.register_forward_hook(hook) for m in linears]
    try:
        for i, (x, y) in enumerate(batches):
            if i >= n_batches:
                break
            model.zero_grad(set_to_none=True)
            logits = model(x)
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    out["weights"] = [m.weight.detach().float().cpu().clone() for m in linears]
    return out


def cast_losses(tensors: Sequence[Tensor], fmt: str, scaled: bool = False) -> dict[str, float]:
    """What casting each tensor to fp8 loses, over all of them: fractions of the non-zero values that
    flush to 0 or saturate at max, and the relative error ||x - fp8(x)|| / ||x||.

    scaled=False casts the values as they are (scale 1); scaled=True with quantize_tensorwise's scale.
    """
    flushed = saturated = nonzero = 0
    err2 = norm2 = 0.0
    limit = FORMATS[fmt].max
    for x in tensors:
        scale = quantize_tensorwise(x, fmt)[1] if scaled else torch.tensor(1.0)
        y = dequantize(cast_to_fp8(x, scale, fmt), scale)
        nz = x != 0
        nonzero += nz.sum().item()
        flushed += (nz & (y == 0)).sum().item()
        saturated += (x.double().abs() * scale.double() > limit * (1 + 2**-23)).sum().item()
        err2 += (x.double() - y.double()).pow(2).sum().item()
        norm2 += x.double().pow(2).sum().item()
    return {"flushed": flushed / nonzero, "saturated": saturated / nonzero, "error": math.sqrt(err2 / norm2)}


def relative_error(x: Tensor, y: Tensor, mask: Tensor | None = None) -> float:
    """||x - y|| / ||x|| (in float64), over the values where mask is True (all by default)."""
    x, y = x.double(), y.double()
    if mask is not None:
        x, y = x[mask], y[mask]
    return ((x - y).norm() / x.norm()).item()


def plot_ranges(tensors: Mapping[str, Sequence[Tensor]], formats: Sequence[str] = ("fp8_e4m3", "fp8_e5m2"),
                xlim: tuple[float, float] = (-40.0, 18.0)) -> Figure:
    """One panel per role: histogram of log2|v| of its non-zero values, each tensor's amax as a tick at
    the top, and each fp8 format's range (smallest subnormal to max) as a band."""
    bins = np.arange(xlim[0], xlim[1] + 0.5, 0.5)
    with course_style():
        fig, axes = plt.subplots(len(tensors), 1, figsize=(9, 1.9 * len(tensors)), sharex=True)
        for ax, (role, values) in zip(np.atleast_1d(axes), tensors.items()):
            for k, fmt in enumerate(formats):
                f = FORMATS[fmt]
                lo, hi = math.log2(f.min_subnormal), math.log2(f.max)
                ax.axvspan(lo, hi, ymin=0.62 + 0.1 * k, ymax=0.7 + 0.1 * k, color=FP8_COLORS[fmt], alpha=0.6,
                           label=f"{fmt}: 2^{lo:.0f} .. {f.max:g}")
            flat = torch.cat([v.flatten() for v in values])
            logs = flat[flat != 0].abs().log2().clamp(*xlim).numpy()
            ax.hist(logs, bins=bins, weights=np.full(len(logs), 100.0 / len(logs)), color=ROLE_COLORS.get(role),
                    alpha=0.7, label=f"{role}: {len(logs):,} non-zero values")
            for v in values:
                ax.axvline(math.log2(v.abs().max().item()), ymin=0.85, ymax=1.0, color="black", lw=1)
            ax.set_ylim(0, ax.get_ylim()[1] * 1.6)                 # room above the histogram for the bands
            ax.set_ylabel("% of values")
            ax.legend(loc="upper left", fontsize=7)
        ax.set_xlabel("log2 |value|   (black ticks at the top: each tensor's amax)")
        ax.set_xlim(*xlim)
        fig.tight_layout()
    return fig


def amax_histories(model: nn.Module, steps: int) -> dict[str, dict[str, Tensor]]:
    """The last `steps` amaxes each delayed-scaling Float8Linear of model recorded: {layer: {role: history}}, on
    the CPU."""
    from ampteach.amp.fp8 import Float8Linear

    names = {"input": "activations", "weight": "weights", "grad_output": "gradients"}
    return {name: {names[role]: s.amax_history[-steps:].cpu().clone() for role, s in m.scalings().items()}
            for name, m in model.named_modules() if isinstance(m, Float8Linear) and m.scalings()}


def plot_amax_history(histories: Mapping[str, Mapping[str, Tensor]], window: int = 1024) -> Figure:
    """One panel per layer: each role's amax per step (thin) and the amax behind the scale that step was
    cast with, the largest of the `window` steps before it (dashed; history_len), on a log scale."""
    with course_style():
        fig, axes = plt.subplots(1, len(histories), figsize=(5.5 * len(histories), 3.2), sharey=True)
        for ax, (layer, roles) in zip(np.atleast_1d(axes), histories.items()):
            for role, history in roles.items():
                amax, color = history.numpy(), ROLE_COLORS.get(role)
                behind = [amax[max(0, t - window):t].max() for t in range(1, len(amax))]
                ax.plot(amax, color=color, lw=1, label=f"{role}: this step's amax")
                ax.plot(range(1, len(amax)), behind, color=color, lw=2, ls="--", label=f"{role}: amax behind its scale")
            ax.set(yscale="log", xlabel="training step", title=f"Linear {layer}")
        np.atleast_1d(axes)[0].set_ylabel("amax")
        np.atleast_1d(axes)[-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
    return fig


def current_vs_delayed(steps: Sequence[Tensor], fmt: str = "fp8_e4m3", history_len: int = 16) -> dict[str, list[float]]:
    """Cast a sequence of tensors (one per training step) with current (tensorwise) and delayed scaling.
    Per step and recipe: the fraction of values saturated (clipped to max), the fraction of non-zero
    values scaled below the smallest normal number (kept with fewer bits, or flushed), the relative error."""
    delayed = DelayedScaling(fmt, history_len=history_len)
    f = FORMATS[fmt]
    out: dict[str, list[float]] = {f"{name} {what}": [] for name in ("current", "delayed")
                                   for what in ("saturated", "subnormal", "error")}
    for x in steps:
        for name, (q, scale) in (("current", quantize_tensorwise(x, fmt)), ("delayed", delayed.quantize(x))):
            scaled = x.double().abs() * scale.double()
            out[f"{name} saturated"].append((scaled > f.max * (1 + 2**-23)).float().mean().item())
            out[f"{name} subnormal"].append((scaled[x != 0] < f.min_normal).float().mean().item())
            out[f"{name} error"].append(relative_error(x, dequantize(q, scale)))
    return out


def plot_current_vs_delayed(result: Mapping[str, list[float]], spike: int | None = None) -> Figure:
    """Per step, for current and delayed scaling: % saturated, % below the smallest normal, relative error."""
    panels = (("saturated", "% of values saturated", "clipped to max"),
              ("subnormal", "% of non-zero values", "below the smallest normal"),
              ("error", "||x - fp8(x)|| / ||x||", "relative error"))
    with course_style():
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
        for ax, (what, ylabel, title) in zip(axes, panels):
            for name, color in (("current", "tab:blue"), ("delayed", "tab:red")):
                values = result[f"{name} {what}"]
                ax.plot(values if what == "error" else [100 * v for v in values], color=color, marker=".", label=name)
            if spike is not None:
                ax.axvline(spike, color="gray", ls=":", label="spike")
            ax.set(xlabel="step", ylabel=ylabel, title=title)
        axes[2].set_yscale("log")
        axes[2].legend()
        fig.tight_layout()
    return fig


def block_size_errors(x: Tensor, elems: Sequence[str], block_sizes: Sequence[int], scale_rounding: str = "floor",
                      mask: Tensor | None = None) -> dict[str, list[float]]:
    """Relative error of MX quantization of x (blocks along its flattened values) for each element
    format and block size, over the values where mask is True."""
    flat = x.reshape(1, -1)
    m = None if mask is None else mask.reshape(1, -1)
    return {elem: [relative_error(flat, mx_fake_quantize(flat, elem, b, scale_rounding), m) for b in block_sizes]
            for elem in elems}


def plot_block_sizes(errors: Mapping[str, Mapping[str, list[float]]], block_sizes: Sequence[int],
                     reference: Mapping[str, float] | None = None) -> Figure:
    """Relative error against block size: one panel per case (e.g. with and without an outlier), one line
    per element format; `reference` draws horizontal lines (e.g. per-tensor fp8 scaling)."""
    with course_style():
        fig, axes = plt.subplots(1, len(errors), figsize=(5.5 * len(errors), 3.4), sharey=True)
        for ax, (case, by_elem) in zip(np.atleast_1d(axes), errors.items()):
            for elem, errs in by_elem.items():
                bits = ELEMENT_FORMATS[elem].bits
                ax.plot(block_sizes, errs, marker="o", label=f"MX {elem} ({bits} bits)")
            for name, value in (reference or {}).get(case, {}).items():
                ax.axhline(value, ls="--", color="gray", lw=1)
                ax.annotate(name, (block_sizes[0], value), fontsize=7, va="bottom")
            ax.axvline(32, color="black", ls=":", lw=1)
            ax.set(xscale="log", yscale="log", xlabel="block size (values per shared scale)", title=case)
            ax.set_xticks(block_sizes, [str(b) for b in block_sizes], fontsize=7)
        np.atleast_1d(axes)[0].set_ylabel("relative error")
        np.atleast_1d(axes)[-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
    return fig
