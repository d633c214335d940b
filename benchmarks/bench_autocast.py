"""Target: a training step under ampteach.autocast costs at most ~1.25x one under torch.autocast (CPU).

    python benchmarks/bench_autocast.py          # prints the device, the times and the ratios

A step is the course's: forward + cross-entropy inside the region, then backward and an AdamW step
outside it, on a FashionMNIST-sized batch (128 images). ampteach's overhead is Python per op call
(a torch function mode looks each call up in its cast lists), so the ratio is largest for models
with many small ops and shrinks as the matmuls grow. Rows: the course MLP (256) and CNN (32, 64) in
bfloat16, plus the MLP in float16 (slow matmuls on CPUs without native fp16: overhead hidden) and a
region-heavy "many small ops" MLP that shows the worst case. Each time is the median of alternating
repeats, so both sides see the same machine load.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch
import torch.nn.functional as F

from ampteach.autocast import autocast
from ampteach.models import cnn, mlp

BATCH = 128
REPEATS = 5
TARGET = 1.25


def step(model, opt, x, y, region) -> None:
    with region:
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def time_steps(model, x, y, make_region, iters: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        step(model, opt, x, y, make_region())
    t0 = time.perf_counter()
    for _ in range(iters):
        step(model, opt, x, y, make_region())
    return (time.perf_counter() - t0) / iters


def alternating_medians(timers: dict, repeats: int = REPEATS) -> dict[str, float]:
    """Median seconds of each timer over `repeats` rounds; each round runs every timer once, in turn."""
    rounds = [{name: timer() for name, timer in timers.items()} for _ in range(repeats)]
    return {name: statistics.median(r[name] for r in rounds) for name in timers}


def compare(label: str, build, dtype: torch.dtype, iters: int) -> float:
    torch.manual_seed(0)
    model = build()
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    medians = alternating_medians({
        "torch": lambda: time_steps(model, x, y, lambda: torch.autocast("cpu", dtype=dtype), iters),
        "ampteach": lambda: time_steps(model, x, y, lambda: autocast("cpu", dtype=dtype), iters),
    })
    ratio = medians["ampteach"] / medians["torch"]
    print(f"{label:<28} torch {medians['torch'] * 1e3:8.2f} ms   ampteach {medians['ampteach'] * 1e3:8.2f} ms"
          f"   ratio {ratio:.2f}x")
    return ratio


def main() -> None:
    print(f"device: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; batch {BATCH}, forward + loss in the region, backward + AdamW outside")
    ratios = {
        "mlp(256) bf16": compare("mlp(256) bf16", mlp, torch.bfloat16, 20),
        "cnn(32, 64) bf16": compare("cnn(32, 64) bf16", cnn, torch.bfloat16, 3),
    }
    compare("mlp(256) fp16", mlp, torch.float16, 3)
    compare("mlp(64 x 8) bf16, small ops", lambda: mlp((64,) * 8), torch.bfloat16, 20)
    worst = max(ratios.values())
    verdict = "meets" if worst <= TARGET else "MISSES"
    print(f"target: a course training step under ampteach.autocast at most ~{TARGET}x torch.autocast's "
          f"-> {verdict} (worst of the course models: {worst:.2f}x)")


if __name__ == "__main__":
    main()
