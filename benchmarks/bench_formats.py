"""Target: ampteach.round_to_format on 4M float32 values costs at most ~30x torch's x.to(dtype).float().

    python benchmarks/bench_formats.py           # prints the device, the times and the ratio per format
    python benchmarks/bench_formats.py --threads 1   # steadier numbers on a machine busy with other work

Two inputs, because the cost depends on where the values sit: "randn*100" (what activations and
gradients look like: almost all in fp16's normal range) and "all bit patterns" (random int32 bit
patterns viewed as float32: every exponent equally often, so ~40% of them fall below fp16's smallest
normal and take the slower subnormal step, and torch's own casts slow down on float32 subnormals).
Each time is the median of several repeats, alternating torch and ampteach. With several threads
every elementwise step is a parallel region, and on a machine busy with other work each of those
can wait for a time slice: there, --threads 1 measures the code rather than the scheduler. tf32 has no torch dtype
and fp32 -> fp32 is a no-op in torch, so neither has a ratio; round_to_bf16 (the short, bf16-only version) is timed
next to bf16.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from ampteach.amp.formats import FORMATS, round_to_bf16, round_to_format

N = 4 * 2**20
REPEATS = 7
TARGET = 30.0


def median_seconds(fns: list, x: torch.Tensor) -> list[float]:
    """Median seconds per call of each fn on x, the fns taking turns within each repeat."""
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn(x)  # warm-up
    for _ in range(REPEATS):
        for fn, t in zip(fns, times):
            t0 = time.perf_counter()
            fn(x)
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    patterns = torch.randint(-(2**31), 2**31, (N,), dtype=torch.int64, generator=g).to(torch.int32)
    return {"randn*100": torch.randn(N, generator=g) * 100, "all bit patterns": patterns.view(torch.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {N:,} float32 values")
    worst = 0.0
    for label, x in inputs().items():
        print(f"\n{label}")
        for name, fmt in FORMATS.items():
            ours = {name: lambda v, f=fmt: round_to_format(v, f)}
            if name == "bf16":
                ours["round_to_bf16"] = round_to_bf16
            if fmt.torch_dtype in (None, torch.float32):
                (t_ours,) = median_seconds([ours[name]], x)
                why = "no torch dtype" if fmt.torch_dtype is None else "torch's cast is a no-op"
                print(f"  {name:<14} torch        -      ampteach {t_ours * 1e3:7.1f} ms   ({why})")
                continue
            for impl, fn in ours.items():
                t_torch, t_ours = median_seconds([lambda v, d=fmt.torch_dtype: v.to(d).float(), fn], x)
                ratio = t_ours / t_torch
                worst = max(worst, ratio)
                print(f"  {impl:<14} torch {t_torch * 1e3:7.1f} ms   ampteach {t_ours * 1e3:7.1f} ms   "
                      f"ratio {ratio:5.1f}x")
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"\ntarget: round_to_format at most ~{TARGET:.0f}x torch's cast -> {verdict} (worst {worst:.1f}x)")


if __name__ == "__main__":
    main()
