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

from ampteach.amp.autocast import CastRecord, autocast

LOWER = {"cpu": torch.bfloat16, "cuda": torch.float16}


def has_cuda() -> bool:
    return torch.cuda.is_available()


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """A region where torch.empty(..., device="cuda") works without a GPU (fake tensors, no autograd)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.no_grad():
        yield


@contextlib.contextmanager
def torch_autocast(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    """torch.autocast(device_type, dtype), also for CUDA on a machine without a GPU (fake tensors).

    torch.autocast("cuda") disables itself when CUDA is unavailable; the region's flags are the same
    thread-local switches it would set, so setting them directly runs torch's real AutocastCUDA lists.
    """
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


# ---------------------------------------------------------------------------------------------------
# Op cases: one call per op family, built fresh on the device with floating inputs of a given dtype.

@dataclass(frozen=True)
class OpCase:
    """`call(device, dtype)` runs one op with floating inputs of `dtype` (where the case lets it)."""

    family: str
    label: str
    call: Callable[[str, torch.dtype], torch.Tensor]


def _r(device: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """Values in [0.5, 1.5): valid input for log, rsqrt, erfinv of (x - 1), probabilities after scaling."""
    return (torch.rand(*shape, device=device) + 0.5).to(dtype)


def _labels(device: str, n: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (n,), device=device)


def _mha(d: str, t: torch.dtype) -> torch.Tensor:
    q, k, v = _r(d, t, 3, 2, 8), _r(d, t, 3, 2, 8), _r(d, t, 3, 2, 8)   # three tensors: no packed path
    out, _ = F.multi_head_attention_forward(q, k, v, 8, 2, _r(d, t, 24, 8), _r(d, t, 24), None, None, False, 0.0,
                                            _r(d, t, 8, 8), _r(d, t, 8), training=False, need_weights=False)
    return out


def _out(d: str, t: torch.dtype, op: Callable, *args) -> torch.Tensor:
    result = torch.empty(0, device=d, dtype=t)
    op(*args, out=result)
    return result


def _inplace(t_: torch.Tensor, method: str, *args) -> torch.Tensor:
    getattr(t_, method)(*args)
    return t_


def _case_list() -> list[OpCase]:
    r, lab = _r, _labels
    f32, f64 = torch.float32, torch.float64
    cases = {
        "matmul": {
            "torch.mm": lambda d, t: torch.mm(r(d, t, 4, 4), r(d, t, 4, 4)),
            "a @ b": lambda d, t: r(d, t, 4, 4) @ r(d, t, 4, 4),
            "torch.bmm": lambda d, t: torch.bmm(r(d, t, 2, 4, 4), r(d, t, 2, 4, 4)),
            "torch.addmm": lambda d, t: torch.addmm(r(d, t, 4), r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.baddbmm": lambda d, t: torch.baddbmm(r(d, t, 2, 4, 4), r(d, t, 2, 4, 4), r(d, t, 2, 4, 4)),
            "F.linear": lambda d, t: F.linear(r(d, t, 2, 4), r(d, t, 3, 4), r(d, t, 3)),
            "torch.einsum('ij,jk')": lambda d, t: torch.einsum("ij,jk->ik", r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.einsum('ij,ij->ij')": lambda d, t: torch.einsum("ij,ij->ij", r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.mv": lambda d, t: torch.mv(r(d, t, 4, 4), r(d, t, 4)),
            "torch.linalg.vecdot": lambda d, t: torch.linalg.vecdot(r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.tensordot": lambda d, t: torch.tensordot(r(d, t, 2, 4), r(d, t, 4, 3), dims=1),
        },
        "convolution": {
            "F.conv1d": lambda d, t: F.conv1d(r(d, t, 1, 2, 8), r(d, t, 3, 2, 3)),
            "F.conv2d": lambda d, t: F.conv2d(r(d, t, 1, 2, 6, 6), r(d, t, 3, 2, 3, 3), r(d, t, 3)),
            "F.conv2d(padding='same')": lambda d, t: F.conv2d(r(d, t, 1, 2, 6, 6), r(d, t, 3, 2, 3, 3), padding="same"),
            "F.conv3d": lambda d, t: F.conv3d(r(d, t, 1, 1, 4, 4, 4), r(d, t, 2, 1, 3, 3, 3)),
            "F.conv_transpose2d": lambda d, t: F.conv_transpose2d(r(d, t, 1, 2, 4, 4), r(d, t, 2, 3, 3, 3)),
            "F.prelu": lambda d, t: F.prelu(r(d, t, 2, 4), r(d, t, 1)),
        },
        "attention": {
            "F.scaled_dot_product_attention": lambda d, t: F.scaled_dot_product_attention(
                r(d, t, 1, 2, 4, 8), r(d, t, 1, 2, 4, 8), r(d, t, 1, 2, 4, 8)),
            "F.multi_head_attention_forward": _mha,
        },
        "pooling and padding": {
            "F.max_pool2d": lambda d, t: F.max_pool2d(r(d, t, 1, 1, 4, 4), 2),
            "F.max_pool3d": lambda d, t: F.max_pool3d(r(d, t, 1, 1, 4, 4, 4), 2),
            "F.max_pool3d(return_indices=True)": lambda d, t: F.max_pool3d(r(d, t, 1, 1, 4, 4, 4), 2, return_indices=True)[0],
            "F.avg_pool3d": lambda d, t: F.avg_pool3d(r(d, t, 1, 1, 4, 4, 4), 2),
            "F.pad(mode='reflect')": lambda d, t: F.pad(r(d, t, 1, 2, 4, 4), (1, 1, 1, 1), mode="reflect"),
            "F.pad(mode='constant')": lambda d, t: F.pad(r(d, t, 1, 2, 4, 4), (1, 1, 1, 1)),
            "F.interpolate(mode='bilinear')": lambda d, t: F.interpolate(r(d, t, 1, 1, 4, 4), scale_factor=2, mode="bilinear"),
        },
        "norm": {
            "F.layer_norm": lambda d, t: F.layer_norm(r(d, t, 2, 8), (8,), r(d, f32, 8), r(d, f32, 8)),
            "F.group_norm": lambda d, t: F.group_norm(r(d, t, 2, 4, 3), 2),
            "F.rms_norm": lambda d, t: F.rms_norm(r(d, t, 2, 8), (8,)),
            "F.batch_norm": lambda d, t: F.batch_norm(r(d, t, 2, 3, 4), r(d, f32, 3), r(d, f32, 3)),
            "F.normalize": lambda d, t: F.normalize(r(d, t, 4, 4)),
            "torch.norm": lambda d, t: torch.norm(r(d, t, 4, 4)),
            "torch.linalg.vector_norm": lambda d, t: torch.linalg.vector_norm(r(d, t, 8)),
        },
        "softmax": {
            "torch.softmax": lambda d, t: torch.softmax(r(d, t, 4, 4), 1),
            "F.log_softmax": lambda d, t: F.log_softmax(r(d, t, 4, 4), dim=1),
            "F.softmin": lambda d, t: F.softmin(r(d, t, 4, 4), dim=1),
        },
        "pointwise": {
            "torch.exp": lambda d, t: torch.exp(r(d, t, 8)),
            "torch.log": lambda d, t: torch.log(r(d, t, 8)),
            "x ** 2": lambda d, t: r(d, t, 8) ** 2,
            "torch.rsqrt": lambda d, t: torch.rsqrt(r(d, t, 8)),
            "torch.reciprocal": lambda d, t: torch.reciprocal(r(d, t, 8)),
            "torch.erfinv": lambda d, t: torch.erfinv(r(d, t, 8) - 1),
            "torch.tan": lambda d, t: torch.tan(r(d, t, 8)),
            "F.softplus": lambda d, t: F.softplus(r(d, t, 8)),
            "torch.sigmoid": lambda d, t: torch.sigmoid(r(d, t, 8)),
            "torch.tanh": lambda d, t: torch.tanh(r(d, t, 8)),
            "F.relu": lambda d, t: F.relu(r(d, t, 8)),
            "F.gelu": lambda d, t: F.gelu(r(d, t, 8)),
            "x + y (t + fp32)": lambda d, t: r(d, t, 8) + r(d, f32, 8),
        },
        "reduction": {
            "torch.sum": lambda d, t: torch.sum(r(d, t, 8)),
            "x.sum(dim=1)": lambda d, t: r(d, t, 4, 4).sum(dim=1),
            "torch.mean": lambda d, t: torch.mean(r(d, t, 8)),
            "torch.prod": lambda d, t: torch.prod(r(d, t, 8)),
            "torch.cumsum": lambda d, t: torch.cumsum(r(d, t, 8), 0),
            "torch.logsumexp": lambda d, t: torch.logsumexp(r(d, t, 4, 4), 1),
            "torch.amax": lambda d, t: torch.amax(r(d, t, 4, 4), 1),
        },
        "loss": {
            "F.cross_entropy": lambda d, t: F.cross_entropy(r(d, t, 4, 5), lab(d, 4, 5)),
            "F.nll_loss": lambda d, t: F.nll_loss(r(d, t, 4, 5), lab(d, 4, 5)),
            "F.mse_loss": lambda d, t: F.mse_loss(r(d, t, 8), r(d, t, 8)),
            "F.l1_loss": lambda d, t: F.l1_loss(r(d, t, 8), r(d, t, 8)),
            "F.smooth_l1_loss": lambda d, t: F.smooth_l1_loss(r(d, t, 8), r(d, t, 8)),
            "F.kl_div": lambda d, t: F.kl_div(r(d, t, 4, 4), r(d, t, 4, 4), reduction="batchmean"),
            "F.binary_cross_entropy_with_logits": lambda d, t: F.binary_cross_entropy_with_logits(r(d, t, 8), r(d, t, 8) - 0.5),
            "F.binary_cross_entropy": lambda d, t: F.binary_cross_entropy(r(d, t, 8) - 0.5, r(d, t, 8) - 0.5),
        },
        "promote": {
            "torch.cat([t, fp32])": lambda d, t: torch.cat([r(d, t, 4), r(d, f32, 4)]),
            "torch.stack([t, t])": lambda d, t: torch.stack([r(d, t, 4), r(d, t, 4)]),
            "torch.addcmul(t, t, fp32)": lambda d, t: torch.addcmul(r(d, t, 4), r(d, t, 4), r(d, f32, 4)),
            "torch.atan2(t, fp32)": lambda d, t: torch.atan2(r(d, t, 4), r(d, f32, 4)),
            "torch.dot(t, fp32)": lambda d, t: torch.dot(r(d, t, 4), r(d, f32, 4)),
            "torch.index_put(t, idx, fp32)": lambda d, t: torch.index_put(r(d, t, 4), (lab(d, 1, 4),), r(d, f32, 1)),
            "torch.scatter_add(t, 0, idx, fp32)": lambda d, t: torch.scatter_add(r(d, t, 4), 0, lab(d, 1, 4), r(d, f32, 1)),
        },
        "fp64 and integers": {
            "torch.mm(fp64, fp64)": lambda d, t: torch.mm(r(d, f64, 4, 4), r(d, f64, 4, 4)),
            "torch.exp(fp64)": lambda d, t: torch.exp(r(d, f64, 4)),
            "torch.softmax(fp64)": lambda d, t: torch.softmax(r(d, f64, 4, 4), 1),
            "torch.sum(int64)": lambda d, t: torch.sum(lab(d, 8, 5)),
            "torch.cat([int64, t])": lambda d, t: torch.cat([lab(d, 4, 5), r(d, t, 4)]),
            "F.linear(fp64 x, t weight)": lambda d, t: F.linear(r(d, f64, 2, 4), r(d, t, 3, 4)),
        },
        "explicit dtype": {
            "torch.softmax(x, 1, dtype=float16)": lambda d, t: torch.softmax(r(d, t, 4, 4), 1, dtype=torch.float16),
            "torch.sum(x, dtype=bfloat16)": lambda d, t: torch.sum(r(d, t, 8), dtype=torch.bfloat16),
            "torch.cumsum(x, 0, dtype=float64)": lambda d, t: torch.cumsum(r(d, t, 8), 0, dtype=f64),
            "torch.prod(x, dtype=bfloat16)": lambda d, t: torch.prod(r(d, t, 8), dtype=torch.bfloat16),
        },
        "out=": {
            "torch.mm(a, b, out=c)": lambda d, t: _out(d, t, torch.mm, r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.exp(x, out=y)": lambda d, t: _out(d, t, torch.exp, r(d, t, 8)),
            "torch.sum(x, 0, out=y)": lambda d, t: _out(d, t, torch.sum, r(d, t, 4, 4), 0),
        },
        "torch.ops.aten": {
            "torch.ops.aten.mm": lambda d, t: torch.ops.aten.mm(r(d, t, 4, 4), r(d, t, 4, 4)),
            "torch.ops.aten.softmax.int": lambda d, t: torch.ops.aten.softmax.int(r(d, t, 4, 4), 1),
            "torch.ops.aten.mm.out": lambda d, t: _out(d, t, torch.ops.aten.mm.out, r(d, t, 4, 4), r(d, t, 4, 4)),
        },
        "in-place": {
            "x.exp_()": lambda d, t: _inplace(r(d, t, 8), "exp_"),
            "x.log_()": lambda d, t: _inplace(r(d, t, 8), "log_"),
            "x.add_(y)": lambda d, t: _inplace(r(d, t, 8), "add_", r(d, t, 8)),
            "F.relu(x, inplace=True)": lambda d, t: F.relu(r(d, t, 8), inplace=True),
        },
    }
    return [OpCase(family, label, call) for family, calls in cases.items() for label, call in calls.items()]


OP_CASES: tuple[OpCase, ...] = tuple(_case_list())


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
        # all of one implementation, then all of the other: each switch between them re-registers kernels
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
        name = func._schema.name.removeprefix("aten::") + ("" if func._overloadname == "default" else f".{func._overloadname}")
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
        with torch.autocast(device_type, dtype=dtype), dispatch_trace() as trace_t:
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
# Display

def html_table(header: list[str], rows: list[list[object]], highlight: Callable[[list[object]], bool] | None = None) -> str:
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
