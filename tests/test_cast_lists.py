"""ampteach.amp.cast_lists against torch 2.13 itself: the dispatcher's registrations and observed behaviour.

Three independent checks: (1) each table holds exactly the ops torch registers for AutocastCPU /
AutocastCUDA; (2) running an op under torch.autocast shows the policy the table names (CUDA with
fake CUDA tensors): what comes out, and which casts torch inserted, seen by a dispatch-mode log below
autocast; (3) every Python binding the mapping for a Python-level autocast names really dispatches
to its aten op (profiler). Composite ops are in no table (the dispatcher decomposes them into listed ops):
a probe listed on one device only must show the same policy under ampteach.autocast as under torch's
on the other, and tests/test_autocast.py checks ampteach's values for them bit for bit.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.amp import cast_lists as cl
from ampteach.amp.autocast import autocast
from ampteach.lab.compare_torch import fake_cuda, has_cuda, torch_autocast

pytestmark = [   # probing deprecated or experimental ops makes torch say so
    pytest.mark.filterwarnings("ignore:.*frobenius_norm is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning"),
    pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss:UserWarning"),
    pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN:UserWarning"),
]

LOW = {"cpu": torch.bfloat16, "cuda": torch.float16}
F32 = torch.float32


# ---------------------------------------------------------------------------------------------------
# (1) the tables are torch's registrations

def registrations(key: str) -> set[str]:
    return {name.removeprefix("aten::") for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)}


@pytest.mark.parametrize("device_type,key", [("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")])
def test_tables_hold_exactly_the_ops_torch_registers(device_type, key):
    got = registrations(key)
    build_only = set(cl.CUDA_BUILD_ONLY) if device_type == "cuda" and torch.version.cuda is None else set()
    if torch.__version__.startswith(cl.TORCH_VERSION + "."):   # the table's version: exact, overloads included
        expected = set(cl.registered(device_type)) - build_only
    else:   # another torch (the GPU machines' 2.11): op names, with the known differences applied
        got = {cl.base_name(op) for op in got}
        expected = {op for ops in cl.table(device_type).values() for op in ops} - build_only
    assert got == expected, \
        f"missing from the table: {sorted(got - expected)}; not registered: {sorted(expected - got)}"


@pytest.mark.parametrize("device_type", cl.DEVICE_TYPES)
def test_each_op_has_one_policy_and_the_policy_names_are_torchs(device_type):
    tables = cl.TABLES[device_type]
    assert tuple(tables) == cl.POLICIES
    counts = collections.Counter(op for ops in tables.values() for op in ops)
    assert [op for op, n in counts.items() if n > 1] == []
    bases = collections.defaultdict(set)
    for policy, ops in tables.items():
        for op in ops:
            bases[cl.base_name(op)].add(policy)
    assert {op: p for op, p in bases.items() if len(p) > 1} == {}, "overloads of one op disagree"


def test_queries():
    for device_type in cl.DEVICE_TYPES:
        for policy in cl.POLICIES:
            ops = cl.ops_with_policy(policy, device_type)
            assert list(ops) == sorted(ops)
            assert all(cl.policy_of(op, device_type) == policy for op in ops)
    assert cl.policy_of("aten::softmax.int", "cuda") == cl.policy_of("softmax", "cuda")
    assert cl.policy_of("relu", "cuda") is None and cl.policy_of("relu", "cpu") is None
    with pytest.raises(ValueError, match="policy must be one of"):
        cl.ops_with_policy("fp16", "cpu")
    with pytest.raises(ValueError, match="'cuda' and 'cpu'"):
        cl.policy_of("mm", "mps")


def test_differences_are_the_ops_whose_two_policies_differ():
    diff = cl.differences()
    for op in cl.all_ops():
        pair = (cl.policies("cpu").get(op), cl.policies("cuda").get(op))
        assert (op in diff) == (pair[0] != pair[1])
    for op in ("softmax", "log_softmax", "layer_norm", "group_norm", "exp", "log", "pow", "sum", "cumsum", "norm"):
        assert diff[op][0] is None and diff[op][1] is not None, op   # not upcast on CPU, upcast on CUDA


def test_version_differences_change_the_table_for_older_torch():
    assert "rms_norm" in cl.table("cuda", "2.13.0")["fp32"]
    assert "rms_norm" in cl.table("cuda", "2.12.1")["fp32"]
    assert "rms_norm" not in cl.table("cuda", "2.11.0+cu130")["fp32"]
    assert cl.policy_of("rms_norm", "cuda", "2.11.0") is None
    assert cl.policy_of("rms_norm", "cpu", "2.13.0") is None
    registered = "rms_norm" in registrations("AutocastCUDA")
    assert registered == (cl.policy_of("rms_norm", "cuda") == "fp32")   # the installed torch decides


# ---------------------------------------------------------------------------------------------------
# (2) each policy, observed: dtypes out, and the casts torch.autocast inserts

class CastLog(TorchDispatchMode):
    """Counts the dtype conversions (aten._to_copy) that reach the dispatcher below autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") is not None:
            self.casts[(args[0].dtype, kwargs["dtype"])] += 1
        return func(*args, **kwargs)


def observe(fn, device_type, low, ta, tb, autocast_on, log_casts=False, region=torch_autocast):
    """(output dtype or 'error', casts) for fn(device, ta, tb), under region(device, low) or without it.

    The cast log is a dispatch mode, and a dispatch mode changes what runs inside ops implemented
    by explicit C++ kernels (their inner calls are no longer autocast), so it is used only where the
    dtype alone cannot tell: promote, whose casts often give the dtype native promotion would give.
    """
    log = CastLog()
    region = region(device_type, low) if autocast_on else contextlib.nullcontext()
    torch.manual_seed(0)
    try:
        with region, (log if log_casts else contextlib.nullcontext()):
            out = fn(device_type, ta, tb)
    except RuntimeError:
        return "error", log.casts
    out = out[0] if isinstance(out, tuple) else out
    return out.dtype, log.casts


def classify(fn, device_type, region=torch_autocast):
    """The policy region(device, dtype) (torch.autocast) shows for this call: lower / fp32 / promote / banned / None.

    Three runs, each with and without autocast: all-fp32 inputs (lower precision comes out in the
    lower dtype), all-lower inputs (fp32 ops come out fp32), and mixed lower + fp32 inputs (promote
    casts the lower one up before the op).
    """
    low = LOW[device_type]
    banned = False

    def run(ta, tb, log_casts=False):
        nonlocal banned
        base, base_casts = observe(fn, device_type, low, ta, tb, False, log_casts)
        auto, auto_casts = observe(fn, device_type, low, ta, tb, True, log_casts, region)
        banned = banned or (auto == "error" and base != "error")
        return base, auto, auto_casts - base_casts

    base, auto, _ = run(F32, F32)
    if banned:
        return "banned"
    if auto == low:
        return "lower_precision_fp"
    base, auto, _ = run(low, low)
    if auto == F32 and base != F32:   # base may be an error: the op has no lower-precision kernel
        return "fp32"
    base, auto, added = run(low, F32, log_casts=True)
    if banned:
        return "banned"
    if added[(low, F32)] or (base == "error" and auto == F32):
        return "promote"
    return None


def r(d, t, *shape):
    return (torch.rand(*shape, device=d) + 0.5).to(t)


def labels(d, n, classes):
    return torch.randint(0, classes, (n,), device=d)


# op -> call(device, dtype_a, dtype_b). Two-input ops take dtype_b for the second input; the mixed run
# (lower, fp32) separates promote (casts the lower input up) from ops that do nothing.
PROBES = {
    # lower_precision_fp
    "mm": lambda d, a, b: torch.mm(r(d, a, 4, 4), r(d, b, 4, 4)),
    "matmul": lambda d, a, b: torch.matmul(r(d, a, 4, 4), r(d, b, 4, 4)),
    "bmm": lambda d, a, b: torch.bmm(r(d, a, 2, 4, 4), r(d, b, 2, 4, 4)),
    "baddbmm": lambda d, a, b: torch.baddbmm(r(d, a, 2, 4, 4), r(d, b, 2, 4, 4), r(d, b, 2, 4, 4)),
    "addmm": lambda d, a, b: torch.addmm(r(d, a, 4, 4), r(d, b, 4, 4), r(d, b, 4, 4)),
    "addbmm": lambda d, a, b: torch.addbmm(r(d, a, 4, 4), r(d, b, 2, 4, 4), r(d, b, 2, 4, 4)),
    "addmv": lambda d, a, b: torch.addmv(r(d, a, 4), r(d, b, 4, 4), r(d, b, 4)),
    "addr": lambda d, a, b: torch.addr(r(d, a, 4, 4), r(d, b, 4), r(d, b, 4)),
    "mv": lambda d, a, b: torch.mv(r(d, a, 4, 4), r(d, b, 4)),
    "linear": lambda d, a, b: F.linear(r(d, a, 2, 4), r(d, b, 3, 4)),
    "linalg_vecdot": lambda d, a, b: torch.linalg.vecdot(r(d, a, 4, 4), r(d, b, 4, 4)),
    "conv1d": lambda d, a, b: F.conv1d(r(d, a, 1, 2, 8), r(d, b, 3, 2, 3)),
    "conv2d": lambda d, a, b: F.conv2d(r(d, a, 1, 2, 6, 6), r(d, b, 3, 2, 3, 3)),
    "conv3d": lambda d, a, b: F.conv3d(r(d, a, 1, 1, 4, 4, 4), r(d, b, 2, 1, 3, 3, 3)),
    "conv_transpose1d": lambda d, a, b: F.conv_transpose1d(r(d, a, 1, 2, 8), r(d, b, 2, 3, 3)),
    "conv_transpose3d": lambda d, a, b: F.conv_transpose3d(r(d, a, 1, 1, 3, 3, 3), r(d, b, 1, 2, 2, 2, 2)),
    "conv_tbc": lambda d, a, b: torch.conv_tbc(r(d, a, 5, 1, 3), r(d, b, 2, 3, 4), r(d, b, 4)),
    "prelu": lambda d, a, b: F.prelu(r(d, a, 2, 4), r(d, b, 1)),
    "scaled_dot_product_attention": lambda d, a, b: F.scaled_dot_product_attention(
        r(d, a, 1, 2, 4, 8), r(d, b, 1, 2, 4, 8), r(d, b, 1, 2, 4, 8)),
    "linalg_multi_dot": lambda d, a, b: torch.linalg.multi_dot([r(d, a, 4, 4), r(d, b, 4, 4)]),
    "lstm_cell": lambda d, a, b: torch.lstm_cell(r(d, a, 2, 3), (r(d, b, 2, 4), r(d, b, 2, 4)),
                                                 r(d, b, 16, 3), r(d, b, 16, 4)),
    "gru_cell": lambda d, a, b: torch.gru_cell(r(d, a, 2, 3), r(d, b, 2, 4), r(d, b, 12, 3), r(d, b, 12, 4)),
    "rnn_tanh_cell": lambda d, a, b: torch.rnn_tanh_cell(r(d, a, 2, 3), r(d, b, 2, 4), r(d, b, 4, 3), r(d, b, 4, 4)),
    "rnn_relu_cell": lambda d, a, b: torch.rnn_relu_cell(r(d, a, 2, 3), r(d, b, 2, 4), r(d, b, 4, 3), r(d, b, 4, 4)),
    # fp32 on CUDA (and some on CPU)
    "acos": lambda d, a, b: torch.acos(r(d, a, 8) - 1),
    "asin": lambda d, a, b: torch.asin(r(d, a, 8) - 1),
    "cosh": lambda d, a, b: torch.cosh(r(d, a, 8)),
    "erfinv": lambda d, a, b: torch.erfinv(r(d, a, 8) - 1),
    "exp": lambda d, a, b: torch.exp(r(d, a, 8)),
    "expm1": lambda d, a, b: torch.expm1(r(d, a, 8)),
    "log": lambda d, a, b: torch.log(r(d, a, 8)),
    "log10": lambda d, a, b: torch.log10(r(d, a, 8)),
    "log2": lambda d, a, b: torch.log2(r(d, a, 8)),
    "log1p": lambda d, a, b: torch.log1p(r(d, a, 8)),
    "reciprocal": lambda d, a, b: torch.reciprocal(r(d, a, 8)),
    "rsqrt": lambda d, a, b: torch.rsqrt(r(d, a, 8)),
    "sinh": lambda d, a, b: torch.sinh(r(d, a, 8)),
    "tan": lambda d, a, b: torch.tan(r(d, a, 8)),
    "pow": lambda d, a, b: torch.pow(r(d, a, 8), 2),
    "softplus": lambda d, a, b: F.softplus(r(d, a, 8)),
    "layer_norm": lambda d, a, b: F.layer_norm(r(d, a, 2, 8), (8,)),
    "group_norm": lambda d, a, b: F.group_norm(r(d, a, 2, 4, 3), 2),
    "rms_norm": lambda d, a, b: F.rms_norm(r(d, a, 2, 8), (8,)),
    "frobenius_norm": lambda d, a, b: torch._C._VariableFunctions.frobenius_norm(r(d, a, 4, 4), (0, 1)),
    "cosine_similarity": lambda d, a, b: F.cosine_similarity(r(d, a, 4, 4), r(d, b, 4, 4)),
    "renorm": lambda d, a, b: torch.renorm(r(d, a, 4, 4), 2, 0, 1.0),
    "logsumexp": lambda d, a, b: torch.logsumexp(r(d, a, 4, 4), 1),
    "dist": lambda d, a, b: torch.dist(r(d, a, 4), r(d, b, 4)),
    "pdist": lambda d, a, b: F.pdist(r(d, a, 4, 4)),
    "cdist": lambda d, a, b: torch.cdist(r(d, a, 4, 4), r(d, b, 4, 4)),
    "upsample_nearest2d": lambda d, a, b: F.interpolate(r(d, a, 1, 1, 4, 4), scale_factor=2),
    "upsample_bilinear2d": lambda d, a, b: F.interpolate(r(d, a, 1, 1, 4, 4), scale_factor=2, mode="bilinear"),
    "nll_loss": lambda d, a, b: torch._C._nn.nll_loss(r(d, a, 4, 5), labels(d, 4, 5)),
    "mse_loss": lambda d, a, b: F.mse_loss(r(d, a, 8), r(d, b, 8)),
    "l1_loss": lambda d, a, b: F.l1_loss(r(d, a, 8), r(d, b, 8)),
    "smooth_l1_loss": lambda d, a, b: F.smooth_l1_loss(r(d, a, 8), r(d, b, 8)),
    "huber_loss": lambda d, a, b: F.huber_loss(r(d, a, 8), r(d, b, 8)),
    "kl_div": lambda d, a, b: F.kl_div(r(d, a, 4, 4), r(d, b, 4, 4), reduction="batchmean"),
    "poisson_nll_loss": lambda d, a, b: F.poisson_nll_loss(r(d, a, 8), r(d, b, 8)),
    "soft_margin_loss": lambda d, a, b: F.soft_margin_loss(r(d, a, 8), r(d, b, 8)),
    "hinge_embedding_loss": lambda d, a, b: F.hinge_embedding_loss(r(d, a, 8), r(d, b, 8)),
    "margin_ranking_loss": lambda d, a, b: F.margin_ranking_loss(r(d, a, 8), r(d, b, 8), r(d, b, 8)),
    "multi_margin_loss": lambda d, a, b: F.multi_margin_loss(r(d, a, 4, 5), labels(d, 4, 5)),
    "triplet_margin_loss": lambda d, a, b: F.triplet_margin_loss(r(d, a, 4, 4), r(d, b, 4, 4), r(d, b, 4, 4)),
    "cosine_embedding_loss": lambda d, a, b: F.cosine_embedding_loss(r(d, a, 4, 4), r(d, b, 4, 4), r(d, b, 4)),
    "binary_cross_entropy_with_logits":
        lambda d, a, b: F.binary_cross_entropy_with_logits(r(d, a, 8), r(d, b, 8) - 0.5),
    "cross_entropy_loss": lambda d, a, b: F.cross_entropy(r(d, a, 4, 5), labels(d, 4, 5)),
    "prod": lambda d, a, b: torch.prod(r(d, a, 8)),
    "softmax": lambda d, a, b: torch.softmax(r(d, a, 4, 4), 1),
    "log_softmax": lambda d, a, b: torch.log_softmax(r(d, a, 4, 4), 1),
    "cumsum": lambda d, a, b: torch.cumsum(r(d, a, 8), 0),
    "cumprod": lambda d, a, b: torch.cumprod(r(d, a, 8), 0),
    "sum": lambda d, a, b: torch.sum(r(d, a, 8)),
    "linalg_vector_norm": lambda d, a, b: torch.linalg.vector_norm(r(d, a, 8)),
    "linalg_matrix_norm": lambda d, a, b: torch.linalg.matrix_norm(r(d, a, 4, 4)),
    "norm": lambda d, a, b: torch._C._VariableFunctions.norm(r(d, a, 8)),
    # fp32 on CPU only
    "avg_pool3d": lambda d, a, b: F.avg_pool3d(r(d, a, 1, 1, 4, 4, 4), 2),
    "max_pool3d": lambda d, a, b: F.max_pool3d(r(d, a, 1, 1, 4, 4, 4), 2),
    "adaptive_avg_pool3d": lambda d, a, b: F.adaptive_avg_pool3d(r(d, a, 1, 1, 4, 4, 4), 2),
    "reflection_pad1d": lambda d, a, b: torch._C._nn.reflection_pad1d(r(d, a, 1, 2, 6), (1, 1)),
    "replication_pad2d": lambda d, a, b: torch._C._nn.replication_pad2d(r(d, a, 1, 1, 4, 4), (1, 1, 1, 1)),
    "grid_sampler": lambda d, a, b: torch.grid_sampler(r(d, a, 1, 1, 4, 4), r(d, b, 1, 2, 2, 2) - 1, 0, 0, False),
    "trace": lambda d, a, b: torch.trace(r(d, a, 4, 4)),
    "quantile": lambda d, a, b: torch.quantile(r(d, a, 8), 0.5),
    "fft_rfft": lambda d, a, b: torch.fft.rfft(r(d, a, 8)).abs(),
    "inverse": lambda d, a, b: torch.inverse(r(d, a, 4, 4) + 4 * torch.eye(4, device=d, dtype=a)),
    "linalg_qr": lambda d, a, b: torch.linalg.qr(r(d, a, 4, 4)),
    "binary_cross_entropy": lambda d, a, b: F.binary_cross_entropy(r(d, a, 8) - 0.5, r(d, b, 8) - 0.5),
    # promote
    "addcdiv": lambda d, a, b: torch.addcdiv(r(d, a, 4), r(d, a, 4), r(d, b, 4)),
    "addcmul": lambda d, a, b: torch.addcmul(r(d, a, 4), r(d, a, 4), r(d, b, 4)),
    "atan2": lambda d, a, b: torch.atan2(r(d, a, 4), r(d, b, 4)),
    "cross": lambda d, a, b: torch.cross(r(d, a, 4, 3), r(d, b, 4, 3), dim=1),
    "dot": lambda d, a, b: torch.dot(r(d, a, 4), r(d, b, 4)),
    "vdot": lambda d, a, b: torch.vdot(r(d, a, 4), r(d, b, 4)),
    "bilinear": lambda d, a, b: F.bilinear(r(d, a, 2, 3), r(d, a, 2, 3), r(d, b, 4, 3, 3)),
    "index_put": lambda d, a, b: torch.index_put(r(d, a, 4), (labels(d, 1, 4),), r(d, b, 1)),
    "scatter_add": lambda d, a, b: torch.scatter_add(r(d, a, 4), 0, labels(d, 1, 4), r(d, b, 1)),
    "cat": lambda d, a, b: torch.cat([r(d, a, 4), r(d, b, 4)]),
    "stack": lambda d, a, b: torch.stack([r(d, a, 4), r(d, b, 4)]),
    "index_copy": lambda d, a, b: torch.index_copy(r(d, a, 4), 0, labels(d, 1, 4), r(d, b, 1)),
    # not autocast anywhere
    "relu": lambda d, a, b: F.relu(r(d, a, 8)),
    "mean": lambda d, a, b: torch.mean(r(d, a, 8)),
    "batch_norm": lambda d, a, b: F.batch_norm(r(d, a, 2, 3, 4), r(d, F32, 3), r(d, F32, 3)),
    "add": lambda d, a, b: torch.add(r(d, a, 4), r(d, b, 4)),
}
# Observation can tell these apart: fp32_set_opt_dtype and fp32_append_dtype run in fp32 too
# (they pass dtype=float32 instead of casting; which one is read in the source, not observed).
CATEGORY = {"fp32_set_opt_dtype": "fp32", "fp32_append_dtype": "fp32"}
UNOBSERVABLE = {   # fake CUDA tensors cannot run these (no meta kernel, or no CUDA device guard)
    ("cuda", "inverse"), ("cuda", "linalg_qr"), ("cuda", "quantile"), ("cuda", "gru_cell"), ("cuda", "lstm_cell"),
}


@pytest.mark.parametrize("op", sorted(PROBES))
@pytest.mark.parametrize("device_type", cl.DEVICE_TYPES)
def test_each_policy_is_what_torch_autocast_does(device_type, op):
    if (device_type, op) in UNOBSERVABLE and not has_cuda():
        pytest.skip("fake CUDA tensors cannot run this op")
    listed = cl.policy_of(op, device_type)
    context = fake_cuda() if device_type == "cuda" and not has_cuda() else contextlib.nullcontext()
    if listed is None and any(cl.policy_of(op, other) for other in cl.DEVICE_TYPES):
        # listed on the other device only: here the ops it decomposes into decide, and what that shows
        # depends on the machine's kernels (an op may fail under autocast): ampteach must show the same
        with context:
            theirs, ours = classify(PROBES[op], device_type), classify(PROBES[op], device_type, ampteach_region)
        assert ours == theirs, f"{op} on {device_type} (unlisted): torch.autocast does {theirs}, ampteach {ours}"
        return
    expected = CATEGORY.get(listed, listed)
    with context:
        observed = classify(PROBES[op], device_type)
    assert observed == expected, f"{op} on {device_type}: the table says {listed}, torch.autocast does {observed}"


def ampteach_region(device_type, dtype):
    """ampteach.amp.autocast(device_type, dtype), also for CUDA on a machine without a GPU (fake tensors)."""
    return autocast(device_type, dtype=dtype, fake_cuda=device_type == "cuda" and not has_cuda())


def test_the_probes_cover_every_policy_on_both_devices():
    for device_type in cl.DEVICE_TYPES:
        covered = {cl.policy_of(op, device_type) for op in PROBES} - {None}
        assert covered == {p for p in cl.POLICIES if cl.ops_with_policy(p, device_type)}, device_type


# ---------------------------------------------------------------------------------------------------
# (3) Python callables -> aten ops

def test_every_binding_is_named_like_the_aten_op_it_maps_to():
    assert len(cl.BUILTIN_OPS) > 200
    for binding, op in cl.BUILTIN_OPS.items():
        assert binding.__name__ == op and hasattr(torch.ops.aten, op), (binding, op)
        assert not op.endswith("_"), f"{op}: in-place ops are not autocast"
    listed = {op for device in cl.DEVICE_TYPES for op in cl.policies(device)}
    unbound = {op for op in listed if not cl.bindings_of(op)}   # called from C++ only
    assert unbound <= {"_thnn_fused_gru_cell", "_thnn_fused_lstm_cell", "multilabel_margin_loss_forward", "_cudnn_rnn"}


def m(*shape):
    return torch.rand(*shape) + 0.5


SAMPLES = {   # op -> arguments that every binding of the op (torch.X, Tensor.X, F.X) accepts
    "mm": lambda: (m(4, 4), m(4, 4)), "matmul": lambda: (m(4, 4), m(4, 4)), "bmm": lambda: (m(2, 4, 4), m(2, 4, 4)),
    "baddbmm": lambda: (m(2, 4, 4), m(2, 4, 4), m(2, 4, 4)), "addmm": lambda: (m(4), m(4, 4), m(4, 4)),
    "linear": lambda: (m(2, 4), m(3, 4)), "einsum": lambda: ("ij,jk->ik", m(4, 4), m(4, 4)),
    "linalg_vecdot": lambda: (m(4, 4), m(4, 4)), "tensordot": lambda: (m(4, 4), m(4, 4)),
    "conv1d": lambda: (m(1, 2, 8), m(3, 2, 3)), "conv2d": lambda: (m(1, 2, 6, 6), m(3, 2, 3, 3)),
    "conv3d": lambda: (m(1, 1, 4, 4, 4), m(2, 1, 3, 3, 3)), "conv_transpose2d": lambda: (m(1, 2, 4, 4), m(2, 3, 3, 3)),
    "prelu": lambda: (m(2, 4), m(1)),
    "scaled_dot_product_attention": lambda: (m(1, 2, 4, 8), m(1, 2, 4, 8), m(1, 2, 4, 8)),
    "exp": lambda: (m(8),), "log": lambda: (m(8),), "rsqrt": lambda: (m(8),), "softplus": lambda: (m(8),),
    "pow": lambda: (m(8), 2), "atan2": lambda: (m(4), m(4)), "addcmul": lambda: (m(4), m(4), m(4)),
    "softmax": lambda: (m(4, 4), 1), "log_softmax": lambda: (m(4, 4), 1), "sum": lambda: (m(4, 4),),
    "cumsum": lambda: (m(8), 0), "prod": lambda: (m(8),), "logsumexp": lambda: (m(4, 4), 1),
    "layer_norm": lambda: (m(2, 4), (4,)), "group_norm": lambda: (m(2, 4, 3), 2), "rms_norm": lambda: (m(2, 4), (4,)),
    "linalg_vector_norm": lambda: (m(4, 4),),
    "cross_entropy_loss": lambda: (m(4, 5), torch.tensor([0, 1, 2, 3])),
    "nll_loss_nd": lambda: (m(4, 5), torch.tensor([0, 1, 2, 3])),
    "mse_loss": lambda: (m(8), m(8)), "l1_loss": lambda: (m(8), m(8)), "kl_div": lambda: (m(4, 4), m(4, 4)),
    "binary_cross_entropy": lambda: (m(8) - 0.5, m(8) - 0.5),
    "binary_cross_entropy_with_logits": lambda: (m(8), m(8) - 0.5),
    "cat": lambda: ([m(4), m(4)],), "stack": lambda: ([m(4), m(4)],),
    "index_copy": lambda: (m(4), 0, torch.tensor([1]), m(1)),
    "pad": lambda: (m(1, 2, 6), (1, 1)), "avg_pool3d": lambda: (m(1, 1, 4, 4, 4), 2),
    "max_pool3d": lambda: (m(1, 1, 4, 4, 4), 2),
}


def top_level_aten_ops(fn, args) -> list[str]:
    """The aten ops the profiler records as called by fn(*args) itself (not from inside other ops)."""
    with torch.autograd.profiler.profile() as prof:
        fn(*args)
    return [e.name.removeprefix("aten::") for e in prof.function_events
            if e.name.startswith("aten::") and e.cpu_parent is None]


@pytest.mark.parametrize("entry", sorted(cl.ENTRY_POINTS))
def test_entry_points_dispatch_to_their_op(entry):
    """Python functions (F.mse_loss) may call helpers first (broadcast_tensors); the op must be among the calls."""
    op = cl.ENTRY_POINTS[entry]
    assert op in top_level_aten_ops(cl.resolve(entry), SAMPLES[op]())
    assert cl.op_of(cl.resolve(entry)) == op


BINDING_SAMPLES = {   # the C++ bindings of ops whose Python wrappers take other arguments
    "einsum": lambda: ("ij,jk->ik", [m(4, 4), m(4, 4)]),
    "tensordot": lambda: (m(4, 4), m(4, 4), [1], [0]),
}


@pytest.mark.parametrize("op", sorted(set(SAMPLES) & set(cl._builtin_names())))
def test_every_binding_of_an_op_dispatches_to_it(op):
    """A C++ binding calls exactly one op: its own."""
    sample = BINDING_SAMPLES.get(op, SAMPLES[op])
    for where, binding in cl.bindings_of(op):
        assert top_level_aten_ops(binding, sample()) == [op], where


def test_the_bug_hunts_penalty_overflows_in_fp16_under_cpu_autocast_only():
    """debug_amp_bug_hunt says: hidden.pow(2).sum() stays fp16 (and overflows) under CPU autocast, while
    CUDA autocast runs pow and sum in float32."""
    hidden = torch.full((64, 256), 20.0)                  # 64 * 256 * 400 = 6.6e6 > fp16's 65504
    with torch_autocast("cpu", torch.float16):
        cpu = F.linear(hidden, torch.eye(256)).pow(2).sum()
    assert cpu.dtype == torch.float16 and torch.isinf(cpu)
    with fake_cuda() if not has_cuda() else contextlib.nullcontext():
        h = torch.full((64, 256), 20.0, device="cuda")
        with torch_autocast("cuda", torch.float16):
            cuda = F.linear(h, torch.eye(256, device="cuda")).pow(2).sum()
        assert cuda.dtype == torch.float32
