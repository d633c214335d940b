"""Targets: a training step under ampteach.autocast within 1.05x of torch.autocast's, and switching
between the two every step within 1.10x (CPU; course MLP 784-256-10, batch 64, bf16).

    python benchmarks/bench_autocast.py                 # both targets: blocks, then --alternate
    python benchmarks/bench_autocast.py --alternate     # only the switching target
    python benchmarks/bench_autocast.py --cpu-time      # one thread, thread CPU time (a shared machine)
    python benchmarks/bench_autocast.py --more          # also the CNN, fp16 and a narrow 8-layer MLP (information)
    python benchmarks/bench_autocast.py --floor         # also blocks with minimal Python kernels (information)

A step is forward + cross-entropy inside the region, then backward outside it. Both autocasts work at
the dispatcher's AutocastCPU key; ampteach's kernels are Python, so a step pays per call of a listed
op (the MLP calls three: two linears and the loss) what running Python costs (see benchmarks/README.md
for instruction counts). Unlisted ops (ReLU, pooling, the whole backward pass) never enter Python.

Blocks: each round runs a block of steps under torch.autocast on torch's own kernels (ampteach's are
removed first, as ampteach.lab.compare_torch.use_torch_kernels does) and a block under ampteach.autocast
(its first step registers the kernels again; the first step of every block is left out), taking turns
to go first. The ratio is the median over rounds of ampteach's block median over torch's block median: each
round's two blocks run milliseconds apart, so a load that drifts more slowly cancels out.

Floor: the blocks again, with ampteach's kernels for linear and cross_entropy_loss replaced by the
least a Python kernel can do (cast every input, call the op below the key: no eligibility checks, no
weight cache, so not torch's rule). What it costs over torch is what any Python kernel pays here.

Alternate: each round runs a block on torch's own kernels, then a block that alternates every step
between torch.autocast and ampteach.autocast, as a user who evaluates under one and trains under the
other would. The kernels stay registered and serve the torch.autocast steps too. The ratio is the
median over rounds of the alternating block's median step over the torch block's median step.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from ampteach.amp import autocast_kernels
from ampteach.amp.autocast import autocast
from ampteach.lab.compare_torch import use_torch_kernels
from ampteach.training.models import cnn, mlp

BATCH = 64
TARGET_BLOCKS, TARGET_ALTERNATE = 1.05, 1.10


def make_step(build, dtype: torch.dtype, batch: int):
    """step(region) -> None: forward + loss under region("cpu", dtype=dtype), backward outside it."""
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step(region) -> None:
        with region("cpu", dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        model.zero_grad(set_to_none=True)
        loss.backward()

    return step


def timed(step, regions: list, clock) -> list[float]:
    """Seconds of each step, step i under regions[i]."""
    times = []
    for region in regions:
        t0 = clock()
        step(region)
        times.append(clock() - t0)
    return times


def blocks(step, rounds: int, block: int, clock) -> dict[str, float]:
    """Per round a torch block on torch's kernels and an ampteach block, in turns first. Ratios of block medians."""
    ratios, fastest = [], {"torch": float("inf"), "ampteach": float("inf")}
    sides = [("torch", torch.autocast), ("ampteach", autocast)]
    for round_ in range(rounds + 1):
        medians = {}
        for name, region in (sides if round_ % 2 else sides[::-1]):
            if name == "torch":
                use_torch_kernels()
            times = timed(step, [region] * block, clock)[1:]     # the first step of a block may (re)register
            medians[name] = statistics.median(times)
            if round_:
                fastest[name] = min(fastest[name], min(times))
        if round_:      # round 0 warms up
            ratios.append(medians["ampteach"] / medians["torch"])
    return {"ratio": statistics.median(ratios), "torch": fastest["torch"], "ampteach": fastest["ampteach"]}


@contextlib.contextmanager
def minimal_kernels():
    """ampteach's CPU kernels, with linear and cross_entropy_loss replaced by casts and a call (the floor)."""
    key, exclude = torch._C.DispatchKey.AutocastCPU, torch._C._dispatch_tls_set_dispatch_key_excluded
    linear, cross_entropy = torch._C._nn.linear, torch._C._nn.cross_entropy_loss
    low = torch.Tensor.bfloat16

    def minimal_linear(x, weight, bias=None):
        exclude(key, True)
        try:
            return linear(x if x.dtype is torch.bfloat16 else low(x), low(weight), None if bias is None else low(bias))
        finally:
            exclude(key, False)

    def minimal_cross_entropy(x, target, weight=None, reduction=1, ignore_index=-100, smoothing=0.0):
        exclude(key, True)
        try:
            return cross_entropy(x.float(), target, weight, reduction, ignore_index, smoothing)
        finally:
            exclude(key, False)

    minimal = {"linear": minimal_linear, "cross_entropy_loss": minimal_cross_entropy}
    real = autocast_kernels._kernel
    autocast_kernels.uninstall()
    autocast_kernels._kernels.cache_clear()
    autocast_kernels._kernel = lambda device, name, policy: (minimal[name] if device == "cpu" and name in minimal
                                                             else real(device, name, policy))
    try:
        yield
    finally:
        autocast_kernels.uninstall()
        autocast_kernels._kernel = real
        autocast_kernels._kernels.cache_clear()


def alternate(step, rounds: int, block: int, clock) -> dict[str, float]:
    """Per round: a torch block on torch's kernels, then a block alternating torch/ampteach every step."""
    ratios, within = [], []
    for round_ in range(rounds + 1):
        use_torch_kernels()
        alone = statistics.median(timed(step, [torch.autocast] * block, clock)[1:])
        mixed = timed(step, [torch.autocast, autocast] * (block // 2), clock)[2:]
        if round_:
            ratios.append(statistics.median(mixed) / alone)
            within.append(statistics.median(mixed[1::2]) / statistics.median(mixed[0::2]))
    return {"ratio": statistics.median(ratios), "ampteach_over_torch_step": statistics.median(within)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternate", action="store_true", help="only the switching target (alternate every step)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds of paired blocks (medians are taken over them)")
    parser.add_argument("--block", type=int, default=20, help="steps per block")
    parser.add_argument("--batch", type=int, default=BATCH, help="images per step")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one intra-op thread, timed by this thread's CPU time (time.thread_time): steadier "
                             "than wall time on a machine shared with other work")
    parser.add_argument("--more", action="store_true", help="also the CNN, the MLP in fp16 and an 8-layer MLP")
    parser.add_argument("--floor", action="store_true",
                        help="also the blocks with minimal Python kernels for linear and the loss (bf16 MLP only)")
    args = parser.parse_args()
    clock = time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)
        clock = time.thread_time
    print(f"device: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {'CPU' if args.cpu_time else 'wall'} time; batch {args.batch}; "
          f"medians of {args.rounds} rounds of {args.block}-step blocks (forward + loss in the region, backward "
          f"outside)", flush=True)
    rows = [("mlp(256) bf16", mlp, torch.bfloat16)]
    if args.more:
        rows += [("cnn(32, 64) bf16", cnn, torch.bfloat16), ("mlp(256) fp16", mlp, torch.float16),
                 ("mlp(64 x 8) bf16, small ops", lambda: mlp((64,) * 8), torch.bfloat16)]
    verdicts = []
    for label, build, dtype in rows:
        step = make_step(build, dtype, args.batch)
        if not args.alternate:
            b = blocks(step, args.rounds, args.block, clock)
            print(f"{label:<30} blocks:    ampteach / torch {b['ratio']:.3f}x   (fastest steps: torch "
                  f"{b['torch'] * 1e3:.3f} ms, ampteach {b['ampteach'] * 1e3:.3f} ms, "
                  f"{b['ampteach'] / b['torch']:.3f}x)", flush=True)
            if label == rows[0][0]:
                verdicts.append(("blocks", b["ratio"], TARGET_BLOCKS))
            if args.floor and label == rows[0][0]:
                with minimal_kernels():
                    f = blocks(step, args.rounds, args.block, clock)
                print(f"{label:<30} floor:     minimal Python kernels / torch {f['ratio']:.3f}x   (what any Python "
                      f"kernel pays here; not torch's rule)", flush=True)
        a = alternate(step, args.rounds, args.block, clock)
        print(f"{label:<30} alternate: mixed / torch alone {a['ratio']:.3f}x   (in the mix, an ampteach step / "
              f"a torch step: {a['ampteach_over_torch_step']:.3f}x)", flush=True)
        if label == rows[0][0]:
            verdicts.append(("alternate", a["ratio"], TARGET_ALTERNATE))
    for name, ratio, target in verdicts:
        print(f"target {name}: at most {target}x -> {'meets' if ratio <= target else 'MISSES'} ({ratio:.3f}x)")


if __name__ == "__main__":
    main()
