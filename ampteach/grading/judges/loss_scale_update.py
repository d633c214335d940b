"""Judge of build it yourself 2: the learner's loss-scale update, step for step against torch.amp.GradScaler.

    @judge("check_loss_scale_update")          # the exercise's five plans (random steps: new under grading)
    @judge("check_loss_scale_update_hidden")   # other intervals, factors and starting scales, drawn each time
"""

from __future__ import annotations

import math
import random
from typing import Iterable

import torch
from torch import nn

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

Plan = tuple[str, dict, list[bool]]


def scale_plans(gen: torch.Generator) -> list[Plan]:
    """(name, GradScaler settings, found_inf per step) for the update-rule check."""
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


def hidden_scale_plans(rng: random.Random) -> list[Plan]:
    """Plans the exercise does not show, drawn each time: other intervals, factors and starting scales."""
    steps = [rng.random() < 0.25 for _ in range(200)]
    growth, backoff = rng.choice((1.3, 1.5, 3.0)), rng.choice((0.7, 0.25, 0.6))
    return [
        ("growth every step, odd factors", dict(init_scale=rng.choice((5.0, 7.0, 3.0)), growth_factor=growth,
                                                backoff_factor=backoff, growth_interval=1), steps[:80]),
        (f"200 random steps, 25% overflow, interval {(interval := rng.randint(3, 6))}",
         dict(init_scale=2.0 ** rng.randint(8, 14), growth_interval=interval), steps),
        ("a scale below 1 that grows back", dict(init_scale=2.0 ** -rng.randint(15, 25), growth_factor=4.0,
                                                 growth_interval=2), [False] * 30),
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


def _run_plans(learner: Learner, update_scale: Ref, plans: list[Plan]) -> int:
    steps = 0
    for name, settings, plan in plans:
        full = dict(dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000), **settings)
        scale, tracker = float(full["init_scale"]), 0
        for step, (found_inf, (want_scale, want_tracker)) in enumerate(zip(plan, _torch_scales(settings, plan))):
            got = learner.call(update_scale, scale, tracker, found_inf, full["growth_factor"], full["backoff_factor"],
                               full["growth_interval"], watch="loss_scale_update")
            if not (isinstance(got, tuple) and len(got) == 2):
                raise CheckFailed(f"{name}, step {step}: expected a (new_scale, new_growth_tracker) tuple, got "
                                  f"{describe(got)}")
            try:
                scale, tracker = float(got[0]), int(got[1])
            except (TypeError, ValueError):
                raise CheckFailed(f"{name}, step {step}: expected a number and a count, got {describe(got)}") from None
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


@judge("check_loss_scale_update")
def check_loss_scale_update(learner: Learner, update_scale: Ref) -> str:
    steps = _run_plans(learner, update_scale, scale_plans(learner.generator(0)))
    return f"{steps} steps in 5 plans, identical to torch.amp.GradScaler"


@judge("check_loss_scale_update_hidden")
def check_loss_scale_update_hidden(learner: Learner, update_scale: Ref) -> str:
    plans = hidden_scale_plans(learner.rng)
    steps = _run_plans(learner, update_scale, plans)
    return f"{steps} steps in {len(plans)} more plans"
