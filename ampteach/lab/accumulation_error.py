"""What lesson 10 measures and draws: how the precision of a matmul's running sum becomes its error.

    from ampteach.lab.accumulation_error import error_vs_k, running_sums, closest_accumulator, plot_error_vs_k
    sums = running_sums(x, y, ks=[1, 2, 4, 4096], acc_bits=11)    # an fp16 accumulator after k products
    errors = error_vs_k(a, b, ks=[16, 64, 256, 1024, 4096],
                        settings={"14 bits, truncate": dict(acc_bits=14, rounding="truncate")})
    fig = plot_error_vs_k(errors, [16, 64, 256, 1024, 4096])
    closest_accumulator(a, b)        # {8: 0.0, 11: 0.16, ..., 24: 1.0}: how often each reproduces torch's bf16 matmul

Every number here comes from ampteach.amp.accumulator.emulated_matmul: float64 arithmetic, the same on
every machine, except closest_accumulator, which runs torch's own kernel under autocast (the CPU's, or
the GPU's with device="cuda"; the emulation it is compared with runs on the CPU).
Plot functions return the Figure (`fig = ...` shows it once), in the course's style.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ampteach.amp.accumulator import emulated_matmul, round_to_bits
from ampteach.lab.plots import course_style

__all__ = ["ACCUMULATOR_NAMES", "autocast_matmul", "closest_accumulator", "error_vs_k", "max_relative_error",
           "plot_error_vs_k", "plot_running_sums", "running_sums"]

# accumulator width (significant bits) -> the format that keeps that many
ACCUMULATOR_NAMES = {8: "bf16", 11: "fp16", 14: "14 bits", 16: "16 bits", 20: "20 bits", 24: "fp32", 53: "float64"}
_OUTPUT_BITS = {torch.bfloat16: 8, torch.float16: 11}


def running_sums(x: Tensor, y: Tensor, ks: Sequence[int], acc_bits: int, rounding: str = "nearest") -> Tensor:
    """The accumulator of the dot product x . y after its first k products, for each k in ks (float64).

    s_k = round(s_(k-1) + x[k] y[k]): row r of one emulated_matmul holds x's first ks[r] values and
    zeros after them (adding 0 leaves a rounded sum as it is), so every k costs one pass, not one call.
    """
    if x.dim() != 1 or x.shape != y.shape:
        raise ValueError(f"x and y must be vectors of one length, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    ks = torch.as_tensor(list(ks))
    if ks.numel() and not (1 <= int(ks.min()) and int(ks.max()) <= len(x)):
        raise ValueError(f"every k must be from 1 to len(x) = {len(x)}, got {ks.tolist()}")
    kept = torch.arange(len(x))[None, :] < ks[:, None]
    rows = (x.float()[None, :] * kept).to(x.dtype)          # exact: x's values, or 0
    return emulated_matmul(rows, y[:, None], acc_bits=acc_bits, rounding=rounding)[:, 0]


def max_relative_error(c: Tensor, exact: Tensor) -> float:
    """max over the outputs of |c - exact| / |exact| (every exact output must be non-zero)."""
    if (exact == 0).any():
        raise ValueError("an exact output is 0, so its relative error is undefined: use inputs of one sign")
    return ((c.double() - exact.double()).abs() / exact.double().abs()).max().item()


def error_vs_k(a: Tensor, b: Tensor, ks: Sequence[int], settings: Mapping[str, dict]) -> dict[str, list[float]]:
    """For each setting (keyword arguments of emulated_matmul) and each K in ks: the max relative error
    of a[:, :K] @ b[:K, :] against the float64 sum (exact for fp8 inputs: every sum fits 53 bits)."""
    errors: dict[str, list[float]] = {label: [] for label in settings}
    for k in ks:
        a_k, b_k = a[:, :k], b[:k]
        exact = emulated_matmul(a_k, b_k, acc_bits=53)
        for label, kwargs in settings.items():
            errors[label].append(max_relative_error(emulated_matmul(a_k, b_k, **kwargs), exact))
    return errors


def autocast_matmul(a: Tensor, b: Tensor, dtype: torch.dtype = torch.bfloat16,
                    device: str | torch.device = "cpu") -> Tensor:
    """a @ b as torch computes it on device under autocast: inputs cast to dtype, torch's own kernel; on the CPU."""
    device = torch.device(device)
    with torch.autocast(device.type, dtype=dtype):
        return (a.to(device) @ b.to(device)).cpu()


def closest_accumulator(a: Tensor, b: Tensor, candidates: Sequence[int] = (8, 11, 14, 16, 20, 24, 53),
                        dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> dict[int, float]:
    """The fraction of torch's autocast a @ b outputs on device that each emulated accumulator reproduces exactly.

    Each candidate sums the same dtype inputs with acc_bits bits, in k order, and then rounds the sum
    to dtype, as torch rounds its output. a, b: float32 (cast to dtype here, as autocast casts them).
    """
    if dtype not in _OUTPUT_BITS:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16 (autocast's half dtypes), got {dtype}")
    got = autocast_matmul(a, b, dtype, device).double()
    a_half, b_half = a.to(dtype), b.to(dtype)
    return {bits: (round_to_bits(emulated_matmul(a_half, b_half, acc_bits=bits), _OUTPUT_BITS[dtype]) == got)
            .double().mean().item() for bits in candidates}


def plot_error_vs_k(errors: Mapping[str, Sequence[float]], ks: Sequence[int], styles: Mapping[str, dict] | None = None,
                    claims: Mapping[str, tuple[float, float]] | None = None, slopes: Mapping[str, float] | None = None,
                    title: str = "", ax=None) -> Figure:
    """Max relative error against K, log-log: one line per setting; `claims` as stars ({label: (K, error)});
    `slopes` as grey dotted lines through a setting's last point ({setting: exponent}, 1 for K, 0.5 for sqrt K)."""
    styles, claims, slopes = styles or {}, claims or {}, slopes or {}
    with course_style():
        fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4.2))
        for label, errs in errors.items():
            ax.plot(ks, errs, marker="o", ms=4, label=label, **{"lw": 1.5, **styles.get(label, {})})
        for label, exponent in slopes.items():
            last_k, last_e = ks[-1], errors[label][-1]
            guide = [last_e * (k / last_k) ** exponent for k in ks]
            ax.plot(ks, guide, ls=":", color="0.5", lw=1)
            middle = len(ks) // 2
            ax.annotate("∝ K" if exponent == 1 else "∝ √K" if exponent == 0.5 else f"∝ K^{exponent:g}",
                        (ks[middle], guide[middle]), xytext=(-4, 4), textcoords="offset points", fontsize=8,
                        color="0.4", ha="right")
        for label, (k, err) in claims.items():
            ax.plot([k], [err], marker="*", ms=14, color="tab:red", ls="none", label=label)
        ax.set(xscale="log", yscale="log", xlabel="K (products summed per output)",
               ylabel="max relative error", title=title)
        ax.set_xticks(list(ks), [str(k) for k in ks])
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def plot_running_sums(ks: Sequence[int], sums: Mapping[str, Sequence[float]], styles: Mapping[str, dict] | None = None,
                      title: str = "", ax=None) -> Figure:
    """The accumulator after k products against k, one line per accumulator (e.g. from running_sums)."""
    styles = styles or {}
    with course_style():
        fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 3.6))
        for label, values in sums.items():
            values = values.tolist() if isinstance(values, Tensor) else list(values)
            ax.plot(list(ks), values, label=label, **{"lw": 1.5, **styles.get(label, {})})
        ax.set(xlabel="k (products added so far)", ylabel="running sum", title=title)
        ax.legend(loc="upper left")
    return fig
