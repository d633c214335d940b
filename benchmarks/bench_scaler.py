"""Target: ampteach.GradScaler's unscale_ + step + update costs at most ~1.5x torch.amp.GradScaler's.

    python benchmarks/bench_scaler.py            # prints the device, the times and the ratios

The model has 200 parameter tensors (100 Linear(64, 64) layers, weight + bias each). Two rows:
"with SGD step" times what a training loop pays (scaler calls + SGD-with-momentum's own step, the
target); "scaler only" uses an optimizer whose step does nothing, so it isolates the scaler's own
bookkeeping (torch's is one fused C++ kernel per dtype; ampteach's uses two foreach passes).
Each time is the median of several repeats of many iterations, alternating the two scalers.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch

from ampteach.scaler import GradScaler

N_LAYERS = 100          # weight + bias each: 200 parameter tensors
WIDTH = 64
ITERS = 200
REPEATS = 7


class NoStep(torch.optim.Optimizer):
    """An optimizer whose step does nothing: what is left is the scaler's own cost."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        return None


def make_params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(N_LAYERS)])
    params = list(model.parameters())
    assert len(params) == 2 * N_LAYERS
    return params


def time_scaler(scaler, params, optimizer, grads) -> float:
    """Seconds per iteration of scale + unscale_ + step + update (gradients reset outside the clock)."""
    loss = torch.ones(())
    total = 0.0
    for _ in range(ITERS):
        for p, g in zip(params, grads):
            p.grad.copy_(g)
        scaler.scale(loss)
        t0 = time.perf_counter()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        total += time.perf_counter() - t0
    return total / ITERS


def compare(make_optimizer, label: str) -> float:
    params = make_params()
    grads = [torch.randn_like(p) * 2.0**10 for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer = make_optimizer(params)
    scalers = {"torch": torch.amp.GradScaler("cpu"), "ampteach": GradScaler("cpu")}
    times: dict[str, list[float]] = {name: [] for name in scalers}
    for _ in range(REPEATS):
        for name, scaler in scalers.items():
            times[name].append(time_scaler(scaler, params, optimizer, grads))
    t_torch, t_ours = statistics.median(times["torch"]), statistics.median(times["ampteach"])
    ratio = t_ours / t_torch
    print(f"{label:<16} torch {t_torch * 1e6:8.1f} us   ampteach {t_ours * 1e6:8.1f} us   ratio {ratio:.2f}x")
    return ratio


def main() -> None:
    print(f"device: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {2 * N_LAYERS} parameter tensors")
    ratio = compare(lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9), "with SGD step")
    compare(NoStep, "scaler only")
    verdict = "meets" if ratio <= 1.5 else "MISSES"
    print(f"target: unscale_ + step + update at most ~1.5x torch's -> {verdict} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
