"""Predict the dtypes through nn.TransformerEncoderLayer under autocast, graded against torch.autocast.

    from ampteach.grading.checks import CONFIGS, POINTS, check_transformer_dtypes
    check_transformer_dtypes(predicted)      # predicted[config][point] = "float32" / "bfloat16" / "float16"

The layer (d_model 16, 2 heads, ReLU feed-forward, dropout 0, batch_first, post-norm: x = norm1(x +
attention(x)); x = norm2(x + ff(x))) runs under torch.autocast in the judge's process, never in the
learner's: CPU autocast uses bfloat16 and the CPU cast lists; CUDA uses float16 and the CUDA lists, on
fake CUDA tensors when no GPU is present. The exercise is to predict, so an answer read off a run is
refused: a notebook whose cells use a name with "autocast" in it, and, under grading, any autocast
region or switch the notebook's own code enters.
"""

from __future__ import annotations

import torch

from ampteach.grading.checks.visible import run_judge
from ampteach.grading.checks.watches import Borrowed, module_files

__all__ = ["BECAUSE", "CONFIGS", "POINTS", "check_transformer_dtypes", "check_pre_norm_output", "sealed"]

CONFIGS = {   # config -> (device, autocast dtype, dtype of the layer's input)
    "cpu, fp32 input": ("cpu", torch.bfloat16, torch.float32),
    "cpu, bf16 input": ("cpu", torch.bfloat16, torch.bfloat16),
    "cuda, fp32 input": ("cuda", torch.float16, torch.float32),
    "cuda, fp16 input": ("cuda", torch.float16, torch.float16),
}
POINTS = ("attention", "x + attention", "norm1", "linear1", "relu", "linear2", "output")
BECAUSE = ("the exercise is to predict the dtypes from the cast lists and the layer's order of ops, not to read "
           "them off a run (run the layer under autocast after you pass, as the notebook's last section suggests)")
AUTOCAST_FILES = ("torch.amp.autocast_mode", "torch.cuda.amp.autocast_mode", "torch.cpu.amp.autocast_mode",
                  "ampteach.amp.autocast", "ampteach.lab.compare_torch", "ampteach.lab.block_dtypes",
                  "ampteach.lab.dtype_flow")


def _switches_autocast(fn) -> bool:
    name = getattr(fn, "__name__", "")
    return "autocast" in name and name.lstrip("_").startswith(("set_", "enter", "autocast_increment"))


def sealed() -> Borrowed:
    """Under grading, for the whole notebook: no autocast region, switch or dtype-flow tool of the course."""
    return Borrowed("notebook", module_files(*AUTOCAST_FILES), BECAUSE, builtins=_switches_autocast)


def check_transformer_dtypes(predicted) -> None:
    """predicted[config][point]: the dtype you expect at each point of the post-norm layer, for each of
    CONFIGS; graded against torch.autocast, with the rule behind every wrong prediction."""
    run_judge("check_transformer_dtypes", predicted)


def check_pre_norm_output(predicted) -> None:
    """predicted[config]: the dtype of the layer's OUTPUT when it is built with norm_first=True
    (x = x + attention(norm1(x)); x = x + ff(norm2(x))), for each of CONFIGS."""
    run_judge("check_pre_norm_output", predicted)
