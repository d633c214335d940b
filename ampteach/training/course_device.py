"""The one switch that moves the course onto a GPU: AMPTEACH_DEVICE=cpu|cuda|auto, read in every lesson's first cell.

    device = ampteach.course_device()          # cpu unless AMPTEACH_DEVICE says otherwise
    data = preload(course_split(load_fashion_mnist()), device=device)
    here = cpu_only("AVX512-BF16 is a CPU feature")   # a cell whose claim is about the CPU: it stays there
    if gpu_skips("the CPU's fp16 matmul is slower than fp32"): ...   # a check of a CPU-only fact, said why

AMPTEACH_DEVICE:
    cpu   (the default) every lesson runs on the CPU, as its stored outputs did: strict nbval and the
          website show these;
    cuda  every lesson runs its GPU path: it trains on the GPU, runs autocast's real CUDA lists on real
          tensors, times with synchronisation; an error where torch sees no GPU;
    auto  the GPU when torch sees one, else the CPU.
A cell whose claim is about the CPU (its kernels, its flags, its rounding) keeps the CPU and says so
(`cpu_only`); a check of such a claim skips on a GPU and says why (`gpu_skips`).
"""

from __future__ import annotations

import os

import torch

__all__ = ["ENV", "CHOICES", "course_device", "cpu_only", "gpu_skips", "on_gpu"]

ENV = "AMPTEACH_DEVICE"
CHOICES = ("cpu", "cuda", "auto")


def course_device() -> torch.device:
    """The device the lessons run on: AMPTEACH_DEVICE (cpu, cuda or auto; cpu when unset)."""
    value = os.environ.get(ENV, "").strip().lower() or "cpu"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: set it to cpu (the default), cuda or auto, e.g. "
                         f"`export {ENV}=auto` before you start JupyterLab")
    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cuda" and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise RuntimeError(f"{ENV}=cuda, but torch sees no GPU here (torch {torch.__version__}, {built}): unset "
                           f"{ENV} to run the lessons on the CPU, or set {ENV}=auto to take a GPU only where there "
                           f"is one; for a GPU, install a CUDA build of torch (pytorch.org) on a machine with an "
                           f"NVIDIA driver")
    return torch.device(value)


def on_gpu() -> bool:
    """Whether the lessons run on a GPU now."""
    return course_device().type == "cuda"


def cpu_only(reason: str) -> torch.device:
    """The CPU, for a cell whose claim is about the CPU; on a GPU run it prints that it stays there, and why."""
    if on_gpu():
        print(f"This cell runs on the CPU, also with {ENV}={os.environ.get(ENV)}: {reason}.")
    return torch.device("cpu")


def gpu_skips(reason: str) -> bool:
    """True (and says why) when a check of a CPU-only fact should not run: the lessons run on a GPU."""
    if on_gpu():
        print(f"Skipped on the GPU: {reason}.")
        return True
    return False
