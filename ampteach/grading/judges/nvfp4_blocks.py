"""Judge of build it yourself 9: the learner's E2M1 rounding and NVFP4 quantization, bit for bit.

    @judge("check_round_to_e2m1")           # an independent E2M1 reference: the grid, nearest, ties to even
    @judge("check_nvfp4_quantize")          # torchao's NVFP4Tensor.to_nvfp4 (or ampteach.amp.nvfp4 without torchao)
    @judge("check_nvfp4_quantize_hidden")   # other shapes and scales, drawn each time

The NVFP4 reference is torchao 0.18's where it is installed (the `compare` extra), else the course's own
ampteach.amp.nvfp4, which tests/test_nvfp4.py holds to torchao's bit for bit.
"""

from __future__ import annotations

import random

import torch

from ampteach.grading.checks.common import CheckFailed, bits32
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_reference(v: torch.Tensor) -> torch.Tensor:
    """Nearest value of GRID (ties to the even code: codes count GRID in order), saturating, sign kept; in float64."""
    grid = torch.tensor(GRID, dtype=torch.float64)
    m = v.double().abs().clamp(max=6.0)
    distance = (m[..., None] - grid).abs()
    best = distance.min(-1, keepdim=True).values
    ties = distance == best                               # one code, or two neighbours at a tie
    even = ties & (torch.arange(8) % 2 == 0)              # the even code of the two (or the one, if even)
    code = torch.where(even.any(-1), even.to(torch.int64).argmax(-1), ties.to(torch.int64).argmax(-1))
    return torch.copysign(grid[code], v.double()).float()


def _reference(x: torch.Tensor, S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s8 as float32, E2M1 values as float32) of NVFP4 with per-tensor scale S."""
    from ampteach.amp.nvfp4 import e2m1_values

    try:
        from torchao.prototype.mx_formats.kernels import unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    except ImportError:
        from ampteach.amp.nvfp4 import nvfp4_quantize

        q = nvfp4_quantize(x, S)
        return q.block_scales.float().reshape(*x.shape[:-1], -1), e2m1_values(q.codes).float().reshape(x.shape)
    t = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=S)
    codes = unpack_uint4(t.qdata.contiguous().view(torch.uint8)).reshape(x.shape)
    return t.scale.float().reshape(*x.shape[:-1], -1), e2m1_values(codes).float()


def rounding_cases(gen: torch.Generator) -> dict[str, torch.Tensor]:
    sixteenths = torch.arange(-128, 129, dtype=torch.float32) / 16
    return {"every multiple of 1/16 from -8 to 8 (the grid, its ties and between)": sixteenths,
            "signs and extremes (-0.0, tiny, just below and above each tie, 6, 7, 1e30, -1e30)":
                torch.tensor([-0.0, 0.0, 1e-30, -1e-30, 0.2499999, 0.2500001, 1.7499999, 1.7500001, 2.4999998,
                              3.4999998, 3.5000002, 4.9999995, 5.0000005, 6.0, 7.0, 1e30, -1e30]),
            "10,000 random values from -12 to 12": (torch.rand(10_000, generator=gen) - 0.5) * 24}


@judge("check_round_to_e2m1")
def check_round_to_e2m1(learner: Learner, fn: Ref) -> str:
    n = 0
    for name, v in rounding_cases(learner.generator(0)).items():
        got = learner.call(fn, v.clone(), watch="nvfp4_blocks")
        if not isinstance(got, torch.Tensor) or got.shape != v.shape or got.dtype != torch.float32:
            what = f"a {got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else \
                describe(got)
            raise CheckFailed(f"{name}: expected a float32 tensor of shape {tuple(v.shape)}, got {what}")
        want = e2m1_reference(v)
        wrong = bits32(got) != bits32(want)
        if wrong.any():
            i = int(wrong.nonzero()[0])
            why = ""
            if got[i].abs() == want[i].abs() and got[i] != want[i]:
                why = " (the sign: a negative value keeps its sign, also when it rounds to zero: -0.0)"
            elif abs(v[i].item()) > 6:
                why = " (E2M1 has no inf: beyond 6 it saturates)"
            elif abs(abs(v[i].item()) - abs(got[i].item())) == abs(abs(v[i].item()) - abs(want[i].item())):
                why = " (an exact tie: it goes to the neighbour whose last mantissa bit is 0)"
            raise CheckFailed(f"{name}: {int(wrong.sum())} of {v.numel()} values wrong; first: {v[i].item()!r} "
                              f"should become {want[i].item()!r}, you gave {got[i].item()!r}{why}")
        n += v.numel()
    return f"{n:,} values on E2M1's grid, nearest even, saturating, signs kept"


def nvfp4_cases(gen: torch.Generator, hidden: bool = False) -> dict[str, torch.Tensor]:
    x = torch.randn(4, 64, generator=gen)
    cases = {"4 rows of 64 normal values": x, "the same, scaled by 10^4": x * 1e4, "tiny values (10^-6)": x * 1e-6}
    outlier = x.clone()
    outlier[1, 5] = 1e5
    zero = x.clone()
    zero[:, 16:32] = 0.0
    cases.update({"an outlier of 10^5 in one block": outlier, "an all-zero block": zero,
                  "a bf16 input": x.to(torch.bfloat16), "a 3-d input (2, 3, 32)": torch.randn(2, 3, 32, generator=gen)})
    if hidden:
        rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
        spread = torch.randn(6, 96, generator=gen).view(-1, 16)
        spread *= torch.exp2(torch.randint(-20, 21, (spread.shape[0], 1), generator=gen).float())
        cases = {f"hidden: {k}": v for k, v in cases.items()}
        cases["every block at its own scale, 2^-20 to 2^20"] = spread.view(6, 96)
        e = rng.randint(-60, 60)
        cases[f"values near 2^{e}"] = torch.randn(rng.randint(1, 5), 16 * rng.randint(1, 6), generator=gen) * 2.0**e
    return cases


def _grade(learner: Learner, fn: Ref, name: str, x: torch.Tensor) -> None:
    S = x.float().abs().amax() / (448 * 6)
    got = learner.call(fn, x.clone(), S.clone(), watch="nvfp4_blocks")
    want_s, want_e = _reference(x, S)
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise CheckFailed(f"{name}: expected (block scales, values), two tensors, got {describe(got)}")
    s8, e = (t.float() if t.dtype != torch.float32 and t.is_floating_point() else t for t in got)
    if s8.shape != want_s.shape or e.shape != want_e.shape:
        raise CheckFailed(f"{name}: expected block scales of shape {tuple(want_s.shape)} (one per 16 values) and "
                          f"values of shape {tuple(want_e.shape)}, got {tuple(s8.shape)} and {tuple(e.shape)}")
    wrong = bits32(s8) != bits32(want_s)
    if wrong.any():
        i = tuple(int(k) for k in wrong.nonzero()[0])
        amax = x.float().reshape(*x.shape[:-1], -1, 16)[i].abs().max().item()
        raw = amax / 6 / S.item()
        hint = " (clamp the scale to [2^-6, 448] before rounding it to E4M3)" if not 2**-6 <= raw <= 448 else ""
        raise CheckFailed(f"{name}: block {i} (amax {amax!r}) should have scale {want_s[i].item()!r}, you gave "
                          f"{s8[i].item()!r}{hint}")
    wrong = bits32(e) != bits32(want_e)
    if wrong.any():
        i = tuple(int(k) for k in wrong.nonzero()[0])
        block = i[:-1] + (i[-1] // 16,)
        v = x.float()[i].item() * ((1.0 / S) / want_s[block]).item()
        other = (x.float()[i] / (S * want_s[block])).item()
        hint = (" (that is block / (S * s8) rounded: compute (1 / S) / s8 first, then one multiply)"
                if e2m1_reference(torch.tensor([other]))[0].item() == e[i].item() and other != v else "")
        raise CheckFailed(f"{name}: {int(wrong.sum())} values wrong; first at {i}: x = {x.float()[i].item()!r} "
                          f"scales to {v!r}, which rounds to {want_e[i].item()!r}; you gave {e[i].item()!r}{hint}")


@judge("check_nvfp4_quantize")
def check_nvfp4_quantize(learner: Learner, fn: Ref) -> str:
    cases = nvfp4_cases(learner.generator(0))
    for name, x in cases.items():
        _grade(learner, fn, name, x)
    return f"{len(cases)} inputs, block scales and values bit for bit as NVFP4 makes them"


@judge("check_nvfp4_quantize_hidden")
def check_nvfp4_quantize_hidden(learner: Learner, fn: Ref) -> str:
    cases = nvfp4_cases(learner.generator(1), hidden=True)
    for name, x in cases.items():
        _grade(learner, fn, name, x)
    return f"{len(cases)} more inputs, bit for bit"
