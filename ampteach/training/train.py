"""One training loop for every precision, run through torch.amp or through ampteach's own pieces.

    data = preload(course_split(load_fashion_mnist()))
    history = train(mlp(), data, TrainConfig(precision="fp16", impl="ampteach", epochs=2))
    history.test_accuracy[-1], history.scales, history.skipped

    text = preload_text(load_shakespeare(), block_size=64, steps_per_epoch=50)    # the same loop, a GPT
    history = train(gpt(65), text, TrainConfig(precision="bf16", epochs=6, batch_size=32))
    history.val_loss[-1]

The loop asks its data for three things only: data.device, data.num_batches(batch_size) (an epoch's
steps) and data.batches(batch_size, shuffle, seed, split) ((x, y) pairs; split="test" for held-out
data). FashionMNIST's preload() and a text's preload_text() both answer them. The loss is the
cross-entropy over every prediction, which covers both: (N, classes) logits against (N,) labels, and a
language model's (B, T, vocab) logits against (B, T) next tokens:
    loss = cross_entropy(logits.flatten(0, -2), y.flatten())

Each step is PyTorch's recipe, with the same calls whichever implementation runs it:

    with autocast(device_type, dtype, enabled=precision != "fp32"):   # forward + loss only
        loss = cross_entropy(model(x), y)
    scaler.scale(loss).backward()                                     # grads of S * loss
    scaler.unscale_(opt); clip_grad_norm_(...)                        # only when clipping
    scaler.step(opt); scaler.update()                                 # skip on inf/NaN, adapt S

`impl="torch"` uses torch.autocast and torch.amp.GradScaler, `impl="ampteach"` uses
ampteach.autocast and ampteach.GradScaler: the loop does not change, which is the point.

`recipe` says where the weights live (Apex's opt levels): "autocast" (O1, the default) keeps fp32
weights and runs the forward under autocast; "master" (O2) halves the model (ampteach.to_half) and
steps fp32 master copies (ampteach.MasterWeights), adding two lines to the same step:

    scaler.scale(loss).backward()                                     # fp16 grads on the model
    master.grads_to_master()                                          # fp32 copies, still times S
    scaler.step(opt); scaler.update()                                 # on the fp32 masters
    master.master_to_model()                                          # round back to fp16

"half" (O3) halves the model and lets the optimizer update the half weights directly; with
rounding="kahan" or "stochastic" the optimizer steps fp32 copies made for the step instead, and
ampteach.HalfWeights writes them back into the half weights by that rule (lesson 3, section 3).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import asdict
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.amp.half_weights import HalfWeights
from ampteach.amp.master import MasterWeights, to_half
from ampteach.training.checkpoint import load_checkpoint, save_checkpoint
from ampteach.training.config import PRECISIONS, History, TrainConfig
from ampteach.training.data import Preloaded
from ampteach.training.machine import sync
from ampteach.training.text import PreloadedText

__all__ = ["StepResult", "Prepared", "autocast_for", "cross_entropy", "evaluate", "held_out", "make_optimizer",
           "prepare", "scaler_for", "train", "train_step"]


def autocast_for(impl: str, device_type: str, precision: str):
    """torch.autocast or ampteach.autocast for this precision (disabled for fp32)."""
    dtype = PRECISIONS[precision]
    enabled = precision != "fp32"
    if impl == "torch":
        return torch.autocast(device_type, dtype=dtype, enabled=enabled)
    from ampteach.amp.autocast import autocast

    return autocast(device_type, dtype=dtype, enabled=enabled)


def scaler_for(config: TrainConfig, device_type: str):
    """The loss scaler config asks for: dynamic (torch's or ampteach's), static, or a disabled pass-through."""
    scaling = config.scaling
    if isinstance(scaling, (int, float)) and scaling is not True:
        from ampteach.amp.scaler import StaticLossScaler

        return StaticLossScaler(float(scaling))
    kwargs = dict(init_scale=config.init_scale, growth_interval=config.growth_interval, enabled=scaling == "dynamic")
    if config.impl == "torch":
        return torch.amp.GradScaler(device_type, **kwargs)
    from ampteach.amp.scaler import GradScaler

    return GradScaler(device_type, **kwargs)


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    cls = torch.optim.Adam if config.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def _all_finite(loss: torch.Tensor, params) -> bool:
    flags = [torch.isfinite(loss).all()] + [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all())


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every prediction: (N, C) logits vs (N,) labels, or (B, T, V) logits vs (B, T) tokens.

    -mean log softmax(logits)[y], the loss of every run of train()."""
    return F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction=reduction)


@torch.no_grad()
def held_out(model: nn.Module, data: Preloaded | PreloadedText, precision: str = "fp32", impl: str = "torch",
             batch_size: int = 1000) -> tuple[float, float]:
    """(mean cross-entropy in nats per prediction, accuracy in percent) on the held-out split, under the run's autocast.

        val_loss, accuracy = held_out(model, data, "bf16")
    """
    was_training = model.training
    model.eval()
    correct, count, loss_sum = 0, 0, 0.0
    for x, y in data.batches(batch_size, shuffle=False, split="test"):
        with autocast_for(impl, data.device.type, precision):
            logits = model(x)
            loss_sum += cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train(was_training)
    return loss_sum / count, 100.0 * correct / count


def evaluate(model: nn.Module, data: Preloaded | PreloadedText, precision: str = "fp32", impl: str = "torch",
             batch_size: int = 1000) -> float:
    """Accuracy in percent on the held-out split, with the forward pass under the run's autocast.

        evaluate(model, data, "bf16")          # e.g. 81.6 (FashionMNIST); for text: next-character accuracy
    """
    return held_out(model, data, precision, impl, batch_size)[1]


class StepResult(NamedTuple):
    loss: torch.Tensor          # the unscaled loss of this batch (before the update)
    scale: float | None         # the loss scale the step used (None when config.record_steps is False)
    skipped: bool               # True where the optimizer step was skipped (recorded steps only)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer, scaler,
               config: TrainConfig, *, master: MasterWeights | None = None, step: int = 0,
               after_backward: Callable[[int, nn.Module], None] | None = None) -> StepResult:
    """One optimizer step of config's recipe on the batch (x, y): the body of train()'s loop.

    With master (recipe "master"), optimizer and scaler work on the fp32 master copies: the model's
    half grads are copied to them after backward and the updated values copied back after the step.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with autocast_for(config.impl, x.device.type, config.autocast_precision):
        loss = cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    if master is not None:
        model.zero_grad(set_to_none=True)  # the model's half grads are not the optimizer's
    scaler.scale(loss).backward()
    if after_backward is not None:
        after_backward(step, model)
    if master is not None:
        master.grads_to_master()  # fp32 grads, still multiplied by S
    scale_used = scaler.get_scale() if config.record_steps else None
    if config.clip_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, config.clip_norm)
    if config.skip_nonfinite and not scaler.is_enabled() and not _all_finite(loss, params):
        skipped = True  # no scaler guards this step (fp32, bf16): drop it, as a scaler would
    else:
        scaler.step(optimizer)
        scaler.update()
        skipped = config.record_steps and _was_skipped(scaler, scale_used)
    if master is not None:
        master.master_to_model()  # fp32 -> half, rounded to nearest
    return StepResult(loss, scale_used, bool(skipped))


class Prepared(NamedTuple):
    master: MasterWeights | None       # fp32 master copies (recipe "master"), else None
    optimizer: torch.optim.Optimizer   # over the master copies for recipe "master"
    scaler: object                     # from scaler_for(config): dynamic, static or disabled


def prepare(model: nn.Module, config: TrainConfig, *, optimizer: torch.optim.Optimizer | None = None,
            master: MasterWeights | None = None) -> Prepared:
    """What a run of config's recipe trains model with: its master copies, optimizer and loss scaler.

        master, opt, scaler = prepare(model, config)        # recipe "master": model is now half
        train_step(model, x, y, opt, scaler, config, master=master)

    Recipes "master" and "half" cast model to half in place (to_half). For "master", pass your own
    master (and an optimizer over master.params or master.param_groups(...)) or let prepare build both.
    """
    if config.precision == "fp8":
        if isinstance(model, nn.Linear):
            raise ValueError("precision='fp8' swaps the nn.Linear layers inside model in place; wrap a lone "
                             "Linear in nn.Sequential(...) or call ampteach.amp.fp8.convert_to_float8_training "
                             "yourself")
        from ampteach.amp.fp8 import convert_to_float8_training

        convert_to_float8_training(model, recipe=config.fp8_recipe)
    if config.recipe != "autocast":
        to_half(model, config.dtype)
    if config.recipe == "master":
        if master is None and optimizer is not None:
            raise ValueError("recipe='master' steps fp32 master copies, which your optimizer cannot hold yet: "
                             "build master = MasterWeights(to_half(model)) and the optimizer over master.params, "
                             "then pass both (optimizer=opt, master=master)")
        if master is not None and master.model is not model:
            raise ValueError("master was built from a different model: pass MasterWeights(model) of the model "
                             "you train")
        master = master or MasterWeights(model)
    elif config.rounding != "nearest":  # recipe "half" with a rounding rule: fp32 working copies for the step
        if master is None and optimizer is not None:
            raise ValueError(f"rounding={config.rounding!r} steps fp32 working copies your optimizer cannot hold yet: "
                             f"build half = HalfWeights(model, {config.rounding!r}), the optimizer over half.params, "
                             f"and pass both (optimizer=opt, master=half)")
        master = master or HalfWeights(model, config.rounding)
    elif master is not None:
        raise ValueError(f"master weights are used by recipe='master' only; this config has recipe={config.recipe!r}")
    opt = optimizer or make_optimizer(master.params if master is not None else model.parameters(), config)
    return Prepared(master, opt, scaler_for(config, next(model.parameters()).device.type))


def train(model: nn.Module, data: Preloaded | PreloadedText, config: TrainConfig | None = None, *,
          optimizer: torch.optim.Optimizer | None = None,
          after_backward: Callable[[int, nn.Module], None] | None = None,
          master: MasterWeights | None = None,
          checkpoint_path: str | os.PathLike | None = None, checkpoint_every: int | None = None,
          resume_from: str | os.PathLike | None = None) -> History:
    """Train model on data's training split for config.epochs and return its History.

    data: preload()'s FashionMNIST or preload_text()'s text (see the module docstring); after each epoch
    the held-out loss and accuracy go into history.val_loss and history.test_accuracy.

    after_backward(step, model) runs after backward and before unscale_/step: the place to look at
    (or, in the fault-injection tests, break) the gradients.
    Recipes "master" and "half" cast model to half in place; see prepare() for optimizer and master.
    checkpoint_path, checkpoint_every: write an ampteach.training.checkpoint there every checkpoint_every steps
    (when a step ends an epoch, after that epoch's evaluation) and at the end of training. resume_from: such a
    checkpoint; give a freshly built model (and optimizer/master if you passed them before) and the same config (epochs
    may grow): weights, optimizer, scaler, step and History come back and training goes on from the
    next batch, ending bit-identical to the run that was never interrupted.
    """
    config = config or TrainConfig()
    if (checkpoint_path is None) != (checkpoint_every is None) or (checkpoint_every is not None
                                                                   and checkpoint_every < 1):
        raise ValueError(f"checkpointing needs both checkpoint_path and checkpoint_every >= 1 (steps between "
                         f"checkpoints), got checkpoint_path={checkpoint_path!r}, "
                         f"checkpoint_every={checkpoint_every!r}")
    device = data.device
    model.to(device)
    model.train()
    master, opt, scaler = prepare(model, config, optimizer=optimizer, master=master)
    history = History(config)

    n_batches = data.num_batches(config.batch_size)
    total_steps = config.epochs * n_batches
    step, loss_sum = 0, torch.zeros((), device=device)
    if resume_from is not None:
        step, history, loss_sum = _resume(resume_from, model, opt, scaler, master, config)

    def save_due_checkpoint(at_end: bool = False) -> None:
        if checkpoint_every is not None and (step % checkpoint_every == 0 or at_end):
            save_checkpoint(checkpoint_path, model, opt, scaler, master=master, step=step, history=history,
                            extra={"epoch_loss_sum": loss_sum})

    bar = _progress(total_steps, config)
    bar.update(step)
    timed_samples, timed_seconds, t0 = 0, 0.0, None
    if step > config.warmup_steps:  # resumed past the warm-up: time from here
        t0 = time.perf_counter()
    for epoch in range(step // n_batches, config.epochs):
        done = step - epoch * n_batches  # batches of this epoch done before a resume (the order is seeded per epoch)
        batches = data.batches(config.batch_size, shuffle=True, seed=config.seed + epoch)
        for x, y in itertools.islice(batches, done, None):
            if step == config.warmup_steps:
                sync(device.type)
                t0 = time.perf_counter()
            loss, scale_used, skipped = train_step(model, x, y, opt, scaler, config, master=master, step=step,
                                                   after_backward=after_backward)
            loss_sum += loss.detach().float()
            if config.record_steps:
                history.step_loss.append(loss.item())
                history.scales.append(scale_used)
                history.skipped.append(skipped)
            step += 1
            if t0 is not None:
                timed_samples += len(x)
            bar.update(1)
            if step % n_batches:
                save_due_checkpoint()
        if t0 is not None:
            sync(device.type)
            timed_seconds += time.perf_counter() - t0
        history.epoch_loss.append(loss_sum.item() / n_batches)
        val_loss, accuracy = held_out(model, data, config.autocast_precision, config.impl)
        history.val_loss.append(val_loss)
        history.test_accuracy.append(accuracy)
        bar.set_postfix(loss=f"{history.epoch_loss[-1]:.3f}", acc=f"{history.test_accuracy[-1]:.1f}%")
        loss_sum = torch.zeros((), device=device)
        save_due_checkpoint()
        if epoch + 1 < config.epochs and step >= config.warmup_steps:
            sync(device.type)
            t0 = time.perf_counter()
    bar.close()
    save_due_checkpoint(at_end=True)  # the final state too (again, if the last epoch's end just saved it)
    history.train_seconds = timed_seconds
    if timed_seconds > 0:
        history.samples_per_s = timed_samples / timed_seconds
    return history


# What a resumed run may change: display, length and when timing starts; all else decides the numbers.
_RESUMABLE_CHANGES = ("progress", "epochs", "warmup_steps")


def _resume(path, model: nn.Module, opt, scaler, master: MasterWeights | None, config: TrainConfig):
    """Load a train() checkpoint into the prepared objects; return its step, History and partial epoch loss."""
    ckpt = load_checkpoint(path, model, opt, scaler, master=master, map_location=next(model.parameters()).device)
    if ckpt.history is None or "epoch_loss_sum" not in ckpt.extra:
        raise ValueError(f"{os.fspath(path)!r} was not written by train(checkpoint_path=...): it has no History "
                         f"or loop state to go on from; use ampteach.load_checkpoint to restore it by hand")
    saved, given = asdict(ckpt.history.config), asdict(config)
    changed = [k for k in given if k not in _RESUMABLE_CHANGES and saved.get(k) != given[k]]
    if changed:
        was = ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
        now = ", ".join(f"{k}={given[k]!r}" for k in changed)
        raise ValueError(f"resume_from: the checkpoint's run had {was} but you passed {now}; resume with the "
                         f"config it was written with (only {', '.join(_RESUMABLE_CHANGES)} may change)")
    history = ckpt.history
    history.config = config
    return ckpt.step, history, ckpt.extra["epoch_loss_sum"]


def _was_skipped(scaler, scale_before: float) -> bool:
    """ampteach's scalers say whether the last step was skipped; torch's show it only as a scale drop."""
    if hasattr(scaler, "last_step_skipped"):
        return bool(scaler.last_step_skipped)
    return scaler.is_enabled() and scaler.get_scale() < scale_before


def _progress(total: int, config: TrainConfig):
    from tqdm.auto import tqdm

    recipe = "" if config.recipe == "autocast" else f" {config.recipe}"
    recipe += "" if config.rounding == "nearest" else f" {config.rounding}"
    scale = f" scale={config.scaling}" if config.scaling is not None else ""
    desc = f"{config.impl} {config.precision}{recipe}{scale}"
    return tqdm(total=total, desc=desc, unit="step", disable=not config.progress)
