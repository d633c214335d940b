"""One training loop for every precision, run through torch.amp or through ampteach's own pieces.

    data = preload(course_split(load_fashion_mnist()))
    history = train(mlp(), data, TrainConfig(precision="fp16", impl="ampteach", epochs=2))
    history.test_accuracy[-1], history.scales, history.skipped

Each step is PyTorch's recipe, with the same calls whichever implementation runs it:

    with autocast(device_type, dtype, enabled=precision != "fp32"):   # forward + loss only
        loss = cross_entropy(model(x), y)
    scaler.scale(loss).backward()                                     # grads of S * loss
    scaler.unscale_(opt); clip_grad_norm_(...)                        # only when clipping
    scaler.step(opt); scaler.update()                                 # skip on inf/NaN, adapt S

`impl="torch"` uses torch.autocast and torch.amp.GradScaler, `impl="ampteach"` uses
ampteach.autocast and ampteach.GradScaler: the loop does not change, which is the point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .data import Preloaded

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
IMPLS = ("torch", "ampteach")
OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass
class TrainConfig:
    """Everything one run depends on; defaults train the course MLP in seconds on a CPU.

    loss_scale (fp16 only): "dynamic" = GradScaler, a number = a static scale (the 2018 paper's
    recipe, ampteach.StaticLossScaler for either impl, since torch has none), None = no scaling.
    skip_nonfinite: when no dynamic scaler guards the step (fp32, bf16), skip any step whose loss
    or gradients are not finite, the way the scaler would.
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

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if self.impl not in IMPLS:
            raise ValueError(f"impl must be 'torch' (torch.amp) or 'ampteach' (from scratch), got {self.impl!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not (self.loss_scale in ("dynamic", None) or (isinstance(self.loss_scale, (int, float)) and self.loss_scale > 0)):
            raise ValueError(f"loss_scale must be 'dynamic', a positive number (static) or None, got {self.loss_scale!r}")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs} and {self.batch_size}")

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision]

    @property
    def scaling(self) -> str | float | None:
        """How this run scales its loss: only fp16 needs it."""
        return self.loss_scale if self.precision == "fp16" else None


@dataclass
class History:
    """What a run measured. Per-step lists are empty when config.record_steps is False."""

    config: TrainConfig
    step_loss: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)     # the loss scale each step used (1.0: none)
    skipped: list[bool] = field(default_factory=list)     # True where the optimizer step was skipped
    epoch_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)
    samples_per_s: float = float("nan")
    train_seconds: float = 0.0

    @property
    def skipped_steps(self) -> int:
        return sum(self.skipped)

    @property
    def final_accuracy(self) -> float:
        return self.test_accuracy[-1]


def autocast_for(impl: str, device_type: str, precision: str):
    """torch.autocast or ampteach.autocast for this precision (disabled for fp32)."""
    dtype = PRECISIONS[precision]
    enabled = precision != "fp32"
    if impl == "torch":
        return torch.autocast(device_type, dtype=dtype, enabled=enabled)
    from .autocast import autocast

    return autocast(device_type, dtype=dtype, enabled=enabled)


def scaler_for(config: TrainConfig, device_type: str):
    """The loss scaler config asks for: dynamic (torch's or ampteach's), static, or a disabled pass-through."""
    scaling = config.scaling
    if isinstance(scaling, (int, float)) and scaling is not True:
        from .scaler import StaticLossScaler

        return StaticLossScaler(float(scaling))
    kwargs = dict(init_scale=config.init_scale, growth_interval=config.growth_interval, enabled=scaling == "dynamic")
    if config.impl == "torch":
        return torch.amp.GradScaler(device_type, **kwargs)
    from .scaler import GradScaler

    return GradScaler(device_type, **kwargs)


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    cls = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def _all_finite(loss: torch.Tensor, params) -> bool:
    flags = [torch.isfinite(loss).all()] + [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def evaluate(model: nn.Module, data: Preloaded, precision: str = "fp32", impl: str = "torch",
             batch_size: int = 1000) -> float:
    """Accuracy in percent on the held-out split, with the forward pass under the run's autocast."""
    was_training = model.training
    model.eval()
    correct = 0
    for x, y in data.batches(batch_size, shuffle=False, split="test"):
        with autocast_for(impl, data.device.type, precision):
            logits = model(x)
        correct += (logits.argmax(1) == y).sum().item()
    model.train(was_training)
    return 100.0 * correct / len(data.test_y)


def train(model: nn.Module, data: Preloaded, config: TrainConfig | None = None, *,
          optimizer: torch.optim.Optimizer | None = None,
          after_backward: Callable[[int, nn.Module], None] | None = None) -> History:
    """Train model on data.train_* for config.epochs and return its History.

    after_backward(step, model) runs after backward and before unscale_/step: the place to look at
    (or, in the fault-injection tests, break) the gradients.
    """
    config = config or TrainConfig()
    device = data.device
    model.to(device)
    model.train()
    opt = optimizer or make_optimizer(model.parameters(), config)
    params = [p for group in opt.param_groups for p in group["params"]]
    scaler = scaler_for(config, device.type)
    history = History(config)

    n_batches = -(-len(data.train_x) // config.batch_size)
    total_steps = config.epochs * n_batches
    bar = _progress(total_steps, config)
    step, timed_samples, timed_seconds, t0 = 0, 0, 0.0, None
    for epoch in range(config.epochs):
        loss_sum = torch.zeros((), device=device)
        for x, y in data.batches(config.batch_size, shuffle=True, seed=config.seed + epoch):
            if step == config.warmup_steps:
                _sync(device)
                t0 = time.perf_counter()
            with autocast_for(config.impl, device.type, config.precision):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if after_backward is not None:
                after_backward(step, model)
            scale_used = scaler.get_scale() if config.record_steps else None
            if config.clip_norm is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, config.clip_norm)
            if config.skip_nonfinite and not scaler.is_enabled() and not _all_finite(loss, params):
                skipped = True  # no scaler guards this step (fp32, bf16): drop it, as a scaler would
            else:
                scaler.step(opt)
                scaler.update()
                skipped = config.record_steps and _was_skipped(scaler, scale_used)
            loss_sum += loss.detach().float()
            if config.record_steps:
                history.step_loss.append(loss.item())
                history.scales.append(scale_used)
                history.skipped.append(bool(skipped))
            step += 1
            if t0 is not None:
                timed_samples += len(x)
            bar.update(1)
        if t0 is not None:
            _sync(device)
            timed_seconds += time.perf_counter() - t0
        history.epoch_loss.append(loss_sum.item() / n_batches)
        history.test_accuracy.append(evaluate(model, data, config.precision, config.impl))
        bar.set_postfix(loss=f"{history.epoch_loss[-1]:.3f}", acc=f"{history.test_accuracy[-1]:.1f}%")
        if epoch + 1 < config.epochs and step >= config.warmup_steps:
            _sync(device)
            t0 = time.perf_counter()
    bar.close()
    history.train_seconds = timed_seconds
    if timed_seconds > 0:
        history.samples_per_s = timed_samples / timed_seconds
    return history


def _was_skipped(scaler, scale_before: float) -> bool:
    """ampteach's scalers say whether the last step was skipped; torch's show it only as a scale drop."""
    if hasattr(scaler, "last_step_skipped"):
        return bool(scaler.last_step_skipped)
    return scaler.is_enabled() and scaler.get_scale() < scale_before


def _progress(total: int, config: TrainConfig):
    from tqdm.auto import tqdm

    desc = f"{config.impl} {config.precision}" + (f" scale={config.scaling}" if config.scaling is not None else "")
    return tqdm(total=total, desc=desc, unit="step", disable=not config.progress)
