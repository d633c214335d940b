"""A training run as plain data: its settings (TrainConfig) and what it measured (History).

    config = TrainConfig(precision="fp16", impl="ampteach", epochs=2)
    history = train(model, data, config)           # ampteach.training.train
    history.test_accuracy[-1], history.scales, history.skipped
    History.from_dict(history.to_dict())           # what a checkpoint stores and reads back

Both are dataclasses of numbers, strings and lists, so a checkpoint stores them as they are and
torch.load(weights_only=True) reads them back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ampteach.amp.half_weights import ROUNDINGS

__all__ = ["FP8_RECIPES", "IMPLS", "OPTIMIZERS", "PRECISIONS", "RECIPES", "History", "TrainConfig"]

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FP8_RECIPES = ("tensorwise", "delayed", "mx")   # precision="fp8": ampteach.amp.fp8.Float8Linear, emulated
IMPLS = ("torch", "ampteach")
OPTIMIZERS = ("sgd", "adam", "adamw")
RECIPES = ("autocast", "master", "half")


@dataclass
class TrainConfig:
    """Everything one run depends on; defaults train the course MLP in seconds on a CPU.

    loss_scale (fp16 only): "dynamic" = GradScaler, a number = a static scale (the 2018 paper's
    recipe, ampteach.StaticLossScaler for either impl, since torch has none), None = no scaling.
    skip_nonfinite: when no dynamic scaler guards the step (fp32, bf16), skip any step whose loss
    or gradients are not finite, the way the scaler would.
    recipe: "autocast" (fp32 weights, autocast forward), "master" (half model + fp32 master weights,
    no autocast) or "half" (half model, half weights updated directly); see the module docstring.
    rounding (recipe "half"): how each update is written into the half weights: "nearest" (the
    optimizer steps them directly), "kahan" or "stochastic" (bf16 only): the optimizer steps fp32
    working copies made for the step and ampteach.HalfWeights writes them back with that rule.
    precision="fp8" swaps every nn.Linear for ampteach.amp.fp8.Float8Linear (fp32 weights, emulated fp8
    matmuls, no autocast, no loss scaling); fp8_recipe picks its scales: "tensorwise", "delayed" or "mx".
    """

    precision: str = "fp32"
    impl: str = "torch"
    loss_scale: str | float | None = "dynamic"
    epochs: int = 2
    batch_size: int = 128
    optimizer: str = "adamw"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    clip_norm: float | None = None
    skip_nonfinite: bool = False
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    seed: int = 0
    warmup_steps: int = 0
    record_steps: bool = True
    progress: bool = True
    recipe: str = "autocast"
    rounding: str = "nearest"
    fp8_recipe: str = "tensorwise"

    def __post_init__(self) -> None:
        if self.precision not in (*PRECISIONS, "fp8"):
            raise ValueError(f"precision must be one of {[*PRECISIONS, 'fp8']}, got {self.precision!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"fp8_recipe must be one of {FP8_RECIPES}, got {self.fp8_recipe!r}")
        if self.precision == "fp8" and self.recipe != "autocast":
            raise ValueError(f"precision='fp8' keeps fp32 weights and casts inside each Linear, so recipe must be "
                             f"'autocast' (the default), got {self.recipe!r}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be 'torch' (torch.amp) or 'ampteach' (from scratch), got {self.impl!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        static = isinstance(self.loss_scale, (int, float)) and self.loss_scale > 0
        if not (self.loss_scale in ("dynamic", None) or static):
            raise ValueError(f"loss_scale must be 'dynamic', a positive number (static) or None, "
                             f"got {self.loss_scale!r}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs} and {self.batch_size}")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.recipe != "autocast" and self.precision == "fp32":
            raise ValueError(f"recipe={self.recipe!r} halves the model, so it needs precision='fp16' or 'bf16' "
                             f"(got 'fp32'); for an fp32 run use recipe='autocast'")
        if self.recipe == "half" and self.scaling is not None:
            raise ValueError("recipe='half' with loss scaling cannot work: the scalers refuse fp16 gradients "
                             "('Attempting to unscale FP16 gradients.'). Use recipe='master' (the scaler then "
                             "unscales the fp32 master gradients), or loss_scale=None")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.rounding != "nearest" and self.recipe != "half":
            raise ValueError(f"rounding={self.rounding!r} writes each update into half weights, so it needs "
                             f"recipe='half' (got {self.recipe!r}); recipe='master' keeps fp32 master weights instead")
        if self.rounding == "stochastic" and self.precision != "bf16":
            raise ValueError(f"rounding='stochastic' rounds to bf16 (fp16 has no cheap stochastic rounding), so it "
                             f"needs precision='bf16', got {self.precision!r}; for fp16 use rounding='kahan'")

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision]

    @property
    def scaling(self) -> str | float | None:
        """How this run scales its loss: only fp16 needs it."""
        return self.loss_scale if self.precision == "fp16" else None

    @property
    def autocast_precision(self) -> str:
        """The precision autocast runs at: the run's own for recipe "autocast", else off (the model is half)."""
        if self.precision == "fp8":
            return "fp32"  # no autocast: each Float8Linear casts its own matmul inputs
        return self.precision if self.recipe == "autocast" else "fp32"


@dataclass
class History:
    """What a run measured. Per-step lists are empty when config.record_steps is False."""

    config: TrainConfig
    step_loss: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)     # the loss scale each step used (1.0: none)
    skipped: list[bool] = field(default_factory=list)     # True where the optimizer step was skipped
    epoch_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)   # held-out accuracy (%) after each epoch
    val_loss: list[float] = field(default_factory=list)        # held-out cross-entropy (nats) after each epoch
    samples_per_s: float = float("nan")
    train_seconds: float = 0.0

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)

    @property
    def final_accuracy(self) -> float:
        return self.test_accuracy[-1]

    def to_dict(self) -> dict:
        """This History as plain data (its config as a dict), which weights_only loading accepts."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        """The History that history.to_dict() was made from."""
        return cls(**{**d, "config": TrainConfig(**d["config"])})
