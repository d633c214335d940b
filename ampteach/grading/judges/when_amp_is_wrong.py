"""Judge of exercise E.6.2: a loss over tiny values, and clipping gradients that are still scaled.

    @judge("check_tiny_loss")        # fp16 and bf16 autocast x 3 logit ranges: finite, float64-accurate, autocast off
    @judge("check_clip_threshold")   # the learner's two predictions, graded by clipping scaled gradients
    @judge("check_clipped_step")     # accumulation + clipping against torch.amp's recipe, mistakes named
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.checks.when_amp_is_wrong import accum_problem, micro_batches, tiny_loss_problem
from ampteach.grading.judges import judge
from ampteach.grading.judges.amp_throughput import compare_models
from ampteach.grading.judges.learner import Learner, NotDone, Ref, describe

__all__ = ["MISTAKES"]


@judge("check_tiny_loss")
def check_tiny_loss(learner: Learner, loss_fn: Ref) -> str:
    for dtype in (torch.float16, torch.bfloat16):
        for center in (-12.0, -20.0, -30.0):
            seed = learner.seed(0)
            got = learner.plan("when_amp_is_wrong.tiny_loss", {"loss_fn": loss_fn}, dtype, center, seed)
            case = f"{short(dtype)} autocast, logits near {center:g}"
            loss, logits = got["loss"], got["logits"]
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise CheckFailed(f"{case}: expected a one-element loss tensor, got {describe(loss)}")
            want_loss = torch.log(torch.sigmoid(logits.double()).sum())
            if not torch.isfinite(loss) or loss.dtype != torch.float32:
                if got["off"]:
                    raise CheckFailed(
                        f"{case}: expected a finite float32 loss close to {want_loss.item():.6g}, got {loss.item()} "
                        f"({loss.dtype}). You switched autocast off, but autocast(enabled=False) does not upcast "
                        f"tensors that are already half: the logits arrive in {short(dtype)}; call .float() on them "
                        f"inside the region")
                raise CheckFailed(f"{case}: expected a finite float32 loss close to {want_loss.item():.6g}, got "
                                  f"{loss.item()} ({loss.dtype}): the sigmoid of such logits underflows in "
                                  f"{short(dtype)}; compute the loss in float32")
            if got["on"]:
                raise CheckFailed(
                    f"{case}: the value is right, but your loss ran inside the autocast region (autocast was on "
                    f"during {', '.join(got['on'][:4])}). The task is to switch it off for the loss, "
                    f"`with torch.autocast(logits.device.type, enabled=False):`, so that no op in it is cast "
                    f"down again (a matmul in a loss would be, on any device)")
            if not math.isclose(loss.item(), want_loss.item(), rel_tol=1e-5):
                raise CheckFailed(f"{case}: expected {want_loss.item():.8g}, got {loss.item():.8g}")
            grad = got["grad"]
            if not isinstance(grad, torch.Tensor):
                raise CheckFailed(f"{case}: your loss has no gradient with respect to the weights: keep it a "
                                  f"differentiable function of the logits")
            _, h = tiny_loss_problem(seed)
            logits64 = logits.double().requires_grad_()  # the same half-precision logits, exactly
            (dlogits,) = torch.autograd.grad(torch.log(torch.sigmoid(logits64).sum()), logits64)
            want_grad = h.double().T @ dlogits
            if not torch.isfinite(grad).all():
                raise CheckFailed(f"{case}: the gradient has {int((~torch.isfinite(grad)).sum())} non-finite values")
            err = ((grad.double() - want_grad).norm() / want_grad.norm()).item()
            if err > 1e-2:  # the weight gradient's matmul runs in half precision under autocast
                raise CheckFailed(f"{case}: gradient off by {err:.1%} (relative) from float64's")
    return "fp16 and bf16 autocast x 3 logit ranges: finite float32 loss and gradient, float64-accurate, computed " \
           "with autocast off"


def _true_norm_left_by_naive_clipping(scale: float, max_norm: float = 1.0) -> float:
    """Clip a large gradient while it is still multiplied by `scale`, then unscale: the norm that is left."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.zeros(1000))
    p.grad = torch.randn(1000) * 10.0 * scale         # a true gradient of norm ~300, times S
    torch.nn.utils.clip_grad_norm_([p], max_norm)      # WRONG order: clipped while scaled
    return (p.grad / scale).norm().item()             # what the step then uses


@judge("check_clip_threshold")
def check_clip_threshold(learner: Learner, at_2_16_ref: Ref, at_2_14_ref: Ref) -> str:
    at_2_16, at_2_14 = learner.value(at_2_16_ref), learner.value(at_2_14_ref)
    if at_2_16 is ... or at_2_14 is ...:
        raise NotDone("write your two predictions in place of the ... first")
    for name, got, scale in (("at S = 2^16", at_2_16, 2.0**16), ("at S = 2^14", at_2_14, 2.0**14)):
        want = _true_norm_left_by_naive_clipping(scale)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            raise CheckFailed(f"{name}: expected a number, got {describe(got)}")
        if math.isclose(got, want, rel_tol=1e-3):
            continue
        if math.isclose(got, 1.0 * scale, rel_tol=1e-3):
            hint = "that is the threshold for the SCALED gradients; the step uses them divided by S"
        elif math.isclose(got, 1.0, rel_tol=1e-3):
            hint = "that is what clipping after unscale_ gives; here the clip sees gradients multiplied by S"
        else:
            hint = "clip_grad_norm_ compares max_norm with the norm of S * g"
        raise CheckFailed(f"{name}: measured {want:.4g} (clip the scaled gradients, then unscale), got {got!r}: {hint}")
    return (f"max_norm / S: {at_2_16:.4g} at S = 2^16 and {at_2_14:.4g} at S = 2^14 (the threshold moves with every "
            f"change of the scale)")


def reference_accum_step(model, micro, optimizer, scaler, max_norm: float, *, zero: bool = True,
                         unscale_first: bool = True, mean: bool = True) -> float:
    """The recipe (zero_grad, scaled backward per micro-batch, unscale_, clip, step, update), or one mistake."""
    if zero:
        optimizer.zero_grad(set_to_none=True)
    for x, y in micro:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
            if mean:
                loss = loss / len(micro)
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


def _diagnose(snapshot, micro, max_norm, got_norm: float, got_params: list) -> str:
    for mistake, message in MISTAKES.items():
        twin, opt, sc = _snapshot(*snapshot)
        norm = reference_accum_step(twin, micro, opt, sc, max_norm, **{mistake: False})
        same = all(torch.allclose(p, q, rtol=1e-5, atol=1e-7) for (_, p), q in zip(got_params, twin.parameters()))
        if math.isclose(norm, got_norm, rel_tol=1e-4) and same:
            return "\n  " + message
    return ""


@judge("check_clipped_step")
def check_clipped_step(learner: Learner, step: Ref) -> str:
    steps = 0
    for max_norm, n_micro in ((0.05, 2), (1.0, 3), (1e6, 2)):
        seed = learner.seed(int(max_norm * 100) + n_micro)
        got = learner.plan("when_amp_is_wrong.clipped_steps", {"step": step}, max_norm, n_micro, seed)
        ref, opt, scaler, gen = accum_problem(max_norm, n_micro, seed)
        for k, mine in enumerate(got):
            micro = micro_batches(gen, n_micro)
            snapshot = _snapshot(ref, opt, scaler)
            want = reference_accum_step(ref, micro, opt, scaler, max_norm)
            case = f"max_norm={max_norm}, {n_micro} micro-batches, step {k}"
            norm = mine["norm"]
            if isinstance(norm, torch.Tensor) and norm.numel() == 1:
                norm = norm.item()
            if isinstance(norm, bool) or not isinstance(norm, (int, float)):
                raise CheckFailed(f"{case}: expected the gradient norm as a number, got {describe(mine['norm'])}")
            norm = float(norm)
            wrong_params = any(not torch.equal(p, q) for (_, p), q in zip(mine["params"], ref.parameters()))
            if not math.isclose(norm, want, rel_tol=1e-6) or wrong_params:
                diagnosis = _diagnose(snapshot, micro, max_norm, norm, mine["params"])
                if not math.isclose(norm, want, rel_tol=1e-6):
                    raise CheckFailed(f"{case}: expected the unscaled gradient norm {want:.7g}, got {norm:.7g}"
                                      + diagnosis)
                try:
                    compare_models(case, mine["params"], [(n, p.detach()) for n, p in ref.named_parameters()])
                except CheckFailed as exc:
                    raise CheckFailed(str(exc) + diagnosis) from None
            if mine["scale"] != scaler.get_scale():
                raise CheckFailed(f"{case}: expected loss scale {scaler.get_scale()}, got {mine['scale']}: "
                                  f"one scaler.step and one scaler.update per optimizer step, after the last backward")
            steps += 1
    return (f"{steps} accumulated steps (3 thresholds, 2 and 3 micro-batches): same norms, parameters and scale as "
            f"zero_grad, backward per micro-batch, unscale_, clip, step, update")
