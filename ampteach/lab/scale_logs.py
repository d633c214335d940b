"""Loss-scale logs of fp16 runs, made by torch.amp.GradScaler itself, for learning to read them.

    from ampteach.lab.scale_logs import CAUSES, real_run, simulate, plot_scale_log
    log = simulate("growth too slow", seed=0)      # [{"step", "scale", "loss", "skipped", "flushed"}, ...]
    plot_scale_log(log, title="run C")
    log = real_run(seed=0)                         # the same columns from a real fp16 training run (CPU, ~2 s)

Each step draws a batch of gradients (log-normal magnitudes) and a loss, and drives a real
torch.amp.GradScaler: the step is skipped when S times the largest gradient overflows fp16 (or
the loss itself is inf/NaN), and the scaler updates S as it would in training. `flushed` is the
fraction of that step's gradients that S * g leaves below fp16's flush-to-zero point, 2^-25:
P(log2|g| < -25 - log2 S), from the normal distribution of log2|g|. The four causes:

    normal calibration                  S backs off from 2^16 to where the gradients fit, then grows
                                        and backs off now and then (a sawtooth); almost nothing flushed
    forward overflow in the model       a normal run until activations outgrow fp16 in the forward
                                        pass: from then on every loss is inf/NaN, every step is skipped
                                        and S halves each step towards 0 (scaling cannot help)
    bf16-pretrained model run in fp16   values trained in bf16's range exceed fp16's on some batches
                                        from the first step: inf losses scattered through the run,
                                        S pushed far below 1 and never recovering
    growth too slow                     S sits low (a small init_scale, or an early back-off) and
                                        growth_interval is longer than the run: no skips, no growth,
                                        and a steady share of gradients flushed to zero
"""

from __future__ import annotations

import math
import random

import torch
from torch import nn

CAUSES = ("normal calibration", "forward overflow in the model", "bf16-pretrained model run in fp16",
          "growth too slow")
FP16_MAX = 65504.0
FLUSH_LOG2 = -25.0   # below half of fp16's smallest subnormal (2^-24), S * g rounds to 0


def _flushed(center: float, spread: float, log2_scale: float) -> float:
    z = (FLUSH_LOG2 - log2_scale - center) / spread
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _setup(cause: str, rng: random.Random) -> dict:
    """The run's settings: scaler settings, the gradients' log2 centre and spread, the loss curve."""
    spread = rng.uniform(2.5, 3.5)
    if cause == "normal calibration":
        fits = rng.randint(9, 14)                 # S at which the largest gradients just fit
        return dict(init_scale=2.0**16, growth_interval=rng.choice((100, 150, 200)), spread=spread,
                    center=math.log2(FP16_MAX) - fits - 4.2 * spread, steps=rng.randint(700, 1000))
    if cause == "forward overflow in the model":
        fits = rng.randint(9, 14)
        steps = rng.randint(500, 800)
        return dict(init_scale=2.0**16, growth_interval=rng.choice((100, 200)), spread=spread,
                    center=math.log2(FP16_MAX) - fits - 4.2 * spread, steps=steps,
                    broken_from=int(steps * rng.uniform(0.4, 0.7)))
    if cause == "bf16-pretrained model run in fp16":
        return dict(init_scale=2.0**16, growth_interval=rng.choice((100, 200, 2000)), spread=spread,
                    center=math.log2(FP16_MAX) + rng.uniform(1, 4) - 4.2 * spread, steps=rng.randint(400, 700),
                    p_inf=rng.uniform(0.15, 0.35))
    if cause == "growth too slow":
        low = rng.randint(0, 8)                   # log2 of where S sits
        early = rng.random() < 0.5                # an early spike backs off from 2^16, else a small init_scale
        return dict(init_scale=2.0**16 if early else 2.0**low, growth_interval=2000, spread=spread,
                    center=FLUSH_LOG2 - low + rng.uniform(1.0, 1.8) * spread, steps=rng.randint(500, 900),
                    spikes=16 - low if early else 0)
    raise ValueError(f"unknown cause {cause!r}; one of {CAUSES}")


def simulate(cause: str, seed: int = 0) -> list[dict]:
    """A log of one run: per step the scale S used, the loss, whether the step was skipped, and the
    fraction of gradients flushed to zero at S. The scaler is torch.amp.GradScaler("cpu")."""
    rng = random.Random(f"{cause}/{seed}")
    cfg = _setup(cause, rng)
    scaler = torch.amp.GradScaler("cpu", init_scale=cfg["init_scale"], growth_interval=cfg["growth_interval"])
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.0)
    log = []
    for step in range(cfg["steps"]):
        scale = scaler.get_scale()
        loss = 0.35 + 1.95 * math.exp(-step / rng.uniform(150, 400)) + rng.gauss(0, 0.04)
        if step >= cfg.get("broken_from", math.inf) or rng.random() < cfg.get("p_inf", 0.0):
            loss = rng.choice((math.inf, math.nan))
        largest = cfg["center"] + 4.2 * cfg["spread"] + rng.gauss(0, 0.6)   # log2 of the step's largest |g|
        spike = step < cfg.get("spikes", 0)
        overflow = spike or (scale > 0 and largest + math.log2(scale) >= math.log2(FP16_MAX))
        found_inf = overflow or not math.isfinite(loss)
        scaler.scale(torch.ones(()))
        param.grad = torch.full((1,), math.inf if found_inf else 1.0)
        scaler.step(opt)
        scaler.update()
        flushed = _flushed(cfg["center"], cfg["spread"], math.log2(scale)) if scale > 0 else 1.0
        log.append({"step": step, "scale": scale, "loss": loss, "skipped": found_inf,
                    "flushed": flushed if math.isfinite(loss) else math.nan})
    return log


def _blobs(seed: int, n: int = 4096, features: int = 32, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """A classification problem: class centres drawn at random, points scattered around them (overlapping
    enough that the loss stays well above 0, so gradients do not vanish and S does not climb for ever)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 0.5
    y = torch.randint(0, classes, (n,), generator=gen)
    return centres[y] + torch.randn(n, features, generator=gen), y


def real_run(seed: int = 0, steps: int = 400, growth_interval: int = 25, batch: int = 32) -> list[dict]:
    """The log of a real fp16 training run: a small MLP (32-64-64-10) learning to classify points,
    its forward pass and loss under torch.autocast("cpu", dtype=torch.float16), backward scaled by a
    torch.amp.GradScaler with the default init_scale (2^16) and a short growth_interval, so that S
    climbs until a scaled gradient overflows fp16 and then saws up and down: normal calibration, as it
    looks in a real run. Per step: the scale S the step used, its loss, whether the scaler skipped it
    (S backed off), and `flushed`: the share of the weight-gradient entries that an fp32 backward of
    the same batch makes nonzero and the scaled fp16 backward leaves at zero."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # ops this small run fastest on one thread, and a busy machine cannot slow it
    try:
        return _real_run(seed, steps, growth_interval, batch)
    finally:
        torch.set_num_threads(threads)


def _real_run(seed: int, steps: int, growth_interval: int, batch: int) -> list[dict]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    x_all, y_all = _blobs(seed)
    weights = [p for p in model.parameters() if p.dim() == 2]
    log = []
    for step in range(steps):
        rows = torch.arange(step * batch, (step + 1) * batch) % len(x_all)
        x, y = x_all[rows], y_all[rows]
        reference = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), weights)   # fp32, unscaled
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        alive = sum(int((r != 0).sum()) for r in reference)
        lost = sum(int(((r != 0) & (p.grad == 0)).sum()) for r, p in zip(reference, weights))
        scaler.step(optimizer)
        scaler.update()
        log.append({"step": step, "scale": scale, "loss": loss.item(), "skipped": scaler.get_scale() < scale,
                    "flushed": lost / max(alive, 1)})
    return log


def example_logs(seed: int = 0) -> dict[str, list[dict]]:
    """Four logs named A-D, one per cause, in an order fixed by the seed (causes_of_examples says which)."""
    order = list(CAUSES)
    random.Random(seed).shuffle(order)
    return {name: simulate(cause, seed) for name, cause in zip("ABCD", order)}


def causes_of_examples(seed: int = 0) -> dict[str, str]:
    order = list(CAUSES)
    random.Random(seed).shuffle(order)
    return dict(zip("ABCD", order))


def plot_scale_log(log: list[dict], title: str = "", axes=None):
    """log2 S per step (skipped steps marked), the loss (inf/NaN marked at the top) and the flushed share."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 2.8))
    steps = [r["step"] for r in log]
    log2s = [math.log2(r["scale"]) if r["scale"] > 0 else -150 for r in log]
    ax = axes[0]
    ax.plot(steps, log2s, lw=1, label="log2 S")
    skipped = [(r["step"], v) for r, v in zip(log, log2s) if r["skipped"]]
    if skipped:
        ax.plot(*zip(*skipped), "rx", ms=3, label="skipped step")
    ax.set_xlabel("step"), ax.set_ylabel("log2 of the loss scale"), ax.legend(loc="best", fontsize=8)
    ax.set_title(title)
    ax = axes[1]
    finite = [(r["step"], r["loss"]) for r in log if math.isfinite(r["loss"])]
    if finite:
        ax.plot(*zip(*finite), lw=1, label="loss")
    top = max([v for _, v in finite] + [1.0]) * 1.1
    bad = [r["step"] for r in log if not math.isfinite(r["loss"])]
    if bad:
        ax.plot(bad, [top] * len(bad), "r|", ms=8, label="loss inf/NaN")
    ax.set_xlabel("step"), ax.set_ylabel("loss")
    twin = ax.twinx()
    flushed = [100 * r["flushed"] for r in log]
    twin.plot(steps, flushed, color="tab:green", lw=1, label="% flushed")
    twin.set_ylim(0, max([1.0] + [1.1 * f for f in flushed if math.isfinite(f)]))   # 0% looks like 0
    twin.set_ylabel("% of gradients flushed", color="tab:green")
    ax.legend(loc="upper right", fontsize=8)
    return axes
