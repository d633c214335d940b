"""Judge of fix_fp16_attention: the learner's fp16 attention on cases where q @ kᵀ overflows fp16 before the scale.

    @judge("check_fp16_attention")          # outliers of size 200 and 250, causal and no mask, a fully masked query
    @judge("check_fp16_attention_hidden")   # padding, d = 48, scores near 65,504, no batch dims: drawn each time

Graded on: its matmuls (the learner's process records every matmul's input dtypes: all fp16, at least
two; the fused attention is refused); its output (fp16, the shape of v's rows, finite, zeros for a
query the mask lets see nothing); its accuracy (the relative error against float64 attention of the
same fp16 inputs at most 3 x that of careful fp16 implementations + 0.005).
"""

from __future__ import annotations

import math
import random

import torch

from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.checks.fp16_attention import attention_case, exact_attention
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

FP16_MAX = 65504.0


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


def _rel(out: torch.Tensor, exact: torch.Tensor, rows: torch.Tensor) -> float:
    diff, ref = (out.double() - exact)[rows], exact[rows]
    return (diff.norm() / ref.norm()).item()


def _grade(learner: Learner, fn: Ref, case: str, q, k, v, mask) -> float:
    out = learner.call(fn, q.clone(), k.clone(), v.clone(), None if mask is None else mask.clone(),
                       watch="fp16_attention")
    calls = learner.last_report or []
    if not isinstance(out, torch.Tensor) or out.shape != v.shape[:-2] + (q.size(-2), v.size(-1)):
        what = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else describe(out)
        raise CheckFailed(f"{case}: expected a tensor of shape {tuple(q.shape[:-1]) + (v.size(-1),)}, got {what}")
    if out.dtype != torch.float16:
        raise CheckFailed(f"{case}: the output should stay fp16 (like q, k and v), got {short(out.dtype)}")
    if len(calls) < 2:
        raise CheckFailed(f"{case}: your function ran {len(calls)} matmul(s); attention takes two, q @ kᵀ and "
                          f"p @ v (write them with @ or torch.matmul)")
    wide = [(name, dtypes) for name, dtypes in calls if any(t != "float16" for t in dtypes)]
    if wide:
        name, dtypes = wide[0]
        raise CheckFailed(f"{case}: a matmul ({name}) ran on {', '.join(dtypes)} inputs; keep both "
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


def _padded(T: int, pad: int, batch: int = 2) -> torch.Tensor:
    """A causal mask (batch, 1, T, T) where sequence 0 starts with `pad` padding tokens no query may attend to:
    its first `pad` queries then see nothing."""
    mask = _causal(T)[None, None].repeat(batch, 1, 1, 1)
    mask[0, 0, :, :pad] = False
    return mask


Case = tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def visible_cases(seed: int = 0) -> list[Case]:
    """(name, (q, k, v), mask) of the cases the exercise shows (seed 0: the exercise's own draws)."""
    return [
        ("small activations, causal mask", attention_case(seed=seed + 1), _causal(16)),
        ("outlier features of size 200, causal mask", attention_case(outlier=200.0, seed=seed + 2), _causal(16)),
        ("outlier features of size 250, no mask", attention_case(outlier=250.0, seed=seed + 3), None),
        ("two padding tokens: queries the mask lets see nothing", attention_case(outlier=220.0, seed=seed + 8),
         _padded(16, 2)),
    ]


def hidden_cases(rng: random.Random) -> list[Case]:
    """The cases `ampteach grade` adds, drawn each time: padding, a head size whose 1/√d is not a power of two,
    scores near 65504, no batch dimensions."""
    T, seed = 16, rng.randrange(1 << 30)
    pad = rng.randint(1, 5)
    top = rng.uniform(300.0, 325.0)
    return [
        (f"left padding ({pad} tokens): queries that may attend to nothing, scores far below -16",
         attention_case(outlier=rng.uniform(20.0, 40.0), key_sign=-1.0, seed=seed), _padded(T, pad)),
        ("head size 48 (1/√d is not a power of two), outliers of size 180",
         attention_case(d=48, outlier=rng.uniform(160.0, 190.0), seed=seed + 1), _causal(T)),
        ("scaled scores up to about 50,000 (fp16's largest number is 65,504)",
         attention_case(outlier=top, seed=seed + 2), _causal(T)),
        ("one head, no batch dimensions, mask given as (T, T)",
         tuple(t[0, 0] for t in attention_case(outlier=rng.uniform(170.0, 200.0), seed=seed + 3)), _causal(T)),
    ]


@judge("check_fp16_attention")
def check_fp16_attention(learner: Learner, fn: Ref) -> str:
    cases = visible_cases(learner.seed(0))
    errors = [_grade(learner, fn, case, q, k, v, mask) for case, (q, k, v), mask in cases]
    return (f"{len(cases)} cases, fp16 matmuls, finite where q @ kᵀ overflows fp16, zeros where a query sees "
            f"nothing; largest relative error {max(errors):.1e}")


@judge("check_fp16_attention_hidden")
def check_fp16_attention_hidden(learner: Learner, fn: Ref) -> str:
    cases = hidden_cases(learner.rng)
    for case, (q, k, v), mask in cases:
        _grade(learner, fn, case, q, k, v, mask)
    return f"{len(cases)} more cases: padding, d = 48, scores near the fp16 limit, no batch dimensions"
