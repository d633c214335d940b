"""Exercise E.6.1: one AMP training step graded against torch.amp's recipe, and the measured table.

    from ampteach.grading.checks import check_amp_step, check_e6_1_measure, check_e6_1_table
    check_amp_step(amp_step)                  # fp32, fp16 + GradScaler, bf16: bit-identical to torch.amp
    check_e6_1_measure(measure, data)         # measure's timing and memory, on a run the check slows down
    check_e6_1_table(rows, device)            # complete, plausible rows beside the textbook's expectations

The plans here run in the learner's process: three steps of their amp_step per precision, and one run
of their measure on a slice of their data whose warm-up steps and evaluation the check makes slower
(global optimizer hooks sleep), with every step's end timestamped. The judge
(ampteach.grading.judges.amp_throughput) compares the steps with torch.amp's recipe and the reported
speed with the timestamps. While their code runs, the course's own training step and loop
(ampteach.train_step, ampteach.train, the bench's run_config) are refused.
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Callable

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed, one_thread
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, library_function

__all__ = ["BECAUSE", "CHECK_BATCH", "CHECK_STEPS", "CHECK_WARMUP", "SLOW_STEPS", "tiny_problem", "amp_steps",
           "check_amp_step", "check_e6_1_measure", "check_e6_1_table"]

BECAUSE = ("the exercise is to write the AMP step and the measurement yourself (the course's train_step, train and "
           "the bench's run_config do it for you: compare with them after you pass)")
CHECK_BATCH, CHECK_STEPS, CHECK_WARMUP = 64, 16, 3   # the check's own run: 16 steps of 64, 3 of them warm-up
SLOW_STEPS, DELAY, MOST = 3, 0.5, 5.0   # the first 3 steps and the evaluation are made 0.5-5 s slower each
LIBRARY_LOOPS = (library_function("training/train.py", "train_step"), library_function("training/train.py", "train"),
                 library_function("tools/bench.py", "run_config"), library_function("tools/bench.py", "run_bench"))


@watch("amp_throughput")
def own_step(who: str) -> Borrowed:
    return Borrowed(who, because=BECAUSE, functions=LIBRARY_LOOPS)


def tiny_problem(seed: int = 0, batch: int = 64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP and one FashionMNIST-shaped batch (random pixels, fixed by seed)."""
    from ampteach.training.models import mlp

    torch.manual_seed(seed)
    model = mlp((64,))
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    return model, x, y


def amp_steps(step: Callable, precision: str, seed: int, watched: bool = True) -> list[dict]:
    """Three steps of step(model, x, y, optimizer, scaler, precision) on tiny_problem(seed): the parameters and
    the scale after each (the judge runs the same with torch.amp's recipe)."""
    with one_thread():
        model, x, y = tiny_problem(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=precision == "fp16")
        out = []
        for _ in range(3):
            if watched:
                with own_step(getattr(step, "__name__", "amp_step")):
                    step(model, x, y, opt, scaler, precision)
            else:
                step(model, x, y, opt, scaler, precision)
            out.append({"params": [(n, p.detach().clone()) for n, p in model.named_parameters()],
                        "scale": scaler.get_scale()})
        return out


@plan("amp_throughput.steps")
def learner_steps(precision: str, seed: int, *, amp_step) -> list[dict]:
    return amp_steps(amp_step, precision, seed)


# --- part 2: is `measure` measuring what it says? -------------------------------------------------------

class StepClock:
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


def sliced(data, n_train: int, n_test: int, clock: StepClock):
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


def names_used(fn: Callable, depth: int = 2) -> list[str]:
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
    return sorted(names)


@plan("amp_throughput.measure")
def learner_measure(*, measure, data) -> dict:
    """One run of measure("fp32", ...) on CHECK_STEPS batches of CHECK_BATCH, the warm-up and evaluation made
    slower: what it reported, and what the clock saw."""
    clock = StepClock(getattr(getattr(data, "device", None), "type", "cpu") == "cuda")
    small = sliced(data, CHECK_BATCH * CHECK_STEPS, 256, clock)
    with clock, own_step(getattr(measure, "__name__", "measure")):
        called = time.perf_counter()
        row = measure("fp32", small, epochs=1, batch_size=CHECK_BATCH, warmup_steps=CHECK_WARMUP)
    steps = len(clock.ends)
    from_call = clock.walls[-1] - called if clock.walls else None
    seconds = clock.seconds(SLOW_STEPS - 1, steps - 1) if steps >= SLOW_STEPS + 1 else None
    params = [p for opt in clock.optimizers for group in opt.param_groups for p in group["params"]]
    return {"row": row, "steps": steps, "batches": len(small.given), "seconds": seconds, "from_call": from_call,
            "slept": clock.slept,
            "cuda": clock.cuda, "params": [(tuple(p.shape), p.element_size()) for p in params],
            "names": names_used(measure), "name": getattr(measure, "__name__", "measure")}


def check_amp_step(amp_step) -> None:
    """amp_step(model, x, y, optimizer, scaler, precision) does one training step with autocast and a
    GradScaler; graded against torch.amp's recipe for fp32, fp16 and bf16, three steps each."""
    run_judge("check_amp_step", amp_step)


def check_e6_1_measure(measure, data) -> None:
    """measure(precision, data, epochs, batch_size, warmup_steps) -> {"samples_per_s", "peak_mem_bytes",
    "accuracy"}, run by the check for fp32 on 16 batches of 64 with warmup_steps=3, while it makes the
    3 warm-up steps and the evaluation slower (each by more than the other steps take together): samples/s
    must match the speed at which the later steps really ran (so warm-up and evaluation stay out of it,
    and CUDA time is synchronised); the memory must fit the model and the batch."""
    run_judge("check_e6_1_measure", measure, data)


def check_e6_1_table(rows: dict, device: str = "cpu") -> None:
    """rows[precision] = {"samples_per_s", "peak_mem_bytes", "accuracy"} for fp32, fp16 and bf16 (as
    measured by your `measure`); checks they are complete and plausible and prints them side by side
    against the textbook's expectations (1.5-3x faster on a GPU, activation memory about halved,
    accuracy within 0.5 points)."""
    run_judge("check_e6_1_table", rows, device)
