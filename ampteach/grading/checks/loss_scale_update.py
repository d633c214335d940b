"""Build it yourself 2: one step of the dynamic loss-scale update, graded against torch.amp.GradScaler.

    from ampteach.grading.checks import check_loss_scale_update
    check_loss_scale_update(update_scale)     # update_scale(scale, tracker, found_inf, growth, backoff, interval)
"""

from __future__ import annotations

import importlib.util
import math
from typing import Callable, Iterable

import torch
from torch import nn

from ampteach.grading.checks.borrowed import Borrowed, package_files
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed


def hidden_scale_plans(seed: int = 1) -> list[tuple[str, dict, list[bool]]]:
    """Plans the exercise does not show: other intervals, factors and starting scales."""
    gen = torch.Generator().manual_seed(seed)
    randoms = (torch.rand(200, generator=gen) < 0.25).tolist()
    return [
        ("growth every step, odd factors", dict(init_scale=5.0, growth_factor=1.3, backoff_factor=0.7,
                                                growth_interval=1), randoms[:80]),
        ("200 random steps, 25% overflow, interval 4", dict(init_scale=2.0**10, growth_interval=4), randoms),
        ("a scale below 1 that grows back", dict(init_scale=2.0**-20, growth_factor=4.0, growth_interval=2),
         [False] * 30),
    ]


# torch's GradScaler, in any of its homes (torch.amp, and the deprecated torch.cuda.amp / torch.cpu.amp)
TORCH_SCALER_MODULES = ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler", "torch.cpu.amp.grad_scaler")
BECAUSE = ("the exercise is to write the rule yourself: what an overflow does to the scale and to the count of "
           "clean steps, and what a clean step does (torch's GradScaler and the course library's own rule, "
           "ampteach.amp.scaler.next_scale, are for comparing after you pass)")


def _own_work(update_scale: Callable) -> Borrowed:
    """torch's scale updates (GradScaler's methods, the _amp_update_scale_ kernel even as torch.ops.aten) and
    every function of the course's torch.amp rebuild (ampteach/amp: its one loss-scale rule wherever it
    lives now) are refused while the learner's update_scale runs; the files are looked up at check time."""
    files = package_files("ampteach.amp", *(m for m in TORCH_SCALER_MODULES if importlib.util.find_spec(m)))
    return Borrowed(getattr(update_scale, "__name__", "function"), files, BECAUSE,
                    aten_ops=("_amp_update_scale_", "_amp_update_scale"))


def scale_plans(seed: int = 0) -> list[tuple[str, dict, list[bool]]]:
    """(name, GradScaler settings, found_inf per step) for the update-rule check."""
    gen = torch.Generator().manual_seed(seed)
    randoms = (torch.rand(300, generator=gen) < 0.1).tolist()
    return [
        ("growth every 3 clean steps, one overflow", dict(init_scale=8.0, growth_interval=3),
         [False, False, False, False, True, False, False, False]),
        ("300 random steps, 10% overflow", dict(init_scale=2.0**16, growth_interval=5), randoms),
        ("odd factors (float32 rounding matters)", dict(init_scale=3.0, growth_factor=1.7, backoff_factor=0.35,
                                                      growth_interval=2), randoms[:60]),
        ("never grow to inf", dict(init_scale=2.0**127, growth_interval=1), [False] * 4),
        ("falls below 1", dict(init_scale=4.0, growth_interval=100), [True] * 6 + [False] * 3),
    ]


def _torch_scales(settings: dict, plan: Iterable[bool]) -> list[tuple[float, int]]:
    """Drive torch.amp.GradScaler with one parameter whose gradient is inf on the planned steps."""
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **settings)
    out = []
    for found_inf in plan:
        scaler.scale(torch.ones(()))  # creates the scale tensor on first use
        param.grad = torch.full((1,), float("inf") if found_inf else 1.0)
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), int(scaler.state_dict()["_growth_tracker"])))
    return out


def check_loss_scale_update(update_scale: Callable[..., tuple[float, int]]) -> None:
    """update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    -> (new_scale, new_growth_tracker); graded step for step against torch.amp.GradScaler."""
    steps = _run_plans(update_scale, scale_plans())
    _passed("check_loss_scale_update", f"{steps} steps in 5 plans, identical to torch.amp.GradScaler")


def check_loss_scale_update_hidden(update_scale: Callable[..., tuple[float, int]]) -> None:
    """The same rule on plans the exercise does not show."""
    steps = _run_plans(update_scale, hidden_scale_plans())
    _passed("check_loss_scale_update_hidden", f"{steps} steps in {len(hidden_scale_plans())} more plans")


def _run_plans(update_scale: Callable, plans: list) -> int:
    steps, guard = 0, _own_work(update_scale)
    for name, settings, plan in plans:
        full = dict(dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000), **settings)
        scale, tracker = float(full["init_scale"]), 0
        for step, (found_inf, (want_scale, want_tracker)) in enumerate(zip(plan, _torch_scales(settings, plan))):
            with guard:
                got = update_scale(scale, tracker, found_inf, full["growth_factor"], full["backoff_factor"],
                                   full["growth_interval"])
            if not (isinstance(got, tuple) and len(got) == 2):
                raise CheckFailed(f"{name}, step {step}: expected a (new_scale, new_growth_tracker) tuple, got {got!r}")
            scale, tracker = float(got[0]), int(got[1])
            if scale != want_scale or tracker != want_tracker:
                hint = ""
                if math.isclose(scale, want_scale, rel_tol=1e-6) and tracker == want_tracker:
                    hint = ("\n  hint: torch keeps the scale in a float32 tensor: round each new scale to float32, "
                            "e.g. float(torch.tensor(x, dtype=torch.float32))")
                raise CheckFailed(
                    f"{name}, step {step} (found_inf={found_inf}, settings {full}): expected scale {want_scale!r} "
                    f"and growth tracker {want_tracker}, got scale {scale!r} and tracker {tracker}{hint}")
            steps += 1
    return steps

