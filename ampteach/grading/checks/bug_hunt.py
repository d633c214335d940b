"""AMP bug hunt: a training loop with planted mistakes, graded by its outcome against a correct torch.amp loop.

    from ampteach.grading.checks import HiddenMLP, bug_hunt_problem, check_bug_hunt
    check_bug_hunt(train_loop)   # train_loop(model, batches, optimizer, scaler, accum_steps, max_norm) -> scales

The correct loop: fp16 autocast around the forward pass and the loss (cross-entropy plus a small
penalty: the L2 norm of the hidden activations, computed in float32), a scaled backward of the loss divided by
accum_steps for every micro-batch, and once per accum_steps micro-batches: unscale_, clip to
max_norm, step, update, zero_grad. Graded by what comes out, as a reviewer would: the loss scale
after every optimizer step must equal the correct loop's exactly, and the final weights must agree
with it to within float32 noise (the penalty may be written in several correct ways).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed

__all__ = [
    "PENALTY", "SETTINGS", "HiddenMLP", "bug_hunt_problem", "check_bug_hunt", "check_bug_hunt_hidden",
    "reference_loop",
]

PENALTY = 1e-3   # weight of the activation penalty: the L2 norm of the hidden activations


class HiddenMLP(nn.Module):
    """64 inputs -> 512 hidden units (ReLU) -> 10 logits; forward returns (hidden, logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 512), nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = F.relu(self.fc1(x))
        return hidden, self.fc2(hidden)


def bug_hunt_problem(seed: int = 0, micro_batches: int = 16, lr: float = 0.05):
    """(model, batches, optimizer): a seeded HiddenMLP, micro-batches of 128 inputs, SGD with momentum."""
    torch.manual_seed(seed)
    model = HiddenMLP()
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [(3.0 * torch.randn(128, 64, generator=gen), torch.randint(0, 10, (128,), generator=gen))
               for _ in range(micro_batches)]
    return model, batches, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def reference_loop(model, batches, optimizer, scaler, accum_steps: int = 4, max_norm: float = 1.0) -> list[float]:
    """The correct loop; returns the loss scale after each optimizer step."""
    scales = []
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.float16):
            hidden, logits = model(x)
            loss = F.cross_entropy(logits, y) + PENALTY * hidden.float().pow(2).sum().sqrt()
        scaler.scale(loss / accum_steps).backward()
        if (i + 1) % accum_steps == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scales.append(scaler.get_scale())
    return scales


SETTINGS = {"visible": dict(seed=0, micro_batches=16, accum_steps=4, max_norm=1.0, init_scale=2.0**16),
            "hidden": dict(seed=5, micro_batches=15, accum_steps=3, max_norm=0.5, init_scale=2.0**12)}


def _run(train_loop: Callable, settings: dict, which: str) -> None:
    s = dict(settings)
    model, batches, opt = bug_hunt_problem(s["seed"], s["micro_batches"])
    ref, ref_batches, ref_opt = bug_hunt_problem(s["seed"], s["micro_batches"])
    start = copy.deepcopy(ref)
    scaler = torch.amp.GradScaler("cpu", init_scale=s["init_scale"], growth_interval=2)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=s["init_scale"], growth_interval=2)
    want = reference_loop(ref, ref_batches, ref_opt, ref_scaler, s["accum_steps"], s["max_norm"])
    got = train_loop(model, batches, opt, scaler, s["accum_steps"], s["max_norm"])
    case = f"{which} run ({s['micro_batches']} micro-batches, accum_steps={s['accum_steps']}, max_norm={s['max_norm']})"
    if not isinstance(got, (list, tuple)) or [float(v) for v in got] != want:
        got_list = list(got) if isinstance(got, (list, tuple)) else got
        note = ""
        if isinstance(got, (list, tuple)) and len(got) != len(want):
            note = f" (expected one scale per optimizer step: {len(want)}, got {len(got)})"
        elif isinstance(got, (list, tuple)) and len(got) > 2 and all(b == a / 2 for a, b in zip(got, got[1:])):
            note = " (yours halves at every step: every step was skipped, so something in every step is inf/NaN)"
        raise CheckFailed(f"{case}: the loss scale after each optimizer step should be {want}, got {got_list}{note}")
    for (name, p), q, p0 in zip(model.named_parameters(), ref.parameters(), start.parameters()):
        if p.dtype != torch.float32:
            raise CheckFailed(f"{case}: parameter {name} is {p.dtype} after training; the model must stay float32 "
                              f"(autocast runs the ops in half precision, the weights stay fp32)")
        moved = (q - p0).abs().max().item()
        diff = (p.detach() - q.detach()).abs().max().item()
        if not diff <= 1e-3 * moved + 1e-7:
            ratio = ((p.detach() - p0).norm() / (q - p0).norm()).item()
            raise CheckFailed(f"{case}: the scale trajectory is right, but parameter {name} ends up "
                              f"{diff:.3g} away from the correct loop's (which moved it up to {moved:.3g}); yours "
                              f"moved {ratio:.3g} times as far")


def check_bug_hunt(train_loop: Callable) -> None:
    """train_loop(model, batches, optimizer, scaler, accum_steps, max_norm) -> loss scale after each
    optimizer step; graded against the correct torch.amp loop: scales exactly, weights to float32 noise."""
    _run(train_loop, SETTINGS["visible"], "the")
    _passed("check_bug_hunt", "same loss scales and final weights as a correct torch.amp loop")


def check_bug_hunt_hidden(train_loop: Callable) -> None:
    """Another seed, accumulation length, clipping threshold and initial scale."""
    _run(train_loop, SETTINGS["hidden"], "another")
    _passed("check_bug_hunt_hidden", "same loss scales and final weights with other settings")


