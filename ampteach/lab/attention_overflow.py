"""Attention scores that overflow fp16: outlier features, and why the 1/√d scale must come before q @ kᵀ.

    from ampteach.lab.attention_overflow import VARIANTS, sweep, largest_finite, overflow_size, plot_overflow
    sizes = [10 ** (i / 5) for i in range(21)]           # outlier size a, from 1 to 10,000
    results = sweep(sizes)                               # variant -> one Point per size
    largest_finite(results["fp16, scale after"], sizes)  # the largest a whose attention output is finite
    fig = plot_overflow(sizes, results)
    results = sweep(sizes, device="cuda")               # on a GPU: SDPA once per backend (flash, efficient, math)

The activations: q, k, v of one head (T tokens, d features) with N(0, 1) entries, except that in
`n_outliers` features q and k hold the value a for every token, as the few large "outlier features" of
trained transformers do (Dettmers et al., LLM.int8(), arXiv:2208.07339). Each score then carries
n·a² on top of its ordinary part. Softmax does not care (the same amount in every score of a row
cancels), but fp16 has to store it first:
    scale after  (nanoGPT's explicit path)   s = (q @ kᵀ) · 1/√d     stores n·a²        overflows at n·a² ≥ 65520
    scale before (SDPA's math path)          s = (q · 1/√d) @ kᵀ     stores n·a²/√d     overflows at n·a²/√d ≥ 65520
    bf16 (scale after)                       fp32's range: no overflow below a ≈ 10^19
65520 is the midpoint between fp16's largest number, 65504, and the next power of two: from there up
a value rounds to inf. One inf score makes its row's softmax NaN (inf - inf), and the NaN spreads.
Scaling first buys a factor √d in the score (√√d in a), not precision: the 8 or 11 significant bits
of a half score measure its ordinary part in steps of ulp(n·a²), which is what the error panel shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.nn.attention import sdpa_kernel

from ampteach.lab.plots import FORMAT_COLORS, course_style
from ampteach.lab.sdpa_backends import CUDA_BACKENDS, Refused, attempt

__all__ = ["FP16_OVERFLOW", "VARIANTS", "Point", "attention", "largest_finite", "outlier_qkv", "overflow_size",
           "plot_overflow", "reference", "sweep", "variants_for"]

FP16_OVERFLOW = 65520.0   # the smallest magnitude that rounds to inf in fp16 (halfway from 65504 to 2^16)
VARIANTS = {               # name -> (dtype of q, k, v and the scores, where 1/√d is applied)
    "fp16, scale after": (torch.float16, "after"),
    "fp16, scale before": (torch.float16, "before"),
    "bf16, scale after": (torch.bfloat16, "after"),
    "fp16, F.scaled_dot_product_attention": (torch.float16, "sdpa"),
}
STYLES = {"fp16, scale after": dict(color=FORMAT_COLORS["fp16"], ls="-"),
          "fp16, scale before": dict(color=FORMAT_COLORS["fp16"], ls="--"),
          "bf16, scale after": dict(color=FORMAT_COLORS["bf16"], ls="-"),
          "fp16, F.scaled_dot_product_attention": dict(color="tab:green", ls=":"),
          "fp16, SDPA flash": dict(color="tab:green", ls=":"),
          "fp16, SDPA efficient": dict(color="tab:olive", ls=":"),
          "fp16, SDPA math": dict(color="tab:cyan", ls=":")}


def variants_for(device: str | torch.device = "cpu") -> dict[str, tuple[torch.dtype, str]]:
    """VARIANTS on the CPU (SDPA: the kernel torch picks); on a GPU the SDPA variant once per CUDA backend,
    named "fp16, SDPA flash" and so on (scale "sdpa flash", ...)."""
    if torch.device(device).type != "cuda":
        return dict(VARIANTS)
    plain = {name: v for name, v in VARIANTS.items() if v[1] != "sdpa"}
    return {**plain, **{f"fp16, SDPA {b}": (torch.float16, f"sdpa {b}") for b in CUDA_BACKENDS}}


def outlier_qkv(size: float, n_outliers: int = 2, T: int = 64, d: int = 64,
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of shape (1, 1, T, d) in fp32: N(0, 1) entries, and `size` in the first n_outliers features of q, k."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, T, d, generator=gen) for _ in range(3))
    q[..., :n_outliers] = size
    k[..., :n_outliers] = size
    return q, k, v


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Causal attention in float64: softmax(q kᵀ / √d, masked to the past) v."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype, scale: str = "after",
              causal: bool = True) -> tuple[torch.Tensor, float]:
    """(output, largest |score| stored) of causal attention with q, k, v and the scores in `dtype`.

    scale "after": s = (q @ kᵀ) · 1/√d; "before": s = (q · 1/√d) @ kᵀ; then the causal mask (-inf), softmax in
    fp32 (as CUDA autocast runs it) and p @ v in dtype. "sdpa": F.scaled_dot_product_attention in dtype, the
    kernel torch picks on q's device (its scores never come out, so the largest stored score is reported as
    nan); "sdpa flash", "sdpa efficient", "sdpa math": that CUDA backend only (it raises where it cannot run).
    """
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if scale == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal), float("nan")
    if scale.startswith("sdpa "):
        with sdpa_kernel(CUDA_BACKENDS[scale.removeprefix("sdpa ")]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal), float("nan")
    if scale not in ("after", "before"):
        raise ValueError(f"scale must be 'after', 'before', 'sdpa' or 'sdpa <backend>', got {scale!r}")
    s = 1.0 / math.sqrt(q.size(-1))
    if scale == "before":
        stored = scores = (q * s) @ k.transpose(-2, -1)
    else:
        stored = q @ k.transpose(-2, -1)             # what the matmul has to write, before the scale
        scores = stored * s
    largest = stored.float().abs().max().item()
    if causal:
        T = q.size(-2)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    p = F.softmax(scores.float(), dim=-1).to(dtype)
    return p @ v, largest


@dataclass(frozen=True)
class Point:
    """One variant at one outlier size."""

    size: float
    finite: bool            # every output element finite
    largest_score: float    # largest |score| the variant stored (inf when it overflowed)
    error: float            # ‖out - exact‖ / ‖exact‖ against float64 attention of the same q, k, v (nan if not finite)
    refused: str | None = None   # an SDPA backend that cannot run these inputs: torch's reason


def sweep(sizes: Sequence[float], variants: Sequence[str] | None = None, n_outliers: int = 2, T: int = 64,
          d: int = 64, seed: int = 0, device: str | torch.device = "cpu") -> dict[str, list[Point]]:
    """variant -> [Point for each outlier size], computed on device (variants: names in variants_for(device),
    all of them by default; a CUDA backend's variant may be named on any device, where it may be refused).
    The exact attention is float64 on the CPU."""
    table = {**variants_for("cuda"), **variants_for(device)}
    results: dict[str, list[Point]] = {name: [] for name in (variants or variants_for(device))}
    for size in sizes:
        q, k, v = outlier_qkv(size, n_outliers, T, d, seed)
        exact = reference(q, k, v)
        q, k, v = (t.to(device) for t in (q, k, v))
        for name in results:
            dtype, scale = table[name]
            got = attempt(partial(attention, q, k, v, dtype, scale))     # the output, or Refused
            if isinstance(got, Refused):
                results[name].append(Point(size, False, float("nan"), float("nan"), got.reason))
                continue
            out, largest = got
            finite = bool(torch.isfinite(out).all())
            error = ((out.double().cpu() - exact).norm() / exact.norm()).item() if finite else float("nan")
            results[name].append(Point(size, finite, largest, error))
    return results


def largest_finite(points: Sequence[Point], sizes: Sequence[float]) -> float:
    """The largest size up to which every output was finite (0.0 if the first already was not)."""
    best = 0.0
    for size, point in zip(sizes, points):
        if not point.finite:
            break
        best = size
    return best


def overflow_size(n_outliers: int = 2, d: int = 64, scale: str = "after") -> float:
    """The outlier size a from which the stored score n·a² (or n·a²/√d, scale "before") rounds to inf in fp16."""
    factor = 1.0 if scale == "after" else 1.0 / math.sqrt(d)
    return math.sqrt(FP16_OVERFLOW / (n_outliers * factor))


def plot_overflow(sizes: Sequence[float], results: dict[str, list[Point]]) -> Figure:
    """Left: the largest score each variant stored against the outlier size (x where the output is not finite).
    Right: the output's relative error against exact attention, where it is finite."""
    with course_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
        for i, (name, points) in enumerate(results.items()):
            style = STYLES.get(name, {})
            stored = [(p.size, p.largest_score) for p in points if math.isfinite(p.largest_score)]
            # SDPA never hands its scores out: no curve on the left, but a legend entry for the right panel's line
            left.plot(*(zip(*stored) if stored else ([], [])), label=name, **style)
            broken = [p.size for p in points if not p.finite]
            if broken:
                left.plot(broken, [FP16_OVERFLOW * 2.5 * 2 ** i] * len(broken), "x", color=style.get("color"), ms=5)
            finite = [(p.size, p.error) for p in points if p.finite]
            if finite:
                right.plot(*zip(*finite), label=name, **style)
        left.axhline(65504, color="tab:red", lw=0.8)
        left.text(sizes[0], 65504 * 1.3, "fp16 max 65504", color="tab:red", fontsize=8)
        left.text(sizes[0], FP16_OVERFLOW * 4, "x: output inf/NaN (one row per variant)", fontsize=8)
        left.set(xscale="log", yscale="log", xlabel="outlier feature size a", ylabel="largest |score| stored",
                 title="Which scores fit in half precision")
        right.set(xscale="log", yscale="log", xlabel="outlier feature size a",
                  ylabel="relative error of the output", title="And how precisely, where they fit")
        left.legend(loc="lower right")
        fig.tight_layout()
    return fig
