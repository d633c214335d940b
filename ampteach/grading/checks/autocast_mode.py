"""Build it yourself 6: autocast as a TorchFunctionMode, graded op by op against torch.autocast.

    from ampteach.grading.checks import check_autocast_mode, check_autocast_mode_hidden
    check_autocast_mode(MyAutocast)          # MyAutocast(device_type, dtype) is a torch function mode

Every case runs twice: under torch.autocast and under the learner's mode, on CPU (bfloat16 and
float16 regions, real tensors: output dtype and values, bit for bit) and on CUDA (float16 and
bfloat16 regions; fake CUDA tensors without a GPU: output dtype, or the error). The learner's mode
may look policies up in ampteach.amp.cast_lists; it may not lean on torch.autocast or ampteach.autocast,
which are refused while it runs.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import CheckFailed, refusing, same_bits, short
from ampteach.grading.checks.common import passed as _passed

__all__ = [
    "BECAUSE", "CPU_ONLY", "REGIONS", "Case", "check_autocast_mode", "check_autocast_mode_hidden", "hidden_cases",
    "run_cases", "visible_cases",
]

REGIONS = (("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.float16), ("cuda", torch.bfloat16))
BECAUSE = "the exercise is to cast the inputs yourself, in your mode"


def _r(device: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return (torch.rand(*shape, device=device) + 0.5).to(dtype)


def _labels(device: str, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=device)


Case = Callable[[str, torch.dtype], Any]   # (device, half dtype of the region) -> output

# Ops that are composites on one device: torch.autocast casts the ops inside them, which a torch
# function mode cannot see (CUDA's cross_entropy is log_softmax + nll_loss in C++). Run on CPU only.
CPU_ONLY = {"F.cross_entropy, half logits"}


def visible_cases() -> dict[str, Case]:
    """One call per policy and its traps; `h` is the region's half dtype (inputs in it, or mixed)."""
    f32, f64 = torch.float32, torch.float64
    return {
        "torch.mm, fp32 inputs": lambda d, h: torch.mm(_r(d, f32, 4, 4), _r(d, f32, 4, 4)),
        "a @ b, half inputs": lambda d, h: _r(d, h, 4, 4) @ _r(d, h, 4, 4),
        "F.linear with bias": lambda d, h: F.linear(_r(d, f32, 2, 4), _r(d, f32, 3, 4), _r(d, f32, 3)),
        "F.conv2d": lambda d, h: F.conv2d(_r(d, f32, 1, 2, 5, 5), _r(d, f32, 3, 2, 3, 3)),
        "torch.bmm, mixed": lambda d, h: torch.bmm(_r(d, h, 2, 4, 4), _r(d, f32, 2, 4, 4)),
        "torch.mm, float64 (not eligible)": lambda d, h: torch.mm(_r(d, f64, 4, 4), _r(d, f64, 4, 4)),
        "torch.relu, half": lambda d, h: torch.relu(_r(d, h, 4)),
        "torch.exp, half": lambda d, h: torch.exp(_r(d, h, 4)),
        "torch.log, fp32": lambda d, h: torch.log(_r(d, f32, 4)),
        "torch.softmax, half": lambda d, h: torch.softmax(_r(d, h, 4, 4), -1),
        "torch.softmax, explicit dtype=float64": lambda d, h: torch.softmax(_r(d, h, 4, 4), -1, dtype=f64),
        "x.sum(), half": lambda d, h: _r(d, h, 4, 4).sum(),
        "F.layer_norm, half input, fp32 weights": lambda d, h: F.layer_norm(_r(d, h, 2, 4), (4,), _r(d, f32, 4),
                                                                          _r(d, f32, 4)),
        "F.cross_entropy, half logits": lambda d, h: F.cross_entropy(_r(d, h, 3, 5), _labels(d, 3, 5)),
        "F.mse_loss, half": lambda d, h: F.mse_loss(_r(d, h, 4), _r(d, h, 4)),
        "F.binary_cross_entropy, half": lambda d, h: F.binary_cross_entropy(_r(d, h, 4) * 0.5, _r(d, h, 4) * 0.5),
        "torch.cat([fp32, half])": lambda d, h: torch.cat([_r(d, f32, 2), _r(d, h, 2)]),
        "torch.cat([half, half])": lambda d, h: torch.cat([_r(d, h, 2), _r(d, h, 2)]),
        "torch.addcmul, mixed": lambda d, h: torch.addcmul(_r(d, h, 4), _r(d, f32, 4), _r(d, h, 4)),
        "x + y, mixed (on no list)": lambda d, h: _r(d, h, 4) + _r(d, f32, 4),
    }


def hidden_cases() -> dict[str, Case]:
    f32 = torch.float32
    return {
        "torch.baddbmm": lambda d, h: torch.baddbmm(_r(d, f32, 2, 4, 4), _r(d, f32, 2, 4, 4), _r(d, h, 2, 4, 4)),
        "F.conv1d": lambda d, h: F.conv1d(_r(d, f32, 1, 2, 7), _r(d, f32, 3, 2, 3)),
        "torch.matmul": lambda d, h: torch.matmul(_r(d, f32, 3, 4), _r(d, f32, 4)),
        "x.log_softmax(-1), half": lambda d, h: _r(d, h, 4, 4).log_softmax(-1),
        "torch.cumsum, half": lambda d, h: torch.cumsum(_r(d, h, 4), 0),
        "torch.sum, explicit dtype=float16": lambda d, h: torch.sum(_r(d, f32, 4), dtype=torch.float16),
        "F.gelu, fp32": lambda d, h: F.gelu(_r(d, f32, 4)),
        "torch.stack([fp32, half, half])": lambda d, h: torch.stack([_r(d, f32, 2), _r(d, h, 2), _r(d, h, 2)]),
        "F.binary_cross_entropy_with_logits, half": lambda d, h: F.binary_cross_entropy_with_logits(
            _r(d, h, 4), _r(d, h, 4) * 0.5),
        "x.exp() method, fp32": lambda d, h: _r(d, f32, 4).exp(),
        "torch.mm(..., out=fp32 tensor)": lambda d, h: torch.mm(_r(d, f32, 4, 4), _r(d, f32, 4, 4),
                                                                out=torch.empty(4, 4, device=d)),
        "x.add_(y), fp32 (in place)": lambda d, h: _r(d, f32, 4).add_(_r(d, h, 4)),
        "F.l1_loss, half": lambda d, h: F.l1_loss(_r(d, h, 4), _r(d, h, 4)),
        "torch.pow, half": lambda d, h: torch.pow(_r(d, h, 4), 2.0),
    }


@contextlib.contextmanager
def _own_work() -> Iterator[None]:
    # the module (ampteach.autocast is also the class)
    ampteach_autocast = importlib.import_module("ampteach.amp.autocast")

    with contextlib.ExitStack() as stack:
        stack.enter_context(refusing(torch.amp.autocast_mode.autocast, ("__enter__", "__init__"), BECAUSE))
        stack.enter_context(refusing(ampteach_autocast.autocast, ("__enter__", "__init__"), BECAUSE))
        for mode in [v for v in vars(ampteach_autocast).values()   # the library's own modes
                     if isinstance(v, type) and issubclass(v, torch.overrides.TorchFunctionMode)]:
            stack.enter_context(refusing(mode, ("__torch_function__",), BECAUSE))
        yield


def _outcome(call: Case, device: str, half: torch.dtype, region: contextlib.AbstractContextManager):
    torch.manual_seed(0)
    try:
        with region:
            out = call(device, half)
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as exc:  # an error is an outcome: torch raises it too, or the rows disagree
        return exc
    if any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
        raise CheckFailed("autocast was still switched on after your mode's region ended; " + BECAUSE)
    return out


def _describe(outcome) -> str:
    if isinstance(outcome, Exception):
        return f"raises {type(outcome).__name__}: {str(outcome).splitlines()[0][:120] if str(outcome) else ''}"
    return f"a {short(outcome.dtype)} tensor"


def run_cases(cls: type, cases: dict[str, Case]) -> int:
    """Each case in each region through torch.autocast and through cls; raise at the first difference."""
    from ampteach.lab.compare_torch import device_context, torch_autocast

    if not (isinstance(cls, type) and issubclass(cls, torch.overrides.TorchFunctionMode)):
        raise CheckFailed(f"expected a subclass of torch.overrides.TorchFunctionMode, got {cls!r}")
    compared = 0
    for device, half in REGIONS:
        with device_context(device):
            for label, call in cases.items():
                if device != "cpu" and label in CPU_ONLY:
                    continue
                want = _outcome(call, device, half, torch_autocast(device, half))
                with _own_work():
                    mode = cls(device, half)
                got = _outcome(call, device, half, _wrapped(mode))
                case = f"{label}, {device} {short(half)} region"
                if isinstance(want, Exception) or isinstance(got, Exception):
                    if isinstance(want, Exception) and isinstance(got, Exception):
                        compared += 1
                        continue
                    raise CheckFailed(f"{case}: torch.autocast {_describe(want)}, your mode {_describe(got)}")
                if got.dtype != want.dtype:
                    raise CheckFailed(f"{case}: torch.autocast gives {_describe(want)}, your mode {_describe(got)}")
                if device == "cpu" and not same_bits(got.detach(), want.detach()):
                    raise CheckFailed(f"{case}: same dtype but different values from torch.autocast (max |difference| "
                                      f"{(got.double() - want.double()).abs().max().item():.3g}): cast every input "
                                      f"the policy names, before the op runs")
                compared += 1
    return compared


@contextlib.contextmanager
def _wrapped(mode) -> Iterator[None]:
    with _own_work(), mode:
        yield


def _training_step(cls: type) -> None:
    """A small MLP's loss and gradients under the mode, bit for bit against torch.autocast on CPU bf16."""
    from ampteach.lab.compare_torch import torch_autocast

    results = []
    for region in (lambda: torch_autocast("cpu", torch.bfloat16), lambda: _wrapped(cls("cpu", torch.bfloat16))):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 5))
        x, y = torch.randn(8, 4, 5), torch.randint(0, 5, (8,))
        with region():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (want, want_grads), (got, got_grads) = results
    if not same_bits(got, want) or not all(g is not None and same_bits(g, w) for g, w in zip(got_grads, want_grads)):
        raise CheckFailed(f"a training step of a small MLP: loss {got.item()!r} ({short(got.dtype)}) and gradients "
                          f"should equal torch.autocast's ({want.item()!r}, {short(want.dtype)}) bit for bit: "
                          f"are your casts ordinary differentiable .to() calls?")


def check_autocast_mode(cls: type) -> None:
    """cls(device_type, dtype) is a TorchFunctionMode that casts each op's inputs by its cast list;
    graded op by op against torch.autocast in CPU bf16/fp16 and CUDA fp16/bf16 regions."""
    compared = run_cases(cls, visible_cases())
    _passed("check_autocast_mode", f"{compared} op cases ({len(visible_cases())} ops in up to 4 regions) agree with "
            "torch.autocast: dtypes everywhere, values bit for bit on CPU")


def check_autocast_mode_hidden(cls: type) -> None:
    """More ops (out=, in-place, explicit dtypes, stacks of three) and a training step's gradients."""
    compared = run_cases(cls, hidden_cases())
    _training_step(cls)
    _passed("check_autocast_mode_hidden",
            f"{compared} more op cases and an MLP training step agree with torch.autocast")
