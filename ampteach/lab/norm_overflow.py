"""LayerNorm in pure half precision: the variance of large activations overflows fp16, and a small epsilon vanishes.

    from ampteach.lab.norm_overflow import outlier_row, half_layer_norm, variance_sweep, plot_variance
    x = outlier_row(300.0)                            # 126 features of ±1, two outliers of ±300
    half_layer_norm(x.half())                         # written out in fp16: var = inf, every output 0
    F.layer_norm(x.half(), (128,))                    # torch's kernel: statistics in fp32, output fine
    fig = plot_variance(*variance_sweep(sizes))

LayerNorm computes y = (x - mean) / sqrt(var + eps) with var = mean((x - mean)²) over the features.
Written out with half tensors (as a hand-made norm or a model cast with .half() may do), each square
is rounded to the half dtype: in fp16 (x - mean)² overflows once |x - mean| >= 256 (256² = 65536
rounds to inf; 255.9² does not), var is then inf and x / sqrt(inf) = 0: the token's features vanish,
silently (pytorch/pytorch#66707 asks for layer_norm of fp16 inputs to run in fp32). Torch's own
layer_norm kernels compute the statistics in fp32 for a half input, and autocast puts layer_norm on
CUDA's fp32 list. The epsilon is the other trap: eps = 1e-12 (BERT's) is below fp16's smallest
subnormal (2^-24 ≈ 6e-8) and becomes 0, so a constant row (var = 0, e.g. padding) gives 0 / 0 = NaN.

The rows used here are exact: ±1 and ±a with a an integer, so every square, sum and mean is exact in
fp32, and each result depends only on how the dtype rounds it, the same on every CPU.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from ampteach.lab.plots import FORMAT_COLORS, course_style

__all__ = ["DTYPES", "EPSILONS", "half_layer_norm", "outlier_row", "plot_variance", "variance_sweep"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPSILONS = (1e-5, 1e-6, 1e-8, 1e-12)      # PyTorch's LayerNorm default, and smaller ones models use


def outlier_row(size: float, d: int = 128, n_outliers: int = 2) -> torch.Tensor:
    """A (1, d) fp32 row with mean 0: alternating ±1, except n_outliers features (an even number) of ±size."""
    if n_outliers % 2 or d % 2:
        raise ValueError(f"d and n_outliers must be even so the row's mean is exactly 0, got {d} and {n_outliers}")
    x = torch.ones(1, d)
    x[:, 1::2] = -1.0
    x[:, :n_outliers] = size * x[:, :n_outliers]
    return x


def half_layer_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm without affine parameters, written out in x's dtype (every intermediate rounded to it).

        mean = x.mean(-1); var = ((x - mean)²).mean(-1); y = (x - mean) / sqrt(var + eps)
    """
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered / torch.sqrt(var + torch.tensor(eps, dtype=x.dtype))


def variance_sweep(sizes: Sequence[float], d: int = 128) -> tuple[Sequence[float], dict[str, list[float]],
                                                                   dict[str, list[float]]]:
    """(sizes, dtype -> var computed in that dtype per size, dtype -> error of half_layer_norm per size).

    The error is max |y - y_exact| / max |y_exact| against float64: 1.0 means the features are gone (all 0)."""
    variances: dict[str, list[float]] = {name: [] for name in DTYPES}
    errors: dict[str, list[float]] = {name: [] for name in DTYPES}
    for size in sizes:
        x = outlier_row(size, d)
        exact = F.layer_norm(x.double(), (d,), eps=0.0)
        for name, dtype in DTYPES.items():
            h = x.to(dtype)
            centered = h - h.mean(-1, keepdim=True)
            variances[name].append((centered * centered).mean().item())
            err = (half_layer_norm(h, eps=0.0).double() - exact).abs().max() / exact.abs().max()
            errors[name].append(err.item() if torch.isfinite(err) else float("inf"))
    return sizes, variances, errors


def plot_variance(sizes: Sequence[float], variances: dict[str, list[float]], errors: dict[str, list[float]]) -> Figure:
    """Left: the variance each dtype computes against the outlier size (inf drawn at the top). Right: output error."""
    with course_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
        for name, values in variances.items():
            color = FORMAT_COLORS[name]
            finite = [(s, v) for s, v in zip(sizes, values) if v != float("inf")]
            left.plot(*zip(*finite), color=color, label=name, marker=".", ms=4)
            over = [s for s, v in zip(sizes, values) if v == float("inf")]
            if over:
                left.plot(over, [1e6] * len(over), "x", color=color, label=f"{name}: var = inf")
            errs = [(s, min(e, 10.0)) for s, e in zip(sizes, errors[name]) if name != "fp32" and e > 0]   # 0: exact
            if errs:
                right.plot(*zip(*errs), color=color, label=name, marker=".", ms=4)
        left.axhline(65504, color="tab:red", lw=0.8)
        left.text(sizes[0], 65504 * 1.4, "fp16 max 65504", color="tab:red", fontsize=8)
        left.set(xscale="log", yscale="log", xlabel="outlier size a", ylabel="variance of the row",
                 title="The variance, computed in each dtype")
        right.set(xscale="log", yscale="log", xlabel="outlier size a", ylabel="max |y - y_exact| / max |y_exact|",
                  title="LayerNorm written out in half: output error")
        right.axhline(1.0, color="0.5", lw=0.8, ls=":")
        right.text(sizes[0], 1.3, "1 = features gone", fontsize=8, color="0.4")
        left.legend(loc="lower right")
        right.legend(loc="center left")
        fig.tight_layout()
    return fig
