"""Op cases for comparing autocasts: one call per op family, built on a device with inputs of a dtype.

    for case in OP_CASES:                              # matmul, convolution, softmax, losses, promote, out=, ...
        out = case.call("cpu", torch.bfloat16)         # run it (inside a region: what dtype comes out?)

ampteach.lab.compare_torch runs every case under torch.autocast and ampteach.autocast (op_agreement).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["OP_CASES", "OpCase"]



@dataclass(frozen=True)
class OpCase:
    """`call(device, dtype)` runs one op with floating inputs of `dtype` (where the case lets it)."""

    family: str
    label: str
    call: Callable[[str, torch.dtype], torch.Tensor]


def _r(device: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Values in [0.5, 1.5): valid input for log, rsqrt, erfinv of (x - 1), probabilities after scaling."""
    return (torch.rand(*shape, device=device) + 0.5).to(dtype)


def _labels(device: str, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=device)


def _mha(d: str, t: torch.dtype) -> torch.Tensor:
    q, k, v = _r(d, t, 3, 2, 8), _r(d, t, 3, 2, 8), _r(d, t, 3, 2, 8)   # three tensors: no packed path
    out, _ = F.multi_head_attention_forward(q, k, v, 8, 2, _r(d, t, 24, 8), _r(d, t, 24), None, None, False, 0.0,
                                            _r(d, t, 8, 8), _r(d, t, 8), training=False, need_weights=False)
    return out


def _out(d: str, t: torch.dtype, op: Callable, *args) -> torch.Tensor:
    result = torch.empty(0, device=d, dtype=t)
    op(*args, out=result)
    return result


def _inplace(t_: torch.Tensor, method: str, *args) -> torch.Tensor:
    getattr(t_, method)(*args)
    return t_


def _case_list() -> list[OpCase]:
    r, lab = _r, _labels
    f32, f64 = torch.float32, torch.float64
    cases = {
        "matmul": {
            "torch.mm": lambda d, t: torch.mm(r(d, t, 4, 4), r(d, t, 4, 4)),
            "a @ b": lambda d, t: r(d, t, 4, 4) @ r(d, t, 4, 4),
            "torch.bmm": lambda d, t: torch.bmm(r(d, t, 2, 4, 4), r(d, t, 2, 4, 4)),
            "torch.addmm": lambda d, t: torch.addmm(r(d, t, 4), r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.baddbmm": lambda d, t: torch.baddbmm(r(d, t, 2, 4, 4), r(d, t, 2, 4, 4), r(d, t, 2, 4, 4)),
            "F.linear": lambda d, t: F.linear(r(d, t, 2, 4), r(d, t, 3, 4), r(d, t, 3)),
            "torch.einsum('ij,jk')": lambda d, t: torch.einsum("ij,jk->ik", r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.einsum('ij,ij->ij')": lambda d, t: torch.einsum("ij,ij->ij", r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.mv": lambda d, t: torch.mv(r(d, t, 4, 4), r(d, t, 4)),
            "torch.linalg.vecdot": lambda d, t: torch.linalg.vecdot(r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.tensordot": lambda d, t: torch.tensordot(r(d, t, 2, 4), r(d, t, 4, 3), dims=1),
        },
        "convolution": {
            "F.conv1d": lambda d, t: F.conv1d(r(d, t, 1, 2, 8), r(d, t, 3, 2, 3)),
            "F.conv2d": lambda d, t: F.conv2d(r(d, t, 1, 2, 6, 6), r(d, t, 3, 2, 3, 3), r(d, t, 3)),
            "F.conv2d(padding='same')": lambda d, t: F.conv2d(r(d, t, 1, 2, 6, 6), r(d, t, 3, 2, 3, 3), padding="same"),
            "F.conv3d": lambda d, t: F.conv3d(r(d, t, 1, 1, 4, 4, 4), r(d, t, 2, 1, 3, 3, 3)),
            "F.conv_transpose2d": lambda d, t: F.conv_transpose2d(r(d, t, 1, 2, 4, 4), r(d, t, 2, 3, 3, 3)),
            "F.prelu": lambda d, t: F.prelu(r(d, t, 2, 4), r(d, t, 1)),
        },
        "attention": {
            "F.scaled_dot_product_attention": lambda d, t: F.scaled_dot_product_attention(
                r(d, t, 1, 2, 4, 8), r(d, t, 1, 2, 4, 8), r(d, t, 1, 2, 4, 8)),
            "F.multi_head_attention_forward": _mha,
        },
        "pooling and padding": {
            "F.max_pool2d": lambda d, t: F.max_pool2d(r(d, t, 1, 1, 4, 4), 2),
            "F.max_pool3d": lambda d, t: F.max_pool3d(r(d, t, 1, 1, 4, 4, 4), 2),
            "F.max_pool3d(return_indices=True)":
                lambda d, t: F.max_pool3d(r(d, t, 1, 1, 4, 4, 4), 2, return_indices=True)[0],
            "F.avg_pool3d": lambda d, t: F.avg_pool3d(r(d, t, 1, 1, 4, 4, 4), 2),
            "F.pad(mode='reflect')": lambda d, t: F.pad(r(d, t, 1, 2, 4, 4), (1, 1, 1, 1), mode="reflect"),
            "F.pad(mode='constant')": lambda d, t: F.pad(r(d, t, 1, 2, 4, 4), (1, 1, 1, 1)),
            "F.interpolate(mode='bilinear')":
                lambda d, t: F.interpolate(r(d, t, 1, 1, 4, 4), scale_factor=2, mode="bilinear"),
        },
        "norm": {
            "F.layer_norm": lambda d, t: F.layer_norm(r(d, t, 2, 8), (8,), r(d, f32, 8), r(d, f32, 8)),
            "F.group_norm": lambda d, t: F.group_norm(r(d, t, 2, 4, 3), 2),
            "F.rms_norm": lambda d, t: F.rms_norm(r(d, t, 2, 8), (8,)),
            "F.batch_norm": lambda d, t: F.batch_norm(r(d, t, 2, 3, 4), r(d, f32, 3), r(d, f32, 3)),
            "F.normalize": lambda d, t: F.normalize(r(d, t, 4, 4)),
            "torch.norm": lambda d, t: torch.norm(r(d, t, 4, 4)),
            "torch.linalg.vector_norm": lambda d, t: torch.linalg.vector_norm(r(d, t, 8)),
        },
        "softmax": {
            "torch.softmax": lambda d, t: torch.softmax(r(d, t, 4, 4), 1),
            "F.log_softmax": lambda d, t: F.log_softmax(r(d, t, 4, 4), dim=1),
            "F.softmin": lambda d, t: F.softmin(r(d, t, 4, 4), dim=1),
        },
        "pointwise": {
            "torch.exp": lambda d, t: torch.exp(r(d, t, 8)),
            "torch.log": lambda d, t: torch.log(r(d, t, 8)),
            "x ** 2": lambda d, t: r(d, t, 8) ** 2,
            "torch.rsqrt": lambda d, t: torch.rsqrt(r(d, t, 8)),
            "torch.reciprocal": lambda d, t: torch.reciprocal(r(d, t, 8)),
            "torch.erfinv": lambda d, t: torch.erfinv(r(d, t, 8) - 1),
            "torch.tan": lambda d, t: torch.tan(r(d, t, 8)),
            "F.softplus": lambda d, t: F.softplus(r(d, t, 8)),
            "torch.sigmoid": lambda d, t: torch.sigmoid(r(d, t, 8)),
            "torch.tanh": lambda d, t: torch.tanh(r(d, t, 8)),
            "F.relu": lambda d, t: F.relu(r(d, t, 8)),
            "F.gelu": lambda d, t: F.gelu(r(d, t, 8)),
            "x + y (t + fp32)": lambda d, t: r(d, t, 8) + r(d, f32, 8),
        },
        "reduction": {
            "torch.sum": lambda d, t: torch.sum(r(d, t, 8)),
            "x.sum(dim=1)": lambda d, t: r(d, t, 4, 4).sum(dim=1),
            "torch.mean": lambda d, t: torch.mean(r(d, t, 8)),
            "torch.prod": lambda d, t: torch.prod(r(d, t, 8)),
            "torch.cumsum": lambda d, t: torch.cumsum(r(d, t, 8), 0),
            "torch.logsumexp": lambda d, t: torch.logsumexp(r(d, t, 4, 4), 1),
            "torch.amax": lambda d, t: torch.amax(r(d, t, 4, 4), 1),
        },
        "loss": {
            "F.cross_entropy": lambda d, t: F.cross_entropy(r(d, t, 4, 5), lab(d, 4, 5)),
            "F.nll_loss": lambda d, t: F.nll_loss(r(d, t, 4, 5), lab(d, 4, 5)),
            "F.mse_loss": lambda d, t: F.mse_loss(r(d, t, 8), r(d, t, 8)),
            "F.l1_loss": lambda d, t: F.l1_loss(r(d, t, 8), r(d, t, 8)),
            "F.smooth_l1_loss": lambda d, t: F.smooth_l1_loss(r(d, t, 8), r(d, t, 8)),
            "F.kl_div": lambda d, t: F.kl_div(r(d, t, 4, 4), r(d, t, 4, 4), reduction="batchmean"),
            "F.binary_cross_entropy_with_logits":
                lambda d, t: F.binary_cross_entropy_with_logits(r(d, t, 8), r(d, t, 8) - 0.5),
            "F.binary_cross_entropy": lambda d, t: F.binary_cross_entropy(r(d, t, 8) - 0.5, r(d, t, 8) - 0.5),
        },
        "promote": {
            "torch.cat([t, fp32])": lambda d, t: torch.cat([r(d, t, 4), r(d, f32, 4)]),
            "torch.stack([t, t])": lambda d, t: torch.stack([r(d, t, 4), r(d, t, 4)]),
            "torch.addcmul(t, t, fp32)": lambda d, t: torch.addcmul(r(d, t, 4), r(d, t, 4), r(d, f32, 4)),
            "torch.atan2(t, fp32)": lambda d, t: torch.atan2(r(d, t, 4), r(d, f32, 4)),
            "torch.dot(t, fp32)": lambda d, t: torch.dot(r(d, t, 4), r(d, f32, 4)),
            "torch.index_put(t, idx, fp32)": lambda d, t: torch.index_put(r(d, t, 4), (lab(d, 1, 4),), r(d, f32, 1)),
            "torch.scatter_add(t, 0, idx, fp32)":
                lambda d, t: torch.scatter_add(r(d, t, 4), 0, lab(d, 1, 4), r(d, f32, 1)),
        },
        "fp64 and integers": {
            "torch.mm(fp64, fp64)": lambda d, t: torch.mm(r(d, f64, 4, 4), r(d, f64, 4, 4)),
            "torch.exp(fp64)": lambda d, t: torch.exp(r(d, f64, 4)),
            "torch.softmax(fp64)": lambda d, t: torch.softmax(r(d, f64, 4, 4), 1),
            "torch.sum(int64)": lambda d, t: torch.sum(lab(d, 8, 5)),
            "torch.cat([int64, t])": lambda d, t: torch.cat([lab(d, 4, 5), r(d, t, 4)]),
            "F.linear(fp64 x, t weight)": lambda d, t: F.linear(r(d, f64, 2, 4), r(d, t, 3, 4)),
        },
        "explicit dtype": {
            "torch.softmax(x, 1, dtype=float16)": lambda d, t: torch.softmax(r(d, t, 4, 4), 1, dtype=torch.float16),
            "torch.sum(x, dtype=bfloat16)": lambda d, t: torch.sum(r(d, t, 8), dtype=torch.bfloat16),
            "torch.cumsum(x, 0, dtype=float64)": lambda d, t: torch.cumsum(r(d, t, 8), 0, dtype=f64),
            "torch.prod(x, dtype=bfloat16)": lambda d, t: torch.prod(r(d, t, 8), dtype=torch.bfloat16),
        },
        "out=": {
            "torch.mm(a, b, out=c)": lambda d, t: _out(d, t, torch.mm, r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.exp(x, out=y)": lambda d, t: _out(d, t, torch.exp, r(d, t, 8)),
            "torch.sum(x, 0, out=y)": lambda d, t: _out(d, t, torch.sum, r(d, t, 4, 4), 0),
        },
        "torch.ops.aten": {
            "torch.ops.aten.mm": lambda d, t: torch.ops.aten.mm(r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.ops.aten.softmax.int": lambda d, t: torch.ops.aten.softmax.int(r(d, t, 4, 4), 1),
            "torch.ops.aten.mm.out": lambda d, t: _out(d, t, torch.ops.aten.mm.out, r(d, t, 4, 4), r(d, t, 4, 4)),
        },
        "in-place": {
            "x.exp_()": lambda d, t: _inplace(r(d, t, 8), "exp_"),
            "x.log_()": lambda d, t: _inplace(r(d, t, 8), "log_"),
            "x.add_(y)": lambda d, t: _inplace(r(d, t, 8), "add_", r(d, t, 8)),
            "F.relu(x, inplace=True)": lambda d, t: F.relu(r(d, t, 8), inplace=True),
        },
    }
    return [OpCase(family, label, call) for family, calls in cases.items() for label, call in calls.items()]


OP_CASES: tuple[OpCase, ...] = tuple(_case_list())
