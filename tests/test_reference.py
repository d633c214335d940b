"""The reference path: training steps through torch.amp and through ampteach agree op by op and bit for bit.

compare_training runs two copies of a model, one under torch.autocast + torch.amp.GradScaler and
one under ampteach.autocast + ampteach.GradScaler. On a CPU every step must match exactly: the same
ops cast the same way, identical logits and gradients, and the same loss-scale trajectory, including
the back-offs an overflow causes and the growth after clean steps.
"""

from __future__ import annotations

import math

import pytest
import torch

from ampteach.lab.compare_torch import (
    OP_CASES,
    _max_diff,
    agreement_rows,
    compare_training,
    dispatch_trace,
    html_table,
    op_agreement,
    torch_autocast,
)
from ampteach.training.data import course_split, load_fashion_mnist, preload
from ampteach.training.models import cnn, mlp


@pytest.fixture(scope="module")
def data():
    return preload(course_split(load_fashion_mnist()))


def test_mlp_fp16_steps_match_bit_for_bit_with_the_same_scale_trajectory(data):
    """init_scale 2**24 overflows fp16 gradients: both scalers must back off on the same steps, then grow."""
    torch.manual_seed(0)
    report = compare_training(mlp(), data.batches(32, shuffle=True, seed=0), precision="fp16", steps=6,
                              init_scale=2.0**24, growth_interval=1)
    assert report.device_type == "cpu" and len(report.steps) == 6
    assert report.ops_agree and report.bitwise
    assert report.scales_torch == report.scales_ampteach
    changes = [b / a for a, b in zip(report.scales_torch, report.scales_torch[1:])]
    assert 0.5 in changes, "an overflow backed the scale off (the test exercises skipped steps)"
    assert [s.loss_torch for s in report.steps] == [s.loss_ampteach for s in report.steps]
    assert [r.op for r in report.records_ampteach] == ["linear", "linear", "cross_entropy_loss"]
    assert report.trace_torch == report.trace_ampteach
    casts = [e for e in report.trace_ampteach if e.op == "_to_copy"]
    assert [str(e) for e in casts[:3]] == ["_to_copy(float32) -> float16"] * 3   # linear's bias, weight, input


def test_a_dispatch_trace_lists_the_calls_below_autocast():
    a = torch.rand(2, 2)
    with torch.autocast("cpu"), dispatch_trace() as trace:
        torch.relu(a @ a)
    assert [str(e) for e in trace] == ["_to_copy(float32) -> bfloat16", "_to_copy(float32) -> bfloat16",
                                       "mm(bfloat16, bfloat16) -> bfloat16", "relu(bfloat16) -> bfloat16"]


@pytest.mark.parametrize("build", [mlp, cnn], ids=["mlp", "cnn"])
def test_bf16_steps_match_bit_for_bit_without_a_scaler(build, data):
    torch.manual_seed(0)
    report = compare_training(build(), data.batches(16, shuffle=True, seed=1), precision="bf16", steps=2)
    assert report.ops_agree and report.bitwise
    assert report.scales_torch == report.scales_ampteach == [1.0, 1.0]   # disabled scalers report 1.0
    assert [r.policy for r in report.records_ampteach][-1] == "fp32"     # the loss


def test_fp32_has_nothing_to_compare(data):
    with pytest.raises(ValueError, match="fp16' or 'bf16"):
        compare_training(mlp(), data.batches(16), precision="fp32")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_training_steps_agree_on_a_real_gpu(precision, data):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    torch.manual_seed(0)
    report = compare_training(mlp(), data.batches(64, shuffle=True, seed=0), precision=precision, steps=4,
                              device="cuda")
    assert report.ops_agree
    assert report.scales_torch == report.scales_ampteach
    for step in report.steps:
        assert math.isclose(step.loss_torch, step.loss_ampteach, rel_tol=1e-3)
    # same kernels on the same inputs: expected to be 0; reported, with a tolerance for cuDNN/cuBLAS heuristics
    assert report.max_output_diff <= 1e-2 and report.max_grad_diff <= 1e-2


def test_max_diff_treats_equal_infinities_and_nans_as_equal():
    inf, nan = math.inf, math.nan
    a = torch.tensor([1.0, inf, -inf, nan])
    assert _max_diff([a], [a.clone()]) == 0.0
    assert _max_diff([a], [torch.tensor([1.5, inf, -inf, nan])]) == 0.5
    assert _max_diff([a], [torch.tensor([1.0, inf, -inf, 0.0])]) == inf
    assert _max_diff([a, None], [a, torch.ones(1)]) == 0.0


def test_torch_autocast_on_fake_cuda_restores_torchs_state():
    before = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    with torch_autocast("cuda", torch.bfloat16):
        if not torch.cuda.is_available():
            assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.bfloat16
    assert (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")) == before


def test_op_agreement_rows_and_their_table():
    cases = [c for c in OP_CASES if c.label in ("torch.mm", "torch.softmax", "F.binary_cross_entropy")]
    rows = op_agreement("cuda", torch.float16, cases=cases, fake=True)
    assert [(r.label, r.input_dtype) for r in rows] == [
        (c.label, d) for c in cases for d in (torch.float32, torch.float16)]
    cells = agreement_rows(rows)
    assert all(cell[-1] == "yes" for cell in cells)
    page = html_table(["family", "call", "input", "torch", "ampteach", "agree"], cells,
                      highlight=lambda row: row[-1] != "yes")
    assert page.count("<tr>") == 1 + len(rows) and "background" not in page
    assert "&lt;" in html_table(["x"], [["<b>"]]) and "background" in html_table(["x"], [["a"]], lambda row: True)
