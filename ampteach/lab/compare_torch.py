"""The autocast reference path: the same ops and training steps through torch.amp and through ampteach.

    rows = op_agreement("cuda", torch.float16)        # every op case, torch.autocast vs ampteach.autocast
    all(row.agree for row in rows)                    # CUDA on a CPU-only machine: fake CUDA tensors

    with dispatch_trace() as trace:                   # every aten call below autocast: op, dtypes in, dtype out
        model(x)

    report = compare_training(mlp(), batches, precision="fp16", steps=5)   # CUDA when present, else CPU
    report.ops_agree, report.max_output_diff, report.max_grad_diff, report.scales_torch, report.scales_ampteach

Both autocasts work at the dispatcher's Autocast keys: torch's kernels are C++, ampteach's Python.
The reference path runs both on the same inputs and compares what comes out: per op, the output
dtype (or the error); per training step, the calls that reach the kernels below autocast (each
cast and each op, with dtypes, in order), the outputs, the gradients and the loss scale. Where torch
is deterministic (a CPU) outputs and gradients must be identical, bit for bit: max |difference| = 0.
Once registered, ampteach's kernels also serve torch.autocast regions, so the torch side runs
on torch's own C++ kernels (TorchAutocast, torch_autocast: they remove ampteach's first).

CUDA without a GPU: torch.autocast("cuda") switches itself off when CUDA is unavailable, so
`torch_autocast` sets torch's autocast flags directly instead, ampteach's regions are opened with
fake_cuda=True, and the op cases build fake CUDA tensors (torch._subclasses.fake_tensor.FakeTensorMode):
dtypes and errors are real, numbers are not. Autograd must not touch fake CUDA tensors (it aborts
the process on a CPU-only build), so the fake cases run under no_grad with inputs that do not
require grad.
"""

from __future__ import annotations

import contextlib
import copy
import html
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.amp import autocast_kernels
from ampteach.amp.autocast import CastRecord, autocast
from ampteach.lab.autocast_op_cases import OP_CASES, OpCase

__all__ = ["CACHE_CASES", "LOWER", "OP_CASES", "Agreement", "DispatchTrace", "OpCase", "ReferenceReport", "StepRecord",
           "TorchAutocast", "TraceEntry", "agreement_rows", "cache_conditions", "compare_training", "device_context",
           "dispatch_trace", "fake_cuda", "has_cuda", "html_table", "op_agreement", "run_case", "torch_autocast",
           "use_torch_kernels"]

LOWER = {"cpu": torch.bfloat16, "cuda": torch.float16}


def has_cuda() -> bool:
    return torch.cuda.is_available()


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """A region where torch.empty(..., device="cuda") works without a GPU (fake tensors, no autograd)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.no_grad():
        yield


def use_torch_kernels() -> None:
    """Let torch's own C++ kernels serve the Autocast keys, for a reference run (outside any region).

    ampteach's kernels, once registered, serve torch.autocast regions too (with torch's results: the
    tests check that). A comparison against torch must not compare ampteach with itself, so the
    reference side removes them first; the next ampteach region registers them again. Inside an open
    region nothing is removed (the region's kernels must stay).
    """
    level = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    if level == 1:
        autocast_kernels.uninstall()


class TorchAutocast(torch.amp.autocast_mode.autocast):
    """torch.autocast, served by torch's own kernels: `with TorchAutocast("cpu", dtype=...)`, the reference."""

    def __enter__(self):
        use_torch_kernels()
        return super().__enter__()


@contextlib.contextmanager
def torch_autocast(device_type: str, dtype: torch.dtype, torch_kernels: bool = True) -> Iterator[None]:
    """torch.autocast(device_type, dtype) on torch's own kernels, also for CUDA without a GPU (fake tensors).

    torch.autocast("cuda") disables itself when CUDA is unavailable; the region's flags are the same
    thread-local switches it would set, so setting them directly runs torch's real AutocastCUDA lists.
    torch_kernels=False leaves ampteach's kernels registered, if they are: they then serve the region.
    """
    if torch_kernels:
        use_torch_kernels()
    if device_type == "cuda" and not has_cuda():
        enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", dtype)
        torch.autocast_increment_nesting()
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", previous)
    else:
        with torch.autocast(device_type, dtype=dtype):
            yield


def device_context(device_type: str, fake: bool | None = None) -> contextlib.AbstractContextManager:
    """Real tensors on a CPU or a GPU; fake CUDA tensors when CUDA is asked for and absent (or fake=True)."""
    if fake is None:
        fake = device_type == "cuda" and not has_cuda()
    return fake_cuda() if fake else contextlib.nullcontext()


def run_case(case: OpCase, device_type: str, input_dtype: torch.dtype, region: contextlib.AbstractContextManager,
             seed: int = 0) -> str:
    """The case's output dtype under `region` ('float16', ...), or 'error: <first line>'."""
    torch.manual_seed(seed)
    try:
        with region:
            out = case.call(device_type, input_dtype)
    except Exception as exc:   # the error is the result: torch raises it too, or the row disagrees
        return "error: " + str(exc).strip().splitlines()[0]
    return str(out.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Agreement:
    """One op case on one device: what torch.autocast and ampteach.autocast made of it."""

    family: str
    label: str
    device_type: str
    dtype: torch.dtype                 # the region's dtype
    input_dtype: torch.dtype
    torch_result: str
    ampteach_result: str

    @property
    def agree(self) -> bool:
        if self.torch_result.startswith("error") and self.ampteach_result.startswith("error"):
            return True
        return self.torch_result == self.ampteach_result


def op_agreement(device_type: str, dtype: torch.dtype | None = None, cases: Iterable[OpCase] = OP_CASES,
                 input_dtypes: Iterable[torch.dtype] | None = None, fake: bool | None = None) -> list[Agreement]:
    """Every case under torch.autocast and under ampteach.autocast, once per input dtype (fp32, lower).

    CUDA without a GPU (or with fake=True) runs on fake CUDA tensors. Rows agree when both give the
    same dtype, or both raise (the messages differ: ampteach's say what to do instead).
    """
    dtype = dtype or LOWER[device_type]
    input_dtypes = tuple(input_dtypes or (torch.float32, dtype))
    cases = tuple(cases)
    fake = (device_type == "cuda" and not has_cuda()) if fake is None else fake
    results = {}
    with device_context(device_type, fake):
        # all of one implementation, then all of the other: the reference removes ampteach's kernels
        for name, region in (("ampteach", lambda: autocast(device_type, dtype=dtype, fake_cuda=fake)),
                             ("torch", lambda: torch_autocast(device_type, dtype))):
            results[name] = [run_case(case, device_type, input_dtype, region())
                             for case in cases for input_dtype in input_dtypes]
    pairs = [(case, input_dtype) for case in cases for input_dtype in input_dtypes]
    return [Agreement(case.family, case.label, device_type, dtype, input_dtype, theirs, ours)
            for (case, input_dtype), theirs, ours in zip(pairs, results["torch"], results["ampteach"])]


# ---------------------------------------------------------------------------------------------------
# Training steps through both stacks

@dataclass(frozen=True)
class TraceEntry:
    """One aten call below the Autocast keys: the op, its tensor inputs' dtypes, its first output's dtype."""

    op: str
    inputs: tuple[torch.dtype, ...]
    output: torch.dtype | None

    def __str__(self) -> str:
        ins = ", ".join(str(d).removeprefix("torch.") for d in self.inputs)
        return f"{self.op}({ins}) -> {str(self.output).removeprefix('torch.')}"


class DispatchTrace(TorchDispatchMode):
    """Logs every aten call that reaches the dispatcher below autocast and autograd (casts included).

    Under either autocast the same model must give the same trace: the same casts (aten._to_copy)
    in the same order, and the same ops on the same dtypes. A dispatch mode runs below the Autocast
    keys, so it sees what autocast produced, not what the user called.
    """

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[TraceEntry] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = tuple(t.dtype for t in _tensor_args(args, kwargs))
        first = out if isinstance(out, torch.Tensor) else next(
            (o for o in out if isinstance(o, torch.Tensor)), None) if isinstance(out, (list, tuple)) else None
        overload = "" if func._overloadname == "default" else f".{func._overloadname}"
        name = func._schema.name.removeprefix("aten::") + overload
        self.entries.append(TraceEntry(name, inputs, None if first is None else first.dtype))
        return out


@contextlib.contextmanager
def dispatch_trace() -> Iterator[list[TraceEntry]]:
    """`with dispatch_trace() as trace:` -> trace lists the aten calls below autocast, in order."""
    mode = DispatchTrace()
    with mode:
        yield mode.entries


def _tensor_args(args, kwargs):
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))


@dataclass
class StepRecord:
    loss_torch: float
    loss_ampteach: float
    ops_agree: bool
    max_output_diff: float
    max_grad_diff: float
    scale_torch: float
    scale_ampteach: float


@dataclass
class ReferenceReport:
    """compare_training's result: per step, and over all steps."""

    device_type: str
    precision: str
    trace_torch: list[TraceEntry] = field(default_factory=list)       # the first step's calls below autocast
    trace_ampteach: list[TraceEntry] = field(default_factory=list)
    records_ampteach: list[CastRecord] = field(default_factory=list)  # the first step's listed ops (record=True)
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def ops_agree(self) -> bool:
        return all(s.ops_agree for s in self.steps)

    @property
    def max_output_diff(self) -> float:
        return max(s.max_output_diff for s in self.steps)

    @property
    def max_grad_diff(self) -> float:
        return max(s.max_grad_diff for s in self.steps)

    @property
    def bitwise(self) -> bool:
        return self.max_output_diff == 0.0 and self.max_grad_diff == 0.0

    @property
    def scales_torch(self) -> list[float]:
        return [s.scale_torch for s in self.steps]

    @property
    def scales_ampteach(self) -> list[float]:
        return [s.scale_ampteach for s in self.steps]


def _max_diff(a: Iterable[torch.Tensor], b: Iterable[torch.Tensor]) -> float:
    """Largest |x - y| over pairs of tensors; equal values (inf == inf, NaN vs NaN included) count 0."""
    worst = 0.0
    for x, y in zip(a, b):
        if x is None or y is None:
            continue
        x, y = x.double(), y.double()
        same = (x == y) | (x.isnan() & y.isnan())
        diff = torch.where(same, torch.zeros_like(x), (x - y).abs().nan_to_num(nan=float("inf")))
        worst = max(worst, diff.max().item() if diff.numel() else 0.0)
    return worst


def compare_training(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     precision: str = "fp16", steps: int = 5, device: str | None = None,
                     make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
                     init_scale: float = 2.0**16, growth_interval: int = 2000) -> ReferenceReport:
    """Train two copies of `model` for `steps` batches: torch.autocast + torch.amp.GradScaler vs ampteach's.

    Each step: forward + cross-entropy under the autocast (traced below autocast), scale(loss).backward(),
    step, update. Per step the report holds both losses, whether the two traces agree, the largest
    |difference| of the logits and of the gradients (unscaled, before the optimizer step), and both
    loss scales. The loss scaler runs for fp16 only, as in the course's training loop.
    """
    from ampteach.amp.scaler import GradScaler

    device_type = device or ("cuda" if has_cuda() else "cpu")
    if precision not in ("fp16", "bf16"):
        raise ValueError(f"precision must be 'fp16' or 'bf16' (fp32 has no autocast to compare), got {precision!r}")
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    make_opt = make_optimizer or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    models = [copy.deepcopy(model).to(device_type), copy.deepcopy(model).to(device_type)]
    opts = [make_opt(m.parameters()) for m in models]
    scaling = dict(init_scale=init_scale, growth_interval=growth_interval, enabled=precision == "fp16")
    scalers = [torch.amp.GradScaler(device_type, **scaling), GradScaler(device_type, **scaling)]
    report = ReferenceReport(device_type, precision)
    for i, (x, y) in enumerate(batches):
        if i == steps:
            break
        x, y = x.to(device_type), y.to(device_type)
        with torch_autocast(device_type, dtype), dispatch_trace() as trace_t:
            logits_t = models[0](x)
            loss_t = F.cross_entropy(logits_t, y)
        with autocast(device_type, dtype=dtype, record=True) as region, dispatch_trace() as trace_a:
            logits_a = models[1](x)
            loss_a = F.cross_entropy(logits_a, y)
        grads = []
        for model_, opt, scaler, loss in zip(models, opts, scalers, (loss_t, loss_a)):
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            grads.append([p.grad for p in model_.parameters()])
        scales = [scaler.get_scale() for scaler in scalers]
        for opt, scaler in zip(opts, scalers):
            scaler.step(opt)
            scaler.update()
        if i == 0:
            report.trace_torch, report.trace_ampteach, report.records_ampteach = trace_t, trace_a, region.records
        report.steps.append(StepRecord(
            loss_t.item(), loss_a.item(), trace_t == trace_a,
            _max_diff([logits_t], [logits_a]), _max_diff(grads[0], grads[1]), scales[0], scales[1]))
    return report


# ---------------------------------------------------------------------------------------------------
# The weight-cast cache: which tensors are cast once per region

class _CastCounter(TorchDispatchMode):
    """Counts the casts of one tensor below autocast (aten._to_copy; in inference mode aten.to arrives whole)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.tensor, self.casts = tensor, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to) and args[0] is self.tensor:
            self.casts += 1
        return func(*args, **(kwargs or {}))


CACHE_CASES: dict[str, tuple[Callable[[nn.Parameter], torch.Tensor], dict, bool]] = {
    # name: (the tensor used as the weight, made from an fp32 parameter p; region options; in inference mode)
    "an fp32 parameter p": (lambda p: p, {}, False),
    "p in a region with cache_enabled=False": (lambda p: p, {"cache_enabled": False}, False),
    "p inside torch.inference_mode()": (lambda p: p, {}, True),
    "a view of p (p[:])": (lambda p: p[:], {}, False),
    "a result computed from p (p * 1)": (lambda p: p * 1, {}, False),
    "p.detach() (no grad)": (lambda p: p.detach(), {}, False),
    "a float64 parameter": (lambda p: nn.Parameter(p.detach().double()), {}, False),
}


def cache_conditions(regions: dict[str, Callable]) -> list[list[str]]:
    """Per CACHE_CASES entry and region: is the weight cast "once" for two uses in one region, "twice", or "never"?

        rows = cache_conditions({"torch.autocast": TorchAutocast, "ampteach.autocast": ampteach.autocast})

    Counted below autocast (the casts that reach the kernels under it), two F.linear calls per region.
    """
    rows = []
    for case, (make, options, inference) in CACHE_CASES.items():
        row = [case]
        for region in regions.values():
            weight = make(nn.Parameter(torch.rand(4, 4)))
            x = torch.rand(2, 4, dtype=weight.dtype)
            with contextlib.ExitStack() as stack:
                if inference:
                    stack.enter_context(torch.inference_mode())
                stack.enter_context(region("cpu", dtype=torch.bfloat16, **options))
                counter = stack.enter_context(_CastCounter(weight))
                F.linear(x, weight)
                F.linear(x, weight)
            row.append({0: "never", 1: "once", 2: "twice"}[counter.casts])
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------
# Display

def html_table(header: list[str], rows: list[list[object]],
               highlight: Callable[[list[object]], bool] | None = None) -> str:
    """A small HTML table (pandas is not a dependency); rows where highlight(row) is true are tinted."""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(h))}</th>" for h in header)
    body = []
    for row in rows:
        style = " style='background:#fde2e2'" if highlight and highlight(row) else ""
        cells = "".join(f"<td style='text-align:left'>{html.escape(str(c))}</td>" for c in row)
        body.append(f"<tr{style}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def agreement_rows(rows: list[Agreement]) -> list[list[object]]:
    """op_agreement rows as table cells: family, call, input, torch, ampteach, agree."""
    return [[r.family, r.label, str(r.input_dtype).removeprefix("torch."), r.torch_result, r.ampteach_result,
             "yes" if r.agree else "NO"] for r in rows]
