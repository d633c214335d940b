"""Judge of predict_transformer_dtypes: the learner's predicted dtypes against torch.autocast, run here.

    @judge("check_transformer_dtypes")   # every point of the post-norm layer in the four configs
    @judge("check_pre_norm_output")      # the pre-norm layer's output dtype in the four configs

`measure` runs the layer under torch.autocast with hooks on its submodules, in this process only. Fake
CUDA tensors cannot index the packed q/k/v projection, so there its three slices run as three linear
ops: the same op, so the same autocast policy and dtypes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.grading.checks.common import CheckFailed, short
from ampteach.grading.checks.transformer_dtypes import BECAUSE, CONFIGS, POINTS
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, NotDone, Ref, describe
from ampteach.grading.judges.scan import refuse_uses

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



def _refuse_runs(learner: Learner) -> None:
    refuse_uses(learner, lambda name: "autocast" in name.lower() or name == "transformer_dtypes", BECAUSE)


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
        raise CheckFailed(f"expected a dict keyed by {what}, got {describe(predicted)}")
    missing = [k for k in keys if k not in predicted]
    if missing:
        raise CheckFailed(f"expected a prediction for every {what}; missing {missing}")
    return predicted


@judge("check_transformer_dtypes")
def check_transformer_dtypes(learner: Learner, predicted_ref: Ref) -> str:
    predicted = learner.value(predicted_ref)
    _read(predicted, tuple(CONFIGS), "config")
    todo = sum(predicted[c].get(p) in (None, "?", ...) for c in CONFIGS for p in POINTS
               if isinstance(predicted[c], dict))
    if todo:
        raise NotDone(f"{todo} predictions are still '?': fill in every cell of the table first")
    _refuse_runs(learner)
    wrong, total = [], 0
    for config in CONFIGS:
        row = _read(predicted[config], POINTS, f"point of {config!r}")
        device = CONFIGS[config][0]
        for point, want in measure(config).items():
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
    return f"all {total} dtypes through the layer as torch.autocast makes them, CPU bf16 and CUDA fp16 lists"


@judge("check_pre_norm_output")
def check_pre_norm_output(learner: Learner, predicted_ref: Ref) -> str:
    predicted = learner.value(predicted_ref)
    _read(predicted, tuple(CONFIGS), "config")
    if any(predicted[config] in (None, "?", ...) for config in CONFIGS):
        raise NotDone("some pre-norm predictions are still '?': fill them in first")
    _refuse_runs(learner)
    wrong = []
    for config in CONFIGS:
        want = measure(config, norm_first=True)["output"]
        got = _dtype(predicted[config])
        if got != want:
            wrong.append(f"{config}: you said {predicted[config]!r}")
    if wrong:
        raise CheckFailed(f"{len(wrong)} of {len(CONFIGS)} pre-norm outputs wrong: " + "; ".join(wrong)
                          + " (what is the layer's last op when the norms come first?)")
    return "the pre-norm layer's output dtype in all 4 configs"
