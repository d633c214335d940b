"""Exercise fix_fp16_attention: attention with both matmuls in fp16 that stays finite where the naive one overflows.

    from ampteach.grading.checks import check_fp16_attention
    check_fp16_attention(attention)          # attention(q, k, v, mask=None) -> fp16, q/k/v fp16 (..., T, d)

While the learner's function runs, a dispatch mode records the input dtypes of every matmul it runs
(aten mm/bmm/baddbmm/addmm/..., however it was called) and refuses PyTorch's fused attention; the judge
(ampteach.grading.judges.fp16_attention) grades the output and that record: both matmuls in fp16, the
output fp16 and finite, zeros for a query the mask lets see nothing, and an error against float64
attention no worse than fp16 allows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.driver import watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import RefuseOps

__all__ = ["MATMULS", "WRITE_IT", "attention_case", "exact_attention", "check_fp16_attention",
           "check_fp16_attention_hidden"]

MATMULS = {"mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "dot", "vdot", "matmul", "linear",
           "_addmm_activation"}
WRITE_IT = "write the attention yourself (q @ kᵀ, scale, mask, softmax, @ v)"
REFUSED = {F.scaled_dot_product_attention: WRITE_IT, F.multi_head_attention_forward: WRITE_IT}


def _normal(gen: torch.Generator, *shape: int) -> torch.Tensor:
    u1, u2 = torch.rand(2, *shape, generator=gen, dtype=torch.float64)
    return torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)


def attention_case(B: int = 2, H: int = 2, T: int = 16, d: int = 64, outlier: float = 0.0, n_outliers: int = 2,
                   seed: int = 0, key_sign: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp16 q, k, v (B, H, T, d): N(0, 1) entries; with outlier > 0, the first n_outliers features of q hold
    outlier·U(0.5, 1.5) and those of k key_sign·outlier·U(0.5, 1.5), a different factor per token."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (_normal(gen, B, H, T, d) for _ in range(3))
    if outlier:
        q[..., :n_outliers] = outlier * (0.5 + torch.rand(B, H, T, n_outliers, generator=gen, dtype=torch.float64))
        k[..., :n_outliers] = key_sign * outlier * (0.5 + torch.rand(B, H, T, n_outliers, generator=gen,
                                                                     dtype=torch.float64))
    return q.half(), k.half(), v.half()


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """float64 softmax(q kᵀ / √d, over the keys mask allows) v; zeros for a query that may attend to nothing."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return p @ v


class Matmuls(TorchDispatchMode):
    """Records the input dtypes of every matmul-like aten op; refuses the fused attention kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[str]]] = []
        self.refuse = RefuseOps(REFUSED)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
            raise CheckFailed(f"your code called {name}: {WRITE_IT}")
        if name in MATMULS:
            self.calls.append((name, [str(a.dtype).removeprefix("torch.") for a in args
                                      if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.refuse.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.refuse.__exit__(*exc)

    def report(self) -> list:
        return self.calls


@watch("fp16_attention")
def watched_matmuls(who: str) -> Matmuls:
    return Matmuls()


def check_fp16_attention(attention) -> None:
    """fn(q, k, v, mask=None): fp16 attention, graded on several cases, one of them with a query the mask lets see
    nothing: its matmuls run in fp16, its output is fp16, finite and zero where a query sees nothing, and its error
    against exact attention is no worse than fp16 allows."""
    run_judge("check_fp16_attention", attention)


def check_fp16_attention_hidden(attention) -> None:
    """Cases the exercise does not show, drawn each time: padding, a head size whose 1/√d is not a power of two,
    scores near 65504, no batch dimensions."""
    run_judge("check_fp16_attention_hidden", attention)
