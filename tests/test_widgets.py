"""ampteach.lab.widgets: driving each widget from code changes what it shows, and what it shows is what torch stores."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ampteach.amp.formats import FORMATS  # noqa: E402
from ampteach.lab.widgets import BitExplorer, FigureSlider, ValueExplorer, stored_everywhere  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_figure_slider_redraws_figure_and_caption_when_the_slider_moves():
    drawn = []

    def draw(k):
        drawn.append(k)
        fig, ax = plt.subplots(figsize=(2, 1))
        ax.plot([0, 1], [0, k])
        ax.set_title(f"k = {k}")
        return fig

    open_before = set(plt.get_fignums())          # figures other tests left open are not this test's
    view = FigureSlider(draw, lambda k: f"<b>k = {k}</b>", value=2, min=0, max=5, description="k")
    assert view.children == (view.slider, view.caption, view.image)
    first = view.image.value
    assert drawn == [2] and first[:8] == PNG and view.caption.value == "<b>k = 2</b>"
    view.slider.value = 4
    assert drawn == [2, 4] and view.caption.value == "<b>k = 4</b>"
    assert view.image.value[:8] == PNG and view.image.value != first
    assert set(plt.get_fignums()) == open_before    # every drawn figure was closed after rendering
    assert (view.slider.min, view.slider.max, view.slider.description) == (0, 5, "k")


def test_bit_explorer_flips_bits_like_torch_reads_them():
    explorer = BitExplorer("fp16", 0x3C00)
    assert explorer.value == 1.0 and len(explorer.buttons.children) == 16
    explorer.buttons.children[-1].click()           # the last mantissa bit
    ones = torch.tensor([0x3C01], dtype=torch.int16).view(torch.float16).item()
    assert explorer.bits == 0x3C01 and explorer.value == ones
    explorer.buttons.children[0].click()            # the sign bit
    assert explorer.value == -ones
    assert "(-1)^1 * 2^(15-15) * (1 + 1/1024)" in explorer.out.value
    assert [b.description for b in explorer.buttons.children] == list(format(0xBC01, "016b"))


def test_bit_explorer_starts_again_from_zero_in_a_new_format():
    explorer = BitExplorer("fp16")
    explorer.choice.value = "fp8_e4m3"
    assert explorer.bits == 0 and explorer.value == 0.0 and len(explorer.buttons.children) == 8
    for position in range(7):                       # all ones but the sign: e4m3fn's NaN
        explorer.flip(position)
    assert math.isnan(explorer.value) and "NaN pattern" in explorer.out.value


def test_value_explorer_shows_what_every_format_stores():
    explorer = ValueExplorer("65519")
    assert explorer.out.value == stored_everywhere(65519.0)
    assert "<td>fp16</td><td><code>0 11110 1111111111</code></td><td>65504.0</td>" in explorer.out.value
    explorer.box.value = "not a number"
    assert "is not a number" in explorer.out.value


@pytest.mark.parametrize("value", [0.1, 1e-7, 65519.0, 3.0e38, -2.5])
def test_stored_everywhere_agrees_with_torch_casts(value):
    table = stored_everywhere(value)
    for fmt in FORMATS.values():
        if fmt.torch_dtype is None:
            continue
        stored = torch.tensor([value], dtype=torch.float64).float().to(fmt.torch_dtype).float().item()
        assert f"<td>{fmt.name}</td>" in table and f"<td>{stored!r}</td>" in table
