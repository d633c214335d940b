"""Attention masks in half precision: finfo(float32).min becomes -inf, and a fully masked row becomes NaN.

    from ampteach.lab.attention_masks import MASKINGS, padded_scores, masked_softmax, plot_masked_rows
    scores = padded_scores(torch.float16)                # 4 queries x 4 keys, query 0 a padding row
    p = masked_softmax(scores, keep, "add finfo(float32).min")
    fig = plot_masked_rows(torch.float16)                # one heatmap per way of masking

A model masks the scores a query must not see before the softmax. Three ways, as public models do it:
    "add finfo(float32).min"   s + m, m = 0 where allowed and finfo(float32).min (-3.4e38) where not: the mask
                               is built in fp32 and cast to the scores' dtype, where -3.4e38 is out of range:
                               fp16's and even bf16's (-3.4028e38 lies past bf16's -3.3895e38 by more than
                               half a step) both round it to -inf
    "add finfo(dtype).min"     s + finfo(s.dtype).min: the largest finite negative of the dtype; in fp16
                               -65504 + s rounds to -inf once s <= -16 (huggingface/transformers#17306)
    "masked_fill finfo(dtype).min"  s.masked_fill(~keep, finfo(dtype).min): replaces, so never -inf
A row in which every key is masked (a padding query) then holds only -inf, whose softmax is
exp(-inf - (-inf)) = exp(NaN): NaN, which the next matmul spreads over every output that reads it.
Replacing with finfo(dtype).min gives such a row equal finite scores: a uniform softmax, finite.
F.scaled_dot_product_attention with a boolean mask is the other fix: in the PyTorch this course runs,
it returns zeros for a query that may attend to nothing.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from ampteach.lab.plots import course_style

__all__ = ["MASKINGS", "apply_mask", "masked_softmax", "padded_keep", "padded_scores", "plot_masked_rows"]

MASKINGS = ("add finfo(float32).min", "add finfo(dtype).min", "masked_fill finfo(dtype).min")


def padded_keep(T: int = 4, pad: int = 1) -> torch.Tensor:
    """(T, T) bool, True where query i may attend key j: causal, with the first `pad` tokens padding (left padding,
    as batched generation pads a short prompt), so the first `pad` queries may attend to nothing."""
    keep = torch.ones(T, T, dtype=torch.bool).tril()
    keep[:, :pad] = False
    return keep


def padded_scores(dtype: torch.dtype, T: int = 4) -> torch.Tensor:
    """A (T, T) score matrix in dtype: every score of row 0 at or below -16 (the fp16 trap), small ones elsewhere."""
    scores = torch.arange(T * T, dtype=torch.float32).reshape(T, T) / 4 - 2
    scores[0] = -20.0 - torch.arange(T, dtype=torch.float32)
    return scores.to(dtype)


def apply_mask(scores: torch.Tensor, keep: torch.Tensor, masking: str) -> torch.Tensor:
    """scores with the disallowed entries masked one of the MASKINGS ways (all arithmetic in the scores' dtype)."""
    if masking == "add finfo(float32).min":
        additive = torch.zeros(keep.shape, device=scores.device).masked_fill(~keep, torch.finfo(torch.float32).min)
        return scores + additive.to(scores.dtype)
    if masking == "add finfo(dtype).min":
        additive = torch.zeros(keep.shape, dtype=scores.dtype, device=scores.device).masked_fill(
            ~keep, torch.finfo(scores.dtype).min)
        return scores + additive
    if masking == "masked_fill finfo(dtype).min":
        return scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    raise ValueError(f"masking must be one of {MASKINGS}, got {masking!r}")


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor, masking: str) -> torch.Tensor:
    """softmax over the keys of the masked scores, computed in fp32 (as autocast runs it on CUDA), returned in fp32."""
    return F.softmax(apply_mask(scores, keep, masking).float(), dim=-1)


def plot_masked_rows(dtype: torch.dtype = torch.float16, T: int = 4) -> Figure:
    """One heatmap of softmax probabilities per masking, for padded_scores(dtype); NaN cells in red."""
    keep = padded_keep(T)
    scores = padded_scores(dtype, T)
    with course_style():
        fig, axes = plt.subplots(1, len(MASKINGS), figsize=(3.3 * len(MASKINGS), 3.2))
        for ax, masking in zip(axes, MASKINGS):
            p = masked_softmax(scores, keep, masking).numpy()
            ax.imshow(np.nan_to_num(p, nan=0.0), cmap="Greys", vmin=0, vmax=1)
            for i in range(T):
                for j in range(T):
                    nan = np.isnan(p[i, j])
                    ax.text(j, i, "NaN" if nan else f"{p[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="tab:red" if nan else ("white" if p[i, j] > 0.5 else "black"))
            ax.set_title(f"{masking}\n({str(dtype).removeprefix('torch.')} scores)", fontsize=9)
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xlabel("key")
        axes[0].set_ylabel("query (0 = padding)")
        fig.tight_layout()
    return fig
