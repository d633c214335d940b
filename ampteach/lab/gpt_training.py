"""The tiny GPT trained in every precision and recipe, through the course's one loop, on a time budget.

    from ampteach.lab.gpt_training import RUNS, step_seconds, plan_steps, train_runs, plot_val_loss, samples
    data = preload_text(load_shakespeare(), block_size=64, steps_per_epoch=10, eval_windows=128)
    times = {name: step_seconds(name, data) for name in RUNS}          # the fastest step, per run
    steps = plan_steps(times, budget_s={"fp32": 90}, default_budget_s=35, max_steps=300, every=10)
    histories, models = train_runs(data, steps)                         # ampteach.train, one run per recipe
    fig = plot_val_loss(histories, every=10)
    print(samples(models, histories, text, "ROMEO:"))                  # each model's text, side by side

Every run starts from the same weights (seed 0) and reads the same batches in the same order, so the
curves differ only by precision. A CPU without native half-precision kernels can run a bf16 or fp16
step many times slower than an fp32 one, so each run gets as many steps as fit in its time budget, at most
max_steps, in whole epochs of `every` steps (at least one): on such a machine the half-precision runs
are shorter, and a lesson compares them with fp32 at the same step.
"""

from __future__ import annotations

import math
from typing import Callable

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from ampteach.lab.plots import FORMAT_COLORS, course_style
from ampteach.training.config import History, TrainConfig
from ampteach.training.gpt import gpt
from ampteach.training.machine import best_seconds
from ampteach.training.seeding import seed_everything
from ampteach.training.text import CharText, PreloadedText
from ampteach.training.train import autocast_for, prepare, train, train_step

__all__ = ["RUNS", "Plan", "config_for", "plan_steps", "plot_val_loss", "samples", "step_seconds", "train_run",
           "train_runs"]

RUNS = {   # name -> what differs from TrainConfig(batch_size=32, lr=1e-3, optimizer="adamw")
    "fp32": dict(precision="fp32"),
    "bf16 autocast": dict(precision="bf16"),
    "fp16 autocast + GradScaler": dict(precision="fp16"),
    "pure bf16": dict(precision="bf16", recipe="half", loss_scale=None),
    "pure bf16 + fp32 masters": dict(precision="bf16", recipe="master"),
}
STYLES = {"fp32": dict(color=FORMAT_COLORS["fp32"], lw=2.0),
          "bf16 autocast": dict(color=FORMAT_COLORS["bf16"]),
          "fp16 autocast + GradScaler": dict(color=FORMAT_COLORS["fp16"]),
          "pure bf16": dict(color="tab:red", ls="--"),
          "pure bf16 + fp32 masters": dict(color="tab:green", ls=":")}


def config_for(name: str, epochs: int = 1, batch_size: int = 32, lr: float = 1e-3, progress: bool = False,
               **changes) -> TrainConfig:
    """The TrainConfig of run `name` (a key of RUNS): AdamW at lr, batch_size windows a step, a bar if progress."""
    return TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, progress=progress, **{**RUNS[name], **changes})


def step_seconds(name: str, data: PreloadedText, make_model: Callable[[], nn.Module] | None = None,
                 batch_size: int = 32, min_seconds: float = 0.5) -> float:
    """The fastest training step of run `name` on data, after one warm-up step (machine.best_seconds; a step
    slower than min_seconds is timed once more). make_model defaults to gpt(65) with the course's shape."""
    seed_everything(0)
    model = (make_model or (lambda: gpt(65)))().to(data.device)
    config = config_for(name, batch_size=batch_size)
    master, opt, scaler = prepare(model, config)
    batches = list(data.batches(batch_size, seed=config.seed))
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        train_step(model, x, y, opt, scaler, config, master=master)

    step()   # a warm-up step of its own: the first step's one-time costs are not the step's time
    return best_seconds(step, data.device.type, min_seconds=min_seconds, clock="wall")


class Plan(dict):
    """name -> training steps (a dict), with .why: name -> why that run got fewer steps than max_steps, or more
    than its budget fits (empty for a run that got max_steps within its budget)."""

    def __init__(self, steps: dict[str, int], why: dict[str, str]):
        super().__init__(steps)
        self.why = why

    def report(self) -> str:
        """One line per run: its steps, and why it got them where its budget decided."""
        return "\n".join(f"{name:28s} {n:4d} steps" + (f"  ({self.why[name]})" if name in self.why else "")
                         for name, n in self.items())


def plan_steps(step_times: dict[str, float], budget_s: dict[str, float] | None = None, default_budget_s: float = 35.0,
               max_steps: int = 300, every: int = 10, min_steps: dict[str, int] | None = None, min_epochs: int = 3,
               alike: bool = False) -> Plan:
    """name -> training steps: as many whole epochs of `every` steps as fit in the run's budget (budget_s[name],
    else default_budget_s) at its measured step time, at most max_steps, and never fewer than min_epochs epochs
    (a curve of min_epochs points, not a dot) nor min_steps[name] (rounded up to whole epochs) however slow the
    step: the reference run others are compared with must stay long enough on a busy machine. alike=True gives
    every run the fewest steps any of them got, so that all compare at every step. The Plan says, in .why and
    .report(), which runs got fewer than max_steps or more than their budget fits, and why.

        plan_steps({"fp32": 0.4, "pure bf16": 3.0}, {"fp32": 75}, 30, min_steps={"fp32": 100})
        # {'fp32': 180, 'pure bf16': 30}: pure bf16's 30 s fit 10 steps, a curve needs 3 epochs
    """
    budget_s, min_steps = budget_s or {}, min_steps or {}
    plan, why = {}, {}
    for name, seconds in step_times.items():
        budget = budget_s.get(name, default_budget_s)
        fit = math.floor(budget / seconds / every) * every
        least = max(every * max(1, min_epochs), math.ceil(min_steps.get(name, 0) / every) * every)
        plan[name] = max(least, min(max_steps, fit))
        if plan[name] > fit:
            why[name] = (f"its {budget:g} s fit {fit} at {seconds * 1e3:.0f} ms a step; raised to {plan[name]}, "
                         f"the least it may have, taking about {plan[name] * seconds:.0f} s")
        elif plan[name] < max_steps:
            why[name] = f"what fits in its {budget:g} s at {seconds * 1e3:.0f} ms a step"
    if alike:
        fewest = min(plan.values())
        for name in plan:
            if plan[name] > fewest:
                why[name] = f"shortened to {fewest} like the other runs, so that all compare at every step"
            plan[name] = fewest
    return Plan(plan, why)


def train_run(data: PreloadedText, name: str, steps: int, make_model: Callable[[], nn.Module] | None = None,
              batch_size: int = 32, lr: float = 1e-3, progress: bool = False,
              label: str | None = None) -> tuple[History, nn.Module]:
    """(History, trained model) of run `name` for `steps` steps (whole epochs of data.steps_per_epoch), from seed 0.

        histories["fp32"], models["fp32"] = train_run(data, "fp32", 300, progress=True)

    progress=True prints a line naming the run (label, else name) and shows train()'s progress bar."""
    every = data.steps_per_epoch
    if steps < every or steps % every:
        raise ValueError(f"{name}: {steps} steps is not a whole number of epochs of {every} steps "
                         f"(data.steps_per_epoch)")
    if progress:
        print(f"{label or name}: {steps} steps of {batch_size} windows, AdamW lr {lr:g}", flush=True)
    seed_everything(0)
    model = (make_model or (lambda: gpt(65)))()
    config = config_for(name, epochs=steps // every, batch_size=batch_size, lr=lr, progress=progress)
    return train(model, data, config), model


def train_runs(data: PreloadedText, steps: dict[str, int], make_model: Callable[[], nn.Module] | None = None,
               batch_size: int = 32, lr: float = 1e-3) -> tuple[dict[str, History], dict[str, nn.Module]]:
    """(name -> History, name -> trained model): train_run for each planned run, all from seed 0."""
    histories, models = {}, {}
    for name, n in steps.items():
        histories[name], models[name] = train_run(data, name, n, make_model, batch_size, lr)
    return histories, models


def plot_val_loss(histories: dict[str, History], every: int, ax=None, vocab_size: int = 65) -> Figure:
    """Validation loss (nats per character) after each epoch of `every` steps, one line per run, ln(vocab_size)
    marked: the loss of a model that knows nothing (a padded model's extra PAD token makes it 66)."""
    with course_style():
        if ax is None:
            fig, ax = plt.subplots(figsize=(8, 3.8))
        else:
            fig = ax.figure
        for name, h in histories.items():
            steps = [every * (i + 1) for i in range(len(h.val_loss))]
            ax.plot(steps, h.val_loss, marker="." if len(steps) < 8 else None, label=name, **STYLES.get(name, {}))
        ax.axhline(math.log(vocab_size), color="0.6", lw=0.8, ls=":")
        ax.text(every, math.log(vocab_size) - 0.12, f"ln {vocab_size}: a model that knows nothing", fontsize=8,
                color="0.4")
        ax.set(xlabel="training step", ylabel="validation loss (nats per character)",
               title="The tiny GPT on Shakespeare, one run per precision and recipe")
        ax.legend()
        fig.tight_layout()
    return fig


@torch.no_grad()
def samples(models: dict[str, nn.Module], histories: dict[str, History], text: CharText, prompt: str = "\n",
            length: int = 120, width: int = 24, seed: int = 0) -> str:
    """Each model's continuation of prompt (the same random draws for all), in columns of `width` characters.

    Each model generates in its run's precision: under the run's autocast, or in bf16 weights for pure bf16."""
    columns = {}
    for name, model in models.items():
        config = histories[name].config
        device = next(model.parameters()).device
        with autocast_for(config.impl, device.type, config.autocast_precision):
            ids = model.generate(text.encode(prompt).to(device), length, generator=torch.Generator().manual_seed(seed))
        columns[name] = text.decode(ids).replace("\n", "⏎")
    lines = {name: [s[i:i + width] for i in range(0, len(s), width)] for name, s in columns.items()}
    rows = [[name[:width].ljust(width) for name in columns]]
    for i in range(max(len(v) for v in lines.values())):
        rows.append([(v[i] if i < len(v) else "").ljust(width) for v in lines.values()])
    return "\n".join(" | ".join(row).rstrip() for row in rows)
