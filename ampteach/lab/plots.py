"""The lessons' figures: one style, and the plots that would otherwise fill a lesson with matplotlib.

    from ampteach.lab.plots import plot_runs, plot_spacing, figure_png
    fig = plot_spacing(["fp32", "bf16", "fp16"])       # the gap between neighbouring numbers, log-log
    fig = plot_runs({"fp32": h32, "fp16": h16})         # training loss per step and accuracy per epoch
    png = figure_png(fig)                               # PNG bytes (for an ipywidgets.Image); closes fig

Every function returns the matplotlib Figure it drew on (assign it, `fig = ...`, so a notebook shows
it once). Functions that draw one panel take `ax=` to draw into a figure of your own. Colours are
fixed per format (FORMAT_COLORS) and per bit field (FIELD_COLORS), so every lesson draws fp16 the
same way. `course_style()` is the style as a context manager, for a lesson's own plots.
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Iterable, Mapping

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from ampteach.amp.formats import FORMATS, FloatFormat, as_format, decode, encode, grid_near, round_to_format, ulp

__all__ = ["STYLE", "FORMAT_COLORS", "FIELD_COLORS", "ZONE_COLORS", "course_style", "figure_png", "plot_bit_layouts",
           "plot_spacing", "plot_ties", "plot_number_line", "plot_runs", "plot_scales"]

STYLE = {
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "figure.dpi": 100,
}
FORMAT_COLORS = {"fp32": "black", "tf32": "tab:purple", "fp16": "tab:blue", "bf16": "tab:orange",
                 "fp8_e4m3": "tab:green", "fp8_e5m2": "tab:red"}
FIELD_COLORS = {"sign": "#e45756", "exponent": "#4c78a8", "mantissa": "#54a24b"}
ZONE_COLORS = {"flushed": "0.85", "subnormal": "#f6e3a1", "normal": "#d9ecd0", "overflow": "#f4c7c3"}


@contextlib.contextmanager
def course_style():
    """with course_style(): ... : matplotlib's rcParams set to the course's figure style for the block.

    Only the STYLE keys are saved and restored. (matplotlib.rc_context restores every rcParam, which
    undoes the `interactive` flag a Jupyter inline backend sets while the block draws its first figure,
    and later figures then stop showing.)
    """
    saved = {key: matplotlib.rcParams[key] for key in STYLE}
    matplotlib.rcParams.update(STYLE)
    try:
        yield
    finally:
        matplotlib.rcParams.update(saved)


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    """The figure as PNG bytes, cropped to everything drawn (labels and outside legends included); closes it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _axes(ax, figsize) -> tuple[Figure, plt.Axes]:
    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def _formats(formats) -> list[FloatFormat]:
    return [as_format(f) for f in (FORMATS.values() if formats is None else formats)]


def plot_bit_layouts(formats: Iterable[FloatFormat | str] | None = None, ax=None) -> Figure:
    """One coloured box per bit (sign, exponent, mantissa) for each format, with its bias and max."""
    formats = _formats(formats)
    with course_style():
        fig, ax = _axes(ax, (11, 0.65 * len(formats) + 0.5))
        for row, fmt in enumerate(formats):
            y, x = len(formats) - 1 - row, 0
            for field, width in (("sign", 1), ("exponent", fmt.exp_bits), ("mantissa", fmt.man_bits)):
                for i in range(width):
                    ax.add_patch(plt.Rectangle((x + i, y), 0.9, 0.8, color=FIELD_COLORS[field]))
                label = f"{field} ({width})" if width >= 5 else "" if field == "sign" else str(width)
                ax.text(x + width / 2 - 0.05, y + 0.4, label, ha="center", va="center", color="white",
                        fontsize=8, weight="bold")
                x += width
            ax.text(-0.6, y + 0.4, fmt.name, ha="right", va="center", fontsize=10)
            ax.text(x + 0.6, y + 0.4, f"{fmt.bits} bits, bias {fmt.bias}, max {fmt.max:.6g}", va="center", fontsize=8)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in FIELD_COLORS.values()]
        ax.legend(handles, list(FIELD_COLORS), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3)
        ax.set(xlim=(-7, 46), ylim=(-0.1, len(formats)), title="One box per bit: sign, exponent, mantissa")
        ax.axis("off")
    return fig


def _spacing(fmt: FloatFormat, lo: float, hi: float, n: int = 4000):
    """Magnitudes x from lo to hi (log-spaced) that fmt can hold, and ulp(x) at each."""
    x = 2.0 ** np.linspace(math.log2(lo), math.log2(hi), n)
    x = x[(x >= fmt.min_subnormal) & (x < 2.0 ** (fmt.emax + 1))]
    return x, np.array([ulp(v, fmt) for v in x])


def _shade_zones(ax, fmt: FloatFormat, lo: float, hi: float, label_y: float | None = None) -> None:
    """Shade fmt's four zones of |x| on a log x-axis: rounds to 0, subnormal, normal, inf."""
    edges = [lo, fmt.min_subnormal / 2, fmt.min_normal, fmt.max + ulp(fmt.max, fmt) / 2, hi]
    names = ["rounds\nto 0", "sub-\nnormal", "normal", "inf"]
    for left, right, name, color in zip(edges, edges[1:], names, ZONE_COLORS.values()):
        ax.axvspan(left, right, color=color, zorder=0)
        if label_y is not None:
            ax.text(math.sqrt(left * right), label_y, f"{fmt.name}\n{name}", ha="center", fontsize=8)


def plot_spacing(formats: Iterable[FloatFormat | str] | None = None, zones: FloatFormat | str = "fp16",
                 xlim: tuple[float, float] = (1e-12, 1e9)) -> Figure:
    """Three panels: ulp(x) against |x| and ulp(x)/|x| over xlim with `zones`' zones shaded; ulp over all of fp32.

    ulp(x) = 2^(max(floor(log2|x|), emin) - M): a staircase up by 2 per binade, flat in the subnormal range.
    """
    formats, zones = _formats(formats), as_format(zones)
    lo, hi = xlim
    with course_style():
        fig = plt.figure(figsize=(13, 8.2))
        gap, relative = fig.add_subplot(2, 2, 1), fig.add_subplot(2, 2, 2)
        whole = fig.add_subplot(2, 1, 2)
        for fmt in formats:
            style = dict(color=FORMAT_COLORS.get(fmt.name), ls="--" if fmt.name == "tf32" else "-", lw=1.4,
                         label=fmt.name)
            x, u = _spacing(fmt, lo, hi)
            gap.loglog(x, u, **style)
            relative.loglog(x, u / x, **style)
            whole.loglog(*_spacing(fmt, 2.0**-150, 2.0**128.5), **style)
        _shade_zones(gap, zones, lo, hi, label_y=3e-17)
        _shade_zones(relative, zones, lo, hi, label_y=0.02)
        for ax in (gap, relative, whole):
            ax.set_xlabel("|x|")
        gap.set(xlim=xlim, ylim=(1e-17, 1e5), ylabel="ulp(x): gap to the next number",
                title=f"ulp against magnitude, with {zones.name}'s zones")
        relative.set(xlim=xlim, ylim=(1e-8, 3), ylabel="ulp(x) / |x|: relative gap",
                     title="The same gap, relative to |x|")
        whole.set(ylabel="ulp(x)", title="The whole range of each format")
        gap.legend(loc="upper left")
        whole.legend(ncol=len(formats), loc="upper left")
        fig.tight_layout()
    return fig


def plot_ties(fmt: FloatFormat | str, lo: float, hi: float, ax=None) -> Figure:
    """fmt's numbers in [lo, hi] as dots (blue: even last mantissa bit) and every tie between two
    neighbours as a red arrow to where round-to-nearest-even sends it; a dashed line where the spacing changes."""
    fmt = as_format(fmt)
    numbers = _numbers_between(lo, hi, fmt)
    ties = torch.tensor([(a + b) / 2 for a, b in zip(numbers, numbers[1:])])
    rounded = round_to_format(ties, fmt)
    with course_style():
        fig, ax = _axes(ax, (11, 2.4))
        even = [encode(v, fmt) % 2 == 0 for v in numbers]
        ax.scatter(numbers, np.zeros(len(numbers)), c=["tab:blue" if e else "0.6" for e in even], s=50, zorder=3)
        for t, r in zip(ties.tolist(), rounded.tolist()):
            ax.annotate("", xy=(r, 0.05), xytext=(t, 0.6), arrowprops=dict(arrowstyle="->", color="tab:red"))
            ax.text(t, 0.68, f"{t:g}", ha="center", fontsize=7)
        gaps = [b - a for a, b in zip(numbers, numbers[1:])]
        for i in range(1, len(gaps)):
            if gaps[i] != gaps[i - 1]:
                ax.axvline(numbers[i], color="0.4", ls="--", lw=1)
                ax.text(numbers[i], -0.25, f"spacing {gaps[i - 1]:g} | {gaps[i]:g}", ha="center", fontsize=8)
        ax.set_yticks([])
        ax.set(ylim=(-0.35, 0.95), xticks=numbers,
               title=f"{fmt.name}: ties (red arrows) go to the neighbour with an even mantissa (blue dots)")
        ax.tick_params(axis="x", labelsize=7, rotation=90 if len(numbers) > 16 else 0)
    return fig


def _numbers_between(lo: float, hi: float, fmt: FloatFormat) -> list[float]:
    """fmt's numbers in [lo, hi] (0 <= lo), ascending: step from the one nearest lo by the ulp."""
    v, out = grid_near(lo, fmt, k=0)[0], []
    v = v if v >= lo else v + ulp(v, fmt)
    while v <= hi:
        out.append(v)
        v += ulp(v, fmt)
    return out


def plot_number_line(formats: Iterable[FloatFormat | str], ax=None) -> Figure:
    """Every positive finite number of each (8-bit or so) format as a tick on a log axis, one row per format."""
    formats = _formats(formats)
    with course_style():
        fig, ax = _axes(ax, (11, 0.6 * len(formats) + 1.2))
        for row, fmt in enumerate(formats):
            values = [v for c in range(2 ** (fmt.bits - 1)) if math.isfinite(v := decode(c, fmt)) and v > 0]
            ax.scatter(values, np.full(len(values), row), marker="|", s=300, color=FORMAT_COLORS.get(fmt.name))
            ax.text(values[-1] * 1.6, row, f"max {fmt.max:g}", va="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_yticks(range(len(formats)), [f.name for f in formats])
        ax.set(ylim=(-0.6, len(formats) - 0.4), xlabel="value", title="Every positive number of each format")
    return fig


def _smooth(values: list[float], k: int) -> list[float]:
    """Running mean over k steps (shorter at the start)."""
    t = torch.tensor(values, dtype=torch.float64)
    sums = torch.cat([torch.zeros(1, dtype=torch.float64), t.cumsum(0)])
    idx = torch.arange(1, len(t) + 1)
    start = (idx - k).clamp(min=0)
    return ((sums[idx] - sums[start]) / (idx - start)).tolist()


def plot_runs(histories: Mapping[str, object], styles: Mapping[str, dict] | None = None, smooth: int = 10,
              title: str = "") -> Figure:
    """Left: each run's training loss per step (running mean over `smooth` steps); right: held-out accuracy per epoch.

    histories: {label: ampteach.History}; styles: {label: matplotlib kwargs such as color, ls, lw}.
    """
    styles = styles or {}
    with course_style():
        fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [2, 1]})
        for label, h in histories.items():
            style = {"lw": 1.5, **styles.get(label, {})}
            loss_ax.plot(_smooth(h.step_loss, smooth), label=label, **style)
            acc_ax.plot(range(1, len(h.test_accuracy) + 1), h.test_accuracy, marker="o", label=label, **style)
        loss_ax.set(xlabel="step", ylabel=f"training loss (mean of {smooth} steps)", title=title)
        epochs = max(len(h.test_accuracy) for h in histories.values())
        acc_ax.set(xlabel="epoch", ylabel="held-out accuracy (%)", xticks=range(1, 1 + epochs))
        loss_ax.legend()
        fig.tight_layout()
    return fig


def plot_scales(histories: Mapping[str, object], styles: Mapping[str, dict] | None = None, ax=None) -> Figure:
    """log2 of the loss scale each step used, one line per run, with a red x on every skipped step."""
    styles = styles or {}
    with course_style():
        fig, ax = _axes(ax, (10, 3.4))
        skip_label = "skipped step (overflow)"
        for label, h in histories.items():
            ax.plot([math.log2(s) for s in h.scales], label=label, **{"lw": 1.5, **styles.get(label, {})})
            skips = [i for i, skipped in enumerate(h.skipped) if skipped]
            if skips:
                ax.plot(skips, [math.log2(h.scales[i]) for i in skips], "x", color="tab:red", label=skip_label)
                skip_label = "_nolegend_"   # one legend entry for every run's skipped steps
        ax.set(xlabel="step", ylabel="log2 S", title="loss scale per step")
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig
