"""fp8 training without a scale, and the two recipe elements that each fix it.

    from ampteach.lab.fp8_ablation import CASES, fp8_model
    model = fp8_model("e4m3 everywhere, no scale")     # each Linear's x, W and g cast to e4m3 as they are
    history = train(model, data, TrainConfig(precision="fp32", epochs=3))   # fp32: the model is converted

The three tensors of a Linear's matmuls sit in very different places (lesson 8, section 1): the course
MLP's gradients lie mostly below e4m3's smallest subnormal, 2^-9. Four ways to cast them, two elements:
    "e4m3 everywhere, no scale"          x, W, g -> e4m3 at scale 1: most gradients flush to 0
    "e4m3 everywhere, scale per tensor"  each tensor scaled by max / amax first (current scaling), g in e4m3 too
    "HYBRID, no scale"                   g in e5m2, whose range reaches 2^-16; no scale
    "HYBRID, scale per tensor"           both elements: torchao's tensorwise recipe, bit for bit
Each is a Float8Linear (ampteach.amp.fp8) with a recipe object of its own: cast(role, x) returns the fp8
values of x, dequantized to float32, as every recipe there does.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ampteach.amp.fp8 import (
    HYBRID,
    Float8Linear,
    cast_to_fp8,
    convert_to_float8_training,
    dequantize,
    quantize_tensorwise,
)
from ampteach.training.models import mlp

__all__ = ["CASES", "CastRecipe", "fp8_model"]

E4M3 = dict.fromkeys(HYBRID, "fp8_e4m3")
CASES = {   # name -> (fp8 format per role, scaled)
    "e4m3 everywhere, no scale": (E4M3, False),
    "e4m3 everywhere, scale per tensor": (E4M3, True),
    "HYBRID, no scale": (HYBRID, False),
    "HYBRID, scale per tensor": (HYBRID, True),
}


class CastRecipe:
    """Cast each role's tensor to its fp8 format, at scale 1 or with a current per-tensor scale (torchao's)."""

    def __init__(self, formats: dict[str, str], scaled: bool):
        if set(formats) != set(HYBRID):
            raise ValueError(f"formats maps the roles {list(HYBRID)} to 'fp8_e4m3' or 'fp8_e5m2', got {formats!r}")
        self.formats, self.scaled = dict(formats), scaled

    def cast(self, role: str, x: Tensor, record: bool = True) -> Tensor:
        fmt = self.formats[role]
        if self.scaled:
            return dequantize(*quantize_tensorwise(x, fmt))
        one = torch.ones((), device=x.device)
        return dequantize(cast_to_fp8(x, one, fmt), one)


def fp8_model(case: str, hidden: tuple[int, ...] = (256,)) -> nn.Module:
    """The course MLP (seeded by the caller) with every Linear's matmuls cast the CASES[case] way."""
    if case not in CASES:
        raise ValueError(f"case must be one of {list(CASES)}, got {case!r}")
    model = convert_to_float8_training(mlp(hidden), recipe="tensorwise")
    for module in model.modules():
        if isinstance(module, Float8Linear):
            module.recipe = CastRecipe(*CASES[case])
            module.recipe_name = case
    return model
