"""Predict the dtypes through nn.TransformerEncoderLayer under autocast, graded against torch.autocast.

    from ampteach.grading.checks import CONFIGS, POINTS, check_transformer_dtypes
    check_transformer_dtypes(predicted)      # predicted[config][point] = "float32" / "bfloat16" / "float16"

The layer (d_model 16, 2 heads, ReLU feed-forward, dropout 0, batch_first, post-norm: x = norm1(x +
attention(x)); x = norm2(x + ff(x))) runs under torch.autocast with hooks on its submodules. CPU
autocast uses bfloat16 and the CPU cast lists; CUDA uses float16 and the CUDA lists, on fake CUDA
tensors when no GPU is present (dtypes are real, values are not). Fake CUDA tensors cannot index
the packed q/k/v projection, so there its three slices run as three linear ops: the same op, so the
same autocast policy and dtypes.

The exercise is to predict, so an answer read off a run is refused: a notebook that entered
torch.autocast or ampteach.autocast before the check (seen at run time in a Jupyter kernel, where
importing the checks starts a watch on both), or whose cells use a name with "autocast" in it
(torch.autocast, observe_autocast, torch.set_autocast_enabled, ...) or this module's `measure`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.borrowed import caller_namespace, notebook_uses
from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.checks.common import passed as _passed

CONFIGS = {   # config -> (device, autocast dtype, dtype of the layer's input)
    "cpu, fp32 input": ("cpu", torch.bfloat16, torch.float32),
    "cpu, bf16 input": ("cpu", torch.bfloat16, torch.bfloat16),
    "cuda, fp32 input": ("cuda", torch.float16, torch.float32),
    "cuda, fp16 input": ("cuda", torch.float16, torch.float16),
}
POINTS = ("attention", "x + attention", "norm1", "linear1", "relu", "linear2", "output")
WHY = {   # the rule behind each point, shown when a prediction is wrong
    "attention": "attention ends in its out_proj linear; linear (and attention's matmuls) are on both devices' "
                 "lower-precision lists",
    "x + attention": "an add is on no list: ordinary type promotion of its two inputs (the layer's input and "
                     "the attention output)",
    "norm1": {"cpu": "layer_norm is on no CPU list: it runs in its input's dtype",
              "cuda": "layer_norm is on CUDA's fp32 list"},
    "linear1": "linear is on both devices' lower-precision lists, whatever its input",
    "relu": "relu is on no list: it keeps its input's dtype (linear1's output)",
    "linear2": "linear is on both devices' lower-precision lists",
    "output": {"cpu": "norm2(x + ff): the add promotes, and layer_norm keeps its input's dtype on CPU",
               "cuda": "norm2 is a layer_norm: CUDA's fp32 list"},
}
NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
         "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


BECAUSE = ("the exercise is to predict the dtypes from the cast lists and the layer's order of ops, not to read "
           "them off a run (run the layer under autocast after you pass, as the notebook's last section suggests)")
_RUNS: list[tuple[dict, str]] = []   # (the namespace of the notebook that entered an autocast region, which one)
_GRADING = [0]                        # > 0 while a check runs the layer itself


def _watched(enter, what: str):
    @functools.wraps(enter)
    def recording_enter(self, *args, **kwargs):
        if not _GRADING[0]:
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__") != "__main__":
                frame = frame.f_back
            if frame is not None and not any(ns is frame.f_globals and w == what for ns, w in _RUNS):
                _RUNS.append((frame.f_globals, what))
        return enter(self, *args, **kwargs)
    recording_enter.__wrapped_by_ampteach__ = enter
    return recording_enter


def _regions() -> list[tuple[type, str]]:
    from ampteach.amp.autocast import autocast as ampteach_autocast

    return [(torch.amp.autocast_mode.autocast, "torch.autocast"), (ampteach_autocast, "ampteach.autocast")]


def start_watch() -> None:
    """Record every autocast region a notebook enters from now on (torch's and ampteach's)."""
    for cls, what in _regions():
        if not hasattr(cls.__enter__, "__wrapped_by_ampteach__"):
            cls.__enter__ = _watched(cls.__enter__, what)


def stop_watch() -> None:
    for cls, _ in _regions():
        cls.__enter__ = getattr(cls.__enter__, "__wrapped_by_ampteach__", cls.__enter__)
    _RUNS.clear()


def _in_a_kernel() -> bool:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and type(shell).__name__ != "TerminalInteractiveShell"


if _in_a_kernel():   # a Jupyter kernel: the notebook imports the checks before the learner's cells run
    start_watch()


def _refuse_runs(namespace: dict) -> None:
    ran = [what for ns, what in _RUNS if ns is namespace]
    if ran:
        raise CheckFailed(f"your notebook ran code under {' and '.join(ran)} before this check: {BECAUSE}. "
                          f"Take that code out, restart the kernel and run the notebook in order")
    used = notebook_uses(namespace, lambda name: "autocast" in name.lower() or name == "transformer_dtypes")
    if used:
        cells = ", ".join(f"`{name}` in cell In[{number}]" for number, name in used)
        raise CheckFailed(f"your notebook used {cells}: {BECAUSE}. Take that code out, restart the kernel and run "
                          f"the notebook in order")


@contextlib.contextmanager
def _grading() -> Iterator[None]:
    _GRADING[0] += 1
    try:
        yield
    finally:
        _GRADING[0] -= 1


def _layer(norm_first: bool) -> nn.TransformerEncoderLayer:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=nn.ReLU(), batch_first=True,
                                      norm_first=norm_first)


@contextlib.contextmanager
def _unpacked_projection() -> Iterator[None]:
    original = F._in_projection_packed
    F._in_projection_packed = lambda q, k, v, w, b=None: F._in_projection(
        q, k, v, *w.chunk(3), *(b.chunk(3) if b is not None else (None,) * 3))
    try:
        yield
    finally:
        F._in_projection_packed = original


def measure(config: str, norm_first: bool = False) -> dict[str, torch.dtype]:
    """The dtype at every point of the layer when it runs under torch.autocast in this config."""
    from ampteach.lab.compare_torch import fake_cuda, torch_autocast

    device, dtype, input_dtype = CONFIGS[config]
    layer = _layer(norm_first)
    seen: dict[str, torch.dtype] = {}

    def hook(name, pick):
        def record(module, inputs, output) -> None:   # returns None: a forward hook's value would replace the output
            seen.setdefault(name, pick(inputs, output).dtype)
        return record

    layer.self_attn.register_forward_hook(hook("attention", lambda i, o: o[0]))
    layer.norm1.register_forward_hook(hook("x + attention", lambda i, o: i[0]))
    layer.norm1.register_forward_hook(hook("norm1", lambda i, o: o))
    layer.linear1.register_forward_hook(hook("linear1", lambda i, o: o))
    layer.activation.register_forward_hook(hook("relu", lambda i, o: o))
    layer.linear2.register_forward_hook(hook("linear2", lambda i, o: o))
    if device == "cuda" and not torch.cuda.is_available():
        shapes = {k: v.shape for k, v in layer.state_dict().items()}
        with fake_cuda(), _unpacked_projection():
            state = {k: torch.empty(s, device="cuda") for k, s in shapes.items()}
            x = torch.randn(2, 5, 16, device="cuda").to(input_dtype)
            with torch_autocast(device, dtype):
                out = torch.func.functional_call(layer, state, (x,))
    else:
        layer = layer.to(device)
        x = torch.randn(2, 5, 16, device=device).to(input_dtype)
        with torch_autocast(device, dtype):
            out = layer(x)
    seen["output"] = out.dtype
    return seen


def _dtype(value) -> torch.dtype | None:
    if isinstance(value, torch.dtype):
        return value
    return NAMES.get(str(value).removeprefix("torch.").strip().lower()) if isinstance(value, str) else None


def _read(predicted, keys: tuple[str, ...], what: str) -> dict:
    if not isinstance(predicted, dict):
        raise CheckFailed(f"expected a dict keyed by {what}, got {type(predicted).__name__}")
    missing = [k for k in keys if k not in predicted]
    if missing:
        raise CheckFailed(f"expected a prediction for every {what}; missing {missing}")
    return predicted


def check_transformer_dtypes(predicted: dict) -> None:
    """predicted[config][point]: the dtype you expect at each point of the post-norm layer, for each of
    CONFIGS; graded against torch.autocast, with the rule behind every wrong prediction."""
    _read(predicted, tuple(CONFIGS), "config")
    todo = sum(predicted[c].get(p) in (None, "?", ...) for c in CONFIGS for p in POINTS
               if isinstance(predicted[c], dict))
    if todo:
        raise NotImplementedError(f"{todo} predictions are still '?': fill in every cell of the table first")
    _refuse_runs(caller_namespace(2))
    wrong, total = [], 0
    for config in CONFIGS:
        row = _read(predicted[config], POINTS, f"point of {config!r}")
        device = CONFIGS[config][0]
        with _grading():
            measured = measure(config)
        for point, want in measured.items():
            got = _dtype(row[point])
            if got is None:
                raise CheckFailed(f"{config}, {point}: {row[point]!r} is not a dtype; "
                                  f"write 'float32', 'bfloat16' or 'float16'")
            total += 1
            if got != want:
                why = WHY[point] if isinstance(WHY[point], str) else WHY[point][device]
                wrong.append(f"{config}, {point}: torch.autocast gives {short(want)}, you said {short(got)} ({why})")
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {total} predictions wrong:\n  " + "\n  ".join(wrong))
    _passed("check_transformer_dtypes", f"all {total} dtypes through the layer as torch.autocast makes them, "
            "CPU bf16 and CUDA fp16 lists")


def check_pre_norm_output(predicted: dict) -> None:
    """predicted[config]: the dtype of the layer's OUTPUT when it is built with norm_first=True
    (x = x + attention(norm1(x)); x = x + ff(norm2(x))), for each of CONFIGS."""
    _read(predicted, tuple(CONFIGS), "config")
    if any(predicted[config] in (None, "?", ...) for config in CONFIGS):
        raise NotImplementedError("some pre-norm predictions are still '?': fill them in first")
    _refuse_runs(caller_namespace(2))
    wrong = []
    for config in CONFIGS:
        with _grading():
            want = measure(config, norm_first=True)["output"]
        got = _dtype(predicted[config])
        if got != want:
            wrong.append(f"{config}: you said {predicted[config]!r}")
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {len(CONFIGS)} pre-norm outputs wrong: " + "; ".join(wrong)
                          + " (what is the layer's last op when the norms come first?)")
    _passed("check_pre_norm_output", "the pre-norm layer's output dtype in all 4 configs")
