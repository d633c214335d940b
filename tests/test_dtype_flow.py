"""dtype_flow: the steps of a traced training step, and the same picture under torch.autocast and ampteach.autocast."""

from __future__ import annotations

import matplotlib
import torch
from torch import nn

import ampteach
from ampteach.lab.dtype_flow import FlowStep, plot_dtype_flow, trace_step

matplotlib.use("Agg")
BF16, FP32 = torch.bfloat16, torch.float32


def mlp_step(region):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    return trace_step(model, x, y, region)


def test_the_steps_of_a_bf16_step_are_torchs():
    ours = mlp_step(lambda: ampteach.autocast("cpu", dtype=BF16))
    assert ours == mlp_step(lambda: torch.autocast("cpu", dtype=BF16))
    forward = [(s.label, s.output) for s in ours if s.phase == "forward"]
    assert forward == [("cast b1", BF16), ("cast W1", BF16), ("cast x", BF16), ("linear", BF16), ("ReLU", BF16),
                       ("cast b2", BF16), ("cast W2", BF16), ("linear", BF16), ("cast to fp32", FP32),
                       ("log_softmax", FP32), ("NLL loss", FP32)]
    backward = [s.label for s in ours if s.phase == "backward"]
    assert {"-> W1.grad", "-> b1.grad", "-> W2.grad", "-> b2.grad"} <= set(backward)
    assert all(s.output == FP32 for s in ours if s.label.startswith("-> "))   # fp32 parameters, fp32 gradients


def test_without_autocast_everything_is_fp32_and_there_are_no_casts():
    import contextlib

    steps = mlp_step(contextlib.nullcontext)
    assert {s.output for s in steps} == {FP32}
    assert not [s for s in steps if s.label.startswith(("cast", "->"))]


def test_the_figure_has_a_box_per_step():
    steps = [FlowStep("forward", "linear", (BF16,), BF16), FlowStep("backward", "grad matmul", (BF16,), BF16),
             FlowStep("backward", "-> W1.grad", (BF16,), FP32)]
    fig = plot_dtype_flow(steps, "title")
    assert len(fig.axes[0].patches) == 3
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["bfloat16", "float32"]
