"""What 4 bits do to a tensor: the E2M1 grid, MXFP4 against NVFP4, outliers and the RHT, rounding, W and W.T.

    from ampteach.lab.fp4_numerics import (plot_e2m1_grid, scale_errors, plot_scale_errors, outlier_sweep,
        plot_outlier_sweep, rounding_drift, plot_rounding_drift, transpose_mismatch, plot_transpose_mismatch)
    fig = plot_e2m1_grid()                                  # the 8 magnitudes, rounding intervals, relative error
    errors = scale_errors(tensors)                          # {(kind, variant): relative error}, lesson 11 section 2
    sweep = outlier_sweep([1, 10, 100, 1000])               # wgrad error with and without the RHT, section 3
    drift = rounding_drift(steps=1000)                      # a small gradient summed over steps: RNE vs SR, section 4
    mismatch = transpose_mismatch(w)                        # 1-D blocks quantize W and W.T differently, section 5

Every error is relative: ||q(x) - x|| / ||x|| over the whole tensor (or list of tensors). The quantizers are
ampteach.amp.nvfp4, ampteach.amp.mx and ampteach.amp.fp4; nothing here rounds on its own.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from ampteach.amp.fp4 import fp4_fake_quantize
from ampteach.amp.hadamard import random_signs, rht, rht_matrix
from ampteach.amp.mx import mx_fake_quantize
from ampteach.amp.nvfp4 import (
    E2M1,
    block_amax,
    nvfp4_fake_quantize,
    nvfp4_four_over_six,
    nvfp4_quantize,
    per_tensor_scale,
    round_e2m1,
)
from ampteach.lab.fp8_plots import linear_tensors
from ampteach.lab.fp8_plots import relative_error as fp8_relative_error
from ampteach.lab.plots import course_style
from ampteach.training.machine import best_seconds, machine_line

__all__ = ["VARIANTS", "relative_error", "plot_e2m1_grid", "gpt_tensors", "scale_errors", "error_table",
           "plot_scale_errors", "scale_sweep", "plot_scale_sweep", "outlier_sweep", "outlier_table", "rht_cost",
           "one_rounding",
           "plot_outlier_sweep", "rounding_drift", "plot_rounding_drift", "transpose_mismatch",
           "plot_transpose_mismatch", "four_over_six_errors", "noise_threshold", "plot_noise_threshold"]

# (scale format, block size, per-tensor scale): MXFP4 is the first, NVFP4 the last; the middle two separate
# the two differences (E8M0 -> E4M3 scales, 32 -> 16 values a block)
VARIANTS = {"MXFP4 (E8M0 / 32)": ("e8m0", 32, False), "E8M0 / 16": ("e8m0", 16, False),
            "E4M3 / 32": ("e4m3", 32, True), "NVFP4 (E4M3 / 16)": ("e4m3", 16, True),
            "NVFP4 without per-tensor scale": ("e4m3", 16, False)}
COLORS = {"MXFP4": "tab:blue", "NVFP4": "tab:green", "nearest": "tab:red", "stochastic": "tab:green"}


def relative_error(q: Tensor | Sequence[Tensor], x: Tensor | Sequence[Tensor]) -> float:
    """||q - x|| / ||x|| over a tensor or over a list of tensors taken together (lesson 8's relative_error)."""
    qs, xs = ([q], [x]) if isinstance(x, Tensor) else (q, x)
    return fp8_relative_error(torch.cat([t.flatten() for t in xs]), torch.cat([t.flatten() for t in qs]))


# --- section 1: the grid --------------------------------------------------------------------------------

def plot_e2m1_grid(ax=None) -> Figure:
    """Left: the 8 E2M1 magnitudes and where each value between them rounds (ties to the even code).
    Right: the relative error of rounding |x| to nearest, for x from 0.1 to 10 (saturating above 6)."""
    with course_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [1.3, 1]})
        grid = E2M1.values().tolist()
        x = torch.linspace(0, 7, 7001)
        left.plot(x, round_e2m1(x), color="tab:blue", lw=1.5, label="round to nearest E2M1")
        left.plot(x, x, color="0.6", ls=":", lw=1, label="exact")
        left.scatter(grid, grid, color="black", zorder=3, s=18, label="the 8 magnitudes")
        for g in grid:
            left.axvline(g, color="0.9", lw=0.8, zorder=0)
        left.set(xlabel="|x| (in units of the block's scale)", ylabel="stored value", xticks=grid,
                 title="E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6")
        left.legend(loc="upper left", fontsize=8)
        xs = torch.logspace(-1, 1, 4001)
        right.semilogx(xs, ((round_e2m1(xs) - xs).abs() / xs), color="tab:red", lw=1)
        right.axvspan(6, 10, color="#f4c7c3", alpha=0.6, label="saturates at 6")
        right.axvspan(0.1, 0.25, color="0.85", alpha=0.8, label="flushes to 0")
        right.set(xlabel="|x|", ylabel="relative rounding error", title="what one mantissa bit costs", ylim=(0, 1.05))
        right.legend(fontsize=8, loc="upper center")
        fig.tight_layout()
    return fig


# --- section 2: MXFP4 against NVFP4 ---------------------------------------------------------------------

def _quantize(x: Tensor, variant: tuple[str, int, bool]) -> Tensor:
    scale, block, two_level = variant
    if scale == "e8m0":
        return mx_fake_quantize(x, "fp4_e2m1", block, "rceil")
    return nvfp4_fake_quantize(x, per_tensor_scale(x) if two_level else None, block)


def scale_errors(tensors: dict[str, Sequence[Tensor]], variants: dict | None = None) -> dict[tuple[str, str], float]:
    """{(kind, variant): relative error of the kind's tensors quantized that way}, each tensor on its own scales."""
    variants = variants or VARIANTS
    return {(kind, name): relative_error([_quantize(t, v) for t in ts], ts)
            for kind, ts in tensors.items() for name, v in variants.items()}


def error_table(errors: dict[tuple[str, str], float]) -> str:
    """scale_errors' result as a table: one row per variant, one column per kind of tensor."""
    kinds = list(dict.fromkeys(k for k, _ in errors))
    names = list(dict.fromkeys(n for _, n in errors))
    rows = [f"{'relative error':31s}" + "".join(f"{k:>13s}" for k in kinds)]
    rows += [f"{n:31s}" + "".join(f"{errors[k, n]:13.3f}" for k in kinds) for n in names]
    return "\n".join(rows)


def plot_scale_errors(errors: dict[tuple[str, str], float], ax=None) -> Figure:
    """Grouped bars: one group per kind of tensor, one bar per variant (MXFP4 ... NVFP4)."""
    kinds = list(dict.fromkeys(k for k, _ in errors))
    names = list(dict.fromkeys(n for _, n in errors))
    colors = ["tab:blue", "#7fb2d9", "#8fd18a", "tab:green", "0.6"]
    with course_style():
        fig, ax = plt.subplots(figsize=(10, 3.6)) if ax is None else (ax.figure, ax)
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(kinds))]
            ax.bar(xs, [errors[kind, name] for kind in kinds], width, label=name, color=colors[i % len(colors)])
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set(ylabel="relative error ||q(x) - x|| / ||x||", title="The same tensors in five 4-bit variants")
        ax.legend(fontsize=8, ncol=3, loc="upper left")
        fig.tight_layout()
    return fig


def gpt_tensors(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, list[Tensor]]:
    """The three operands of every Linear inside the GPT's blocks on one batch (x, y), float32: lesson 8's
    linear_tensors, {"activations": each Linear's input, "weights", "gradients": the gradient at its output}."""
    return linear_tensors(model, [(x, y)], 1, include=lambda name: name.startswith("blocks."))


def scale_sweep(x: Tensor, factors: Sequence[float]) -> dict[str, list[float]]:
    """Relative error of x * factor, for each factor, in MXFP4, NVFP4 and NVFP4 without its per-tensor scale."""
    names = ("MXFP4 (E8M0 / 32)", "NVFP4 (E4M3 / 16)", "NVFP4 without per-tensor scale")
    return {name: [relative_error(_quantize(x * f, VARIANTS[name]), x * f) for f in factors] for name in names}


def plot_scale_sweep(factors: Sequence[float], sweep: dict[str, list[float]], amax: float, ax=None) -> Figure:
    """Error against the tensor's amax (amax * factor), with 6 * 448 marked: where one-level NVFP4 saturates."""
    colors = {"MXFP4 (E8M0 / 32)": "tab:blue", "NVFP4 (E4M3 / 16)": "tab:green",
              "NVFP4 without per-tensor scale": "0.4"}
    with course_style():
        fig, ax = plt.subplots(figsize=(8, 3.6)) if ax is None else (ax.figure, ax)
        amaxes = [amax * f for f in factors]
        for name, errors in sweep.items():
            ax.loglog(amaxes, errors, label=name, color=colors[name], ls="--" if "without" in name else "-")
        ax.axvline(6 * 448, color="tab:red", lw=0.8, ls=":")
        ax.text(6 * 448 * 1.3, 0.5, "amax = 6 x 448", fontsize=8, color="tab:red")
        ax.set(xlabel="the tensor's amax", ylabel="relative error", title="One tensor, scaled up and down")
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
    return fig


# --- section 3: outliers and the random Hadamard transform -----------------------------------------------

def outlier_sweep(sizes: Sequence[float], tokens: int = 1024, features: int = 128, outputs: int = 128,
                  every: int = 64, seed: int = 0) -> dict[tuple[str, bool], list[float]]:
    """The weight gradient g.T @ x in NVFP4 and in MXFP4, with and without the RHT on both operands, as every
    `every`-th token's activations grow to `size` times the rest (attention-sink-like tokens: whole rows large).

    {(format, rht): [relative error of g.T @ x, one per size]}; both operands are quantized along the tokens
    (blocks of 16 or 32 tokens), as the weight-gradient matmul quantizes them; the RHT has the block's size."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(tokens, features, generator=g)
    grad = torch.randn(tokens, outputs, generator=g)
    out: dict[tuple[str, bool], list[float]] = {}
    for fmt, d in (("NVFP4", 16), ("MXFP4", 32)):
        H = rht_matrix(random_signs(d, seed))
        for rotate in (False, True):
            errors = []
            for size in sizes:
                x = x0.clone()
                x[5::every] *= size
                gt, xt = (rht(grad.t(), H), rht(x.t(), H)) if rotate else (grad.t(), x.t())
                product = fp4_fake_quantize(gt, fmt.lower()) @ fp4_fake_quantize(xt, fmt.lower()).t()
                errors.append(relative_error(product, grad.t() @ x))
            out[fmt, rotate] = errors
    return out


def rht_cost(x: Tensor) -> dict[str, float | str]:
    """{"quantize": seconds to quantize x to NVFP4 with its per-tensor scale, "rht": seconds for the RHT of x,
    "machine": machine_line()}: the fastest of repeated calls on one thread, by its CPU time (best_seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        H = rht_matrix(random_signs(16, 0))
        return {"quantize": best_seconds(lambda: nvfp4_quantize(x, per_tensor_scale(x)), clock="cpu"),
                "rht": best_seconds(lambda: rht(x, H), clock="cpu"), "machine": machine_line()}
    finally:
        torch.set_num_threads(threads)


def outlier_table(sizes: Sequence[float], sweep: dict[tuple[str, bool], list[float]]) -> str:
    """outlier_sweep's result as a table: one row per format and RHT setting, one column per outlier size."""
    rows = [f"{'outlier size':20s}" + "".join(f"{s:>8g}" for s in sizes)]
    rows += [f"{fmt + (' with RHT' if rotate else ''):20s}" + "".join(f"{e:8.3f}" for e in errs)
             for (fmt, rotate), errs in sweep.items()]
    return "\n".join(rows)


def plot_outlier_sweep(sizes: Sequence[float], sweep: dict[tuple[str, bool], list[float]], ax=None) -> Figure:
    with course_style():
        fig, ax = plt.subplots(figsize=(8, 3.6)) if ax is None else (ax.figure, ax)
        for (fmt, rotate), errors in sweep.items():
            ax.semilogx(sizes, errors, color=COLORS[fmt], ls="-" if rotate else "--", marker="o" if rotate else ".",
                        label=f"{fmt}, {'with' if rotate else 'without'} RHT")
        ax.set(xlabel="outlier tokens' size (times the other tokens)", ylabel="relative error of g.T @ x",
               title="Weight gradient in 4 bits, one outlier token in every 64")
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


# --- section 4: rounding --------------------------------------------------------------------------------

def rounding_drift(steps: int = 1000, signal: float = 0.1, noise: float = 0.05, draws: int = 20,
                   seed: int = 0) -> dict[str, Tensor]:
    """A gradient component that is `signal` (in units of its block's scale, below the first grid step 0.5)
    plus N(0, noise) every step, in a block whose largest value sits at the grid's top (6), summed over steps.

    {"exact": (steps,), "nearest": (steps,), "stochastic": (draws, steps)}: the running sums."""
    g = torch.Generator().manual_seed(seed)
    values = signal + noise * torch.randn(steps, generator=g)
    sr = torch.stack([round_e2m1(values, "stochastic", torch.Generator().manual_seed(seed + 1 + d))
                      for d in range(draws)])
    return {"exact": values.cumsum(0), "nearest": round_e2m1(values).cumsum(0), "stochastic": sr.cumsum(1)}


def one_rounding(n: int = 4096, seed: int = 0) -> dict[str, float]:
    """Relative error of one rounding of n values from N(0, 2^2) to E2M1: {"nearest": ..., "stochastic": ...}."""
    v = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2
    sr = round_e2m1(v, "stochastic", torch.Generator().manual_seed(seed + 1))
    return {"nearest": relative_error(round_e2m1(v), v), "stochastic": relative_error(sr, v)}


def plot_rounding_drift(drift: dict[str, Tensor], ax=None) -> Figure:
    """Left: the running sums (stochastic: every draw, faint, and their mean). Right: |sum - exact| against
    the step, log-log, with lines of slope 1 (bias) and 1/2 (variance) for reference."""
    steps = torch.arange(1, drift["exact"].numel() + 1)
    with course_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
        left.plot(steps, drift["exact"], color="black", lw=2, label="exact")
        left.plot(steps, drift["nearest"], color=COLORS["nearest"], label="round to nearest")
        for i, run in enumerate(drift["stochastic"]):
            left.plot(steps, run, color=COLORS["stochastic"], lw=0.5, alpha=0.35,
                      label="stochastic rounding (each draw)" if i == 0 else None)
        left.set(xlabel="step", ylabel="sum of the stored gradient", title="The same small gradient, step after step")
        left.legend(fontsize=8)
        exact = drift["exact"]
        right.loglog(steps, (drift["nearest"] - exact).abs().clamp(min=1e-3), color=COLORS["nearest"],
                     label="nearest: |error|")
        sr_rms = (drift["stochastic"] - exact).pow(2).mean(0).sqrt()
        right.loglog(steps, sr_rms, color=COLORS["stochastic"], label="stochastic: rms error over draws")
        right.loglog(steps, 0.1 * steps, color="0.6", ls=":", lw=1, label="slope 1")
        right.loglog(steps, 0.3 * steps.sqrt(), color="0.6", ls="--", lw=1, label="slope 1/2")
        right.set(xlabel="step", ylabel="error of the sum", title="Bias grows like n, noise like sqrt(n)")
        right.legend(fontsize=8)
        fig.tight_layout()
    return fig


# --- section 5: W and W.T ----------------------------------------------------------------------------------

def transpose_mismatch(w: Tensor) -> dict[str, float]:
    """What the forward's W and the backward's W differ by, with 1 x 16 blocks and with 16 x 16 tiles.

    {"1d differ": share of entries whose two quantized values differ, "1d gap": ||W_fwd - W_bwd|| / ||W||,
     "2d differ", "2d gap", "1d error": ||W_fwd - W|| / ||W||, "2d error": the same for tiles}"""
    out = {}
    for name, tiled in (("1d", False), ("2d", True)):
        fwd = fp4_fake_quantize(w, tiled=tiled)                 # blocks along the input features (forward)
        bwd = fp4_fake_quantize(w.t(), tiled=tiled).t()         # blocks along the output features (dgrad)
        out[f"{name} differ"] = (fwd != bwd).float().mean().item()
        out[f"{name} gap"] = relative_error(bwd, fwd)
        out[f"{name} error"] = relative_error(fwd, w)
    return out


def plot_transpose_mismatch(w: Tensor, rows: int = 48, cols: int = 48) -> Figure:
    """Where the forward's and the backward's quantized W differ, in the top-left corner of w: 1-D blocks, tiles."""
    with course_style():
        fig, axes = plt.subplots(1, 2, figsize=(8.5, 4))
        for ax, tiled, title in zip(axes, (False, True), ("1 x 16 blocks", "16 x 16 tiles")):
            fwd = fp4_fake_quantize(w, tiled=tiled)
            bwd = fp4_fake_quantize(w.t(), tiled=tiled).t()
            diff = (fwd != bwd)[:rows, :cols].float()
            ax.imshow(diff, cmap="Reds", vmin=0, vmax=1, interpolation="nearest")
            for k in range(16, max(rows, cols), 16):
                ax.axhline(k - 0.5, color="0.7", lw=0.6)
                ax.axvline(k - 0.5, color="0.7", lw=0.6)
            ax.set(title=f"{title}: {int(diff.sum())} of {rows * cols} differ", xlabel="input feature",
                   ylabel="output feature")
        fig.suptitle("Red: W in the forward and W in the backward are different numbers")
        fig.tight_layout()
    return fig


# --- section 7 (going deeper): four over six ------------------------------------------------------------

def four_over_six_errors(x: Tensor) -> dict[str, float]:
    """Relative errors of NVFP4 and of Four Over Six (ampteach.amp.nvfp4.nvfp4_four_over_six) on x, overall and
    on the values in the top third of their block (|v| >= 2/3 of the block's amax: 4 to 6 on plain NVFP4's grid),
    and the share of blocks that chose 4."""
    plain = nvfp4_fake_quantize(x, per_tensor_scale(x))
    adaptive, to_4 = nvfp4_four_over_six(x)
    top = x.abs() >= (block_amax(x).repeat_interleave(16, -1)[..., : x.shape[-1]] * (2 / 3))
    return {"NVFP4": relative_error(plain, x), "four over six": relative_error(adaptive, x),
            "NVFP4, top third": relative_error(plain[top], x[top]),
            "four over six, top third": relative_error(adaptive[top], x[top]),
            "blocks scaled to 4": to_4.float().mean().item()}


# --- section 7 (going deeper): when quantization noise drowns the gradient -------------------------------

def noise_threshold(steps: int = 400, lr: float = 0.05, n: int = 512, d: int = 64,
                    seed: int = 0) -> dict[str, list[float]]:
    """Least squares, loss = ||X w - y||^2 / n, by gradient descent with w in NVFP4 in the forward: the gradient
    is taken at q(w), so it carries an error that does not shrink as w converges.

    {"loss": the loss at q(w), "exact loss": at w, "ratio": ||grad(w)|| / ||grad(q(w)) - grad(w)||, per step}"""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    w_true = torch.randn(d, generator=g)
    y = X @ w_true
    w = 0.1 * torch.randn(d, generator=g)

    def grad(v: Tensor) -> Tensor:
        return 2 * X.t() @ (X @ v - y) / n

    out: dict[str, list[float]] = {"loss": [], "exact loss": [], "ratio": []}
    for _ in range(steps):
        q = nvfp4_fake_quantize(w.reshape(-1, 16), "auto").reshape(d)
        exact, noisy = grad(w), grad(q)
        out["loss"].append(float((X @ q - y).pow(2).mean()))
        out["exact loss"].append(float((X @ w - y).pow(2).mean()))
        out["ratio"].append(float(exact.norm() / (noisy - exact).norm()))
        w = w - lr * noisy
    return out


def plot_noise_threshold(run: dict[str, list[float]], ax=None) -> Figure:
    """Loss (left axis) and the gradient-to-noise ratio (right axis) against the step, sqrt(3) marked."""
    steps = range(1, len(run["loss"]) + 1)
    with course_style():
        fig, ax = plt.subplots(figsize=(8, 3.6)) if ax is None else (ax.figure, ax)
        ax.semilogy(steps, run["exact loss"], color="tab:blue", label="loss of w (the master weights)")
        ax.set(xlabel="step", ylabel="loss", title="Gradient descent with the weights in NVFP4 in the forward")
        twin = ax.twinx()
        twin.semilogy(steps, run["ratio"], color="tab:red", lw=1, label="||gradient|| / ||quantization's error||")
        twin.axhline(math.sqrt(3), color="tab:red", ls=":", lw=1)
        twin.set_ylabel("ratio", color="tab:red")
        twin.set_ylim(0.1, max(100.0, min(max(run["ratio"]), 1e4)))
        crossed = next((i for i, r in enumerate(run["ratio"]) if r < math.sqrt(3)), None)
        if crossed is not None:
            ax.axvline(crossed + 1, color="0.5", ls="--", lw=0.8)
        lines = ax.get_lines()[:1] + twin.get_lines()[:1]
        ax.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="upper right")
        fig.tight_layout()
    return fig
