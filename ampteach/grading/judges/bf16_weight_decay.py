"""Judge of fix_bf16_weight_decay: decay_is_lost against torch.optim.AdamW, KeepDecay against exact decay.

    @judge("check_decay_is_lost"), @judge("check_decay_is_lost_hidden")   # weight by weight, against AdamW itself
    @judge("check_keep_decay"), @judge("check_keep_decay_hidden")         # within one bf16 ulp of exact decay

Weights come from torch.rand and float64 arithmetic, the same on every CPU; their seeds are fixed while a
learner works on a visible check and new under grading.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ampteach.grading.checks.bf16_weight_decay import BECAUSE
from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe
from ampteach.grading.judges.scan import refuse_uses

LIBRARY = {"MasterWeights", "grads_to_master", "master_to_model", "decay_changes", "decay_only_norms"}


def decay_weights(n: int, std: float = 0.02, seed: int = 0) -> torch.Tensor:
    """n float64 weights, normal with std `std` (GPT-2's init), from torch.rand by Box-Muller: no ISA-dependent RNG."""
    gen = torch.Generator().manual_seed(seed)
    u1, u2 = torch.rand(2, n, generator=gen, dtype=torch.float64)
    return std * torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)


def torch_decay_is_lost(w: torch.Tensor, lr: float, weight_decay: float) -> torch.Tensor:
    """True where one torch.optim.AdamW step with a zero gradient leaves the weight unchanged."""
    p = nn.Parameter(w.clone())
    p.grad = torch.zeros_like(p)
    torch.optim.AdamW([p], lr=lr, weight_decay=weight_decay).step()
    return p.detach() == w


def _special(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    return torch.tensor([0.0, -0.0, info.tiny, -info.tiny, info.smallest_normal / 4, 1.0, -1.0, 1.0 + info.eps,
                         2.0 - info.eps, 0.5, 3.0, -100.0, 1e-30, info.max], dtype=torch.float64).to(dtype)


def _grade_lost(learner: Learner, fn: Ref, case: str, w: torch.Tensor, lr: float, wd: float) -> None:
    got = learner.call(fn, w.clone(), lr, wd, watch="bf16_weight_decay")
    if not isinstance(got, torch.Tensor) or got.shape != w.shape or got.dtype != torch.bool:
        what = f"a {got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else describe(got)
        raise CheckFailed(f"{case}: expected a bool tensor of shape {tuple(w.shape)}, got {what}")
    want = torch_decay_is_lost(w, lr, wd)
    wrong = got != want
    if wrong.any():
        i = int(wrong.nonzero()[0])
        value = w[i].item()
        raise CheckFailed(f"{case}: {int(wrong.sum())} of {w.numel()} weights wrong; first: w = {value!r} "
                          f"({short(w.dtype)}), lr·wd = {lr * wd:g}: AdamW's decay step "
                          f"{'leaves it unchanged' if want[i] else 'moves it'} (w·(1 - lr·wd) = "
                          f"{w[i].double().item() * (1 - lr * wd)!r} before rounding), you said "
                          f"{'lost' if got[i] else 'not lost'}")


@judge("check_decay_is_lost")
def check_decay_is_lost(learner: Learner, fn: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    w = decay_weights(4096, seed=learner.seed(0)).to(torch.bfloat16)
    settings = [(1e-3, 0.1), (3e-4, 0.01), (1e-2, 0.2), (1e-2, 0.3), (1e-2, 0.5), (0.1, 0.1)]
    for lr, wd in settings:
        _grade_lost(learner, fn, f"4,096 bf16 weights (std 0.02), lr = {lr:g}, weight_decay = {wd:g}", w, lr, wd)
    _grade_lost(learner, fn, "bf16 zeros, subnormals, powers of two and the largest, lr·wd = 2^-9",
                _special(torch.bfloat16), 2.0**-9, 1.0)
    return f"{len(settings)} settings of lr·wd from 3e-6 to 1e-2, weight by weight against torch.optim.AdamW"


@judge("check_decay_is_lost_hidden")
def check_decay_is_lost_hidden(learner: Learner, fn: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    w = torch.cat([_special(torch.bfloat16), decay_weights(2048, std=1.0, seed=learner.seed(1)).to(torch.bfloat16)])
    settings = (2.0**-9, 2.0**-8, 2.0**-9 * 1.0001, 2.0**-10, 0.25)
    for lr_wd in settings:
        _grade_lost(learner, fn, f"bf16 weights incl. 0, subnormals, powers of two and the largest, lr·wd = {lr_wd:g}",
                    w, lr_wd, 1.0)
    return f"special values at {len(settings)} settings of lr·wd around 2^-9 and 2^-8"


def _grade_keeper(learner: Learner, cls: Ref, case: str, weights: list[torch.Tensor], lr: float, wd: float,
                  steps: int) -> None:
    start = [w.to(torch.bfloat16).double() for w in weights]
    got = learner.plan("bf16_weight_decay.keeper", {"cls": cls}, weights, lr, wd, steps)
    params = got["params"]
    if not got["same"] or len(params) != len(start) or any(p.shape != w.shape for p, w in zip(params, start)):
        raise CheckFailed(f"{case}: the parameters must stay the same bf16 tensors (update them in place, e.g. with "
                          f"p.copy_(...)); keep any fp32 copies beside them")
    factor = (1 - lr * wd) ** steps
    for i, (p, w0) in enumerate(zip(params, start)):
        exact = w0 * factor
        ulp = torch.where(exact == 0, torch.zeros_like(exact),
                          torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**-126))) - 7))
        off = (p.detach().double() - exact).abs() > ulp
        if off.any():
            flat_p, flat_e, flat_0 = p.detach().flatten(), exact.flatten(), w0.flatten()
            j = int(off.flatten().nonzero()[0])
            raise CheckFailed(f"{case}: parameter {i}, {int(off.sum())} of {p.numel()} weights more than one bf16 ulp "
                              f"from w0·(1 - lr·wd)^{steps}; first: w0 = {flat_0[j].item():.6g}, exact "
                              f"{flat_e[j].item():.6g}, yours {flat_p[j].item():.6g} (exact ratio {factor:.5f}). "
                              f"Is the decay rounded away in bf16 at every step, or does rounding drift add up? "
                              f"Whatever keeps what rounding drops must itself grow by lr·wd·w at every step")


@judge("check_keep_decay")
def check_keep_decay(learner: Learner, cls: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    base = learner.seed(2)
    weights = [decay_weights(1024, seed=base), decay_weights(64 * 32, seed=base + 1).reshape(64, 32),
               torch.cat([decay_weights(7, seed=base + 2), torch.tensor([0.0, -0.0, 1e-30], dtype=torch.float64)])]
    _grade_keeper(learner, cls, "lr 1e-3, weight_decay 0.1, 1,000 steps (exact: x 0.905)", weights, 1e-3, 0.1, 1000)
    return "3 bf16 parameters decay as in exact arithmetic over 1,000 steps, within one bf16 ulp"


@judge("check_keep_decay_hidden")
def check_keep_decay_hidden(learner: Learner, cls: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    base = learner.seed(5)
    mixed = torch.cat([decay_weights(500, std=3.0, seed=base), torch.tensor([0.0, -0.0, 1e-30, 2.0**-120, -7.0, 300.0],
                                                                            dtype=torch.float64)])
    cases = [("lr 1e-2, weight_decay 0.5 (lr·wd above 2^-8), 300 steps", [mixed], 1e-2, 0.5, 300),
             ("lr 3e-4, weight_decay 0.01, 3,000 steps", [decay_weights(256, seed=base + 1)], 3e-4, 0.01, 3000),
             ("lr 1e-3, weight_decay 0.1, weights of mixed size and zeros, 2,000 steps", [mixed], 1e-3, 0.1, 2000)]
    for case, weights, lr, wd, steps in cases:
        _grade_keeper(learner, cls, case, weights, lr, wd, steps)
    return f"{len(cases)} more cases: lr·wd above 2^-8, 3,000 steps, zeros and tiny weights"
