"""AMP bug hunt: a training loop with planted mistakes, graded by its outcome against a correct torch.amp loop.

    from ampteach.grading.checks import HiddenMLP, bug_hunt_problem, check_bug_hunt
    check_bug_hunt(train_loop)   # train_loop(model, batches, optimizer, scaler, accum_steps, max_norm) -> scales

The correct loop: fp16 autocast around the forward pass and the loss (cross-entropy plus a small
penalty: the L2 norm of the hidden activations, computed in float32), a scaled backward of the loss
divided by accum_steps for every micro-batch, and once per accum_steps micro-batches: unscale_, clip to
max_norm, step, update, zero_grad. Graded by what comes out, as a reviewer would: the loss scale after
every optimizer step must equal the correct loop's exactly, and the final weights must agree with it
to within float32 noise. The learner's process runs their loop (`run_loop`); the judge runs the correct
one on the same problem.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import one_thread
from ampteach.grading.checks.driver import plan
from ampteach.grading.checks.visible import run_judge

__all__ = ["PENALTY", "HiddenMLP", "bug_hunt_problem", "run_loop", "check_bug_hunt", "check_bug_hunt_hidden"]

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


def run_loop(loop, settings: dict) -> dict:
    """loop(model, batches, optimizer, scaler, accum_steps, max_norm) on the problem `settings` name: what it
    returned, and the model's parameters before and after."""
    s = settings
    with one_thread():
        model, batches, opt = bug_hunt_problem(s["seed"], s["micro_batches"])
        start = [p.detach().clone() for p in model.parameters()]
        scaler = torch.amp.GradScaler("cpu", init_scale=s["init_scale"], growth_interval=2)
        got = loop(model, batches, opt, scaler, s["accum_steps"], s["max_norm"])
        return {"scales": got, "start": start,
                "params": [(name, p.detach().clone()) for name, p in model.named_parameters()]}


@plan("bug_hunt.run")
def learner_loop(settings: dict, *, train_loop) -> dict:
    return run_loop(train_loop, settings)


def check_bug_hunt(train_loop) -> None:
    """train_loop(model, batches, optimizer, scaler, accum_steps, max_norm) -> loss scale after each
    optimizer step; graded against the correct torch.amp loop: scales exactly, weights to float32 noise."""
    run_judge("check_bug_hunt", train_loop)


def check_bug_hunt_hidden(train_loop) -> None:
    """Another seed, accumulation length, clipping threshold and initial scale, drawn each time."""
    run_judge("check_bug_hunt_hidden", train_loop)
