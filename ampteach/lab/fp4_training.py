"""The tiny GPT trained in NVFP4, emulated: the naive recipe, then each element of NVIDIA's recipe added back.

    from ampteach.lab.fp4_training import RUNS, step_seconds, plan, train_run, gradient_errors, ablation_rows
    times = {name: step_seconds(name, data) for name in RUNS}        # the fastest step of each run
    steps = plan(times, budget_s=35, reference_budget_s=20, max_steps=200, min_steps=40)
    histories, models = {}, {}
    histories[name], models[name] = train_run(data, name, steps[name])     # one per run, all from seed 0
    errors = gradient_errors(models["BF16"], data)                   # one step's gradient error of each recipe
    print(ablation_rows(histories, errors, every=10))
    fig = plot_ablation(histories, every=10)

Every run is ampteach.lab.gpt_training's: the same GPT (seed 0), the same batches, AdamW at lr 1e-3, batch 32,
and bf16 autocast around everything that is not an NVFP4 matmul (fp32 runs the yardstick without autocast).
The NVFP4 runs swap the Linears inside the blocks for Float8Linear with recipe "nvfp4"
(ampteach.amp.fp4.FP4Recipe), its switches set per run; the output head (tied to the embedding) stays in
higher precision in every run, as the NVFP4 paper keeps it (arXiv:2509.25149, section 4.1). The runs add the
recipe's elements one at a time, in the order the paper's Figure 8 adds three of them after the BF16 layers.
"""

from __future__ import annotations

import copy
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn

from ampteach.amp.fp4 import keep_high_precision
from ampteach.amp.fp8 import convert_to_float8_training
from ampteach.lab import gpt_training
from ampteach.lab.plots import FORMAT_COLORS, course_style
from ampteach.training.config import History
from ampteach.training.gpt import gpt
from ampteach.training.seeding import seed_everything
from ampteach.training.text import PreloadedText

__all__ = ["RUNS", "FP4_RUNS", "fp4_model", "step_seconds", "plan", "train_run", "gradient_errors", "mean_gaps",
           "ablation_rows", "plot_ablation"]

NAIVE = dict(weight_2d=False, rht=False, stochastic=False, high_precision=("lm_head",))
RUNS = {   # name -> None (fp32), "bf16" (bf16 autocast) or the FP4Recipe switches and the Linears kept out of FP4
    "fp32": None,
    "BF16": "bf16",
    "NVFP4 naive": NAIVE,
    "+ 2D weights": {**NAIVE, "weight_2d": True},
    "+ RHT on wgrad": {**NAIVE, "weight_2d": True, "rht": True},
    "+ SR on gradients": {**NAIVE, "weight_2d": True, "rht": True, "stochastic": True},
    "+ last MLP in BF16": {**NAIVE, "weight_2d": True, "rht": True, "stochastic": True,
                           "high_precision": ("lm_head", "blocks.3.mlp")},
}
FP4_RUNS = [name for name, run in RUNS.items() if isinstance(run, dict)]
STYLES = {"fp32": dict(color=FORMAT_COLORS["fp32"], lw=1.2, ls=":"), "BF16": dict(color=FORMAT_COLORS["bf16"], lw=2.2),
          "NVFP4 naive": dict(color="tab:red"), "+ 2D weights": dict(color="tab:purple"),
          "+ RHT on wgrad": dict(color="tab:blue"), "+ SR on gradients": dict(color="tab:cyan"),
          "+ last MLP in BF16": dict(color="tab:green", lw=2.0)}


def _base(name: str) -> str:
    """The run of ampteach.lab.gpt_training that name trains like: "fp32", or "bf16 autocast" for the rest."""
    return "fp32" if RUNS[name] is None else "bf16 autocast"


def fp4_model(name: str) -> nn.Module:
    """A fresh GPT (from the current seed) with run `name`'s Linears in NVFP4; fp32 and BF16 runs: a plain GPT."""
    model = gpt(65)
    run = RUNS[name]
    if isinstance(run, dict):
        switches = {k: v for k, v in run.items() if k != "high_precision"}
        convert_to_float8_training(model, recipe="nvfp4", module_filter_fn=keep_high_precision(*run["high_precision"]),
                                   **switches)
    return model


def step_seconds(name: str, data: PreloadedText) -> float:
    """The fastest training step of run `name` (gpt_training.step_seconds, one warm-up step first)."""
    return gpt_training.step_seconds(_base(name), data, make_model=lambda: fp4_model(name))


def plan(times: dict[str, float], budget_s: float = 35.0, reference_budget_s: float = 20.0, max_steps: int = 200,
         min_steps: int = 40, every: int = 10) -> dict[str, int]:
    """name -> steps. The NVFP4 runs all get the same steps, as many as fit in budget_s at the slowest one's step
    time (so they compare at every step); fp32 and BF16 both get what fits in reference_budget_s at the slower
    one's step time, and at least as many as the NVFP4 runs (BF16 is what they are compared with). Every run
    at least min_steps, at most max_steps, in whole epochs of `every` steps (gpt_training.plan_steps)."""
    slowest = max(times[name] for name in FP4_RUNS)
    fp4 = gpt_training.plan_steps({"fp4": slowest}, default_budget_s=budget_s, max_steps=max_steps, every=every,
                                  min_steps={"fp4": min_steps})["fp4"]
    slowest_reference = max(t for name, t in times.items() if name not in FP4_RUNS)
    reference = gpt_training.plan_steps({"reference": slowest_reference}, default_budget_s=reference_budget_s,
                                        max_steps=max_steps, every=every, min_steps={"reference": fp4})["reference"]
    return {name: fp4 if name in FP4_RUNS else reference for name in RUNS}


def train_run(data: PreloadedText, name: str, steps: int) -> tuple[History, nn.Module]:
    """(History, model) of run `name` for `steps` steps, from seed 0 (gpt_training.train_run)."""
    return gpt_training.train_run(data, _base(name), steps, make_model=lambda: fp4_model(name))


def _gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, autocast: bool) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
    F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if n.startswith("blocks.")}
    model.zero_grad(set_to_none=True)
    return grads


def _error(g: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    num = sum(float((g[k].double() - ref[k].double()).pow(2).sum()) for k in ref)
    return math.sqrt(num / sum(float(ref[k].double().pow(2).sum()) for k in ref))


def gradient_errors(model: nn.Module, data: PreloadedText, draws: int = 8, batch_seed: int = 1,
                    seed: int = 0) -> dict[str, dict[str, float]]:
    """One step's gradient of each run's arithmetic, on model's weights and one batch, against fp32's.

    name -> {"one step": ||g - g_fp32|| / ||g_fp32|| over the blocks' parameters, "mean of draws": the same for
    the mean of `draws` gradients (differs from "one step" only where stochastic rounding draws anew)}."""
    x, y = next(iter(data.batches(32, seed=batch_seed)))
    ref = _gradients(model, x, y, autocast=False)
    out = {}
    for name, run in RUNS.items():
        if run is None:
            continue
        m = copy.deepcopy(model)
        if isinstance(run, dict):
            convert_to_float8_training(m, recipe="nvfp4", module_filter_fn=keep_high_precision(*run["high_precision"]),
                                       **{k: v for k, v in run.items() if k != "high_precision"})
        seed_everything(seed)
        grads = [_gradients(m, x, y, autocast=True) for _ in range(draws if isinstance(run, dict) and
                                                                   run["stochastic"] else 1)]
        mean = {k: torch.stack([g[k] for g in grads]).mean(0) for k in ref}
        out[name] = {"one step": _error(grads[0], ref), "mean of draws": _error(mean, ref)}
    return out


def mean_gaps(histories: dict[str, History]) -> dict[str, float]:
    """name -> the mean, over the evaluations both runs made, of (validation loss - BF16's at the same step)."""
    bf16 = histories["BF16"].val_loss
    return {name: sum(a - b for a, b in zip(h.val_loss, bf16)) / min(len(h.val_loss), len(bf16))
            for name, h in histories.items()}


def ablation_rows(histories: dict[str, History], errors: dict[str, dict[str, float]], every: int = 10) -> str:
    """The table: each run's steps, final validation loss, its gap to BF16 at the same step (the shorter run's
    last) and averaged over the run (mean_gaps), and one step's gradient error (gradient_errors)."""
    bf16, mean = histories["BF16"].val_loss, mean_gaps(histories)
    rows = [f"{'run':20s} {'steps':>5s} {'val loss':>8s} {'- BF16':>7s} {'mean - BF16':>11s} {'grad error':>10s} "
            f"{'(mean of draws)':>15s}"]
    for name, h in histories.items():
        n = min(len(h.val_loss), len(bf16))
        e = errors.get(name)
        err = f"{e['one step']:10.3f} {e['mean of draws']:15.3f}" if e else f"{'0 (reference)':>10s}"
        rows.append(f"{name:20s} {len(h.val_loss) * every:5d} {h.val_loss[-1]:8.3f} "
                    f"{h.val_loss[n - 1] - bf16[n - 1]:+7.3f} {mean[name]:+11.3f} {err}")
    return "\n".join(rows)


def plot_ablation(histories: dict[str, History], every: int = 10) -> Figure:
    """Left: validation loss of every run. Right: each run's gap to BF16 at the same step (nats)."""
    with course_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 3.8))
        bf16 = histories["BF16"].val_loss
        for name, h in histories.items():
            steps = [every * (i + 1) for i in range(len(h.val_loss))]
            left.plot(steps, h.val_loss, label=name, **STYLES.get(name, {}))
            right.plot(steps, [v - bf16[i] for i, v in enumerate(h.val_loss)], label=name, **STYLES.get(name, {}))
        left.set(xlabel="training step", ylabel="validation loss (nats per character)",
                 title="The tiny GPT, NVFP4 recipe built up element by element")
        right.axhline(0, color="0.6", lw=0.8)
        right.set(xlabel="training step", ylabel="val loss - BF16's (nats)", title="Gap to BF16 at the same step")
        right.legend(fontsize=7, ncol=2)
        fig.tight_layout()
    return fig
