"""ampteach.amp.fp8 bit for bit: tensorwise scaling against torch's fp8 casts, an exact reference and torchao;
delayed scaling against Transformer Engine's rule over sequences with 0, inf, NaN and spikes; Float8Linear's
three matmuls against their formulas and torchao's Float8Linear(emulate=True); training in fp8.

References are written from the recipes' definitions: NumPy float64/float32 arithmetic for scales,
ampteach.amp.formats.encode/decode (Python ints, from the bit layout) for fp8 rounding, plain lists for
the amax history window.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch import nn

from ampteach import TrainConfig, mlp, seed_everything, train
from ampteach.amp.formats import decode, encode
from ampteach.amp.fp8 import (
    DelayedScaling,
    Float8Linear,
    MXTensor,
    convert_to_float8_training,
    dequantize,
    mx_dequantize,
    mx_quantize,
    quantize_tensorwise,
)

MAX = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
DTYPE = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FLT_MAX = float(np.finfo(np.float32).max)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32)


# --- tensorwise ------------------------------------------------------------------------------------

def ref_tensorwise(x: np.ndarray, fmt: str) -> tuple[np.float32, list[float]]:
    """scale = float32(max / max(float64 amax, 1e-12)); each x * scale in float32, clamped, rounded by encode."""
    amax = float(np.max(np.abs(x)))
    scale = np.float32(MAX[fmt] / max(amax, 1e-12))
    products = (x.astype(np.float32) * scale).astype(np.float32)
    q = [decode(encode(float(min(max(p, -MAX[fmt]), MAX[fmt])), fmt), fmt) for p in products]
    return scale, q


def test_tensorwise_by_hand():
    q, scale = quantize_tensorwise(torch.tensor([1.0, -2.0, 896.0, 1.0625]), "fp8_e4m3")
    assert scale.dtype == torch.float32 and scale.item() == 0.5 and q.dtype == torch.float8_e4m3fn
    # 1.0625 * 0.5 = 0.53125 is a tie between 0.5 and 0.5625 in e4m3 (steps of 1/16 there): even -> 0.5
    assert q.float().tolist() == [0.5, -1.0, 448.0, 0.5]
    assert dequantize(q, scale).tolist() == [1.0, -2.0, 896.0, 1.0]
    q, scale = quantize_tensorwise(torch.zeros(4), "fp8_e5m2")            # amax floored at 1e-12
    assert scale.item() == np.float32(57344.0 / 1e-12) and q.float().abs().sum() == 0


@pytest.mark.parametrize("fmt", list(MAX))
def test_tensorwise_is_torchs_cast_of_the_scaled_tensor(fmt):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-30, 10, (4096,), generator=gen).float())
    q, scale = quantize_tensorwise(x, fmt)
    expected = (x * scale).clamp(-MAX[fmt], MAX[fmt]).to(DTYPE[fmt])
    assert q.dtype == DTYPE[fmt] and torch.equal(q.view(torch.uint8), expected.view(torch.uint8))
    assert scale.item() == np.float32(MAX[fmt] / float(x.abs().max()))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 16), elements=st.floats(allow_nan=False, allow_infinity=False, width=32)),
       st.sampled_from(list(MAX)))
def test_tensorwise_matches_the_reference(x, fmt):
    q, scale = quantize_tensorwise(torch.from_numpy(x), fmt)
    ref_scale, ref_q = ref_tensorwise(x, fmt)
    assert scale.item() == ref_scale
    assert torch.equal(bits(q.float()), bits(torch.tensor(ref_q, dtype=torch.float32)))


def test_tensorwise_of_bf16_takes_amax_in_bf16():
    x = torch.tensor([1.0, 3.0, -7.5], dtype=torch.bfloat16)
    q, scale = quantize_tensorwise(x, "fp8_e4m3")
    assert scale.item() == np.float32(448.0 / 7.5) and q.float().tolist() == [60.0, 176.0, -448.0]


def test_tensorwise_matches_torchao():
    utils = pytest.importorskip("torchao.float8.float8_utils")
    tensor = pytest.importorskip("torchao.float8.float8_training_tensor")
    gen = torch.Generator().manual_seed(1)
    for fmt, dtype in DTYPE.items():
        x = torch.randn(64, 96, generator=gen) * 1e-3
        scale = utils.tensor_to_scale(x, dtype)
        theirs = tensor.hp_tensor_and_scale_to_float8(x, scale, dtype)
        q, ours_scale = quantize_tensorwise(x, fmt)
        assert torch.equal(bits(ours_scale), bits(scale))
        assert torch.equal(q.view(torch.uint8), theirs._data.view(torch.uint8))
        assert torch.equal(dequantize(q, ours_scale), theirs.to_original_precision())


def test_tensorwise_refuses_what_it_cannot_scale():
    with pytest.raises(ValueError, match="fp8_e4m3"):
        quantize_tensorwise(torch.ones(3), "e4m3")
    with pytest.raises(TypeError, match="non-empty floating-point"):
        quantize_tensorwise(torch.ones(0))
    with pytest.raises(TypeError, match="non-empty floating-point"):
        quantize_tensorwise(torch.ones(3, dtype=torch.int64))


# --- delayed scaling --------------------------------------------------------------------------------

def ref_delayed(amaxes: list[float], fmt: str, history_len: int, algo: str, margin: int = 0) -> list[float]:
    """Transformer Engine's rule, from its description: window = last history_len amaxes (zeros before the
    first step), a = max ignoring NaN or the newest; new scale = f32(f32(max * 2^-margin) / a) if a is
    finite and > 0, else the old one (1 at first); inf -> FLT_MAX."""
    window, scale, out = [0.0] * history_len, np.float32(1.0), []
    scaled_max = np.float32(MAX[fmt]) * np.float32(2.0**-margin)
    for amax in amaxes:
        window = window[1:] + [float(np.float32(amax))]
        a = max((v for v in window if not math.isnan(v)), default=0.0) if algo == "max" else window[-1]
        if math.isfinite(a) and a > 0:
            with np.errstate(over="ignore"):
                scale = np.float32(scaled_max / np.float32(a))
            scale = np.float32(FLT_MAX) if np.isinf(scale) else scale
        out.append(float(scale))
    return out


SEQUENCE = [2.0, 0.0, math.inf, 1.0, 8.0, 0.5, 0.5, 0.5, math.nan]


def test_delayed_scaling_by_hand():
    # history_len 3, algo "max": the inf is in the window for three steps and the scale stays 448/2
    ds = DelayedScaling("fp8_e4m3", history_len=3, algo="max")
    assert ds.scale.item() == 1.0
    assert [ds.update(a).item() for a in SEQUENCE] == [224, 224, 224, 224, 224, 56, 56, 896, 896]
    ds = DelayedScaling("fp8_e4m3", history_len=3, algo="most_recent")
    assert [ds.update(a).item() for a in SEQUENCE] == [224, 224, 224, 448, 56, 896, 896, 896, 896]
    ds = DelayedScaling("fp8_e5m2", history_len=1, margin=1)
    assert [ds.update(a).item() for a in (4.0, 0.0, 2.0**-20)] == [57344 / 2 / 4, 57344 / 2 / 4, 28672 * 2**20]
    ds = DelayedScaling("fp8_e4m3", history_len=2)
    assert ds.update(1e-45).item() == FLT_MAX                 # 448 / (a subnormal) overflows float32
    assert ds.amax_history.tolist() == [0.0, np.float32(1e-45)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=0, max_value=1e6, width=32), st.sampled_from([0.0, math.inf, math.nan]),
                          st.floats(min_value=0, max_value=2.0**-126, width=32)), min_size=1, max_size=40),
       st.sampled_from(list(MAX)), st.integers(1, 6), st.sampled_from(["max", "most_recent"]), st.integers(-2, 3))
def test_delayed_scaling_matches_the_reference(amaxes, fmt, history_len, algo, margin):
    ds = DelayedScaling(fmt, history_len=history_len, algo=algo, margin=margin)
    ours = [ds.update(a).item() for a in amaxes]
    assert ours == ref_delayed(amaxes, fmt, history_len, algo, margin)


def test_a_spike_saturates_under_delayed_scaling_but_not_under_current_scaling():
    gen = torch.Generator().manual_seed(2)
    steps = [torch.randn(1000, generator=gen) for _ in range(5)]
    steps[3] = steps[3] * 20                                    # a spike at step 3

    def clipped(x, scale):                                     # values beyond 448 once scaled: saturated
        return (x.double().abs() * scale.double() > 448 * (1 + 2**-23)).sum().item()

    ds = DelayedScaling("fp8_e4m3", history_len=16)
    amaxes = [float(s.abs().max()) for s in steps]
    for i, x in enumerate(steps):
        q, scale = ds.quantize(x)
        assert scale.item() == (1.0 if i == 0 else ref_delayed(amaxes[:i], "fp8_e4m3", 16, "max")[-1])
        assert clipped(x, quantize_tensorwise(x, "fp8_e4m3")[1]) == 0
        if i == 3:
            assert clipped(x, scale) > 10 and dequantize(q, scale).abs().max() < x.abs().max() / 10
        elif i > 0:                                            # only values above every earlier amax clip
            assert clipped(x, scale) == (x.abs() > max(amaxes[:i])).sum().item()
    assert clipped(steps[4], scale) == 0                       # after the spike the scale is 20x too small


def test_delayed_scaling_refuses_bad_settings():
    with pytest.raises(ValueError, match="algo"):
        DelayedScaling(algo="mean")
    with pytest.raises(ValueError, match="history_len"):
        DelayedScaling(history_len=0)
    ds = DelayedScaling(history_len=4)
    with pytest.raises(ValueError, match="same history_len"):
        ds.load_state_dict(DelayedScaling(history_len=8).state_dict())


# --- Float8Linear ------------------------------------------------------------------------------------

def tw(x, fmt):
    return dequantize(*quantize_tensorwise(x, fmt))


def mxd(x, fmt):
    return mx_dequantize(mx_quantize(x.contiguous(), fmt, 32, "rceil"))


def run(layer, x, grad_out):
    x = x.clone().requires_grad_()
    out = layer(x)
    out.backward(grad_out)
    return out, x.grad, layer.weight.grad, layer.bias.grad


@pytest.fixture
def linear_case():
    gen = torch.Generator().manual_seed(5)
    lin = nn.Linear(80, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 80, generator=gen) * 0.05)
        lin.bias.copy_(torch.randn(48, generator=gen))
    return lin, torch.randn(24, 80, generator=gen) * 3, torch.randn(24, 48, generator=gen) * 1e-4


def test_tensorwise_linear_is_the_three_fp8_matmuls(linear_case):
    lin, x, g = linear_case
    out, gx, gw, gb = run(Float8Linear.from_float(copy.deepcopy(lin)), x, g)
    x8, w8, g8 = tw(x, "fp8_e4m3"), tw(lin.weight.detach(), "fp8_e4m3"), tw(g, "fp8_e5m2")
    assert torch.equal(out, x8 @ w8.T + lin.bias.detach())
    assert torch.equal(gx, g8 @ w8)
    assert torch.equal(gw, g8.T @ x8)
    assert torch.equal(gb, g.sum(0))


def test_mx_linear_blocks_along_the_summed_dimension(linear_case):
    lin, x, g = linear_case
    out, gx, gw, gb = run(Float8Linear.from_float(copy.deepcopy(lin), recipe="mx"), x, g)
    w = lin.weight.detach()
    assert torch.equal(out, mxd(x, "fp8_e4m3") @ mxd(w, "fp8_e4m3").T + lin.bias.detach())
    assert torch.equal(gx, mxd(g, "fp8_e5m2") @ mxd(w.T, "fp8_e4m3").T)
    assert torch.equal(gw, mxd(g.T, "fp8_e5m2") @ mxd(x.T, "fp8_e4m3").T)
    assert torch.equal(gb, g.sum(0))


def test_the_matmul_stays_float32_inside_autocast(linear_case):
    lin, x, g = linear_case
    layer = Float8Linear.from_float(copy.deepcopy(lin))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.float32 and torch.equal(out, layer(x))


def test_mx_linear_takes_other_element_formats(linear_case):
    lin, x, g = linear_case
    elements = {"input": "fp4_e2m1", "weight": "fp6_e2m3"}
    layer = Float8Linear.from_float(copy.deepcopy(lin), recipe="mx", scale_rounding="floor", elements=elements)
    out, gx, _, _ = run(layer, x, g)
    w = lin.weight.detach()
    x4, w6 = mx_dequantize(mx_quantize(x, "fp4_e2m1")), mx_dequantize(mx_quantize(w, "fp6_e2m3"))
    assert torch.equal(out, x4 @ w6.T + lin.bias.detach())
    w_fp6 = mx_dequantize(mx_quantize(w.T.contiguous(), "fp6_e2m3")).T
    assert torch.equal(gx, mx_dequantize(mx_quantize(g, "fp8_e5m2")) @ w_fp6)
    with pytest.raises(ValueError, match="element formats"):
        Float8Linear(4, 4, recipe="mx", elements={"input": "int8"})
    with pytest.raises(ValueError, match="scale_rounding"):
        Float8Linear(4, 4, recipe="mx", scale_rounding="ceil")


def test_delayed_linear_casts_with_the_previous_scales(linear_case):
    lin, x, g = linear_case
    layer = Float8Linear.from_float(copy.deepcopy(lin), recipe="delayed", history_len=4)
    run(layer, x, g)                                           # step 1: every scale is 1, then the amaxes land
    scales = {role: s.scale.clone() for role, s in layer.scalings().items()}
    assert scales["input"].item() == np.float32(448.0) / np.float32(x.abs().max())
    layer.weight.grad = layer.bias.grad = None
    out, gx, gw, _ = run(layer, x * 2, g)                      # step 2 casts with step 1's scales
    w = lin.weight.detach()
    x8 = dequantize(torch.clamp(x * 2 * scales["input"], -448, 448).to(torch.float8_e4m3fn), scales["input"])
    w8 = dequantize(torch.clamp(w * scales["weight"], -448, 448).to(torch.float8_e4m3fn), scales["weight"])
    g8 = dequantize(torch.clamp(g * scales["grad_output"], -57344, 57344).to(torch.float8_e5m2), scales["grad_output"])
    assert torch.equal(out, x8 @ w8.T + lin.bias.detach()) and torch.equal(gx, g8 @ w8) and torch.equal(gw, g8.T @ x8)
    assert layer.input_amax_history.tolist()[-2:] == [x.abs().max().item(), (x * 2).abs().max().item()]
    layer.eval()
    with torch.no_grad():
        layer(x * 100)
    assert layer.input_amax_history.tolist()[-1] == (x * 2).abs().max().item()   # evaluation records nothing


def test_delayed_state_travels_with_the_state_dict(linear_case):
    lin, x, g = linear_case
    a = convert_to_float8_training(nn.Sequential(copy.deepcopy(lin)), recipe="delayed", history_len=4)
    run(a[0], x, g)
    b = convert_to_float8_training(nn.Sequential(copy.deepcopy(lin)), recipe="delayed", history_len=4)
    b.load_state_dict(a.state_dict())
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert torch.equal(a[0].scalings()["grad_output"].scale, b[0].scalings()["grad_output"].scale)
    assert set(convert_to_float8_training(nn.Sequential(copy.deepcopy(lin))).state_dict()) == {"0.weight", "0.bias"}


def test_convert_swaps_every_linear_and_keeps_its_parameters():
    model = mlp((64, 32))
    params = list(model.parameters())
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn != "5")
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Flatten", "Float8Linear", "ReLU", "Float8Linear", "ReLU", "Linear"]
    assert all(p is q for p, q in zip(params, model.parameters()))
    single = convert_to_float8_training(nn.Linear(4, 4), recipe="mx")
    assert isinstance(single, Float8Linear) and single.recipe_name == "mx"
    with pytest.raises(ValueError, match="recipe must be one of"):
        convert_to_float8_training(mlp(), recipe="rowwise")
    with pytest.raises(TypeError, match="takes no options"):
        convert_to_float8_training(mlp(), recipe="tensorwise", history_len=3)


def _torchao_model(model):
    float8 = pytest.importorskip("torchao.float8")
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name("tensorwise"), emulate=True)
    return float8.convert_to_float8_training(model, config=config)


def test_tensorwise_training_matches_torchao_step_for_step():
    """The course MLP, 5 AdamW steps: same losses, gradients and weights as torchao's emulated Float8Linear."""
    seed_everything(0)
    base = mlp((256,))
    theirs = _torchao_model(copy.deepcopy(base))
    ours = convert_to_float8_training(copy.deepcopy(base))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (ours, theirs)]
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        x, y = torch.randn(128, 1, 28, 28, generator=gen), torch.randint(0, 10, (128,), generator=gen)
        losses = []
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)
        assert torch.equal(losses[0], losses[1])
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(p.grad, q.grad) and torch.equal(p, q)


# --- training ---------------------------------------------------------------------------------------

def test_train_config_fp8_validation():
    assert TrainConfig(precision="fp8").fp8_recipe == "tensorwise"
    assert TrainConfig(precision="fp8").autocast_precision == "fp32" and TrainConfig(precision="fp8").scaling is None
    with pytest.raises(ValueError, match="fp8_recipe"):
        TrainConfig(precision="fp8", fp8_recipe="rowwise")
    with pytest.raises(ValueError, match="recipe must be 'autocast'"):
        TrainConfig(precision="fp8", recipe="master")


@pytest.mark.slow
def test_fp8_training_stays_within_1_5_points_of_fp32(data):
    """3 epochs of the course MLP (the lessons' setting) in fp32 and in each fp8 recipe."""
    accuracy = {}
    for precision, recipe in (("fp32", "tensorwise"), ("fp8", "tensorwise"), ("fp8", "delayed"), ("fp8", "mx")):
        seed_everything(0)
        model = mlp((256,))
        history = train(model, data, TrainConfig(precision=precision, fp8_recipe=recipe, epochs=3, progress=False))
        accuracy[precision, recipe] = history.final_accuracy
        if precision == "fp8":
            assert all(type(m) is not nn.Linear for m in model.modules())
    for acc in accuracy.values():
        assert abs(acc - accuracy["fp32", "tensorwise"]) < 1.5, accuracy


@pytest.fixture(scope="module")
def data():
    from ampteach import course_split, load_fashion_mnist, preload

    return preload(course_split(load_fashion_mnist()))


def test_mx_names_are_exposed_by_ampteach_fp8():
    assert MXTensor.__module__ == "ampteach.amp.mx" and callable(mx_quantize) and callable(mx_dequantize)
