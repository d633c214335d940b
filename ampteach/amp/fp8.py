"""FP8 training from scratch, emulated on the CPU: the scaling recipes of torchao and Transformer Engine, bit for bit.

    from ampteach.amp.fp8 import quantize_tensorwise, DelayedScaling, mx_quantize, convert_to_float8_training
    q, scale = quantize_tensorwise(x, "fp8_e4m3")       # torchao's "tensorwise": q is torch.float8_e4m3fn
    x_back = q.float() / scale                            # dequantize divides
    delayed = DelayedScaling("fp8_e4m3")                  # Transformer Engine's recipe: a scale from past amaxes
    q, scale_used = delayed.quantize(x)                   # casts with the current scale, then records amax(x)
    model = convert_to_float8_training(mlp(), recipe="tensorwise")   # every nn.Linear -> Float8Linear

An fp8 number is x * scale rounded to e4m3 (max 448) or e5m2 (max 57344), nearest even, clamped to
+-max; the scale moves the tensor's largest magnitude (amax) to the top of the format:

    tensorwise ("current" scaling, torchao): scale = float32(max / max(float64(amax(x)), 1e-12))
    delayed (Transformer Engine):            scale = float32(max * 2^-margin) / max(last history_len amaxes)
    mx (OCP Microscaling, ampteach.amp.mx):      one power-of-two scale per block of 32 values
    nvfp4, mxfp4 (4 bits, ampteach.amp.fp4):     the same layers, with NVIDIA's NVFP4 training recipe as switches

Float8Linear runs a Linear's three matmuls on fp8 values (dequantized to float32 and multiplied with
float32 accumulation, which is what torchao's emulate=True does on a CPU): input and weight in e4m3 in
the forward, grad_output in e5m2 in the backward (Transformer Engine's HYBRID format).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ampteach.amp.formats import ELEMENT_FORMATS, FORMATS
from ampteach.amp.fp4 import FP4_FORMATS, FP4Recipe
from ampteach.amp.mx import MXTensor, check_options, mx_dequantize, mx_fake_quantize, mx_quantize

__all__ = ["FP8_DTYPES", "RECIPES", "HYBRID", "quantize_tensorwise", "dequantize", "cast_to_fp8", "fp8_dtype",
           "fp8_max", "DelayedScaling", "mx_quantize", "mx_dequantize", "mx_fake_quantize", "MXTensor",
           "Float8Linear", "convert_to_float8_training", "ELEMENT_FORMATS"]

FP8_DTYPES = {name: FORMATS[name].torch_dtype for name in ("fp8_e4m3", "fp8_e5m2")}   # from the one registry
EPS = 1e-12                     # torchao's floor on amax: an all-zero tensor gets scale max / 1e-12
RECIPES = ("tensorwise", "delayed", "mx", "nvfp4", "mxfp4")   # the last two: ampteach.amp.fp4
ALGOS = ("max", "most_recent")
HYBRID = {"input": "fp8_e4m3", "weight": "fp8_e4m3", "grad_output": "fp8_e5m2"}   # Transformer Engine's HYBRID


def fp8_dtype(fmt: str) -> torch.dtype:
    """fp8_dtype("fp8_e4m3") is torch.float8_e4m3fn: the torch dtype of an fp8 format in FORMATS."""
    if fmt not in FP8_DTYPES:
        raise ValueError(f"fmt must be 'fp8_e4m3' (torch.float8_e4m3fn) or 'fp8_e5m2' (torch.float8_e5m2), "
                         f"got {fmt!r}")
    return FP8_DTYPES[fmt]


def fp8_max(fmt: str) -> float:
    """fp8_max("fp8_e4m3") == 448.0 (57344.0 for "fp8_e5m2"): FORMATS[fmt].max, the same as torch.finfo's."""
    fp8_dtype(fmt)
    return FORMATS[fmt].max


def cast_to_fp8(x: Tensor, scale: Tensor, fmt: str) -> Tensor:
    """q = cast_to_fp8(x, scale, "fp8_e4m3"): the cast every per-tensor recipe shares, saturating.

    q = fp8(clamp(float32(x) * scale, -max, max))
    """
    limit = fp8_max(fmt)
    return (x.float() * scale).clamp(-limit, limit).to(fp8_dtype(fmt))


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """x_back = dequantize(q, scale): the float32 values an fp8 tensor and its scale stand for, q.float() / scale."""
    return q.float() / scale


def quantize_tensorwise(x: Tensor, fmt: str = "fp8_e4m3") -> tuple[Tensor, Tensor]:
    """q, scale = quantize_tensorwise(x, "fp8_e4m3"): torchao's tensorwise recipe; x ~ q.float() / scale.

    scale = float32(max_fmt / clamp(float64(amax(|x|)), min=1e-12));  q = clamp(x * scale, +-max_fmt) in fmt
    """
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.numel() == 0:
        got = f"a {x.dtype} tensor with {x.numel()} values" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"quantize_tensorwise takes a non-empty floating-point tensor, got {got}")
    amax = x.abs().max().to(torch.float64)                     # in x's dtype, then float64 (as torchao)
    scale = (fp8_max(fmt) / amax.clamp(min=EPS)).to(torch.float32)
    return cast_to_fp8(x, scale, fmt), scale


class DelayedScaling:
    """Transformer Engine's delayed scaling for one tensor: the scale comes from amaxes already seen.

        ds = DelayedScaling("fp8_e5m2", history_len=16)
        q, scale_used = ds.quantize(grad)      # cast with ds.scale, then ds.update(amax(grad))
        scale = ds.update(amax)                # or record an amax yourself: returns the next scale

    window = the last history_len amaxes, this one included; a = max(window) (NaN ignored, as fmaxf
    does) or the newest ("most_recent"); scale <- float32(float32(max * 2^-margin) / a) when a is
    finite and > 0, else the previous scale (1 at the start); a scale that overflows becomes FLT_MAX.

    Args:
        fmt (str, default "fp8_e4m3"): the fp8 format cast to, "fp8_e4m3" or "fp8_e5m2" (FORMATS).
        history_len (int, default 1024): amaxes kept (Transformer Engine's amax_history_len).
        algo (str, default "max"): "max" of the window, or "most_recent" amax (amax_compute_algo).
        margin (int, default 0): the scaled amax lands at max * 2^-margin, leaving headroom.
    """

    def __init__(self, fmt: str = "fp8_e4m3", history_len: int = 1024, algo: str = "max", margin: int = 0):
        fp8_dtype(fmt)
        if algo not in ALGOS:
            raise ValueError(f"algo must be 'max' (largest amax in the window) or 'most_recent', got {algo!r}")
        if not (isinstance(history_len, int) and history_len >= 1):
            raise ValueError(f"history_len must be a positive int (Transformer Engine's default is 1024), "
                             f"got {history_len!r}")
        self.fmt, self.history_len, self.algo, self.margin = fmt, history_len, algo, margin
        self.amax_history = torch.zeros(history_len)   # oldest first, newest last; zeros before any step
        self.scale = torch.tensor(1.0)                 # both updated in place (a module may hold them as buffers)

    @property
    def scaled_max(self) -> Tensor:
        """float32(max * 2^-margin): where the window's amax lands after scaling."""
        return torch.tensor(fp8_max(self.fmt)) * torch.exp2(torch.tensor(-float(self.margin)))

    def update(self, amax: Tensor | float) -> Tensor:
        """Record amax (float32) and return the scale for the next cast (also kept in self.scale)."""
        history = self.amax_history
        amax = torch.as_tensor(amax, dtype=torch.float32, device=history.device).reshape(1)
        history.copy_(torch.cat([history[1:], amax]))
        a = torch.where(history.isnan(), 0.0, history).max() if self.algo == "max" else amax[0]
        if torch.isfinite(a) and a > 0:
            scale = self.scaled_max.to(a.device) / a
            self.scale.copy_(torch.where(torch.isinf(scale), torch.finfo(torch.float32).max, scale))
        return self.scale.clone()

    def quantize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """q, scale_used: x cast with the current scale; then amax(x) joins the history for the next one."""
        scale = self.scale.clone()
        q = cast_to_fp8(x, scale, self.fmt)
        self.update(x.detach().abs().max().float())
        return q, scale

    def state_dict(self) -> dict:
        return {"amax_history": self.amax_history.clone(), "scale": self.scale.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state["amax_history"].shape != self.amax_history.shape:
            raise ValueError(f"this DelayedScaling keeps {self.history_len} amaxes, the state has "
                             f"{state['amax_history'].numel()}: build it with the same history_len")
        self.amax_history.copy_(state["amax_history"])
        self.scale.copy_(state["scale"])

    def __repr__(self) -> str:
        return (f"DelayedScaling({self.fmt!r}, history_len={self.history_len}, algo={self.algo!r}, "
                f"margin={self.margin}, scale={self.scale.item():.6g})")


# --- recipes: how one tensor of a matmul becomes fp8 (returned dequantized, in float32) ---------------

class _Tensorwise:
    """A fresh scale from each tensor's own amax (torchao's tensorwise, Transformer Engine's current scaling)."""

    def cast(self, role: str, x: Tensor, record: bool = True) -> Tensor:
        return dequantize(*quantize_tensorwise(x, HYBRID[role]))


class _Delayed:
    """One DelayedScaling per role; record=False (evaluation) casts without adding to the histories."""

    def __init__(self, **kwargs):
        self.scalings = {role: DelayedScaling(fmt, **kwargs) for role, fmt in HYBRID.items()}

    def cast(self, role: str, x: Tensor, record: bool = True) -> Tensor:
        scaling = self.scalings[role]
        if record:
            q, scale = scaling.quantize(x)
        else:
            q, scale = cast_to_fp8(x, scaling.scale, scaling.fmt), scaling.scale
        return dequantize(q, scale)


class _MX:
    """Blocks of 32 along the last dimension, which Float8Linear makes the dimension each matmul sums over.
    elements: an element format per role (default HYBRID's); e.g. {"input": "fp4_e2m1", ...} for MXFP4."""

    blockwise = True   # cast each operand along the dimension its matmul sums over, from the float32 values

    def __init__(self, scale_rounding: str = "rceil", block_size: int = 32, elements: dict[str, str] | None = None):
        self.scale_rounding, self.block_size = scale_rounding, block_size
        self.elements = {**HYBRID, **(elements or {})}
        check_options(block_size, scale_rounding)
        unknown = set(self.elements.values()) - set(ELEMENT_FORMATS)
        if unknown or set(self.elements) != set(HYBRID):
            raise ValueError(f"elements maps the roles {list(HYBRID)} to MX element formats "
                             f"{list(ELEMENT_FORMATS)}, got {elements!r}")

    def cast(self, role: str, x: Tensor, record: bool = True) -> Tensor:
        return mx_fake_quantize(x.contiguous(), self.elements[role], self.block_size, self.scale_rounding)

    def wgrad_operands(self, g_t: Tensor, x_t: Tensor, record: bool = True) -> tuple[Tensor, Tensor]:
        """The weight gradient's operands g.T and x.T, cast along the token dimension."""
        return self.cast("grad_output", g_t, record), self.cast("input", x_t, record)


def _make_recipe(recipe: str, **kwargs):
    if recipe == "tensorwise":
        if kwargs:
            raise TypeError(f"recipe 'tensorwise' takes no options, got {sorted(kwargs)}")
        return _Tensorwise()
    if recipe == "delayed":
        return _Delayed(**kwargs)
    if recipe == "mx":
        return _MX(**kwargs)
    if recipe in FP4_FORMATS:
        return FP4Recipe(recipe, **kwargs)
    raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")


class _Float8Matmul(torch.autograd.Function):
    """x @ weight.T with its three matmuls on fp8 values; float32 accumulation.

    forward      out         = fp8(x)           @ fp8(weight).T          (e4m3, e4m3)
    backward     grad_input  = fp8(grad_out)    @ fp8(weight)            (e5m2, e4m3)
                 grad_weight = fp8(grad_out).T  @ fp8(x)                 (e5m2, e4m3)

    Per-tensor recipes reuse the forward's fp8 x and weight in the backward. Blockwise recipes (MX, NVFP4,
    MXFP4) scale blocks along the dimension a matmul sums over, so they cast x, weight and grad_output again
    along the other dimension (from the float32 values, as Transformer Engine does), and a tensor's two casts
    can differ; recipe.wgrad_operands(g.T, x.T) casts the weight gradient's pair (FP4 may rotate it first).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, recipe, record: bool) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        x8, w8 = recipe.cast("input", x2, record), recipe.cast("weight", weight, record)
        ctx.recipe, ctx.record, ctx.x_shape = recipe, record, x.shape
        ctx.save_for_backward(*((x2, weight) if getattr(recipe, "blockwise", False) else (x8, w8)))
        with torch.autocast(x.device.type, enabled=False):     # float32 accumulation, even inside autocast
            out = torch.mm(x8, w8.t())
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        recipe, record = ctx.recipe, ctx.record
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        a, b = ctx.saved_tensors
        if getattr(recipe, "blockwise", False):   # a, b = float32 x and weight: block along the summed dim
            g8 = recipe.cast("grad_output", g2, record)
            grad_input = torch.mm(g8, recipe.cast("weight", b.t(), record).t())
            g8_t, x8_t = recipe.wgrad_operands(g2.t(), a.t(), record)
            grad_weight = torch.mm(g8_t, x8_t.t())
        else:                            # a, b = the forward's fp8 x and weight
            g8 = recipe.cast("grad_output", g2, record)
            grad_input = torch.mm(g8, b)
            grad_weight = torch.mm(g8.t(), a)
        return grad_input.reshape(ctx.x_shape), grad_weight, None, None


class Float8Linear(nn.Linear):
    """nn.Linear with emulated fp8 matmuls: convert_to_float8_training(model) swaps these in (torchao's names).

        layer = Float8Linear.from_float(nn.Linear(784, 256), recipe="delayed", history_len=16)

    out = fp8(x) @ fp8(weight).T + bias, float32 accumulation; the bias is added in float32. Delayed
    scaling keeps its histories and scales as buffers (input_amax_history, input_scale, ...), so they
    are saved with the state_dict; in eval mode it casts with them and records nothing.

    Args:
        in_features, out_features, bias, device, dtype: as nn.Linear's.
        recipe (str, default "tensorwise"): how each tensor gets its scale: "tensorwise" (torchao's
            default), "delayed" (Transformer Engine's DelayedScaling), "mx" (a scale per 32 values), or the
            4-bit "nvfp4" and "mxfp4" (ampteach.amp.fp4.FP4Recipe: the NVFP4 training recipe's switches).
        **recipe_options: "delayed" takes history_len, algo, margin (DelayedScaling's); "mx" takes
            scale_rounding ("rceil" by default, as Transformer Engine's MXFP8), block_size, and elements,
            an MX element format per role: {"input": "fp4_e2m1", "weight": "fp4_e2m1"} trains in MXFP4;
            "nvfp4" and "mxfp4" take FP4Recipe's weight_2d, rht, stochastic, seed, generator.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, recipe: str = "tensorwise",
                 device=None, dtype=None, **recipe_options):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe_name = recipe
        self._set_recipe(_make_recipe(recipe, **recipe_options))

    @classmethod
    def from_float(cls, mod: nn.Linear, recipe: str = "tensorwise", **recipe_options) -> Float8Linear:
        """A Float8Linear sharing mod's weight and bias Parameters (an optimizer built on mod still works)."""
        with torch.device("meta"):                               # no memory for weights replaced next
            new = cls(mod.in_features, mod.out_features, bias=False, recipe=recipe, **recipe_options)
        new.weight, new.bias = mod.weight, mod.bias
        new._set_recipe(_make_recipe(recipe, **recipe_options))  # its buffers (delayed) off the meta device
        return new

    def _set_recipe(self, recipe) -> None:
        self.recipe = recipe
        for role, scaling in self.scalings().items():
            self.register_buffer(f"{role}_amax_history", scaling.amax_history)
            self.register_buffer(f"{role}_scale", scaling.scale)

    def forward(self, x: Tensor) -> Tensor:
        for role, scaling in self.scalings().items():   # the buffers, wherever .to() or load_state_dict put them
            scaling.amax_history, scaling.scale = getattr(self, f"{role}_amax_history"), getattr(self, f"{role}_scale")
        out = _Float8Matmul.apply(x, self.weight, self.recipe, self.training)
        return out if self.bias is None else out + self.bias

    def scalings(self) -> dict[str, DelayedScaling]:
        """The DelayedScaling of each role ("input", "weight", "grad_output"); {} for the other recipes."""
        return getattr(self.recipe, "scalings", {})

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe_name!r}"


def convert_to_float8_training(module: nn.Module, recipe: str = "tensorwise", module_filter_fn=None,
                               **recipe_options) -> nn.Module:
    """model = convert_to_float8_training(model, recipe="mx"): every nn.Linear (module_filter_fn(mod, fqn)
    may skip some) becomes a Float8Linear with the same Parameters, in place; returns the model.
    """
    _make_recipe(recipe, **recipe_options)                      # fail before changing anything
    if type(module) is nn.Linear:
        return Float8Linear.from_float(module, recipe, **recipe_options)
    for name, child in list(module.named_modules()):
        for child_name, grandchild in list(child.named_children()):
            fqn = f"{name}.{child_name}" if name else child_name
            if type(grandchild) is nn.Linear and (module_filter_fn is None or module_filter_fn(grandchild, fqn)):
                setattr(child, child_name, Float8Linear.from_float(grandchild, recipe, **recipe_options))
    return module
