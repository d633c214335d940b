"""Which kernel F.scaled_dot_product_attention ran: each CUDA backend tried in turn, and what it did.

    from ampteach.lab.sdpa_backends import backends_for, each_backend
    backends_for("cuda")        # {"flash": SDPBackend.FLASH_ATTENTION, "efficient": ..., "math": ...}
    backends_for("cpu")         # {"default": None}: the kernel torch picks on the CPU
    out = each_backend(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep), "cuda")
    # {"flash": Refused("No available kernel..."), "efficient": tensor(...), "math": tensor(...)}

SDPA picks one of several kernels for the inputs it gets: FlashAttention and the memory-efficient kernel
(tiles of queries and keys, softmax computed online, scores never stored whole) and the math path (the
formula op by op). Which one ran decides what a half-precision input meets, so on a GPU a lesson asks each
in turn (torch.nn.attention.sdpa_kernel) and reports the one that refuses the inputs, with torch's reason.
On the CPU the lesson keeps torch's own choice.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["CUDA_BACKENDS", "Refused", "attempt", "backends_for", "each_backend"]

CUDA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "math": SDPBackend.MATH}
T = TypeVar("T")


@dataclass(frozen=True)
class Refused:
    """A backend that raised for these inputs: torch's message, first line."""

    reason: str

    def __str__(self) -> str:
        return f"refused ({self.reason})"


def backends_for(device: str | torch.device) -> dict[str, SDPBackend | None]:
    """name -> backend to force: the three CUDA backends on a GPU; {"default": None} (torch's choice) elsewhere."""
    return dict(CUDA_BACKENDS) if torch.device(device).type == "cuda" else {"default": None}


def attempt(fn: Callable[[], T]) -> T | Refused:
    """fn(), or Refused where SDPA raised (with the reason torch warned of, else its error's first line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn()
        except RuntimeError as exc:
            reasons = [str(w.message) for w in caught] + [str(exc)]
            return Refused(reasons[0].strip().splitlines()[0][:160])
    for w in caught:                     # a call that ran: its warnings are not ours to swallow
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


def each_backend(fn: Callable[[], T], device: str | torch.device) -> dict[str, T | Refused]:
    """name -> fn() run with SDPA limited to that backend (backends_for(device)), or Refused where it raised."""
    results: dict[str, T | Refused] = {}
    for name, backend in backends_for(device).items():
        if backend is None:
            results[name] = attempt(fn)
        else:
            with sdpa_kernel(backend):
                results[name] = attempt(fn)
    return results
