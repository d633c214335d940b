"""Assertion helpers for the exercises: each grades a learner's function against PyTorch.

    from ampteach.checks import check_round_to_bf16
    check_round_to_bf16(my_round_to_bf16)     # prints "passed ..." or raises CheckFailed

Every check runs several cases and stops at the first wrong one with a message that says which
case, what was expected (computed by PyTorch, never typed in) and what came back. Errors raised by
the learner's code (NotImplementedError for an untouched exercise) pass through unchanged.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, Iterable

import torch
from torch import nn

Case = tuple[str, torch.Tensor]


class CheckFailed(AssertionError):
    """Your answer gave a wrong result; the message says which case, what was expected, what came back."""


def _passed(name: str, detail: str) -> None:
    print(f"passed {name}: {detail}")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _describe(value: float, bits: int) -> str:
    return f"{value!r} (bits 0x{bits & 0xFFFFFFFF:08x})"


# --- build 1: float32 -> bf16, round to nearest even ---------------------------------------------

class _NoHalfCasts(torch.overrides.TorchFunctionMode):
    """Refuse torch's own casts to a 16-bit float while a learner's rounding function runs."""

    HALF = (torch.bfloat16, torch.float16)
    CASTS = {torch.Tensor.to, torch.Tensor.type, torch.Tensor.view, torch.Tensor.bfloat16, torch.Tensor.half,
             torch.Tensor.new_tensor, torch.tensor, torch.as_tensor, torch.Tensor.type_as, torch.Tensor.copy_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.CASTS:
            named = [a for a in list(args[1:]) + list(kwargs.values()) if a in self.HALF]
            tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
            if named or func in (torch.Tensor.bfloat16, torch.Tensor.half) or (
                    func in (torch.Tensor.type_as, torch.Tensor.copy_) and any(t.dtype in self.HALF for t in tensors)):
                raise CheckFailed(f"your function called torch's own cast (Tensor.{getattr(func, '__name__', func)} with a "
                                  "16-bit float dtype); the exercise is to round from the float32 bits with integer ops")
        return func(*args, **kwargs)


def bf16_cases(seed: int = 0) -> list[Case]:
    """Named values, every bf16 upper half with every rounding case of the lower half, random bits."""
    f32 = torch.finfo(torch.float32)
    named = torch.tensor([
        1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 257.0, 259.0, -259.0, 0.1, -0.0, 0.0,
        f32.max, f32.tiny, 2.0**-133, 1.5 * 2**-133, 2.0**-134, 2.0**-149, 3.3895e38, 3.3961e38,
        float("inf"), float("-inf"), float("nan"),
    ], dtype=torch.float32)
    upper = torch.arange(1 << 16, dtype=torch.int64) << 16
    lower = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    every = (upper[:, None] | lower[None, :]).flatten()
    every = torch.where(every >= 1 << 31, every - (1 << 32), every).to(torch.int32).view(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    random = torch.randint(-(1 << 31), 1 << 31, (1_000_000,), generator=gen, dtype=torch.int64)
    return [
        ("named values (ties, overflow, subnormals, signed zero, inf, NaN)", named),
        ("all 65,536 bf16 upper halves x lower halves 0x0000/0x0001/0x7fff/0x8000/0x8001/0xffff", every),
        ("1,000,000 random float32 bit patterns", random.to(torch.int32).view(torch.float32)),
    ]


def check_round_to_bf16(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """fn(x: float32 tensor) -> float32 tensor of the values x becomes in bf16; graded by x.to(torch.bfloat16)."""
    total = 0
    for name, x in bf16_cases():
        with _NoHalfCasts():
            got = fn(x.clone())
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            raise CheckFailed(f"{name}: expected a tensor of shape {tuple(x.shape)}, got "
                              f"{type(got).__name__} {tuple(getattr(got, 'shape', ()))}")
        if got.dtype != torch.float32:
            raise CheckFailed(f"{name}: expected a float32 tensor (bf16 values stored in float32), got {got.dtype}")
        want = x.to(torch.bfloat16).float()
        both_nan = torch.isnan(want) & torch.isnan(got)
        wrong = (_bits(want) != _bits(got)) & ~both_nan
        if wrong.any():
            i = int(wrong.nonzero()[0])
            raise CheckFailed(
                f"{name}: {int(wrong.sum()):,} of {len(x):,} values wrong; first: input "
                f"{_describe(x[i].item(), int(_bits(x)[i]))}: expected {_describe(want[i].item(), int(_bits(want)[i]))}, "
                f"got {_describe(got[i].item(), int(_bits(got)[i]))}")
        total += len(x)
    _passed("check_round_to_bf16", f"{total:,} values in 3 cases, bit-exact with x.to(torch.bfloat16)")


# --- build 2: the dynamic loss-scale update rule ------------------------------------------------

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
    steps = 0
    for name, settings, plan in scale_plans():
        full = dict(dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000), **settings)
        scale, tracker = float(full["init_scale"]), 0
        for step, (found_inf, (want_scale, want_tracker)) in enumerate(zip(plan, _torch_scales(settings, plan))):
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
    _passed("check_loss_scale_update", f"{steps} steps in 5 plans, identical to torch.amp.GradScaler")


# --- E.6.1 and E.6.2: training steps graded against torch.amp -------------------------------------

def tiny_problem(seed: int = 0, batch: int = 64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP and one FashionMNIST-shaped batch (random pixels, fixed by seed)."""
    from .models import mlp

    torch.manual_seed(seed)
    model = mlp((64,))
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    return model, x, y


def _reference_step(model, x, y, optimizer, scaler, precision: str, clip_norm: float | None = None):
    from .train import TrainConfig, train_step

    config = TrainConfig(precision=precision, impl="torch", clip_norm=clip_norm, progress=False)
    return train_step(model, x, y, optimizer, scaler, config)


def _compare_models(case: str, mine: nn.Module, ref: nn.Module) -> None:
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        if not torch.equal(p, q):
            diff = (p.detach().float() - q.detach().float()).abs().max().item()
            raise CheckFailed(f"{case}: parameter {name} differs from torch.amp's recipe (max |difference| {diff:.3g}); "
                              f"expected the same values bit for bit")


def check_amp_step(amp_step: Callable) -> None:
    """amp_step(model, x, y, optimizer, scaler, precision) does one training step with autocast and a
    GradScaler; graded against torch.amp's recipe for fp32, fp16 and bf16, three steps each."""
    for precision in ("fp32", "fp16", "bf16"):
        model, x, y = tiny_problem()
        ref = copy.deepcopy(model)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, ref)]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=precision == "fp16") for _ in range(2)]
        for step in range(3):
            amp_step(model, x, y, opts[0], scalers[0], precision)
            _reference_step(ref, x, y, opts[1], scalers[1], precision)
            _compare_models(f"{precision}, step {step}", model, ref)
            if scalers[0].get_scale() != scalers[1].get_scale():
                raise CheckFailed(f"{precision}, step {step}: expected loss scale {scalers[1].get_scale()}, got "
                                  f"{scalers[0].get_scale()} (did you call scaler.update()?)")
    _passed("check_amp_step", "fp32, fp16 + GradScaler and bf16, 3 steps each, bit-identical to torch.amp's recipe")


def _reference_clipped_step(model, x, y, optimizer, scaler, max_norm: float) -> float:
    """The recipe: scale, backward, unscale_, clip, step, update; returns the pre-clip norm."""
    import torch.nn.functional as F

    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return norm.item()


def check_clipped_step(clipped_step: Callable) -> None:
    """clipped_step(model, x, y, optimizer, scaler, max_norm) -> total gradient norm (unscaled, before
    clipping); an fp16 step with gradient clipping, graded against unscale_ -> clip -> step -> update."""
    for max_norm in (0.05, 1.0, 1e6):
        model, x, y = tiny_problem(seed=1)
        ref = copy.deepcopy(model)
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref)]
        scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**16) for _ in range(2)]
        for step in range(2):
            got = float(clipped_step(model, x, y, opts[0], scalers[0], max_norm))
            want = _reference_clipped_step(ref, x, y, opts[1], scalers[1], max_norm)
            case = f"max_norm={max_norm}, step {step}"
            if not math.isclose(got, want, rel_tol=1e-6):
                hint = " (about the loss scale times too big: clip AFTER scaler.unscale_)" if got > 100 * want else ""
                raise CheckFailed(f"{case}: expected the unscaled gradient norm {want:.7g}, got {got:.7g}{hint}")
            _compare_models(case, model, ref)
    _passed("check_clipped_step", "3 clipping thresholds x 2 steps: same norms and parameters as unscale_, clip, step")


def check_tiny_loss(loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """loss_fn(logits) = log(sum(sigmoid(logits))), computed so that it stays finite under fp16/bf16
    autocast; graded against float64 on logits far below zero, with its gradient."""
    for dtype in (torch.float16, torch.bfloat16):
        for center in (-12.0, -20.0, -30.0):
            torch.manual_seed(0)
            w = nn.Parameter(torch.randn(32, 16) * 0.1)
            h = torch.randn(8, 32)
            with torch.autocast("cpu", dtype=dtype):
                logits = h @ w + center  # half-precision logits, as a model under autocast makes them
                loss = loss_fn(logits)
            case = f"{str(dtype).replace('torch.', '')} autocast, logits near {center:g}"
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise CheckFailed(f"{case}: expected a one-element loss tensor, got {loss!r}")
            want_loss = torch.log(torch.sigmoid(logits.detach().double()).sum())
            if not torch.isfinite(loss):
                raise CheckFailed(f"{case}: expected a finite loss close to {want_loss.item():.6g}, got {loss.item()} "
                                  f"(the sigmoid of such logits underflows in {dtype}: compute in float32)")
            if loss.dtype != torch.float32:
                raise CheckFailed(f"{case}: expected the loss in torch.float32, got {loss.dtype}")
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
    _passed("check_tiny_loss", "fp16 and bf16 autocast x 3 logit ranges: finite float32 loss and gradient, float64-accurate")


def check_e6_1_table(rows: dict[str, dict], device: str = "cpu") -> None:
    """rows[precision] = {"samples_per_s", "peak_mem_bytes", "accuracy"} for fp32, fp16 and bf16 (as
    measured by your `measure`); checks they are complete and plausible and prints them side by side
    against the textbook's expectations (1.5-3x faster on a GPU, activation memory about halved,
    accuracy within 0.5 points)."""
    missing = [p for p in ("fp32", "fp16", "bf16") if p not in rows]
    if missing:
        raise CheckFailed(f"expected rows for fp32, fp16 and bf16, missing {missing}")
    for precision, row in rows.items():
        for key in ("samples_per_s", "peak_mem_bytes", "accuracy"):
            value = row.get(key) if isinstance(row, dict) else None
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise CheckFailed(f"{precision}: expected a positive number for {key!r}, got {value!r}")
        if row["accuracy"] <= 1:
            raise CheckFailed(f"{precision}: expected accuracy in percent (0-100), got {row['accuracy']!r}")
    base = rows["fp32"]
    print(f"{'config':7s} {'samples/s':>10s} {'vs fp32':>8s} {'memory MB':>10s} {'vs fp32':>8s} {'accuracy':>9s} {'vs fp32':>8s}")
    for precision, row in rows.items():
        print(f"{precision:7s} {row['samples_per_s']:10,.0f} {row['samples_per_s'] / base['samples_per_s']:7.2f}x "
              f"{row['peak_mem_bytes'] / 2**20:10.2f} {row['peak_mem_bytes'] / base['peak_mem_bytes']:7.2f}x "
              f"{row['accuracy']:8.1f}% {row['accuracy'] - base['accuracy']:+7.1f}")
    for precision in ("fp16", "bf16"):
        gap = rows[precision]["accuracy"] - base["accuracy"]
        if abs(gap) > 2.0:
            raise CheckFailed(f"{precision}: accuracy {rows[precision]['accuracy']:.1f}% is {gap:+.1f} points from fp32's "
                              f"{base['accuracy']:.1f}%; expected within 2 points (the textbook: 0.5 at convergence). "
                              f"Same model, seed, data order and epochs for every config?")
        if device == "cpu" and rows[precision]["peak_mem_bytes"] >= base["peak_mem_bytes"]:
            raise CheckFailed(f"{precision}: expected fewer activation bytes than fp32 "
                              f"({base['peak_mem_bytes']:,}), got {rows[precision]['peak_mem_bytes']:,}: "
                              f"was the forward pass under autocast when you measured?")
    speed = max(rows["fp16"]["samples_per_s"], rows["bf16"]["samples_per_s"]) / base["samples_per_s"]
    print(f"\ntextbook: 1.5-3x faster on a GPU; here the faster AMP config ran {speed:.2f}x fp32 on {device}")
    _passed("check_e6_1_table", "three complete rows; accuracies within 2 points of fp32"
            + ("; less activation memory than fp32" if device == "cpu" else ""))


# --- build 3: the master-weight step (O2) -------------------------------------------------------

def check_master_step(make_master_copies: Callable, master_step: Callable) -> None:
    """make_master_copies(model) -> [(half_param, fp32_copy), ...]; master_step(pairs, optimizer, scaler)
    runs after scaler.scale(loss).backward(). Graded against ampteach.MasterWeights + torch.amp.GradScaler
    (SGD with momentum and AdamW, five steps each, an overflow injected at step 2), bit for bit."""
    import torch.nn.functional as F

    from .master import MasterWeights, to_half
    from .models import mlp

    for opt_name in ("sgd", "adamw"):
        torch.manual_seed(0)
        model = to_half(mlp((32,)))
        mine = copy.deepcopy(model)
        pairs = make_master_copies(mine)
        params = list(mine.parameters())
        if not isinstance(pairs, list) or len(pairs) != len(params):
            raise CheckFailed(f"make_master_copies: expected a list of {len(params)} (half, fp32) pairs, got {pairs!r:.200}")
        for i, (p, m) in enumerate(pairs):
            if p is not params[i] or m.dtype != torch.float32 or not m.requires_grad or not torch.equal(m, p.float()):
                raise CheckFailed(f"make_master_copies, pair {i}: expected (the model's parameter {i}, an fp32 leaf "
                                  f"copy with requires_grad and the same values), got ({p.dtype} {tuple(p.shape)}, "
                                  f"{m.dtype} requires_grad={m.requires_grad})")
            if m.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
                raise CheckFailed(f"make_master_copies, pair {i}: the fp32 copy must not share memory with the model")
        master = MasterWeights(model)
        make_opt = (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)) if opt_name == "sgd" else \
            (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        opt_ref, opt_me = make_opt(master.params), make_opt([m for _, m in pairs])
        scaler_ref, scaler_me = (torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) for _ in range(2))
        gen = torch.Generator().manual_seed(1)
        for step in range(5):
            x, y = torch.randn(32, 1, 28, 28, generator=gen).half(), torch.randint(0, 10, (32,), generator=gen)
            for net, scaler in ((model, scaler_ref), (mine, scaler_me)):
                net.zero_grad(set_to_none=True)
                scaler.scale(F.cross_entropy(net(x).float(), y)).backward()  # fp16 grads, times S
                if step == 2:
                    next(net.parameters()).grad[0, 0] = float("inf")         # an overflow: skip this step
            master.grads_to_master()
            scaler_ref.step(opt_ref)
            scaler_ref.update()
            master.master_to_model()
            master_step(pairs, opt_me, scaler_me)
            case = f"{opt_name}, step {step}" + (" (an inf gradient: the step must be skipped)" if step == 2 else "")
            if scaler_me.get_scale() != scaler_ref.get_scale():
                raise CheckFailed(f"{case}: expected loss scale {scaler_ref.get_scale()}, got {scaler_me.get_scale()} "
                                  f"(scaler.step then scaler.update, once per step)")
            for i, ((p, m), (q, n)) in enumerate(zip(pairs, master.pairs)):
                if not torch.equal(m, n):
                    raise CheckFailed(f"{case}: fp32 copy {i} differs from the reference (max |difference| "
                                      f"{(m - n).abs().max().item():.3g}): its .grad must be the model's grad in fp32")
                if not torch.equal(p, q):
                    raise CheckFailed(f"{case}: model parameter {i} differs from the reference: after the step, "
                                      f"copy the fp32 values back into the half model")
    _passed("check_master_step", "SGD and AdamW, 5 steps each with an overflow: same fp32 copies, half weights and scale")


# --- build 4: sorting ops into autocast's cast lists ----------------------------------------------

def _cast_list_calls() -> dict[str, Callable]:
    """For each exercise op, a call taking (device, dtype of the first input, dtype of the others)."""
    import torch.nn.functional as F

    from .reference import _labels as labels
    from .reference import _r as r

    return {
        "mm": lambda d, a, b: torch.mm(r(d, a, 4, 4), r(d, b, 4, 4)),
        "bmm": lambda d, a, b: torch.bmm(r(d, a, 2, 4, 4), r(d, b, 2, 4, 4)),
        "linear": lambda d, a, b: F.linear(r(d, a, 2, 4), r(d, b, 3, 4)),
        "conv2d": lambda d, a, b: F.conv2d(r(d, a, 1, 2, 5, 5), r(d, b, 3, 2, 3, 3)),
        "relu": lambda d, a, b: F.relu(r(d, a, 4)),
        "exp": lambda d, a, b: torch.exp(r(d, a, 4)),
        "log": lambda d, a, b: torch.log(r(d, a, 4)),
        "pow": lambda d, a, b: torch.pow(r(d, a, 4), 2.0),
        "sum": lambda d, a, b: r(d, a, 4, 4).sum(),
        "norm": lambda d, a, b: torch.norm(r(d, a, 4)),
        "softmax": lambda d, a, b: torch.softmax(r(d, a, 4, 4), -1),
        "log_softmax": lambda d, a, b: torch.log_softmax(r(d, a, 4, 4), -1),
        "layer_norm": lambda d, a, b: F.layer_norm(r(d, a, 2, 4), (4,), r(d, b, 4), r(d, b, 4)),
        "mse_loss": lambda d, a, b: F.mse_loss(r(d, a, 4), r(d, b, 4)),
        "nll_loss": lambda d, a, b: F.nll_loss(r(d, a, 3, 5), labels(d, 3, 5)),
        "binary_cross_entropy": lambda d, a, b: F.binary_cross_entropy(r(d, a, 4) * 0.5, r(d, b, 4) * 0.5),
        "binary_cross_entropy_with_logits":
            lambda d, a, b: F.binary_cross_entropy_with_logits(r(d, a, 4), r(d, b, 4) * 0.5),
        "cat": lambda d, a, b: torch.cat([r(d, a, 2), r(d, b, 2)]),
        "addcmul": lambda d, a, b: torch.addcmul(r(d, a, 4), r(d, b, 4), r(d, b, 4)),
    }


CAST_LIST_OPS = (
    "mm", "bmm", "linear", "conv2d", "relu", "exp", "log", "pow", "sum", "norm", "softmax", "log_softmax",
    "layer_norm", "mse_loss", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cat", "addcmul")


def observe_autocast(op: str, device_type: str) -> str:
    """What torch.autocast does with op: its output dtype for fp32, half and mixed inputs (or its error).

    CUDA on a machine without a GPU runs torch's real CUDA autocast on fake tensors (dtypes only)."""
    from .reference import LOWER, device_context, torch_autocast

    call, half = _cast_list_calls()[op], LOWER[device_type]
    results = []
    with device_context(device_type):
        for label, dtypes in (("fp32", (torch.float32,) * 2), (str(half).removeprefix("torch."), (half,) * 2),
                              ("mixed", (half, torch.float32))):
            torch.manual_seed(0)
            try:
                with torch_autocast(device_type, half):
                    out = call(device_type, *dtypes)
                results.append(f"{label} in -> {str(out.dtype).removeprefix('torch.')}")
            except Exception as exc:  # the error is the observation (a banned op)
                return f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return ", ".join(results)


def check_cast_lists(sort_into_cast_lists: Callable[[], dict]) -> None:
    """sort_into_cast_lists() -> {"cpu": {op: policy}, "cuda": {op: policy}} for every op in
    CAST_LIST_OPS, a policy being one of PyTorch's category names or None (on no list). Graded
    against the lists torch 2.13 registers for its CPU and CUDA autocast (ampteach.cast_lists, which
    the course's tests check against torch's dispatcher); a wrong answer shows what torch.autocast did."""
    from .cast_lists import POLICIES, policy_of

    answer = sort_into_cast_lists()
    if not isinstance(answer, dict) or set(answer) != {"cpu", "cuda"}:
        raise CheckFailed(f'expected a dict with keys "cpu" and "cuda", got {answer!r:.200}')
    wrong = []
    for device in ("cpu", "cuda"):
        missing = [op for op in CAST_LIST_OPS if op not in answer[device]]
        if missing:
            raise CheckFailed(f"{device}: expected a policy (or None) for every op; missing {missing}")
        for op in CAST_LIST_OPS:
            got, want = answer[device][op], policy_of(op, device)
            if got is not None and got not in POLICIES:
                raise CheckFailed(f"{device}, {op}: {got!r} is not a category; use one of {POLICIES} or None")
            if got != want:
                wrong.append(f"{device:4s} {op}: expected {want!r}, got {got!r}; torch.autocast: "
                             f"{observe_autocast(op, device)}")
    if wrong:
        total = 2 * len(CAST_LIST_OPS)
        raise CheckFailed(f"{len(wrong)} of {total} placements wrong:\n  " + "\n  ".join(wrong))
    _passed("check_cast_lists", f"all {len(CAST_LIST_OPS)} ops placed as torch 2.13 places them, on CPU and on CUDA")
