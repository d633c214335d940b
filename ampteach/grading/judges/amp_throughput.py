"""Judge of exercise E.6.1: the learner's AMP step against torch.amp's recipe, and whether `measure` measures.

    @judge("check_amp_step")       # fp32, fp16 + GradScaler, bf16: three steps each, bit for bit
    @judge("check_e6_1_measure")   # samples/s against the timestamps of a run the check slowed down; memory
    @judge("check_e6_1_table")     # three complete, plausible rows beside the textbook's expectations
"""

from __future__ import annotations

import math

import torch

from ampteach.grading.checks.amp_throughput import BECAUSE, CHECK_BATCH, CHECK_STEPS, SLOW_STEPS, amp_steps
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe
from ampteach.grading.judges.scan import calls_from, refuse_uses

LIBRARY = {"train_step", "run_config", "run_bench", "TrainConfig"}


def reference_step(model, x, y, optimizer, scaler, precision: str, clip_norm: float | None = None):
    from ampteach.training.train import TrainConfig, train_step

    config = TrainConfig(precision=precision, impl="torch", clip_norm=clip_norm, progress=False)
    return train_step(model, x, y, optimizer, scaler, config)


def compare_models(case: str, mine: list, ref: list) -> None:
    for (name, p), (_, q) in zip(mine, ref):
        if not (isinstance(p, torch.Tensor) and p.shape == q.shape and torch.equal(p, q)):
            diff = (p.float() - q.float()).abs().max().item() if isinstance(p, torch.Tensor) and \
                p.shape == q.shape else float("nan")
            raise CheckFailed(f"{case}: parameter {name} differs from torch.amp's recipe "
                              f"(max |difference| {diff:.3g}); expected the same values bit for bit")


@judge("check_amp_step")
def check_amp_step(learner: Learner, amp_step: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    for precision in ("fp32", "fp16", "bf16"):
        seed = learner.seed(0)
        got = learner.plan("amp_throughput.steps", {"amp_step": amp_step}, precision, seed)
        want = amp_steps(reference_step, precision, seed, watched=False)
        for step, (mine, ref) in enumerate(zip(got, want)):
            compare_models(f"{precision}, step {step}", mine["params"], ref["params"])
            if mine["scale"] != ref["scale"]:
                raise CheckFailed(f"{precision}, step {step}: expected loss scale {ref['scale']}, got "
                                  f"{mine['scale']} (did you call scaler.update()?)")
    return "fp32, fp16 + GradScaler and bf16, 3 steps each, bit-identical to torch.amp's recipe"


def _plausible_memory(peak: float, params: list[tuple[tuple[int, ...], int]], cuda: bool) -> str | None:
    """What looks wrong with a peak-memory figure for this model at CHECK_BATCH, or None."""
    param_bytes = sum(math.prod(shape) * size for shape, size in params)
    weights = [shape for shape, _ in params if len(shape) == 2]
    if cuda:
        if peak < param_bytes:
            return (f"peak memory {peak:,.0f} bytes is less than the model's own parameters ({param_bytes:,} bytes): "
                    f"read torch.cuda.memory_allocated() as the baseline before you build the model, and "
                    f"reset_peak_memory_stats() before training, so the peak counts the weights, their gradients, "
                    f"AdamW's moments and the activations")
        return None
    first_in = weights[0][1] if weights else 1
    least = CHECK_BATCH * first_in * 2            # the first layer keeps its input for backward, 2 bytes or more each
    widths = sum(w[0] + w[1] for w in weights)
    most = 4 * CHECK_BATCH * widths * 4 + 2 * param_bytes   # every layer's input and output in fp32, 4x, + weights
    if not least <= peak <= most:
        return (f"peak_mem_bytes {peak:,.0f} for a batch of {CHECK_BATCH} is not what one batch's saved activations "
                f"take in this model (between {least:,} and {most:,} bytes: its first layer alone keeps "
                f"{CHECK_BATCH} x {first_in} inputs): on a CPU, report saved_activation_bytes(model, x, y, precision) "
                f"for one batch of batch_size images")
    return None


@judge("check_e6_1_measure")
def check_e6_1_measure(learner: Learner, measure: Ref, data: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    run = learner.plan("amp_throughput.measure", {"measure": measure, "data": data})
    row, cuda = run["row"], run["cuda"]
    keys = ("samples_per_s", "peak_mem_bytes", "accuracy")
    if not isinstance(row, dict) or not all(isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)
                                            and math.isfinite(row[k]) for k in keys):
        raise CheckFailed(f"expected a dict of three numbers, samples_per_s, peak_mem_bytes and accuracy, "
                          f"got {describe(row)}")
    if not calls_from(learner.sources(), run["name"]) & {"synchronize", "elapsed_time"}:
        raise CheckFailed("your measure never calls torch.cuda.synchronize(): on a GPU, kernels run asynchronously "
                          "and the clock would time their launch, not their work. Call it (when the data is on "
                          "CUDA) before each clock read")
    if run["steps"] < CHECK_STEPS or run["batches"] < CHECK_STEPS:
        raise CheckFailed(f"expected {CHECK_STEPS} optimizer steps on the {CHECK_STEPS} batches of {CHECK_BATCH} "
                          f"the check passed (epochs=1), saw {run['steps']} steps on {run['batches']} batches")
    after = run["steps"] - SLOW_STEPS
    true = CHECK_BATCH * after / run["seconds"]
    ratio = row["samples_per_s"] / true
    # every step timed from the call, warm-up included: a figure nearer that than the true one timed the warm-up
    with_warmup = CHECK_BATCH * run["steps"] / run["from_call"] if run.get("from_call") else true
    timed_warmup = with_warmup < 0.7 * true and row["samples_per_s"] < math.sqrt(with_warmup * true)
    if ratio < 0.5 or timed_warmup:
        raise CheckFailed(
            f"your measure reported {row['samples_per_s']:,.0f} samples/s, but the steps after the warm-up ran at "
            f"{true:,.0f} samples/s: the check made the first {SLOW_STEPS} steps and the evaluation slower (by "
            f"{run['slept']:.1f} s in all), and your figure slowed down with them. Start the clock after warmup_steps "
            f"steps and stop it before evaluate()")
    if ratio > 2.0:
        sync = ", and call torch.cuda.synchronize() before each clock read (else you time the launches)" if cuda else ""
        raise CheckFailed(
            f"your measure reported {row['samples_per_s']:,.0f} samples/s, faster than the {true:,.0f} samples/s at "
            f"which this machine ran the steps: count only the samples of the steps you timed{sync}")
    wrong = _plausible_memory(row["peak_mem_bytes"], run["params"], cuda)
    if wrong:
        raise CheckFailed(wrong)
    if not 0 < row["accuracy"] <= 100:
        raise CheckFailed(f"expected accuracy in percent (0-100], got {row['accuracy']!r}")
    return (f"samples/s {ratio:.2f}x the speed the steps ran at (warm-up and evaluation left out); memory fits the "
            f"model and a batch of {CHECK_BATCH}")


@judge("check_e6_1_table")
def check_e6_1_table(learner: Learner, rows_ref: Ref, device_ref: Ref) -> str:
    from ampteach.training.machine import machine_line

    rows, device = learner.value(rows_ref), learner.value(device_ref)
    if not isinstance(rows, dict):
        raise CheckFailed(f"expected a dict of rows keyed by precision, got {describe(rows)}")
    missing = [p for p in ("fp32", "fp16", "bf16") if p not in rows]
    if missing:
        raise CheckFailed(f"expected rows for fp32, fp16 and bf16, missing {missing}")
    for precision, row in rows.items():
        for key in ("samples_per_s", "peak_mem_bytes", "accuracy"):
            value = row.get(key) if isinstance(row, dict) else None
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise CheckFailed(f"{precision}: expected a positive number for {key!r}, got {describe(value)}")
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
    print(f"\ntextbook: 1.5-3x faster on a GPU; here the faster AMP config ran {speed:.2f}x fp32 on {device}")
    print(machine_line(device if device in ("cpu", "cuda") else "cpu"))
    return "three complete rows; accuracies within 2 points of fp32" + ("; less activation memory than fp32"
                                                                        if device == "cpu" else "")
