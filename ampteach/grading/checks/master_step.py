"""Build it yourself 3: the master-weight (O2) step, graded against ampteach.MasterWeights + torch.amp.GradScaler.

    from ampteach.grading.checks import check_master_step
    check_master_step(make_master_copies, master_step)

The plan below runs in the learner's process: it builds the half model, calls make_master_copies,
then five training steps with an overflow at step 2, calling master_step after each scaled backward,
and sends back what each step left (the fp32 copies, the half weights, the scale). The judge
(ampteach.grading.judges.master_step) replays the same steps with the course's MasterWeights. While the
learner's functions run, the library's MasterWeights (ampteach/amp/master.py) is refused.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ampteach.grading.checks.common import CheckFailed, one_thread
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, package_files

__all__ = ["BECAUSE", "OPTIMIZERS", "check_master_step", "make_optimizer", "o2_problem", "o2_batch", "o2_steps"]

BECAUSE = ("the exercise is to keep the fp32 copies and move gradients and weights between them yourself "
           "(ampteach.MasterWeights is the course's version, for comparing after you pass)")
OPTIMIZERS = ("sgd", "adamw")
STEPS, OVERFLOW_AT = 5, 2


@watch("master_step")
def own_copies(who: str) -> Borrowed:
    return Borrowed(who, package_files("ampteach.amp.master"), BECAUSE)


def o2_problem() -> torch.nn.Module:
    """The half model both sides start from: the course MLP 784-32-10 in fp16, seed 0."""
    from ampteach.amp.master import to_half
    from ampteach.training.models import mlp

    torch.manual_seed(0)
    return to_half(mlp((32,)))


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3)


def o2_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(32, 1, 28, 28, generator=gen).half(), torch.randint(0, 10, (32,), generator=gen)


def scaled_backward(net: torch.nn.Module, scaler, x, y, step: int) -> None:
    """zero_grad, scale(loss).backward() (fp16 grads, times S), and an inf in the first weight at OVERFLOW_AT."""
    net.zero_grad(set_to_none=True)
    scaler.scale(F.cross_entropy(net(x).float(), y)).backward()
    if step == OVERFLOW_AT:
        next(net.parameters()).grad[0, 0] = float("inf")


def _check_pairs(pairs, params: list) -> None:
    if not isinstance(pairs, list) or len(pairs) != len(params):
        raise CheckFailed(f"make_master_copies: expected a list of {len(params)} (half, fp32) pairs, "
                          f"got {pairs!r:.200}")
    for i, pair in enumerate(pairs):
        p, m = pair if isinstance(pair, (tuple, list)) and len(pair) == 2 else (None, None)
        if p is not params[i] or not isinstance(m, torch.Tensor) or m.dtype != torch.float32 \
                or not m.requires_grad or not torch.equal(m, p.float()):
            raise CheckFailed(f"make_master_copies, pair {i}: expected (the model's parameter {i}, an fp32 leaf "
                              f"copy with requires_grad and the same values), got "
                              f"({getattr(p, 'dtype', p)} {tuple(getattr(p, 'shape', ()))}, "
                              f"{getattr(m, 'dtype', m)} requires_grad={getattr(m, 'requires_grad', None)})")
        if m.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
            raise CheckFailed(f"make_master_copies, pair {i}: the fp32 copy must not share memory with the model")


def o2_steps(make_master_copies, master_step, opt_name: str, data_seed: int, watched: bool = True) -> list[dict]:
    """make_master_copies on the half model, then STEPS steps, master_step after each scaled backward: what each
    step leaves. The learner's process runs it with the learner's functions (watched); the judge with the course's
    MasterWeights (not watched)."""
    def guard(fn):
        return own_copies(getattr(fn, "__name__", "function")) if watched else contextlib.nullcontext()

    with one_thread():
        model = o2_problem()
        with guard(make_master_copies):
            pairs = make_master_copies(model)
        _check_pairs(pairs, list(model.parameters()))
        opt = make_optimizer(opt_name, [m for _, m in pairs])
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        gen = torch.Generator().manual_seed(data_seed)
        steps = []
        for step in range(STEPS):
            x, y = o2_batch(gen)
            scaled_backward(model, scaler, x, y, step)
            with guard(master_step):
                master_step(pairs, opt, scaler)
            steps.append({"scale": scaler.get_scale(), "masters": [m.detach().clone() for _, m in pairs],
                          "params": [p.detach().clone() for p, _ in pairs]})
        return steps


@plan("master_step.steps")
def run_steps(opt_name: str, data_seed: int, *, make_master_copies, master_step) -> dict:
    return {"steps": o2_steps(make_master_copies, master_step, opt_name, data_seed)}


def check_master_step(make_master_copies, master_step) -> None:
    """make_master_copies(model) -> [(half_param, fp32_copy), ...]; master_step(pairs, optimizer, scaler)
    runs after scaler.scale(loss).backward(). Graded against ampteach.MasterWeights + torch.amp.GradScaler
    (SGD with momentum and AdamW, five steps each, an overflow injected at step 2), bit for bit."""
    run_judge("check_master_step", make_master_copies, master_step)
