"""The lessons' interactive pieces (ipywidgets): a slider that redraws a figure, and two float-format explorers.

    FigureSlider(draw, caption, description="log2 S", min=0, max=40)   # draw(k) -> Figure, caption(k) -> HTML
    BitExplorer("fp16")      # click bits of a pattern; see the formula, the value, what every format stores
    ValueExplorer("0.1")     # type a number; see its bits and rounding error in every format

Each is an ipywidgets.VBox: the last line of a cell displays it. Widgets need a running kernel; a
notebook read without one shows the state it was saved with. The parts are attributes
(`.slider`, `.caption`, `.image`, ...) so a test, or a curious learner, can drive them from code.
"""

from __future__ import annotations

import html
import math
from typing import Callable

import ipywidgets as widgets
from matplotlib.figure import Figure

from ampteach.amp.formats import FORMATS, bit_string, decode, encode, formula
from ampteach.lab.plots import FIELD_COLORS, figure_png

__all__ = ["FigureSlider", "stored_everywhere", "BitExplorer", "ValueExplorer"]


class FigureSlider(widgets.VBox):
    """An integer slider over a figure and an HTML caption, both redrawn when the slider moves.

        FigureSlider(lambda k: plot_something(2.0**k), lambda k: f"<b>S = 2^{k}</b>", min=0, max=40)

    The slider updates on release (continuous_update=False).

    Args:
        draw (callable): value -> a new matplotlib Figure (it is turned into a PNG and closed).
        caption (callable, optional): value -> HTML shown above the figure.
        value, min, max, step, description: the ipywidgets.IntSlider's.
    """

    def __init__(self, draw: Callable[[int], Figure], caption: Callable[[int], str] | None = None, *,
                 value: int = 0, min: int = 0, max: int = 10, step: int = 1, description: str = "") -> None:
        self.draw, self.describe = draw, caption
        self.slider = widgets.IntSlider(value=value, min=min, max=max, step=step, description=description,
                                        continuous_update=False)
        self.caption = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.slider.observe(lambda change: self.show(change["new"]), names="value")
        super().__init__([self.slider, self.caption, self.image])
        self.show(value)

    def show(self, value: int) -> None:
        """Redraw the figure and the caption for this slider value."""
        self.caption.value = self.describe(value) if self.describe else ""
        self.image.value = figure_png(self.draw(value))


def stored_everywhere(value: float) -> str:
    """An HTML table: for every format in FORMATS, the bits value is stored as, the stored value and the error."""
    rows = []
    for fmt in FORMATS.values():
        bits = encode(value, fmt)
        y = decode(bits, fmt)
        err = f"{y - value:+.3g}" if math.isfinite(y) and math.isfinite(value) else ""
        rows.append(f"<tr><td>{fmt.name}</td><td><code>{bit_string(bits, fmt)}</code></td><td>{y!r}</td>"
                    f"<td>{err}</td></tr>")
    return ("<table><tr><th>format</th><th>bits</th><th>stored value</th><th>rounding error</th></tr>"
            + "".join(rows) + "</table>")


class BitExplorer(widgets.VBox):
    """A row of bit buttons (coloured by field) for one pattern of a format; a click flips that bit.

        BitExplorer("fp16", 0x3C00)     # 0 01111 0000000000 = 1.0; explorer.show(0x3C01) from code

    Below it: decode's formula with these bits, the value, and what that value becomes in every format.
    Changing the format starts again from the pattern 0.

    Args:
        fmt_name (str, default "fp16"): the format first shown, a key of FORMATS.
        bits (int, default 0x3C00): the bit pattern first shown (fp16's 1.0).
    """

    def __init__(self, fmt_name: str = "fp16", bits: int = 0x3C00) -> None:
        self.choice = widgets.Dropdown(options=list(FORMATS), value=fmt_name, description="format")
        self.buttons = widgets.HBox()
        self.out = widgets.HTML()
        self.choice.observe(lambda change: self.show(0), names="value")
        super().__init__([self.choice, self.buttons, self.out])
        self.show(bits)

    def flip(self, position: int) -> None:
        """Flip bit `position` (0 = the last mantissa bit) of the pattern shown."""
        self.show(self.bits ^ (1 << position))

    def show(self, bits: int) -> None:
        fmt = FORMATS[self.choice.value]
        self.bits = bits
        fields = ["sign"] + ["exponent"] * fmt.exp_bits + ["mantissa"] * fmt.man_bits
        buttons = []
        for i, field in enumerate(fields):
            position = fmt.bits - 1 - i
            b = widgets.Button(description=str(bits >> position & 1), layout=widgets.Layout(width="26px", padding="0"),
                               style=widgets.ButtonStyle(button_color=FIELD_COLORS[field]))
            b.on_click(lambda _, p=position: self.flip(p))
            buttons.append(b)
        self.buttons.children = buttons
        self.value = decode(bits, fmt)
        self.out.value = (f"<p><code>{bit_string(bits, fmt)}</code> in {fmt.name}: "
                          f"{html.escape(formula(bits, fmt))} = <b>{self.value!r}</b></p>"
                          + stored_everywhere(self.value))


class ValueExplorer(widgets.VBox):
    """A text box: type a number (0.1, 1e-7, 65519, nan, ...) to see how every format stores it.

        ValueExplorer("0.1")            # explorer.box.value = "65519" redraws from code

    Args:
        text (str, default "0.1"): the number first shown, as typed.
    """

    def __init__(self, text: str = "0.1") -> None:
        self.box = widgets.Text(value=text, description="value", continuous_update=False)
        self.out = widgets.HTML()
        self.box.observe(lambda change: self.show(), names="value")
        super().__init__([self.box, self.out])
        self.show()

    def show(self) -> None:
        try:
            value = float(self.box.value)
        except ValueError:
            self.out.value = f"<p>{html.escape(self.box.value)} is not a number: type e.g. 0.1, 1e-7 or 65519</p>"
            return
        self.out.value = stored_everywhere(value)
