"""Judge of the AMP bug hunt: the learner's loop against the correct torch.amp loop, on the same problem.

    @judge("check_bug_hunt")          # the exercise's settings (a new seed under grading)
    @judge("check_bug_hunt_hidden")   # another seed, accumulation length, threshold and initial scale, drawn each time
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ampteach.grading.checks.bug_hunt import PENALTY, run_loop
from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe


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


def _grade(learner: Learner, train_loop: Ref, settings: dict, which: str) -> None:
    s = settings
    got = learner.plan("bug_hunt.run", {"train_loop": train_loop}, s)
    ref = run_loop(reference_loop, s)
    want, scales = ref["scales"], got["scales"]
    case = f"{which} run ({s['micro_batches']} micro-batches, accum_steps={s['accum_steps']}, max_norm={s['max_norm']})"
    numbers = isinstance(scales, (list, tuple)) and all(isinstance(v, (int, float)) for v in scales)
    if not numbers or [float(v) for v in scales] != want:
        note = ""
        if numbers and len(scales) != len(want):
            note = f" (expected one scale per optimizer step: {len(want)}, got {len(scales)})"
        elif numbers and len(scales) > 2 and all(b == a / 2 for a, b in zip(scales, scales[1:])):
            note = " (yours halves at every step: every step was skipped, so something in every step is inf/NaN)"
        shown = list(scales) if isinstance(scales, (list, tuple)) else describe(scales)
        raise CheckFailed(f"{case}: the loss scale after each optimizer step should be {want}, got {shown}{note}")
    for (name, p), (_, q), p0 in zip(got["params"], ref["params"], ref["start"]):
        if p.dtype != torch.float32:
            raise CheckFailed(f"{case}: parameter {name} is {p.dtype} after training; the model must stay float32 "
                              f"(autocast runs the ops in half precision, the weights stay fp32)")
        moved = (q - p0).abs().max().item()
        diff = (p - q).abs().max().item()
        if not diff <= 1e-3 * moved + 1e-7:
            ratio = ((p - p0).norm() / (q - p0).norm()).item()
            raise CheckFailed(f"{case}: the scale trajectory is right, but parameter {name} ends up "
                              f"{diff:.3g} away from the correct loop's (which moved it up to {moved:.3g}); yours "
                              f"moved {ratio:.3g} times as far")


@judge("check_bug_hunt")
def check_bug_hunt(learner: Learner, train_loop: Ref) -> str:
    _grade(learner, train_loop, dict(seed=learner.seed(0), micro_batches=16, accum_steps=4, max_norm=1.0,
                                     init_scale=2.0**16), "the")
    return "same loss scales and final weights as a correct torch.amp loop"


@judge("check_bug_hunt_hidden")
def check_bug_hunt_hidden(learner: Learner, train_loop: Ref) -> str:
    rng = learner.rng
    _grade(learner, train_loop, dict(seed=learner.seed(5), micro_batches=rng.choice((12, 15, 18)),
                                     accum_steps=3, max_norm=rng.choice((0.5, 0.25)),
                                     init_scale=2.0 ** rng.choice((12, 13, 14))), "another")
    return "same loss scales and final weights with other settings"
