"""Judge of build it yourself 6: the learner's autocast mode, op by op against torch.autocast.

    @judge("check_autocast_mode")          # the exercise's ops in CPU bf16/fp16, CUDA fp16/bf16; a training step
    @judge("check_autocast_mode_hidden")   # more ops of the same kinds
"""

from __future__ import annotations

from ampteach.grading.checks.autocast_mode import BECAUSE, CPU_ONLY, REGIONS, outcome, training_step
from ampteach.grading.checks.common import CheckFailed, same_bits, short
from ampteach.grading.checks.wire import RemoteError
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref
from ampteach.grading.judges.scan import refuse_uses


def _switch_name(name: str) -> bool:
    """torch's own switches of its autocast state, by name: the exercise is to cast, not to switch torch's on."""
    return "autocast" in name and name.lstrip("_").startswith(("set_", "autocast_increment", "autocast_decrement"))

VISIBLE = {   # one call per policy and its traps; `h` is the region's half dtype (inputs in it, or mixed)
    "torch.mm, fp32 inputs": "torch.mm(_r(d, f32, 4, 4), _r(d, f32, 4, 4))",
    "a @ b, half inputs": "_r(d, h, 4, 4) @ _r(d, h, 4, 4)",
    "F.linear with bias": "F.linear(_r(d, f32, 2, 4), _r(d, f32, 3, 4), _r(d, f32, 3))",
    "F.conv2d": "F.conv2d(_r(d, f32, 1, 2, 5, 5), _r(d, f32, 3, 2, 3, 3))",
    "torch.bmm, mixed": "torch.bmm(_r(d, h, 2, 4, 4), _r(d, f32, 2, 4, 4))",
    "torch.mm, float64 (not eligible)": "torch.mm(_r(d, f64, 4, 4), _r(d, f64, 4, 4))",
    "torch.relu, half": "torch.relu(_r(d, h, 4))",
    "torch.exp, half": "torch.exp(_r(d, h, 4))",
    "torch.log, fp32": "torch.log(_r(d, f32, 4))",
    "torch.softmax, half": "torch.softmax(_r(d, h, 4, 4), -1)",
    "torch.softmax, explicit dtype=float64": "torch.softmax(_r(d, h, 4, 4), -1, dtype=f64)",
    "x.sum(), half": "_r(d, h, 4, 4).sum()",
    "F.layer_norm, half input, fp32 weights": "F.layer_norm(_r(d, h, 2, 4), (4,), _r(d, f32, 4), _r(d, f32, 4))",
    "F.cross_entropy, half logits": "F.cross_entropy(_r(d, h, 3, 5), _labels(d, 3, 5))",
    "F.mse_loss, half": "F.mse_loss(_r(d, h, 4), _r(d, h, 4))",
    "F.binary_cross_entropy, half": "F.binary_cross_entropy(_r(d, h, 4) * 0.5, _r(d, h, 4) * 0.5)",
    "torch.cat([fp32, half])": "torch.cat([_r(d, f32, 2), _r(d, h, 2)])",
    "torch.cat([half, half])": "torch.cat([_r(d, h, 2), _r(d, h, 2)])",
    "torch.addcmul, mixed": "torch.addcmul(_r(d, h, 4), _r(d, f32, 4), _r(d, h, 4))",
    "x + y, mixed (on no list)": "_r(d, h, 4) + _r(d, f32, 4)",
    "torch.mm(..., out=fp32 tensor)": "torch.mm(_r(d, f32, 4, 4), _r(d, f32, 4, 4), out=torch.empty(4, 4, device=d))",
    "x.add_(y), fp32 (in place)": "_r(d, f32, 4).add_(_r(d, h, 4))",
}
HIDDEN = {
    "torch.baddbmm": "torch.baddbmm(_r(d, f32, 2, 4, 4), _r(d, f32, 2, 4, 4), _r(d, h, 2, 4, 4))",
    "F.conv1d": "F.conv1d(_r(d, f32, 1, 2, 7), _r(d, f32, 3, 2, 3))",
    "torch.matmul": "torch.matmul(_r(d, f32, 3, 4), _r(d, f32, 4))",
    "x.log_softmax(-1), half": "_r(d, h, 4, 4).log_softmax(-1)",
    "torch.cumsum, half": "torch.cumsum(_r(d, h, 4), 0)",
    "torch.sum, explicit dtype=float16": "torch.sum(_r(d, f32, 4), dtype=torch.float16)",
    "F.gelu, fp32": "F.gelu(_r(d, f32, 4))",
    "torch.stack([fp32, half, half])": "torch.stack([_r(d, f32, 2), _r(d, h, 2), _r(d, h, 2)])",
    "F.binary_cross_entropy_with_logits, half": "F.binary_cross_entropy_with_logits(_r(d, h, 4), _r(d, h, 4) * 0.5)",
    "x.exp() method, fp32": "_r(d, f32, 4).exp()",
    "torch.addmm, mixed": "torch.addmm(_r(d, f32, 4), _r(d, h, 4, 4), _r(d, f32, 4, 4))",
    "x.mul_(y), half (in place)": "_r(d, h, 4).mul_(_r(d, f32, 4))",
    "F.l1_loss, half": "F.l1_loss(_r(d, h, 4), _r(d, h, 4))",
    "torch.pow, half": "torch.pow(_r(d, h, 4), 2.0)",
}


def _describe(result: dict) -> str:
    if result["error"] is not None:
        error: RemoteError = result["error"]
        first = error.message.splitlines()[0][:120] if error.message else ""
        return f"raises {error.short_type}: {first}"
    return f"a {short(result['out'].dtype)} tensor"


def run_cases(learner: Learner, cls: Ref, cases: dict[str, str]) -> int:
    """Each case in each region through torch.autocast here and through the learner's mode there."""
    from ampteach.lab.compare_torch import torch_autocast

    compared = 0
    for device, half in REGIONS:
        for label, source in cases.items():
            if device != "cpu" and label in CPU_ONLY:
                continue
            want = outcome(f"lambda d, h: {source}", device, half, lambda d=device, h=half: torch_autocast(d, h))
            got = learner.plan("autocast_mode.case", {"cls": cls}, source, device, half)
            case = f"{label}, {device} {short(half)} region"
            if got.get("inside"):
                raise CheckFailed(f"{case}: torch's own autocast was switched on inside your mode's region; "
                                  f"{BECAUSE}")
            if got.get("after"):
                raise CheckFailed(f"autocast was still switched on after your mode's region ended; {BECAUSE}")
            if want["error"] is not None or got["error"] is not None:
                if want["error"] is not None and got["error"] is not None:
                    compared += 1
                    continue
                raise CheckFailed(f"{case}: torch.autocast {_describe(want)}, your mode {_describe(got)}")
            if got["out"].dtype != want["out"].dtype:
                raise CheckFailed(f"{case}: torch.autocast gives {_describe(want)}, your mode {_describe(got)}")
            if device == "cpu" and not same_bits(got["out"], want["out"]):
                diff = (got["out"].double() - want["out"].double()).abs().max().item() \
                    if got["out"].shape == want["out"].shape else float("nan")
                raise CheckFailed(f"{case}: same dtype but different values from torch.autocast (max |difference| "
                                  f"{diff:.3g}): cast every input the policy names, before the op runs")
            compared += 1
    return compared


def _training_step(learner: Learner, cls: Ref) -> None:
    import torch

    from ampteach.lab.compare_torch import torch_autocast

    got, got_grads = learner.plan("autocast_mode.training_step", {"cls": cls})
    want, want_grads = training_step(lambda: torch_autocast("cpu", torch.bfloat16))
    if not same_bits(got, want) or len(got_grads) != len(want_grads) or \
            not all(g is not None and same_bits(g, w) for g, w in zip(got_grads, want_grads)):
        raise CheckFailed(f"a training step of a small MLP: loss {got.item()!r} ({short(got.dtype)}) and gradients "
                          f"should equal torch.autocast's ({want.item()!r}, {short(want.dtype)}) bit for bit: "
                          f"are your casts ordinary differentiable .to() calls?")


@judge("check_autocast_mode")
def check_autocast_mode(learner: Learner, cls: Ref) -> str:
    refuse_uses(learner, _switch_name, BECAUSE)
    compared = run_cases(learner, cls, VISIBLE)
    _training_step(learner, cls)
    return (f"{compared} op cases ({len(VISIBLE)} ops in up to 4 regions, out= and in place among them) and an MLP "
            f"training step agree with torch.autocast: dtypes everywhere, values bit for bit on CPU")


@judge("check_autocast_mode_hidden")
def check_autocast_mode_hidden(learner: Learner, cls: Ref) -> str:
    refuse_uses(learner, _switch_name, BECAUSE)
    compared = run_cases(learner, cls, HIDDEN)
    return f"{compared} more op cases agree with torch.autocast"
