"""ampteach.lab.plots: each figure draws what the formats (and torch) say, and keeps its labels and legend in view."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ampteach.amp.formats import FORMATS, ulp  # noqa: E402
from ampteach.lab.plots import (  # noqa: E402
    FIELD_COLORS,
    _smooth,
    course_style,
    figure_png,
    plot_bit_layouts,
    plot_number_line,
    plot_runs,
    plot_scales,
    plot_spacing,
    plot_ties,
)
from ampteach.lab.underflow import plot_gradient_histogram  # noqa: E402
from ampteach.training.train import History, TrainConfig  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def positive_numbers(dtype: torch.dtype) -> torch.Tensor:
    """Every positive finite number of a 8- or 16-bit torch dtype, ascending (torch reads every bit pattern)."""
    bits = torch.finfo(dtype).bits
    codes = torch.arange(2 ** (bits - 1), dtype=torch.int32).to(torch.int16 if bits == 16 else torch.uint8)
    values = codes.view(dtype).double()
    return values[values.isfinite() & (values > 0)]


def test_figure_png_is_a_png_and_closes_the_figure():
    fig, ax = plt.subplots()
    ax.set_xlabel("a label")
    png = figure_png(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)


def test_bit_layouts_draw_one_box_per_bit_in_the_fields_colours():
    fig = plot_bit_layouts(["fp16", "bf16"])
    boxes = [p for p in fig.axes[0].patches if isinstance(p, plt.Rectangle)]
    assert len(boxes) == 16 + 16
    colors = [matplotlib.colors.to_hex(b.get_facecolor()) for b in boxes]
    assert colors[:16] == [FIELD_COLORS["sign"]] + [FIELD_COLORS["exponent"]] * 5 + [FIELD_COLORS["mantissa"]] * 10
    assert colors[16:] == [FIELD_COLORS["sign"]] + [FIELD_COLORS["exponent"]] * 8 + [FIELD_COLORS["mantissa"]] * 7


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_spacing_lines_are_torchs_gaps_between_neighbours(name):
    fig = plot_spacing(["fp32", name])
    gap_panel = fig.axes[0]
    line = next(c for c in gap_panel.get_lines() if c.get_label() == name)
    x, gap = line.get_xdata(), line.get_ydata()
    dtype = FORMATS[name].torch_dtype
    nearest = torch.tensor(x).to(dtype)
    toward_zero = torch.nextafter(nearest, torch.zeros((), dtype=dtype))
    below = torch.where(nearest.double() > torch.tensor(x), toward_zero, nearest)
    above = torch.nextafter(below, torch.tensor(math.inf, dtype=dtype))
    assert torch.equal(torch.tensor(gap), above.double() - below.double())   # the two torch numbers around x
    relative = next(line for line in fig.axes[1].get_lines() if line.get_label() == name)
    assert np.allclose(relative.get_ydata(), gap / x, rtol=0)
    assert [t.get_text() for t in gap_panel.get_legend().get_texts()] == ["fp32", name]


def test_spacing_shows_bf16_finer_than_fp16_below_2_to_the_minus_17():
    fig = plot_spacing(["fp16", "bf16"])
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    x = 2.0**-18
    gaps = {n: np.interp(math.log2(x), np.log2(line.get_xdata()), line.get_ydata()) for n, line in lines.items()}
    assert gaps["bf16"] < gaps["fp16"] == 2.0**-24 == ulp(x, "fp16")


def test_ties_arrows_go_where_torch_rounds_and_the_spacing_change_is_marked():
    fig = plot_ties("fp16", 2043, 2058)
    ax = fig.axes[0]
    arrows = [a for a in ax.texts if isinstance(a, matplotlib.text.Annotation)]
    starts = torch.tensor([a.xyann[0] for a in arrows])
    ends = torch.tensor([a.xy[0] for a in arrows])
    assert starts.tolist() == [2043.5, 2044.5, 2045.5, 2046.5, 2047.5, 2049, 2051, 2053, 2055, 2057]
    assert torch.equal(ends, starts.to(torch.float16).double())
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [2048]            # the one dashed line
    assert any(t.get_text() == "spacing 1 | 2" for t in ax.texts)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_number_line_has_one_tick_per_positive_number(name):
    fig = plot_number_line([name])
    ticks = fig.axes[0].collections[0].get_offsets()[:, 0]
    assert torch.equal(torch.tensor(np.asarray(ticks)), positive_numbers(FORMATS[name].torch_dtype))


def history(losses, accuracies, scales=(), skipped=()):
    return History(TrainConfig(), step_loss=list(losses), test_accuracy=list(accuracies), scales=list(scales),
                   skipped=list(skipped))


def test_smooth_is_a_running_mean():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    expected = [sum(values[max(0, i - 2):i + 1]) / len(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    assert _smooth(values, 3) == pytest.approx(expected, rel=1e-15)


def test_runs_draw_smoothed_loss_and_accuracy_per_epoch():
    runs = {"fp32": history([4, 2, 2, 0], [50, 70]), "fp16": history([1, 1, 1, 1], [60, 65])}
    fig = plot_runs(runs, styles={"fp16": {"color": "tab:red", "ls": ":"}}, smooth=2)
    loss_ax, acc_ax = fig.axes
    loss_lines = {line.get_label(): line for line in loss_ax.get_lines()}
    assert list(loss_lines["fp32"].get_ydata()) == [4, 3, 2, 1]
    assert loss_lines["fp16"].get_linestyle() == ":"
    acc = {line.get_label(): line for line in acc_ax.get_lines()}
    assert list(acc["fp16"].get_xdata()) == [1, 2] and list(acc["fp16"].get_ydata()) == [60, 65]


def test_scales_in_log2_with_every_skipped_step_marked_once_in_the_legend():
    runs = {"a": history([], [], [8.0, 16.0, 8.0, 8.0], [False, True, False, True]),
            "b": history([], [], [8.0, 8.0, 4.0, 4.0], [False, True, False, False])}
    fig = plot_scales(runs)
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert list(lines[0].get_ydata()) == [3, 4, 3, 3]
    marks = [line for line in lines if line.get_marker() == "x"]
    assert [list(m.get_xdata()) for m in marks] == [[1, 3], [1]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "skipped step (overflow)", "b"]


def test_gradient_histogram_keeps_its_legend_off_the_data_and_its_label_in_the_figure():
    grads = {"weights": torch.tensor([2.0**-30, 2.0**-3]), "output": torch.tensor([2.0**-7, 0.0])}
    ax = plot_gradient_histogram(grads, "fp16", scale=2.0**10)
    fig = ax.figure
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1                  # to the right of the axes
    label = ax.xaxis.label.get_window_extent()
    assert label.y0 >= 0 and "2^10" in ax.get_xlabel()             # tight_layout kept it on the canvas


def test_course_style_restores_only_its_own_keys():
    before = matplotlib.rcParams["axes.spines.top"]
    interactive = matplotlib.is_interactive()
    with course_style():
        assert matplotlib.rcParams["axes.spines.top"] is False
        matplotlib.interactive(not interactive)     # what a notebook's inline backend does on its first figure
    assert matplotlib.rcParams["axes.spines.top"] == before
    assert matplotlib.is_interactive() == (not interactive)
    matplotlib.interactive(interactive)
