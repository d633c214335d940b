"""Autocast's cast lists as plain data: which aten ops torch 2.13 runs in half, in float32, or widest.

    policy_of("mm", "cuda")                  # 'lower_precision_fp'
    policy_of("softmax", "cuda")             # 'fp32_set_opt_dtype': softmax(x) -> softmax(x, dtype=float32)
    policy_of("softmax", "cpu")              # None: not autocast on CPU, runs in its input's dtype
    ops_with_policy("promote", "cpu")        # ('cat', 'index_copy', 'stack')
    registered("cpu")                        # every 'op.overload' torch registers at AutocastCPU
    op_of(torch.Tensor.__matmul__)           # 'matmul': which aten op a Python callable dispatches to

The policies, per eligible input x (floating point, on the region's device, not float64):

    lower_precision_fp   x -> x.to(autocast dtype)         matmuls, convolutions, attention
    fp32                 x -> x.float()                    exp, log, pow, norms, losses (range, accuracy)
    fp32_set_opt_dtype   op(x) -> op(x, dtype=float32)     softmax, sum, cumsum, prod (an fp32 result)
    fp32_append_dtype    norm(x) -> norm(x, dtype=float32) (norm's overloads without a dtype)
    promote              all inputs -> the widest of them  several inputs that must agree on one dtype
    banned               raise                             binary_cross_entropy on CUDA

Tables hold the ops exactly as torch 2.13 registers them with the dispatcher (`op.overload`;
tests/test_cast_lists.py compares them with `torch._C._dispatch_get_registrations_for_dispatch_key`),
and every policy was observed by running the op under torch.autocast (CUDA with fake CUDA tensors).
An op that is in no table has no kernel at the Autocast key: the dispatcher falls through to the
next key and the op runs in the dtypes it is given. A composite op (one implemented by calling
other ops, such as CUDA's cross_entropy_loss -> log_softmax + nll_loss) is therefore cast op by op
inside: each op it calls passes the Autocast key again. ampteach.autocast registers one kernel per
table entry and nothing else.

The tables describe torch 2.13; `table(device, version=...)` applies VERSION_DIFFERENCES for an older torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

POLICIES = ("lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")
DEVICE_TYPES = ("cuda", "cpu")
TORCH_VERSION = "2.13"   # the version the tables below describe

# AutocastCUDA in torch 2.13: 119 registrations from aten/src/ATen/autocast_mode.{h,cpp}, plus _cudnn_rnn.
CUDA: dict[str, tuple[str, ...]] = {
    "lower_precision_fp": (
        # convolutions
        "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc",
        "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
        "cudnn_convolution", "cudnn_convolution_transpose", "prelu",
        # matrix products
        "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
        "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
        # recurrent cells
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
        "rnn_relu_cell",
        # attention
        "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
        # cuDNN RNNs (aten/src/ATen/cudnn/AutocastRNN.cpp: casts and re-flattens the weights)
        "_cudnn_rnn",
    ),
    "fp32": (
        # pointwise functions whose result leaves fp16's range or loses its accuracy
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
        "softplus",
        # normalisations and norms (reductions inside)
        "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
        "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "renorm", "logsumexp",
        # losses
        "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
        "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
        "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        # distances
        "dist", "pdist", "cdist",
        # resampling
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
        "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
        "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    ),
    "fp32_set_opt_dtype": (
        "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
        "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
    ),
    "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"),
    "promote": (
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
        "tensordot", "scatter_add",
    ),
    "banned": ("binary_cross_entropy",),
}

# Registered only by CUDA builds of torch (a CPU-only build has the other 119 CUDA entries).
CUDA_BUILD_ONLY = ("_cudnn_rnn",)

# AutocastCPU in torch 2.13: 127 registrations. float16 uses the same lists as bfloat16.
CPU: dict[str, tuple[str, ...]] = {
    "lower_precision_fp": (
        "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding",
        "_convolution.deprecated", "conv_tbc", "conv_transpose1d", "conv_transpose2d.input",
        "conv_transpose3d.input", "prelu",
        "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "_addmm_activation", "addbmm", "linear",
        "matmul",
        "mkldnn_rnn_layer", "scaled_dot_product_attention", "_native_multi_head_attention",
    ),
    "fp32": (
        # pooling and padding in 3-D (and reflection/replication padding)
        "avg_pool3d", "max_pool3d", "adaptive_avg_pool3d", "adaptive_max_pool3d",
        "fractional_max_pool2d", "fractional_max_pool3d", "max_unpool2d", "max_unpool3d",
        "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
        "replication_pad3d",
        # sampling, reductions, statistics, signal processing
        "grid_sampler", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d", "polar",
        "prod", "prod.dim_int", "quantile", "quantile.scalar", "nanquantile", "nanquantile.scalar",
        "stft", "stft.center", "cdist", "trace", "view_as_complex",
        "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft",
        "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft",
        # losses (binary_cross_entropy included: it is not banned on CPU)
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "cosine_embedding_loss",
        "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss", "smooth_l1_loss",
        "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss",
        "triplet_margin_loss", "multi_margin_loss", "ctc_loss.IntList", "ctc_loss.Tensor", "kl_div",
        "multilabel_margin_loss", "multilabel_margin_loss_forward",
        # linear algebra
        "cholesky", "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr",
        "pinverse", "geqrf", "_lu_with_info", "qr", "svd", "triangular_solve",
        "linalg_cond", "linalg_cond.p_str", "linalg_matrix_rank", "linalg_matrix_rank.tol_tensor",
        "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.atol_rtol_float", "linalg_solve",
        "linalg_cholesky", "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
        "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve", "linalg_qr",
        "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex",
        # quantisation
        "fake_quantize_per_tensor_affine",
    ),
    "fp32_set_opt_dtype": (),
    "fp32_append_dtype": (),
    "promote": ("cat", "stack", "index_copy"),
    "banned": (),
}

TABLES = {"cuda": CUDA, "cpu": CPU}


@dataclass(frozen=True)
class VersionDifference:
    """An op whose policy is different in another torch version than in TORCH_VERSION."""

    device_type: str
    op: str
    policy: str | None           # the policy in the versions named by `versions`
    versions: str                # e.g. "<2.12"
    source: str


# What changed between torch 2.11 and this table's 2.13. Named-tensor overloads
# (softmax.Dimname, sum.dim_DimnameList, prod.dim_Dimname, cumsum.dimname, cumprod.dimname,
# log_softmax.Dimname, norm.names_ScalarOpt_dim, CPU index_copy.dimname) are still registered in 2.11
# with the same policies as their ops; 2.13 no longer has those overloads at all.
VERSION_DIFFERENCES: tuple[VersionDifference, ...] = (
    VersionDifference("cuda", "rms_norm", None, "<2.12",
                      "added to the CUDA fp32 list in 2.12 (pytorch/pytorch#174824, fixing #167308; "
                      "discussed in #188955): in 2.11 rms_norm runs in its input's dtype"),
)
NAMED_TENSOR_OVERLOAD = ("Dimname", "dimname", "DimnameList", "names_")


def base_name(op: str) -> str:
    """'softmax.int' -> 'softmax'; 'aten::mm' -> 'mm'."""
    return op.removeprefix("aten::").split(".")[0]


def _check_device(device_type: str) -> str:
    if device_type not in TABLES:
        raise ValueError(f"cast lists exist for device_type 'cuda' and 'cpu', got {device_type!r} "
                         "(other devices have their own lists in torch; use torch.autocast there)")
    return device_type


def _older(version: str, bound: str) -> bool:
    """Does `version` satisfy '<X.Y'?"""
    major_minor = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    limit = tuple(int(p) for p in bound.removeprefix("<").split("."))
    return major_minor < limit


def registered(device_type: str) -> frozenset[str]:
    """The table's entries as the dispatcher names them ('conv2d', 'softmax.int', ...): torch 2.13."""
    return frozenset(op for ops in TABLES[_check_device(device_type)].values() for op in ops)


def table(device_type: str, version: str | None = None) -> dict[str, tuple[str, ...]]:
    """policy -> sorted base op names for device_type, in torch `version` (default: the installed one)."""
    version = version or torch.__version__
    lists = TABLES[_check_device(device_type)]
    result = {policy: sorted({base_name(op) for op in ops}) for policy, ops in lists.items()}
    for diff in VERSION_DIFFERENCES:
        if diff.device_type == device_type and _older(version, diff.versions):
            for ops in result.values():
                if diff.op in ops:
                    ops.remove(diff.op)
            if diff.policy is not None:
                result[diff.policy] = sorted(result[diff.policy] + [diff.op])
    return {policy: tuple(ops) for policy, ops in result.items()}


def _by_op(device_type: str, version: str) -> dict[str, str]:
    return {op: policy for policy, ops in table(device_type, version).items() for op in ops}


_POLICY_CACHE: dict[tuple[str, str], dict[str, str]] = {}


def policies(device_type: str, version: str | None = None) -> dict[str, str]:
    """op base name -> policy for every listed op (not composites), for one device and version."""
    key = (device_type, version or torch.__version__)
    if key not in _POLICY_CACHE:
        _POLICY_CACHE[key] = _by_op(device_type, key[1])
    return _POLICY_CACHE[key]


def policy_of(op: str, device_type: str, version: str | None = None) -> str | None:
    """The autocast policy of aten op `op` ('mm', 'softmax.int', 'aten::exp') on device_type, or None.

    None means no kernel at the Autocast key: the op runs in its inputs' dtypes (a composite op's
    inner ops are still cast one by one when they are listed).
    """
    return policies(device_type, version).get(base_name(op))


def ops_with_policy(policy: str, device_type: str, version: str | None = None) -> tuple[str, ...]:
    """Sorted base names of the ops listed under `policy` on device_type."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return table(device_type, version)[policy]


def differences(version: str | None = None) -> dict[str, tuple[str | None, str | None]]:
    """op -> (CPU policy, CUDA policy) for every listed op whose two policies differ."""
    cpu, cuda = policies("cpu", version), policies("cuda", version)
    both = {op: (cpu.get(op), cuda.get(op)) for op in set(cpu) | set(cuda)}
    return {op: pair for op, pair in sorted(both.items()) if pair[0] != pair[1]}


# ---------------------------------------------------------------------------------------------------
# Python callables -> aten ops
#
# A Python-level autocast (a torch function mode, lesson 4's first model) sees Python calls, not aten
# ops; ampteach.autocast itself works on aten ops and needs none of this. A C++ binding named like an
# aten op dispatches to it:
# torch.mm, Tensor.mm -> aten::mm; F.linear is torch._C._nn.linear -> aten::linear;
# torch.linalg.vector_norm is torch._C._linalg.linalg_vector_norm; torch.fft.fft is
# torch._C._fft.fft_fft. BINDINGS lists where those bindings live; op_of() looks a callable up.
# ENTRY_POINTS spells out the mapping for what learners call, including Python-level functions
# (F.cross_entropy runs Python that calls torch._C._nn.cross_entropy_loss); tests/test_cast_lists.py
# checks with the profiler that each one really reaches its op.

BINDINGS: tuple[tuple[str, Any], ...] = (
    ("torch", torch._C._VariableFunctions),
    ("torch.Tensor", torch._C.TensorBase),
    ("torch._C._nn", torch._C._nn),
    ("torch._C._linalg", torch._C._linalg),
    ("torch._C._fft", torch._C._fft),
    ("torch._C._special", torch._C._special),
)

ENTRY_POINTS: dict[str, str] = {
    # matmuls: `a @ b` reaches __torch_function__ as Tensor.matmul
    "torch.mm": "mm", "torch.Tensor.mm": "mm", "torch.matmul": "matmul", "torch.Tensor.matmul": "matmul",
    "torch.Tensor.__matmul__": "matmul", "torch.bmm": "bmm", "torch.baddbmm": "baddbmm",
    "torch.addmm": "addmm", "torch.nn.functional.linear": "linear", "torch.einsum": "einsum",
    "torch.linalg.vecdot": "linalg_vecdot", "torch.tensordot": "tensordot",
    # convolutions and attention
    "torch.nn.functional.conv1d": "conv1d", "torch.nn.functional.conv2d": "conv2d",
    "torch.nn.functional.conv3d": "conv3d", "torch.nn.functional.conv_transpose2d": "conv_transpose2d",
    "torch.nn.functional.prelu": "prelu",
    "torch.nn.functional.scaled_dot_product_attention": "scaled_dot_product_attention",
    # pointwise
    "torch.exp": "exp", "torch.Tensor.exp": "exp", "torch.log": "log", "torch.Tensor.log": "log",
    "torch.pow": "pow", "torch.Tensor.__pow__": "pow", "torch.Tensor.__rpow__": "pow",
    "torch.rsqrt": "rsqrt", "torch.nn.functional.softplus": "softplus", "torch.atan2": "atan2",
    "torch.addcmul": "addcmul",
    # softmaxes, norms, reductions
    "torch.softmax": "softmax", "torch.Tensor.softmax": "softmax", "torch.nn.functional.softmax": "softmax",
    "torch.nn.functional.log_softmax": "log_softmax", "torch.sum": "sum", "torch.Tensor.sum": "sum",
    "torch.cumsum": "cumsum", "torch.prod": "prod", "torch.logsumexp": "logsumexp",
    "torch.nn.functional.layer_norm": "layer_norm", "torch.nn.functional.group_norm": "group_norm",
    "torch.nn.functional.rms_norm": "rms_norm", "torch.norm": "linalg_vector_norm",
    "torch.Tensor.norm": "linalg_vector_norm", "torch.linalg.vector_norm": "linalg_vector_norm",
    # losses
    "torch.nn.functional.cross_entropy": "cross_entropy_loss", "torch.nn.functional.nll_loss": "nll_loss_nd",
    "torch.nn.functional.mse_loss": "mse_loss", "torch.nn.functional.l1_loss": "l1_loss",
    "torch.nn.functional.binary_cross_entropy": "binary_cross_entropy",
    "torch.nn.functional.binary_cross_entropy_with_logits": "binary_cross_entropy_with_logits",
    "torch.nn.functional.kl_div": "kl_div",
    # promote, padding, pooling
    "torch.cat": "cat", "torch.stack": "stack", "torch.index_copy": "index_copy",
    "torch.nn.functional.pad": "pad", "torch.nn.functional.avg_pool3d": "avg_pool3d",
    "torch.nn.functional.max_pool3d": "max_pool3d",
}


def resolve(dotted: str) -> Callable:
    """'torch.nn.functional.linear' -> the object."""
    parts = dotted.split(".")
    obj: Any = __import__(parts[0])
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def _builtin_names() -> set[str]:
    return {base_name(op) for device in TABLES for ops in TABLES[device].values() for op in ops}


def bindings_of(op: str) -> list[tuple[str, Callable]]:
    """The C++ bindings that dispatch to aten op `op`: [('torch.mm', torch.mm), ('torch.Tensor.mm', ...)]."""
    name = base_name(op)
    return [(f"{where}.{name}", getattr(namespace, name)) for where, namespace in BINDINGS if hasattr(namespace, name)]


def _build_builtin_ops() -> dict[Any, str]:
    ops: dict[Any, str] = {}
    for name in sorted(_builtin_names()):
        for _, binding in bindings_of(name):
            ops[binding] = name
    return ops


BUILTIN_OPS: dict[Any, str] = _build_builtin_ops()   # C++ binding -> aten op (what autocast looks up)


def op_of(func: Callable) -> str | None:
    """The aten op a callable dispatches to, for listed ops; None for anything else (F.relu: on no list)."""
    op = BUILTIN_OPS.get(func)
    if op is not None:
        return op
    for dotted, name in ENTRY_POINTS.items():
        if resolve(dotted) is func:
            return name
    return None


def describe(op: str, device_type: str) -> str:
    """One line on what autocast does with `op` on device_type, for tables and error messages."""
    name = base_name(op)
    listed = policies(device_type).get(name)
    if listed is not None:
        return f"{name}: {listed}"
    return f"{name}: no autocast kernel (runs in its inputs' dtype; ops it calls inside are cast if listed)"


# fp32_append_dtype: torch's kernel for an overload without a dtype argument calls the overload with one.
APPEND_DTYPE_TARGETS = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}


def all_ops(devices: Iterable[str] = DEVICE_TYPES) -> tuple[str, ...]:
    """Every listed base op name on any of `devices`, sorted."""
    return tuple(sorted({op for d in devices for op in policies(d)}))
