"""torch.amp and ampteach side by side: the pairs of drop-ins, one starting model, bit-for-bit comparison.

    for impl, (autocast, GradScaler) in IMPLEMENTATIONS.items():     # the same recipe, run twice
        model = fresh_mlp()                                           # the same initial weights each time
        ...
    same_weights(model_a, model_b)              # every parameter equal, bit for bit
    first_difference(state_a, state_b)          # None, or where two checkpoints (nested data) differ

Lessons 5 and 6 run every recipe through both implementations; "identical" there means torch.equal
on every tensor (and equal dtypes), never allclose.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ampteach.amp.autocast import autocast, custom_bwd, custom_fwd
from ampteach.amp.scaler import GradScaler
from ampteach.lab.compare_torch import TorchAutocast
from ampteach.training.models import mlp

__all__ = ["CUSTOM_FUNCTIONS", "IMPLEMENTATIONS", "first_difference", "fresh_mlp", "same_state", "same_weights"]

# name -> (autocast, GradScaler): call them the same way, autocast("cpu", dtype=...), GradScaler("cpu", ...).
# torch's side is torch.autocast on torch's own C++ kernels (TorchAutocast): ampteach's, once registered,
# serve torch.autocast regions too, and a comparison of ampteach with itself would prove nothing.
IMPLEMENTATIONS = {
    "torch.amp": (TorchAutocast, torch.amp.GradScaler),
    "ampteach": (autocast, GradScaler),
}

# name -> (autocast, custom_fwd, custom_bwd) for custom autograd functions
CUSTOM_FUNCTIONS = {
    "torch.amp": (TorchAutocast, torch.amp.custom_fwd, torch.amp.custom_bwd),
    "ampteach": (autocast, custom_fwd, custom_bwd),
}


def fresh_mlp(hidden: tuple[int, ...] = (64,), seed: int = 0, device: torch.device | str = "cpu") -> nn.Sequential:
    """The course MLP (ampteach.mlp) with the same initial weights for the same seed, every time, on `device`
    (initialised on the CPU, then moved: the same weights on every device)."""
    torch.manual_seed(seed)
    return mlp(hidden).to(device)


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    """True if the two models' parameters are equal bit for bit (and of the same dtypes)."""
    pa, pb = list(a.parameters()), list(b.parameters())
    return len(pa) == len(pb) and all(p.dtype == q.dtype and torch.equal(p, q) for p, q in zip(pa, pb))


def first_difference(a, b, where: str = "state") -> str | None:
    """Where two nested states (checkpoints, state_dicts) first differ, or None if equal bit for bit.

    Tensors compare with torch.equal and dtype, containers entry by entry, floats with NaN == NaN.
    """
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        return None if a.dtype == b.dtype and torch.equal(a, b) else f"{where}: tensors differ"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        return next((d for k in a if (d := first_difference(a[k], b[k], f"{where}[{k!r}]"))), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: lengths {len(a)} != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{where}[{i}]"))),
                    None)
    if isinstance(a, float) and math.isnan(a):
        return None if math.isnan(b) else f"{where}: nan != {b!r}"
    return None if a == b else f"{where}: {a!r} != {b!r}"


def same_state(a, b) -> bool:
    """True if two nested states are equal bit for bit (see first_difference)."""
    return first_difference(a, b) is None
