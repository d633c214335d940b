"""Kahan-compensated updates: a bf16 weight plus a bf16 compensation that keeps what rounding dropped.

    c = torch.zeros_like(w)            # bf16, one compensation value per weight
    kahan_add_(w, u, c)                # after each step: w + c = (w + c before) + u, up to one small rounding

Plain `w.add_(u)` in bf16 rounds the sum to nearest and forgets the difference: an update below half
the gap to w's neighbour (w/u beyond about 2^8) is lost every time. Kahan's compensated summation
(Kahan 1965) carries that difference over to the next step instead:

    c <- c + u           the update joins what earlier roundings left over
    t <- w
    w <- w + c           rounded to bf16: w moves once c has grown past half a gap
    c <- c + (t - w)     what that rounding left over, kept for the next step

When |c + u| <= |w| (small updates, where this matters), t - w is exact and so is c + (t - w): it is
the rounding error of w + c, which a bf16 number always holds (Fast2Sum). The only rounding left is
that of c + u, at most half a gap of c, about 2^-8 of the error that rounding w + u makes: w + c
behaves like a weight with about twice bf16's mantissa, for 2 extra bytes per parameter where an
fp32 master copy costs 4. This is the update of torchdistx's
`AnyPrecisionAdamW(use_kahan_summation=True)` (pytorch/torchdistx, with a bf16
`compensation_buffer_dtype`), also used by optimi (`kahan_sum=True`); Zamirai et al. 2020
("Revisiting BFloat16 Training", arXiv:2010.06192) compare it with stochastic rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["kahan_add_"]


@torch.no_grad()
def kahan_add_(weight: Tensor, update: Tensor, compensation: Tensor) -> Tensor:
    """kahan_add_(w, u, c): weight += update in place, the rounding error kept in compensation (weight's dtype, shape).

        c <- c + u;  t <- w;  w <- w + c;  c <- c + (t - w)

    update may be fp32 (an optimizer's result): c + u is computed in fp32 and rounded once into c.
    Returns weight. weight + compensation, summed exactly, is the running total of every update, up to
    the rounding of c + u at each step.
    """
    if compensation.dtype != weight.dtype or compensation.shape != weight.shape:
        raise ValueError(f"the compensation must match the weight ({weight.dtype}, {tuple(weight.shape)}), got "
                         f"{compensation.dtype}, {tuple(compensation.shape)}: create it as torch.zeros_like(weight)")
    compensation.add_(update)               # c + u, rounded once into c's dtype
    before = weight.clone()
    weight.add_(compensation)               # rounded to nearest: moves by whole gaps only
    compensation.add_(before.sub_(weight))  # t - w is exact; c + (t - w) is the rounding error of w + c
    return weight
