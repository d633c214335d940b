"""Exercise E.6.1: one AMP training step graded against torch.amp's recipe, and the measured table.

    from ampteach.grading.checks import check_amp_step, check_e6_1_measure, check_e6_1_table
    check_amp_step(amp_step)                  # fp32, fp16 + GradScaler, bf16: bit-identical to torch.amp
    check_e6_1_measure(measure, data)         # measure's timing and memory, on a run the check slows down
    check_e6_1_table(rows, device)            # complete, plausible rows beside the textbook's expectations
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import types
from typing import Callable

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed


def tiny_problem(seed: int = 0, batch: int = 64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP and one FashionMNIST-shaped batch (random pixels, fixed by seed)."""
    from ampteach.training.models import mlp

    torch.manual_seed(seed)
    model = mlp((64,))
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    return model, x, y


def _reference_step(model, x, y, optimizer, scaler, precision: str, clip_norm: float | None = None):
    from ampteach.training.train import TrainConfig, train_step

    config = TrainConfig(precision=precision, impl="torch", clip_norm=clip_norm, progress=False)
    return train_step(model, x, y, optimizer, scaler, config)


def compare_models(case: str, mine: nn.Module, ref: nn.Module) -> None:
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        if not torch.equal(p, q):
            diff = (p.detach().float() - q.detach().float()).abs().max().item()
            raise CheckFailed(f"{case}: parameter {name} differs from torch.amp's recipe "
                              f"(max |difference| {diff:.3g}); expected the same values bit for bit")


def check_amp_step(amp_step: Callable) -> None:
    """amp_step(model, x, y, optimizer, scaler, precision) does one training step with autocast and a
    GradScaler; graded against torch.amp's recipe for fp32, fp16 and bf16, three steps each."""
    for precision in ("fp32", "fp16", "bf16"):
        model, x, y = tiny_problem()
        ref = copy.deepcopy(model)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=precision == "fp16") for _ in range(2)]
        for step in range(3):
            amp_step(model, x, y, opts[0], scalers[0], precision)
            _reference_step(ref, x, y, opts[1], scalers[1], precision)
            compare_models(f"{precision}, step {step}", model, ref)
            if scalers[0].get_scale() != scalers[1].get_scale():
                raise CheckFailed(f"{precision}, step {step}: expected loss scale {scalers[1].get_scale()}, got "
                                  f"{scalers[0].get_scale()} (did you call scaler.update()?)")
    _passed("check_amp_step", "fp32, fp16 + GradScaler and bf16, 3 steps each, bit-identical to torch.amp's recipe")


# --- part 2: is `measure` measuring what it says? -------------------------------------------------------

CHECK_BATCH, CHECK_STEPS, CHECK_WARMUP = 64, 16, 3   # the check's own run: 16 steps of 64, 3 of them warm-up
SLOW_STEPS, DELAY, MOST = 3, 0.5, 5.0   # the first 3 steps and the evaluation are made 0.5-5 s slower each


def _sliced(data, n_train: int, n_test: int, clock: _StepClock):
    """A copy of `data` holding its first n_train / n_test images, whose held-out batches come late (each
    evaluation takes twice as long as the steps after the warm-up), and which counts the training batches
    it gives out."""
    from ampteach.training.data import Preloaded

    if not isinstance(data, Preloaded):
        raise CheckFailed(f"expected the preloaded FashionMNIST data your measure trains on (the notebook's `data`), "
                          f"got {type(data).__name__}")

    class SlowHeldOut(type(data)):
        def batches(self, batch_size, shuffle=True, seed=0, split="train", drop_last=False):
            if split == "test":
                clock.sleep(2 * clock.since_warmup())     # evaluation: it must not count as training time
            for x, y in super().batches(batch_size, shuffle, seed, split, drop_last):
                if split == "train":
                    self.given.append(len(x))
                yield x, y

    fields = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    fields.update(train_x=data.train_x[:n_train], train_y=data.train_y[:n_train],
                  test_x=data.test_x[:n_test], test_y=data.test_y[:n_test])
    small = SlowHeldOut(**fields)
    small.given = []
    return small


def _names_used(fn: Callable, depth: int = 2) -> set[str]:
    """The global and attribute names fn's code uses, with those of the notebook functions it calls."""
    names, seen = set(), set()

    def walk(code: types.CodeType, namespace: dict, level: int) -> None:
        if code in seen:
            return
        seen.add(code)
        names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const, namespace, level)
        for name in code.co_names:
            other = namespace.get(name)
            if level and isinstance(other, types.FunctionType) and other.__globals__ is namespace:
                walk(other.__code__, namespace, level - 1)

    code = getattr(fn, "__code__", None)
    if code is not None:
        walk(code, fn.__globals__, depth)
    return names


class _StepClock:
    """Global optimizer hooks: the first SLOW_STEPS steps are a warm-up that costs (the last of them sleeps
    long enough to outweigh every later step together, judged from the one before it), and every step's
    end is timestamped (on CUDA with an event, read after the run, so that nothing here synchronises)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.ends, self.walls, self.sleeps, self.optimizers = cuda, [], [], [], []
        self.slept = 0.0

    def sleep(self, seconds: float) -> None:
        start = time.perf_counter()
        time.sleep(min(MOST, max(DELAY, seconds)))
        self.sleeps.append(time.perf_counter() - start)     # as slept: a busy machine wakes late
        self.slept += self.sleeps[-1]

    def since_warmup(self) -> float:
        """Seconds from the end of the warm-up to the end of the last step so far."""
        return self.walls[-1] - self.walls[SLOW_STEPS - 1] if len(self.walls) >= SLOW_STEPS else 0.0

    def pre(self, optimizer, args, kwargs) -> None:
        step = len(self.ends)
        if step < SLOW_STEPS:
            typical = 0.0       # the last warm-up step outweighs every later one, judged by the step before it
            if step == SLOW_STEPS - 1 and step >= 2 and not self.cuda:
                typical = self.walls[step - 1] - self.walls[step - 2] - self.sleeps[step - 1]
            self.sleep(2 * CHECK_STEPS * typical)
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)

    def post(self, optimizer, args, kwargs) -> None:
        self.walls.append(time.perf_counter())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.ends.append(event)
        else:
            self.ends.append(self.walls[-1])

    def seconds(self, first: int, last: int) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return self.ends[first].elapsed_time(self.ends[last]) / 1e3
        return self.ends[last] - self.ends[first]

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.handles = [register_optimizer_step_pre_hook(self.pre), register_optimizer_step_post_hook(self.post)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


def _plausible_memory(peak: float, params: list[torch.Tensor], cuda: bool) -> str | None:
    """What looks wrong with a peak-memory figure for this model at CHECK_BATCH, or None."""
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    weights = [p for p in params if p.dim() == 2]
    if cuda:
        if peak < param_bytes:
            return (f"peak memory {peak:,.0f} bytes is less than the model's own parameters ({param_bytes:,} bytes): "
                    f"read torch.cuda.memory_allocated() as the baseline before you build the model, and "
                    f"reset_peak_memory_stats() before training, so the peak counts the weights, their gradients, "
                    f"AdamW's moments and the activations")
        return None
    first_in = weights[0].shape[1] if weights else 1
    least = CHECK_BATCH * first_in * 2            # the first layer keeps its input for backward, 2 bytes or more each
    widths = sum(w.shape[0] + w.shape[1] for w in weights)
    most = 4 * CHECK_BATCH * widths * 4 + 2 * param_bytes   # every layer's input and output in fp32, 4x, + weights
    if not least <= peak <= most:
        return (f"peak_mem_bytes {peak:,.0f} for a batch of {CHECK_BATCH} is not what one batch's saved activations "
                f"take in this model (between {least:,} and {most:,} bytes: its first layer alone keeps "
                f"{CHECK_BATCH} x {first_in} inputs): on a CPU, report saved_activation_bytes(model, x, y, precision) "
                f"for one batch of batch_size images")
    return None


def check_e6_1_measure(measure: Callable, data) -> None:
    """measure(precision, data, epochs, batch_size, warmup_steps) -> {"samples_per_s", "peak_mem_bytes",
    "accuracy"}, run by the check for fp32 on 16 batches of 64 with warmup_steps=3, while it makes the
    3 warm-up steps and the evaluation slower (each by more than the other steps take together): samples/s
    must match the speed at which the later steps really ran (so warm-up and evaluation stay out of it,
    and CUDA time is synchronised); the memory must fit the model and the batch."""
    clock = _StepClock(getattr(getattr(data, "device", None), "type", "cpu") == "cuda")
    small = _sliced(data, CHECK_BATCH * CHECK_STEPS, 256, clock)
    cuda = clock.cuda
    with clock:
        row = measure("fp32", small, epochs=1, batch_size=CHECK_BATCH, warmup_steps=CHECK_WARMUP)
    if not isinstance(row, dict) or not all(isinstance(row.get(k), (int, float)) and math.isfinite(row[k])
                                            for k in ("samples_per_s", "peak_mem_bytes", "accuracy")):
        raise CheckFailed(f"expected a dict of three numbers, samples_per_s, peak_mem_bytes and accuracy, "
                          f"got {row!r:.200}")
    if not _names_used(measure) & {"synchronize", "elapsed_time"}:
        raise CheckFailed("your measure never calls torch.cuda.synchronize(): on a GPU, kernels run asynchronously "
                          "and the clock would time their launch, not their work. Call it (when the data is on "
                          "CUDA) before each clock read")
    if len(clock.ends) < CHECK_STEPS or len(small.given) < CHECK_STEPS:
        raise CheckFailed(f"expected {CHECK_STEPS} optimizer steps on the {CHECK_STEPS} batches of {CHECK_BATCH} "
                          f"the check passed (epochs=1), saw {len(clock.ends)} steps on {len(small.given)} batches")
    after = len(clock.ends) - SLOW_STEPS
    true = CHECK_BATCH * after / clock.seconds(SLOW_STEPS - 1, len(clock.ends) - 1)
    ratio = row["samples_per_s"] / true
    if ratio < 0.5:
        raise CheckFailed(
            f"your measure reported {row['samples_per_s']:,.0f} samples/s, but the steps after the warm-up ran at "
            f"{true:,.0f} samples/s: the check made the first {SLOW_STEPS} steps and the evaluation slower (by "
            f"{clock.slept:.1f} s in all), and your figure slowed down with them. Start the clock after warmup_steps "
            f"steps and stop it before evaluate()")
    if ratio > 2.0:
        sync = ", and call torch.cuda.synchronize() before each clock read (else you time the launches)" if cuda else ""
        raise CheckFailed(
            f"your measure reported {row['samples_per_s']:,.0f} samples/s, faster than the {true:,.0f} samples/s at "
            f"which this machine ran the steps: count only the samples of the steps you timed{sync}")
    params = [p for opt in clock.optimizers for group in opt.param_groups for p in group["params"]]
    wrong = _plausible_memory(row["peak_mem_bytes"], params, cuda)
    if wrong:
        raise CheckFailed(wrong)
    if not 0 < row["accuracy"] <= 100:
        raise CheckFailed(f"expected accuracy in percent (0-100], got {row['accuracy']!r}")
    _passed("check_e6_1_measure", f"samples/s {ratio:.2f}x the speed the steps ran at (warm-up and evaluation "
            f"left out); memory fits the model and a batch of {CHECK_BATCH}")


def check_e6_1_table(rows: dict[str, dict], device: str = "cpu") -> None:
    """rows[precision] = {"samples_per_s", "peak_mem_bytes", "accuracy"} for fp32, fp16 and bf16 (as
    measured by your `measure`); checks they are complete and plausible and prints them side by side
    against the textbook's expectations (1.5-3x faster on a GPU, activation memory about halved,
    accuracy within 0.5 points)."""
    missing = [p for p in ("fp32", "fp16", "bf16") if p not in rows]
    if missing:
        raise CheckFailed(f"expected rows for fp32, fp16 and bf16, missing {missing}")
    for precision, row in rows.items():
        for key in ("samples_per_s", "peak_mem_bytes", "accuracy"):
            value = row.get(key) if isinstance(row, dict) else None
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise CheckFailed(f"{precision}: expected a positive number for {key!r}, got {value!r}")
        if row["accuracy"] <= 1:
            raise CheckFailed(f"{precision}: expected accuracy in percent (0-100), got {row['accuracy']!r}")
    base = rows["fp32"]
    print(f"{'config':7s} {'samples/s':>10s} {'vs fp32':>8s} {'memory MB':>10s} {'vs fp32':>8s} {'accuracy':>9s} "
          f"{'vs fp32':>8s}")
    for precision, row in rows.items():
        print(f"{precision:7s} {row['samples_per_s']:10,.0f} {row['samples_per_s'] / base['samples_per_s']:7.2f}x "
              f"{row['peak_mem_bytes'] / 2**20:10.2f} {row['peak_mem_bytes'] / base['peak_mem_bytes']:7.2f}x "
              f"{row['accuracy']:8.1f}% {row['accuracy'] - base['accuracy']:+7.1f}")
    for precision in ("fp16", "bf16"):
        gap = rows[precision]["accuracy"] - base["accuracy"]
        if abs(gap) > 2.0:
            raise CheckFailed(f"{precision}: accuracy {rows[precision]['accuracy']:.1f}% is {gap:+.1f} points from "
                              f"fp32's {base['accuracy']:.1f}%; expected within 2 points (the textbook: 0.5 at "
                              f"convergence). Same model, seed, data order and epochs for every config?")
        if device == "cpu" and rows[precision]["peak_mem_bytes"] >= base["peak_mem_bytes"]:
            raise CheckFailed(f"{precision}: expected fewer activation bytes than fp32 "
                              f"({base['peak_mem_bytes']:,}), got {rows[precision]['peak_mem_bytes']:,}: "
                              f"was the forward pass under autocast when you measured?")
    speed = max(rows["fp16"]["samples_per_s"], rows["bf16"]["samples_per_s"]) / base["samples_per_s"]
    from ampteach.training.machine import machine_line

    print(f"\ntextbook: 1.5-3x faster on a GPU; here the faster AMP config ran {speed:.2f}x fp32 on {device}")
    print(machine_line(device))
    _passed("check_e6_1_table", "three complete rows; accuracies within 2 points of fp32"
            + ("; less activation memory than fp32" if device == "cpu" else ""))

