"""Build it yourself 6: autocast as a TorchFunctionMode, graded op by op against torch.autocast.

    from ampteach.grading.checks import check_autocast_mode, check_autocast_mode_hidden
    check_autocast_mode(MyAutocast)          # MyAutocast(device_type, dtype) is a torch function mode

Every case runs twice: under torch.autocast (in the judge's process) and under the learner's mode (in
theirs), on CPU (bfloat16 and float16 regions, real tensors: output dtype and values, bit for bit) and
on CUDA (float16 and bfloat16 regions; fake CUDA tensors without a GPU: output dtype, or the error). A
case travels as one line of code (`torch.mm(_r(d, f32, 4, 4), ...)`), run by `outcome` on both sides.
The learner's mode may look policies up in ampteach.amp.cast_lists; torch.autocast, ampteach.autocast
(their files) and torch's autocast switches (torch.set_autocast_enabled, ...) are refused while it runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import CheckFailed, one_thread
from ampteach.grading.checks.driver import plan, watch
from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, module_files
from ampteach.grading.checks.wire import RemoteError

__all__ = ["BECAUSE", "REGIONS", "CPU_ONLY", "outcome", "training_step", "check_autocast_mode",
           "check_autocast_mode_hidden"]

REGIONS = (("cpu", torch.bfloat16), ("cpu", torch.float16), ("cuda", torch.float16), ("cuda", torch.bfloat16))
BECAUSE = "the exercise is to cast the inputs yourself, in your mode"
# Ops that are composites on one device: torch.autocast casts the ops inside them, which a torch
# function mode cannot see (CUDA's cross_entropy is log_softmax + nll_loss in C++). Run on CPU only.
CPU_ONLY = {"F.cross_entropy, half logits"}
AUTOCAST_FILES = ("torch.amp.autocast_mode", "torch.cuda.amp.autocast_mode", "torch.cpu.amp.autocast_mode",
                  "ampteach.amp.autocast", "ampteach.amp.autocast_kernels", "ampteach.amp.autocast_fast",
                  "ampteach.amp.autocast_cache")


def _r(device: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return (torch.rand(*shape, device=device) + 0.5).to(dtype)


def _labels(device: str, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=device)


def _switches_autocast(fn: Any) -> bool:
    """torch's own switches of its autocast state (torch.set_autocast_enabled, torch._C._set_autocast_..., ...)."""
    name = getattr(fn, "__name__", "")
    return "autocast" in name and (name.lstrip("_").startswith(("set_", "enter", "exit", "autocast_increment",
                                                                "autocast_decrement")))


@watch("autocast_mode")
def own_casts(who: str) -> Borrowed:
    return Borrowed(who, module_files(*AUTOCAST_FILES), BECAUSE, builtins=_switches_autocast)


def _autocast_on() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda"))


def outcome(source: str, device: str, half: torch.dtype, region: Callable[[], Any]) -> dict:
    """Run one case (`source`, with d the device and h the region's half dtype) inside region(): the output (a
    tensor; dtype and shape only on fake CUDA) or the error, and whether torch's autocast was on inside and after."""
    from ampteach.lab.compare_torch import device_context

    namespace = {"torch": torch, "F": F, "_r": _r, "_labels": _labels, "d": device, "h": half,
                 "f32": torch.float32, "f64": torch.float64}
    call = eval(compile(source, "<case>", "eval"), namespace)   # a course-written case, sent by the judge
    result: dict = {"error": None, "out": None}
    with one_thread(), device_context(device):
        torch.manual_seed(0)
        try:
            with region():
                result["inside"] = _autocast_on()
                out = call(device, half)
            result["out"] = out.detach() if device == "cpu" else torch.empty(out.shape, dtype=out.dtype,
                                                                            device="meta")
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:  # an error is an outcome: torch raises it too, or the rows disagree
            result["error"] = RemoteError.of(exc)
        result["after"] = _autocast_on()
    return result


def _region(cls: type, device: str, half: torch.dtype) -> Callable[[], Any]:
    @contextlib.contextmanager
    def region() -> Iterator[None]:
        with own_casts(getattr(cls, "__name__", "mode")):
            mode = cls(device, half)
            with mode:
                yield
    return region


def _own_class(cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, torch.overrides.TorchFunctionMode)):
        raise CheckFailed(f"expected a subclass of torch.overrides.TorchFunctionMode, got {cls!r:.100}")


@plan("autocast_mode.case")
def learner_case(source: str, device: str, half: torch.dtype, *, cls: type) -> dict:
    _own_class(cls)
    return outcome(f"lambda d, h: {source}", device, half, _region(cls, device, half))


def training_step(region: Callable[[], Any]) -> tuple[torch.Tensor, list]:
    """A small MLP's loss (under region()) and gradients: the same model and batch on both sides."""
    with one_thread():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 5))
        x, y = torch.randn(8, 4, 5), torch.randint(0, 5, (8,))
        with region():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]


@plan("autocast_mode.training_step")
def learner_training_step(*, cls: type) -> tuple:
    _own_class(cls)
    return training_step(_region(cls, "cpu", torch.bfloat16))


def check_autocast_mode(cls) -> None:
    """cls(device_type, dtype) is a TorchFunctionMode that casts each op's inputs by its cast list;
    graded op by op against torch.autocast in CPU bf16/fp16 and CUDA fp16/bf16 regions (out= and in-place
    calls among them), and by an MLP training step's loss and gradients, bit for bit."""
    run_judge("check_autocast_mode", cls)


def check_autocast_mode_hidden(cls) -> None:
    """More ops of the same kinds (explicit dtypes, stacks of three, in-place and mixed calls)."""
    run_judge("check_autocast_mode_hidden", cls)
