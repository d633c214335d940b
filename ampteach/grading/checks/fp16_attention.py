"""Exercise fix_fp16_attention: attention with both matmuls in fp16 that stays finite where the naive one overflows.

    from ampteach.grading.checks import check_fp16_attention
    check_fp16_attention(attention)          # attention(q, k, v, mask=None) -> fp16, q/k/v fp16 (..., T, d)

Each case builds fp16 q, k, v (from torch.rand and float64 arithmetic, the same on every CPU), some with
outlier features (a few features of size a, varying by token) large enough that q @ kᵀ overflows fp16 before
the 1/√d scale, though the scaled scores fit. The learner's function is graded on:
    - its matmuls: every matmul it runs (aten mm/bmm/baddbmm/addmm/...) takes fp16 inputs, at least two;
      F.scaled_dot_product_attention and F.multi_head_attention_forward are refused (the exercise is to write it);
    - its output: fp16, the shape of v's rows, finite; a query the mask lets see nothing gives zeros;
    - its accuracy: the relative error ‖out - exact‖ / ‖exact‖ (rows that see something) against float64 attention
      of the same fp16 inputs is at most 3 x that of careful fp16 implementations (q or q and k scaled before
      the matmul, mask, fp32 softmax, fp16 p @ v; the larger of the two errors) + 0.005: no worse than fp16
      allows, with room for a different order of roundings.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.grading.checks.common import CheckFailed, RefuseOps, short
from ampteach.grading.checks.common import passed as _passed

__all__ = ["attention_case", "careful_fp16_attention", "check_fp16_attention", "check_fp16_attention_hidden",
           "exact_attention", "hidden_cases", "visible_cases"]

FP16_MAX = 65504.0
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


def careful_fp16_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                           split_scale: bool = False) -> torch.Tensor:
    """A careful fp16 attention (what the exercise asks for): scale before q @ kᵀ, fp16 matmuls, fp32 softmax.

    split_scale: scale q and k by d^-1/4 each, as PyTorch's math path of scaled_dot_product_attention does,
    instead of q by d^-1/2."""
    d = q.size(-1)
    if split_scale:
        scores = (q * d ** -0.25) @ (k * d ** -0.25).transpose(-2, -1)
    else:
        scores = (q * (1.0 / math.sqrt(d))) @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores.float(), dim=-1)
    if mask is not None:
        p = p.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return p.half() @ v


class _Matmuls(TorchDispatchMode):
    """Records the input dtypes of every matmul-like aten op; refuses the fused attention kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.removeprefix("aten::")
        if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
            raise CheckFailed(f"your code called {name}: {WRITE_IT}")
        if name in MATMULS:
            self.calls.append((name, tuple(a.dtype for a in args if isinstance(a, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def _rel(out: torch.Tensor, exact: torch.Tensor, rows: torch.Tensor) -> float:
    diff, ref = (out.double() - exact)[rows], exact[rows]
    return (diff.norm() / ref.norm()).item()


def _grade(fn: Callable, case: str, q, k, v, mask) -> float:
    with _Matmuls() as seen, RefuseOps(REFUSED):
        out = fn(q.clone(), k.clone(), v.clone(), None if mask is None else mask.clone())
    if not isinstance(out, torch.Tensor) or out.shape != v.shape[:-2] + (q.size(-2), v.size(-1)):
        raise CheckFailed(f"{case}: expected a tensor of shape {tuple(q.shape[:-1]) + (v.size(-1),)}, got "
                          f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}")
    if out.dtype != torch.float16:
        raise CheckFailed(f"{case}: the output should stay fp16 (like q, k and v), got {short(out.dtype)}")
    if len(seen.calls) < 2:
        raise CheckFailed(f"{case}: your function ran {len(seen.calls)} matmul(s); attention takes two, q @ kᵀ and "
                          f"p @ v (write them with @ or torch.matmul)")
    wide = [(name, dtypes) for name, dtypes in seen.calls if any(t != torch.float16 for t in dtypes)]
    if wide:
        name, dtypes = wide[0]
        raise CheckFailed(f"{case}: a matmul ({name}) ran on {', '.join(short(t) for t in dtypes)} inputs; keep both "
                          f"matmuls in fp16 (that is where half precision saves time and memory) and make the "
                          f"scores fit instead: where does 1/√d go?")
    if not torch.isfinite(out).all():
        rows = (~torch.isfinite(out)).any(-1).sum().item()
        hint = ("a query the mask lets see nothing came out NaN: softmax over a row of -inf is NaN; give such "
                "rows zeros") if mask is not None and not mask.any(-1).all() else \
            "the scores overflowed fp16 (inf) and softmax turned them into NaN: where does 1/√d go?"
        raise CheckFailed(f"{case}: {rows} output rows are not finite; {hint}")
    seeing = torch.ones(out.shape[:-1], dtype=torch.bool) if mask is None else \
        mask.any(-1).expand(out.shape[:-1])
    if (out[~seeing] != 0).any():
        raise CheckFailed(f"{case}: a query the mask lets see nothing should give zeros (as "
                          f"F.scaled_dot_product_attention does), got {out[~seeing].abs().max().item():.3g}")
    exact = exact_attention(q, k, v, mask)
    err = _rel(out, exact, seeing)
    careful = max(_rel(careful_fp16_attention(q, k, v, mask, split), exact, seeing) for split in (False, True))
    allowed = 3 * careful + 0.005
    if not err <= allowed:
        raise CheckFailed(f"{case}: relative error {err:.3g} against exact attention; fp16 allows {allowed:.3g} "
                          f"(3 x a careful fp16 version + 0.005). Is the softmax over the right axis, the scale 1/√d?")
    return err


def _causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()


def visible_cases() -> list[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]]:
    """(name, (q, k, v), mask) of the cases the exercise shows."""
    return [
        ("small activations, causal mask", attention_case(seed=1), _causal(16)),
        ("outlier features of size 200, causal mask", attention_case(outlier=200.0, seed=2), _causal(16)),
        ("outlier features of size 250, no mask", attention_case(outlier=250.0, seed=3), None),
    ]


def hidden_cases() -> list[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor | None]]:
    """The cases `ampteach grade` adds: padding, a head size whose 1/√d is not a power of two, scores near 65504."""
    T = 16
    padded = _causal(T)[None, None].repeat(2, 1, 1, 1)
    padded[0, 0, :, :3] = False                       # sequence 0: three padding tokens on the left
    return [
        ("left padding: queries that may attend to nothing, scores far below -16",
         attention_case(outlier=30.0, key_sign=-1.0, seed=4), padded),
        ("head size 48 (1/√d is not a power of two), outliers of size 180",
         attention_case(d=48, outlier=180.0, seed=5), _causal(T)),
        ("scaled scores up to about 50,000 (fp16's largest number is 65,504)",
         attention_case(outlier=320.0, seed=6), _causal(T)),
        ("one head, no batch dimensions, mask given as (T, T)",
         tuple(t[0, 0] for t in attention_case(outlier=150.0, seed=7)), _causal(T)),
    ]


def check_fp16_attention(fn: Callable) -> None:
    """fn(q, k, v, mask=None): fp16 attention; see the module docstring for what is graded."""
    cases = visible_cases()
    errors = [_grade(fn, case, q, k, v, mask) for case, (q, k, v), mask in cases]
    _passed("check_fp16_attention", f"{len(cases)} cases, fp16 matmuls, finite where q @ kᵀ overflows fp16; largest "
            f"relative error {max(errors):.1e}")


def check_fp16_attention_hidden(fn: Callable) -> None:
    """Cases the exercise does not show: padding, a head size whose 1/√d is not a power of two, scores near 65504."""
    cases = hidden_cases()
    for case, (q, k, v), mask in cases:
        _grade(fn, case, q, k, v, mask)
    _passed("check_fp16_attention_hidden", f"{len(cases)} more cases: padding, d = 48, scores near the fp16 limit, "
            f"no batch dimensions")
