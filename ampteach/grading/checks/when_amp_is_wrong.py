"""Exercise E.6.2: when AMP is wrong: (a) a loss over tiny values, (b) clipping gradients that are still scaled.

    from ampteach.grading.checks import check_tiny_loss, check_clip_threshold, check_clipped_step
    check_tiny_loss(tiny_loss)                              # float32 with autocast off, float64-accurate
    check_clip_threshold(at_2_16, at_2_14)                  # measured by clipping scaled gradients
    check_clipped_step(clipped_accum_step)                  # accumulation + clipping vs torch.amp's recipe

The plans here run in the learner's process: their loss on half-precision logits under autocast, with
a witness that records, for each op it runs, whether autocast was on; and their accumulated, clipped
step, three steps at three thresholds. The judge (ampteach.grading.judges.when_amp_is_wrong) computes
the float64 loss and gradient and replays torch.amp's recipe, and names the usual mistakes: a half
tensor left half inside autocast(enabled=False), a loss computed inside the region, gradients left
over from an earlier step, clipping before unscale_, summing instead of averaging over micro-batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.amp_throughput import tiny_problem
from ampteach.grading.checks.common import one_thread
from ampteach.grading.checks.driver import plan
from ampteach.grading.checks.visible import run_judge

__all__ = ["tiny_loss_problem", "accum_problem", "check_tiny_loss", "check_clip_threshold", "check_clipped_step"]


class AutocastWitness(torch.overrides.TorchFunctionMode):
    """Records, for each tensor op the loss runs, whether CPU autocast was on at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in ("__get__", "__set__", "dtype", "device", "shape", "numel", "dim", "size"):
            self.calls.append((name, torch.is_autocast_enabled("cpu")))
        return func(*args, **(kwargs or {}))


def tiny_loss_problem(seed: int) -> tuple[nn.Parameter, torch.Tensor]:
    torch.manual_seed(seed)
    return nn.Parameter(torch.randn(32, 16) * 0.1), torch.randn(8, 32)


@plan("when_amp_is_wrong.tiny_loss")
def run_tiny_loss(dtype: torch.dtype, center: float, seed: int, *, loss_fn) -> dict:
    """The learner's loss on logits h @ w + center made under CPU autocast: the loss, the logits, the gradient
    with respect to w, and the ops it ran with autocast on and off."""
    with one_thread():
        w, h = tiny_loss_problem(seed)
        witness = AutocastWitness()
        with torch.autocast("cpu", dtype=dtype):
            logits = h @ w + center  # half-precision logits, as a model under autocast makes them
            with witness:
                loss = loss_fn(logits)
        out = {"loss": loss.detach() if isinstance(loss, torch.Tensor) else loss, "logits": logits.detach(),
               "on": sorted({name for name, on in witness.calls if on}),
               "off": any(not on for _, on in witness.calls), "grad": None}
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad:
            (out["grad"],) = torch.autograd.grad(loss, w)
        return out


def accum_problem(max_norm: float, n_micro: int, seed: int):
    """The model (with an earlier step's gradients left in .grad), optimizer, scaler and the micro-batch generator."""
    model, _, _ = tiny_problem(seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
    gen = torch.Generator().manual_seed(seed)
    F.cross_entropy(model(torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(9))),
                    torch.arange(16) % 10).backward()          # an earlier step's gradients, left in .grad
    return model, opt, scaler, gen


def micro_batches(gen: torch.Generator, n_micro: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen))
            for _ in range(n_micro)]


@plan("when_amp_is_wrong.clipped_steps")
def run_clipped_steps(max_norm: float, n_micro: int, seed: int, *, step) -> list[dict]:
    """Three steps of the learner's step on accum_problem: the norm it returned, the parameters and the scale."""
    with one_thread():
        model, opt, scaler, gen = accum_problem(max_norm, n_micro, seed)
        out = []
        for _ in range(3):
            got = step(model, micro_batches(gen, n_micro), opt, scaler, max_norm)
            if isinstance(got, torch.Tensor):
                got = got.detach()
            out.append({"norm": got, "params": [(n, p.detach().clone()) for n, p in model.named_parameters()],
                        "scale": scaler.get_scale()})
        return out


def check_tiny_loss(tiny_loss) -> None:
    """loss_fn(logits) = log(sum(sigmoid(logits))) computed in float32 with autocast disabled, so it
    stays finite under fp16/bf16 autocast; graded against float64 on logits far below zero, with its
    gradient, and by watching that its ops ran with autocast off."""
    run_judge("check_tiny_loss", tiny_loss)


def check_clip_threshold(at_2_16, at_2_14) -> None:
    """Your predictions: the largest TRUE gradient norm that clip_grad_norm_(max_norm=1.0) lets through
    when it runs before unscale_, at S = 2^16 and at S = 2^14; graded by doing it."""
    run_judge("check_clip_threshold", at_2_16, at_2_14)


def check_clipped_step(clipped_accum_step) -> None:
    """clipped_accum_step(model, micro_batches, optimizer, scaler, max_norm) -> the total gradient norm
    (unscaled, before clipping): one fp16 step accumulated over the micro-batches, with clipping; graded
    against zero_grad -> scaled backward per micro-batch (mean loss) -> unscale_ -> clip -> step -> update.
    The model arrives with the previous step's gradients still in .grad, as in a training loop."""
    run_judge("check_clipped_step", clipped_accum_step)
