"""ampteach: mixed-precision training in PyTorch, rebuilt from scratch and checked against torch.amp.

    import ampteach
    scaler = ampteach.GradScaler("cpu")              # drop-in for torch.amp.GradScaler
    with ampteach.autocast("cpu", dtype=torch.bfloat16):   # drop-in for torch.autocast
        loss = model(x).float().pow(2).mean()

Names are imported on first use (PEP 562), so `ampteach doctor` starts fast and a lesson pays only
for what it uses. The table below is also a map of the library: name -> the module that teaches it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # data and models (foundation)
    "load_fashion_mnist": "data",
    "course_split": "data",
    "preload": "data",
    "FashionMNIST": "data",
    "DatasetNotFoundError": "data",
    "DataFileError": "data",
    "seed_everything": "seeding",
    "mlp": "models",
    "cnn": "models",
    "train": "train",
    "evaluate": "train",
    "TrainConfig": "train",
    "History": "train",
    # lesson 1: float formats
    "FORMATS": "formats",
    "round_to_format": "formats",
    "encode": "formats",
    "decode": "formats",
    "FloatFormat": "formats",
    "round_to_bf16": "formats",
    "ulp": "formats",
    "grid_near": "formats",
    "bit_string": "formats",
    "format_table": "formats",
    "like_torch": "formats",
    # lesson 2: loss scaling
    "GradScaler": "scaler",
    "StaticLossScaler": "scaler",
    "OptState": "scaler",
    # lesson 3: master weights
    "MasterWeights": "master",
    "to_half": "master",
    # lesson 4: autocast
    "autocast": "autocast",
    "custom_fwd": "autocast",
    "custom_bwd": "autocast",
    # lesson 5: recipes, checkpoints, scale-out
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
}

_SUBMODULES = (
    "autocast", "bench", "cast_lists", "checkpoint", "checks", "cli", "data", "distributed", "doctor",
    "formats", "grade", "master", "memory", "models", "reference", "scaler", "seeding", "train",
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ampteach' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


# A function named like its own module must be bound now: importing the submodule (which any other
# module may do) sets the package attribute to the module, and __getattr__ is then never asked.
from .train import train  # noqa: E402
from .autocast import autocast  # noqa: E402
