"""Target: ampteach.nvfp4_quantize on 4M float32 values costs at most 30x torch's bf16 cast, on one thread.

    python benchmarks/bench_nvfp4.py              # one thread (the target's setting), 4M values of randn
    python benchmarks/bench_nvfp4.py --threads 2

Timed: nvfp4_quantize(x) (one level, torchao's default), nvfp4_quantize(x, per_tensor_scale(x)) (two levels,
what training quantizes; the scale's amax pass included), nvfp4_quantize_2d (the 16x16 weight tiles) and the
stochastic-rounding variant, each against torch's x.to(torch.bfloat16) (and its round trip .float(), which
bench_formats.py compares with). Each time is the median of several repeats, torch and ampteach alternating,
by the thread's own CPU time (time.thread_time: other programs on a shared machine do not count) and by
wall time. The target is for nvfp4_quantize(x) by CPU time; the others are printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ampteach.amp.nvfp4 import nvfp4_quantize, nvfp4_quantize_2d, per_tensor_scale
from ampteach.training.machine import machine_line

N = 4 * 2**20
REPEATS = 9
TARGET = 30.0


def median_seconds(fns: dict, x: torch.Tensor) -> dict[str, tuple[float, float]]:
    """(median thread CPU seconds, median wall seconds) per call of each fn on x, the fns taking turns."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for fn in fns.values():
        fn(x)  # warm-up
    for _ in range(REPEATS):
        for name, fn in fns.items():
            c0, w0 = time.thread_time(), time.perf_counter()
            fn(x)
            times[name].append((time.thread_time() - c0, time.perf_counter() - w0))
    return {name: tuple(statistics.median(col) for col in zip(*t)) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, the target's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(N // 2048, 2048, generator=torch.Generator().manual_seed(0))
    print(f"{machine_line()}; {N:,} float32 values (randn, 2048 wide)")
    fns = {
        "torch x.to(bfloat16)": lambda v: v.to(torch.bfloat16),
        "torch x.to(bfloat16).float()": lambda v: v.to(torch.bfloat16).float(),
        "nvfp4_quantize(x)": lambda v: nvfp4_quantize(v),
        "nvfp4_quantize(x, per_tensor_scale(x))": lambda v: nvfp4_quantize(v, per_tensor_scale(v)),
        "nvfp4_quantize_2d(x, per_tensor_scale(x))": lambda v: nvfp4_quantize_2d(v, per_tensor_scale(v)),
        "... rounding='stochastic'": lambda v: nvfp4_quantize(v, per_tensor_scale(v), rounding="stochastic"),
    }
    t = median_seconds(fns, x)
    cpu, wall = t["torch x.to(bfloat16)"]
    print(f"  {'':44s} {'CPU time':>8s} {'ratio':>6s}   {'wall':>8s} {'ratio':>6s}")
    for name, (c, w) in t.items():
        print(f"  {name:44s} {c * 1e3:5.1f} ms {c / cpu:5.1f}x   {w * 1e3:5.1f} ms {w / wall:5.1f}x")
    ratio = t["nvfp4_quantize(x)"][0] / cpu
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"\ntarget: nvfp4_quantize(x) at most {TARGET:.0f}x torch's bf16 cast by CPU time -> {verdict} "
          f"({ratio:.1f}x)")


if __name__ == "__main__":
    main()
