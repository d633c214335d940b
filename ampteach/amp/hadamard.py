"""The random Hadamard transform (RHT) of NVFP4 training: rotate 16 values at a time before quantizing.

    from ampteach.amp.hadamard import hadamard_matrix, random_signs, rht_matrix, rht, inverse_rht
    H = rht_matrix(random_signs(16, seed=0))       # (1 / sqrt(16)) * diag(signs) @ H16: orthogonal, H @ H.T = I
    y = rht(x, H)                                  # every 16 consecutive values along the last dim times H
    x_back = inverse_rht(y, H)                     # times H.T: x again (to float32 rounding)
    (rht(a, H) @ rht(b, H).T) == a @ b.T           # up to rounding: both operands rotated, the product is not

H16 is Sylvester's Hadamard matrix, H1 = [1], H2d = [[Hd, Hd], [Hd, -Hd]]: entries +-1, H16 @ H16.T = 16 I.
Scaled by 1 / sqrt(16) = 1/4 it is orthogonal, and every entry (+-1/4) and every product of two rows is exact
in float32. The signs flip rows of H16 (the NVFP4 paper, arXiv:2509.25149, appendix C: H = S_d H_d); one
seeded sign vector serves every layer for the whole run, as the paper and Transformer Engine do.

A rotation spreads a block's outlier over all 16 values: [16, 0, ..., 0] becomes 16 values of +-4, so the
block's scale no longer has to stretch over one large value and many small ones. NVFP4 training applies it to
the two inputs of the weight-gradient matmul only, grad_W = g.T @ x, along the token dimension they share;
the rotations cancel in the product (H @ H.T = I) and only the quantization in between sees them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["hadamard_matrix", "random_signs", "rht_matrix", "rht", "inverse_rht"]


def hadamard_matrix(d: int = 16) -> Tensor:
    """Sylvester's d x d Hadamard matrix (float32, entries +-1, d a power of two): H @ H.T = d I."""
    if not (isinstance(d, int) and d >= 1 and d & (d - 1) == 0):
        raise ValueError(f"d must be a power of two (Sylvester's construction doubles 1 -> 2 -> 4 ...), got {d!r}")
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_signs(d: int = 16, seed: int = 0) -> Tensor:
    """d random +-1 (float32) from a torch.Generator seeded with seed: the sign vector S of the RHT."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (d,), generator=g).float().mul_(2).sub_(1)


def rht_matrix(signs: Tensor | None = None, d: int | None = None) -> Tensor:
    """H = diag(signs) @ H_d / sqrt(d) (float32): orthogonal; signs=None gives the plain normalized Hadamard."""
    d = d if d is not None else (16 if signs is None else signs.numel())
    h = hadamard_matrix(d) / math.sqrt(d)
    return h if signs is None else signs.reshape(d, 1) * h


def rht(x: Tensor, H: Tensor) -> Tensor:
    """x' = x H, applied to every d consecutive values along the last dim (float32; the last dim a multiple of d)."""
    d = H.shape[0]
    if x.shape[-1] % d:
        raise ValueError(f"the last dim ({x.shape[-1]}) must be a multiple of the transform's size {d}; pad with "
                         "zeros first (they change no dot product)")
    return (x.float().reshape(-1, d) @ H.to(x.device)).reshape(x.shape)


def inverse_rht(y: Tensor, H: Tensor) -> Tensor:
    """x = y H.T: undoes rht (H is orthogonal)."""
    return rht(y, H.t())
