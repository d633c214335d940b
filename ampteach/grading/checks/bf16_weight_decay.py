"""Exercise fix_bf16_weight_decay: find the bf16 weights AdamW's decay cannot move, then make the decay stick.

    from ampteach.grading.checks import check_decay_is_lost, check_keep_decay
    check_decay_is_lost(decay_is_lost)     # decay_is_lost(w_bf16, lr, weight_decay) -> bool tensor
    check_keep_decay(KeepDecay)            # KeepDecay(params, lr, weight_decay).step(): w <- w (1 - lr wd), kept

decay_is_lost is graded against torch.optim.AdamW itself (in the judge's process): bf16 parameters with
zero gradients, one step, weight by weight. KeepDecay runs here, in the learner's process (`run_keeper`):
many steps on bf16 parameters, then the judge checks every weight within one bf16 ulp of w0·(1 - lr·wd)^steps
computed in float64. While the learner's code runs, the course's MasterWeights (ampteach/amp/master.py) and
its bf16 optimizer demos (ampteach/lab/bf16_optimizer.py) are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from ampteach.grading.checks.common import one_thread
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, package_files

__all__ = ["BECAUSE", "run_keeper", "check_decay_is_lost", "check_decay_is_lost_hidden", "check_keep_decay",
           "check_keep_decay_hidden"]

BECAUSE = ("the exercise is to find the lost decay and keep it yourself (the course's MasterWeights and its bf16 "
           "optimizer demos do it for you: compare with them after you pass)")


def _allowed():
    from ampteach.lab.bf16_optimizer import normal_weights
    return (normal_weights,)


@watch("bf16_weight_decay")
def own_decay(who: str) -> Borrowed:
    return Borrowed(who, package_files("ampteach.amp.master", "ampteach.lab.bf16_optimizer"), BECAUSE,
                    allowed=_allowed())


@plan("bf16_weight_decay.keeper")
def run_keeper(weights: list, lr: float, wd: float, steps: int, *, cls) -> dict:
    """cls(params, lr, wd) on bf16 parameters made from `weights`, `steps` calls of .step(): the parameters after,
    and whether they are still the same bf16 tensors."""
    with one_thread():
        params = [nn.Parameter(w.to(torch.bfloat16)) for w in weights]
        ids = [id(p) for p in params]
        with own_decay(getattr(cls, "__name__", "KeepDecay")):
            keeper = cls(params, lr, wd)
            for _ in range(steps):
                keeper.step()
        same = [id(p) for p in params] == ids and all(p.dtype == torch.bfloat16 for p in params)
        return {"same": same, "params": [p.detach().clone() for p in params]}


def check_decay_is_lost(decay_is_lost) -> None:
    """fn(w, lr, weight_decay) -> bool tensor: True where one AdamW decay step leaves the bf16 weight unchanged."""
    run_judge("check_decay_is_lost", decay_is_lost)


def check_decay_is_lost_hidden(decay_is_lost) -> None:
    """Zeros, subnormals, the largest bf16 numbers, powers of two, lr·wd right at 2^-9 and 2^-8."""
    run_judge("check_decay_is_lost_hidden", decay_is_lost)


def check_keep_decay(KeepDecay) -> None:  # noqa: N803 (the exercise's class)
    """cls(params, lr, weight_decay) with .step(): after many steps every bf16 weight within one ulp of exact decay."""
    run_judge("check_keep_decay", KeepDecay)


def check_keep_decay_hidden(KeepDecay) -> None:  # noqa: N803
    """Decay rates where plain bf16 decays but drifts, weights of every size including zeros, many steps."""
    run_judge("check_keep_decay_hidden", KeepDecay)
