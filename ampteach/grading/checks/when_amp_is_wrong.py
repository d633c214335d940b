"""Exercise E.6.2: when AMP is wrong: (a) a loss over tiny values, (b) clipping gradients that are still scaled.

    from ampteach.grading.checks import check_tiny_loss, check_clip_threshold, check_clipped_step
    check_tiny_loss(tiny_loss)                              # float32 with autocast off, float64-accurate
    check_clip_threshold(at_2_16, at_2_14)                  # measured by clipping scaled gradients
    check_clipped_step(clipped_accum_step)                  # accumulation + clipping vs torch.amp's recipe

The messages name the usual mistakes: a half tensor left half inside autocast(enabled=False), a
loss computed inside the autocast region, gradients left over from an earlier step (no zero_grad),
clipping before unscale_, and summing instead of averaging over micro-batches.
"""

from __future__ import annotations

import copy
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.amp_throughput import compare_models, tiny_problem
from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.checks.common import passed as _passed

__all__ = ["MISTAKES", "check_clip_threshold", "check_clipped_step", "check_tiny_loss"]

# --- (a) a loss over tiny probabilities -----------------------------------------------------------


class _AutocastWitness(torch.overrides.TorchFunctionMode):
    """Records, for each tensor op the loss runs, whether CPU autocast was on at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in ("__get__", "__set__", "dtype", "device", "shape", "numel", "dim", "size"):
            self.calls.append((name, torch.is_autocast_enabled("cpu")))
        return func(*args, **(kwargs or {}))


def check_tiny_loss(loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """loss_fn(logits) = log(sum(sigmoid(logits))) computed in float32 with autocast disabled, so it
    stays finite under fp16/bf16 autocast; graded against float64 on logits far below zero, with its
    gradient, and by watching that its ops ran with autocast off."""
    for dtype in (torch.float16, torch.bfloat16):
        for center in (-12.0, -20.0, -30.0):
            torch.manual_seed(0)
            w = nn.Parameter(torch.randn(32, 16) * 0.1)
            h = torch.randn(8, 32)
            witness = _AutocastWitness()
            with torch.autocast("cpu", dtype=dtype):
                logits = h @ w + center  # half-precision logits, as a model under autocast makes them
                with witness:
                    loss = loss_fn(logits)
            case = f"{short(dtype)} autocast, logits near {center:g}"
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise CheckFailed(f"{case}: expected a one-element loss tensor, got {loss!r}")
            inside = sorted({name for name, on in witness.calls if on})
            off = any(not on for _, on in witness.calls)
            want_loss = torch.log(torch.sigmoid(logits.detach().double()).sum())
            if not torch.isfinite(loss) or loss.dtype != torch.float32:
                if off:
                    raise CheckFailed(
                        f"{case}: expected a finite float32 loss close to {want_loss.item():.6g}, got {loss.item()} "
                        f"({loss.dtype}). You switched autocast off, but autocast(enabled=False) does not upcast "
                        f"tensors that are already half: the logits arrive in {short(dtype)}; call .float() on them "
                        f"inside the region")
                raise CheckFailed(f"{case}: expected a finite float32 loss close to {want_loss.item():.6g}, got "
                                  f"{loss.item()} ({loss.dtype}): the sigmoid of such logits underflows in "
                                  f"{short(dtype)}; compute the loss in float32")
            if inside:
                raise CheckFailed(
                    f"{case}: the value is right, but your loss ran inside the autocast region (autocast was on "
                    f"during {', '.join(inside[:4])}). The task is to switch it off for the loss, "
                    f"`with torch.autocast(logits.device.type, enabled=False):`, so that no op in it is cast "
                    f"down again (a matmul in a loss would be, on any device)")
            if not math.isclose(loss.item(), want_loss.item(), rel_tol=1e-5):
                raise CheckFailed(f"{case}: expected {want_loss.item():.8g}, got {loss.item():.8g}")
            (grad,) = torch.autograd.grad(loss, w)
            logits64 = logits.detach().double().requires_grad_()  # the same half-precision logits, exactly
            (dlogits,) = torch.autograd.grad(torch.log(torch.sigmoid(logits64).sum()), logits64)
            want_grad = h.double().T @ dlogits
            if not torch.isfinite(grad).all():
                raise CheckFailed(f"{case}: the gradient has {int((~torch.isfinite(grad)).sum())} non-finite values")
            err = ((grad.double() - want_grad).norm() / want_grad.norm()).item()
            if err > 1e-2:  # the weight gradient's matmul runs in half precision under autocast
                raise CheckFailed(f"{case}: gradient off by {err:.1%} (relative) from float64's")
    _passed("check_tiny_loss", "fp16 and bf16 autocast x 3 logit ranges: finite float32 loss and gradient, "
            "float64-accurate, computed with autocast off")


# --- (b) clipping scaled gradients ------------------------------------------------------------------

def _true_norm_left_by_naive_clipping(scale: float, max_norm: float = 1.0) -> float:
    """Clip a large gradient while it is still multiplied by `scale`, then unscale: the norm that is left."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.zeros(1000))
    p.grad = torch.randn(1000) * 10.0 * scale         # a true gradient of norm ~300, times S
    torch.nn.utils.clip_grad_norm_([p], max_norm)      # WRONG order: clipped while scaled
    return (p.grad / scale).norm().item()             # what the step then uses


def check_clip_threshold(at_2_16: float, at_2_14: float) -> None:
    """Your predictions: the largest TRUE gradient norm that clip_grad_norm_(max_norm=1.0) lets through
    when it runs before unscale_, at S = 2^16 and at S = 2^14; graded by doing it."""
    if at_2_16 is ... or at_2_14 is ...:
        raise NotImplementedError("write your two predictions in place of the ... first")
    for name, got, scale in (("at S = 2^16", at_2_16, 2.0**16), ("at S = 2^14", at_2_14, 2.0**14)):
        want = _true_norm_left_by_naive_clipping(scale)
        if not isinstance(got, (int, float)) or not math.isfinite(got):
            raise CheckFailed(f"{name}: expected a number, got {got!r}")
        if math.isclose(got, want, rel_tol=1e-3):
            continue
        if math.isclose(got, 1.0 * scale, rel_tol=1e-3):
            hint = "that is the threshold for the SCALED gradients; the step uses them divided by S"
        elif math.isclose(got, 1.0, rel_tol=1e-3):
            hint = "that is what clipping after unscale_ gives; here the clip sees gradients multiplied by S"
        else:
            hint = "clip_grad_norm_ compares max_norm with the norm of S * g"
        raise CheckFailed(f"{name}: measured {want:.4g} (clip the scaled gradients, then unscale), got {got!r}: {hint}")
    _passed("check_clip_threshold", f"max_norm / S: {at_2_16:.4g} at S = 2^16 and {at_2_14:.4g} at S = 2^14 "
            "(the threshold moves with every change of the scale)")


def _reference_accum_step(model, micro_batches, optimizer, scaler, max_norm: float, *, zero: bool = True,
                          unscale_first: bool = True, mean: bool = True) -> float:
    """The recipe (zero_grad, scaled backward per micro-batch, unscale_, clip, step, update), or one mistake."""
    if zero:
        optimizer.zero_grad(set_to_none=True)
    for x, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
            if mean:
                loss = loss / len(micro_batches)
        scaler.scale(loss).backward()
    if unscale_first:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm.item()


MISTAKES = {
    "zero": "the gradients from the previous step were still in .grad and your step added to them: "
            "did you zero_grad? Call optimizer.zero_grad() before the first backward of the step",
    "unscale_first": "your norm is about S times the true one: the clip saw gradients still multiplied by the "
                     "loss scale. Call scaler.unscale_(optimizer) AFTER the last backward and BEFORE clipping",
    "mean": "your gradients are the SUM over the micro-batches; the step should use their mean, as one big "
            "batch would: divide each micro-batch's loss by len(micro_batches)",
}


def _snapshot(model, optimizer, scaler):
    """Copies of (model with its .grad, optimizer state, scaler state) to replay a step with one mistake."""
    twin = copy.deepcopy(model)
    for p, q in zip(model.parameters(), twin.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    opt = type(optimizer)(twin.parameters(), **optimizer.defaults)
    opt.load_state_dict(optimizer.state_dict())
    sc = torch.amp.GradScaler("cpu")
    sc.load_state_dict(scaler.state_dict())
    return twin, opt, sc


def _diagnose(snapshot, micro_batches, max_norm, got_norm: float, got_model) -> str:
    for mistake, message in MISTAKES.items():
        twin, opt, sc = _snapshot(*snapshot)
        norm = _reference_accum_step(twin, micro_batches, opt, sc, max_norm, **{mistake: False})
        same = all(torch.allclose(p, q, rtol=1e-5, atol=1e-7) for p, q in zip(got_model.parameters(),
                                                                                twin.parameters()))
        if math.isclose(norm, got_norm, rel_tol=1e-4) and same:
            return "\n  " + message
    return ""


def check_clipped_step(clipped_accum_step: Callable) -> None:
    """clipped_accum_step(model, micro_batches, optimizer, scaler, max_norm) -> the total gradient norm
    (unscaled, before clipping): one fp16 step accumulated over the micro-batches, with clipping; graded
    against zero_grad -> scaled backward per micro-batch (mean loss) -> unscale_ -> clip -> step -> update.
    The model arrives with the previous step's gradients still in .grad, as in a training loop."""
    steps = 0
    for max_norm, n_micro in ((0.05, 2), (1.0, 3), (1e6, 2)):
        model, _, _ = tiny_problem(seed=1)
        ref = copy.deepcopy(model)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref)]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2) for _ in range(2)]
        gen = torch.Generator().manual_seed(int(max_norm * 100) + n_micro)
        for m in (model, ref):   # an earlier step's gradients, left in .grad
            F.cross_entropy(m(torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(9))),
                            torch.arange(16) % 10).backward()
        for step in range(3):
            micro = [(torch.randn(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen))
                     for _ in range(n_micro)]
            snapshot = _snapshot(ref, opts[1], scalers[1])
            got = clipped_accum_step(model, micro, opts[0], scalers[0], max_norm)
            want = _reference_accum_step(ref, micro, opts[1], scalers[1], max_norm)
            case = f"max_norm={max_norm}, {n_micro} micro-batches, step {step}"
            if not isinstance(got, (int, float, torch.Tensor)) or torch.as_tensor(got).numel() != 1:
                raise CheckFailed(f"{case}: expected the gradient norm as a number, got {got!r}")
            got = float(got)
            wrong_params = any(not torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))
            if not math.isclose(got, want, rel_tol=1e-6) or wrong_params:
                diagnosis = _diagnose(snapshot, micro, max_norm, got, model)
                if not math.isclose(got, want, rel_tol=1e-6):
                    raise CheckFailed(f"{case}: expected the unscaled gradient norm {want:.7g}, got {got:.7g}"
                                      + diagnosis)
                try:
                    compare_models(case, model, ref)
                except CheckFailed as exc:
                    raise CheckFailed(str(exc) + diagnosis) from None
            if scalers[0].get_scale() != scalers[1].get_scale():
                raise CheckFailed(f"{case}: expected loss scale {scalers[1].get_scale()}, "
                                  f"got {scalers[0].get_scale()}: "
                                  f"one scaler.step and one scaler.update per optimizer step, after the last backward")
            steps += 1
    _passed("check_clipped_step", f"{steps} accumulated steps (3 thresholds, 2 and 3 micro-batches): same norms, "
            "parameters and scale as zero_grad, backward per micro-batch, unscale_, clip, step, update")
