"""Target: a training step under ampteach.autocast within 1.05x of one under torch.autocast (CPU).

    python benchmarks/bench_autocast.py              # prints the device, the times and the ratios
    python benchmarks/bench_autocast.py --steps 400  # more steps: steadier minima on a busy machine

A step is the course's: forward + cross-entropy inside the region, then backward and an AdamW step
outside it, on a FashionMNIST-sized batch (128 images). Both autocasts work at the dispatcher's
AutocastCPU key; ampteach's kernels are Python, so its overhead is a few microseconds per call of
a listed op (the MLP calls three: two linears and the loss; the CNN five) plus entering and leaving
the region. Unlisted ops (ReLU, pooling, BatchNorm, the whole backward pass) never enter Python.
Rows: the course MLP (256) and CNN (32, 64) in bfloat16 (the target), the MLP in float16 and an MLP
of eight narrow layers (many calls, little arithmetic: the worst case), for information.

Steps alternate between torch and ampteach, one at a time, and a row compares each side's fastest
step: on a shared machine the fastest run is the one least disturbed by other work, so this ratio
stays stable where averages swing with the load.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from ampteach.autocast import autocast
from ampteach.models import cnn, mlp

BATCH = 128
TARGET = 1.05


def best_steps(build, dtype: torch.dtype, steps: int) -> dict[str, float]:
    """Fastest full training step (seconds) of the same model trained alternately under each autocast."""
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    regions = {"torch": lambda: torch.autocast("cpu", dtype=dtype), "ampteach": lambda: autocast("cpu", dtype=dtype)}
    best = {name: float("inf") for name in regions}
    for i in range(steps + 5):
        for name, region in regions.items():
            t0 = time.perf_counter()
            with region():
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            elapsed = time.perf_counter() - t0
            if i >= 5:   # the first steps warm up kernels, caches and ampteach's registration
                best[name] = min(best[name], elapsed)
    return best


def compare(label: str, build, dtype: torch.dtype, steps: int) -> float:
    best = best_steps(build, dtype, steps)
    ratio = best["ampteach"] / best["torch"]
    print(f"{label:<28} torch {best['torch'] * 1e3:8.3f} ms   ampteach {best['ampteach'] * 1e3:8.3f} ms"
          f"   ratio {ratio:.3f}x")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="measured steps per side for the MLP rows")
    args = parser.parse_args()
    print(f"device: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; batch {BATCH}; best of {args.steps} alternating steps "
          "(forward + loss in the region, backward + AdamW outside)")
    ratios = {
        "mlp(256) bf16": compare("mlp(256) bf16", mlp, torch.bfloat16, args.steps),
        "cnn(32, 64) bf16": compare("cnn(32, 64) bf16", cnn, torch.bfloat16, max(20, args.steps // 5)),
    }
    compare("mlp(256) fp16", mlp, torch.float16, max(20, args.steps // 5))
    compare("mlp(64 x 8) bf16, small ops", lambda: mlp((64,) * 8), torch.bfloat16, args.steps)
    worst = max(ratios.values())
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"target: a course training step under ampteach.autocast at most {TARGET}x torch.autocast's "
          f"-> {verdict} (worst of the course models: {worst:.3f}x)")


if __name__ == "__main__":
    main()
