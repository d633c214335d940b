"""What dtype every step of a training step computes in, forward and backward: a picture of autocast's work.

    steps = trace_step(model, x, y, lambda: ampteach.autocast("cpu", dtype=torch.bfloat16))
    fig = plot_dtype_flow(steps)          # two rows of boxes (forward, backward), coloured by dtype

trace_step runs forward + cross-entropy inside the region and backward after it, under a dispatch
trace (reference.DispatchTrace, below autocast and autograd), and keeps the calls that compute:
each cast (aten._to_copy), matmul, activation, softmax and loss, forward and backward. Bookkeeping
calls (transposes, views, detach) are left out. Each step is named after what it computes; a cast
names the tensor it casts when that is a parameter or the input ("cast W1"), and a cast in backward
that becomes a parameter's .grad is named after it ("-> W1.grad", found by its value). The colour is the dtype of what
the step produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from torch import nn

from ampteach.lab.compare_torch import DispatchTrace
from ampteach.lab.plots import FORMAT_COLORS, course_style

# bookkeeping: views, detach, and AccumulateGrad's copy into .grad (the trace holds the gradient, so it copies)
SKIPPED = {"t", "view", "detach", "ones_like", "expand", "reshape", "_unsafe_view", "transpose", "permute",
           "new_empty_strided", "copy_"}
NAMES = {   # aten op -> what it computes, in the forward (first) and the backward (second) pass
    "addmm": ("linear", "linear"), "mm": ("matmul", "grad matmul"), "relu": ("ReLU", "ReLU"),
    "threshold_backward": ("ReLU backward", "ReLU backward"), "_log_softmax": ("log_softmax", "log_softmax"),
    "_log_softmax_backward_data": ("log_softmax backward", "log_softmax backward"),
    "nll_loss_forward": ("NLL loss", "NLL loss"), "nll_loss_backward": ("NLL backward", "NLL backward"),
    "sum": ("sum", "grad sum (bias)"), "_softmax": ("softmax", "softmax"),
}
DTYPE_KEYS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class FlowStep:
    """One computing call of a training step: its pass, its name, its dtypes in and out."""

    phase: str                          # "forward" or "backward"
    label: str
    inputs: tuple[torch.dtype, ...]
    output: torch.dtype


class _NamedTrace(DispatchTrace):
    """A dispatch trace that also remembers which tensor each call got and made."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.calls.append((self.entries[-1].op.split(".")[0], args, out))
        return out


def trace_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, region: Callable) -> list[FlowStep]:
    """The computing calls of one step: forward and loss inside region(), backward outside it.

    Parameters are named W1, b1, W2, b2... in order of the model's nn.Linear layers (other
    parameters by their own names); the input is x.
    """
    names = {id(x): "x"}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears, 1):
        names[id(layer.weight)] = f"W{i}"
        if layer.bias is not None:
            names[id(layer.bias)] = f"b{i}"
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    model.zero_grad(set_to_none=True)
    forward, backward = _NamedTrace(), _NamedTrace()
    with region(), forward:
        loss = F.cross_entropy(model(x), y)
    with backward:
        loss.backward()
    grads = [(p.grad, f"{names[id(p)]}.grad") for p in model.parameters() if p.grad is not None]
    steps = []
    for phase, trace in (("forward", forward), ("backward", backward)):
        for entry, (op, args, out) in zip(trace.entries, trace.calls):
            if op in SKIPPED or entry.output is None:
                continue
            steps.append(FlowStep(phase, _label(op, phase, args, out, names, grads), entry.inputs, entry.output))
    return steps


def _label(op: str, phase: str, args: tuple, out, names: dict, grads: list) -> str:
    if op == "_to_copy":
        source = names.get(id(args[0])) if args else None
        target = next((name for grad, name in grads if phase == "backward" and grad.shape == out.shape
                       and grad.dtype == out.dtype and torch.equal(grad, out)), None)
        to = DTYPE_KEYS.get(out.dtype, str(out.dtype))
        return f"-> {target}" if target else f"cast {source}" if source else f"cast to {to}"
    forward, backward = NAMES.get(op, (op, op))
    return forward if phase == "forward" else backward


def _color(dtype: torch.dtype) -> str:
    return FORMAT_COLORS.get(DTYPE_KEYS.get(dtype, ""), "0.6")


def plot_dtype_flow(steps: list[FlowStep], title: str = "") -> Figure:
    """Forward (top row, left to right) and backward (bottom row) as boxes coloured by output dtype."""
    rows = {phase: [s for s in steps if s.phase == phase] for phase in ("forward", "backward")}
    width = max(len(r) for r in rows.values())
    with course_style():
        fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * width), 3.6))
        for row, (phase, row_steps) in enumerate(rows.items()):
            y = 1.0 - row * 1.25
            ax.text(-0.6, y, phase, ha="right", va="center", fontsize=9, fontweight="bold")
            for i, step in enumerate(row_steps):
                color = _color(step.output)
                box = FancyBboxPatch((i - 0.42, y - 0.32), 0.84, 0.64, boxstyle="round,pad=0.02",
                                     facecolor=color, edgecolor="none", alpha=0.85)
                ax.add_patch(box)
                text_color = "white" if color in ("black", "tab:blue") else "black"
                ax.text(i, y, step.label.replace(" ", "\n", 1), ha="center", va="center", fontsize=8, color=text_color)
                if i:
                    ax.annotate("", (i - 0.44, y), (i - 0.56, y), arrowprops=dict(arrowstyle="->", lw=0.8))
        used = sorted({s.output for s in steps if s.output in DTYPE_KEYS}, key=str)
        handles = [plt.Rectangle((0, 0), 1, 1, color=_color(d), alpha=0.85) for d in used]
        ax.legend(handles, [str(d).removeprefix("torch.") for d in used], loc="upper right",
                  bbox_to_anchor=(1.0, 1.32), ncol=len(used), title="dtype of what the step produces")
        ax.set_xlim(-1.6, width - 0.4)
        ax.set_ylim(-0.75, 1.5)
        ax.axis("off")
        if title:
            ax.set_title(title, loc="left")
        fig.tight_layout()
    return fig
