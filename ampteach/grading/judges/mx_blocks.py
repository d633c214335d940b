"""Judge of build it yourself 7: the learner's MX block quantization against the OCP MX v1.0 rule.

    @judge("check_mx_quantize")          # the exercise's inputs (random ones new under grading), 5 element formats
    @judge("check_mx_quantize_hidden")   # random bit patterns, huge values, 3-d inputs: drawn each time

The reference, independent of the course's library, in exact float64 steps: each block of 32 values
shares e = floor(log2(amax)) - emax (torch.frexp, never log2), clamped to [-127, 127]; elements are
v / 2^e rounded to nearest even in the element's grid, saturating at its largest value.
"""

from __future__ import annotations

import math

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.mx_blocks import BLOCK, ELEMENTS
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe


def ocp_reference(x: torch.Tensor, elem: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(e per block as int32, element values as float32) by the OCP MX v1.0 rule, in exact float64 steps."""
    ebits, mbits, emax, vmax = ELEMENTS[elem]
    emin = 2 - 2 ** (ebits - 1)                       # exponent of the smallest normal element
    blocks = x.double().reshape(*x.shape[:-1], -1, BLOCK)
    amax = blocks.abs().amax(-1)
    _, k = torch.frexp(amax)                          # amax = m * 2^k with 0.5 <= m < 1: floor(log2) = k - 1
    e = torch.where(amax > 0, k.long() - 1 - emax, torch.full_like(k, -127, dtype=torch.long)).clamp(-127, 127)
    v = blocks * torch.exp2(-e.double())[..., None]   # exact: a power of two, in float64
    _, kv = torch.frexp(v)
    quantum = torch.exp2((torch.clamp(kv.long() - 1, min=emin) - mbits).double())
    p = (torch.round(v / quantum) * quantum).clamp(-vmax, vmax)   # torch.round: ties to even
    return e.to(torch.int32), p.reshape(x.shape).float()


def mx_cases(gen: torch.Generator, hidden: bool = False) -> dict[str, torch.Tensor]:
    """Named inputs (last dimension a multiple of 32): random magnitudes and the rule's edge cases."""
    below_pow2 = torch.full((BLOCK,), 0.25)
    below_pow2[0] = 8 * (1 - 2**-24)                  # float32 log2 rounds this up to 3.0 exactly
    top = torch.linspace(-7.0, 7.0, BLOCK)            # MXFP4: amax 7 lies in the top binade, clips to 6
    ties = torch.tensor([2.5, 3.5, 5.0, 1.25, 0.75, 0.25, -2.5, -0.25] * 4) * 1.0   # ties on small grids
    tiny = torch.randn(BLOCK, generator=gen) * 2.0**-130   # e would be far below -127: clamped
    mixed = torch.randn(BLOCK, generator=gen) * torch.exp2(torch.randint(-20, 4, (BLOCK,), generator=gen).float())
    cases = {
        "4 rows of 64 normal values": torch.randn(4, 64, generator=gen),
        "wide magnitudes (2^-20 to 2^3 in one block)": mixed,
        "amax just below a power of two": below_pow2,
        "values in the top binade": top,
        "exact ties": ties,
        "a tiny block (subnormal float32)": tiny,
        "an all-zero block next to a normal one": torch.cat([torch.zeros(BLOCK), torch.randn(BLOCK, generator=gen)]),
        "a 3-d input (blocks along the last dimension)": torch.randn(2, 2, 64, generator=gen) * 10,
        "values near float32's max (e clamped to 127)": torch.randn(BLOCK, generator=gen) * 4e37,
    }
    if hidden:
        bits = torch.randint(-(2**31), 2**31, (8, 96), generator=gen, dtype=torch.int64).to(torch.int32)
        finite = bits.view(torch.float32)
        cases = {**{f"hidden: {k}": v * (3.0 if torch.is_floating_point(v) else 1) for k, v in cases.items()},
                 "random finite float32 bit patterns": torch.where(torch.isfinite(finite), finite, 1.0),
                 "huge values near float32's max": torch.randn(BLOCK, generator=gen) * 1e37,
                 "a 3-d input": torch.randn(2, 3, 64, generator=gen) * 100}
    return cases


def _why_exponent(x_block: torch.Tensor, got: int, want: int, elem: str) -> str:
    amax = x_block.abs().max().item()
    emax = ELEMENTS[elem][2]
    if amax > 0 and got == math.floor(torch.log2(torch.tensor(amax, dtype=torch.float32)).item()) - emax != want:
        return (" (log2 in float32 rounds up just below a power of two: read the exponent from the bits, "
                "e.g. torch.frexp)")
    if amax > 0 and got == math.ceil(math.log2(amax / ELEMENTS[elem][3])) != want:
        return " (that is the ceiling rule Transformer Engine uses; OCP's is floor(log2(amax)) - emax)"
    if want == -127 and got < -127:
        return " (E8M0 holds exponents -127..127: clamp)"
    return ""


def _grade(learner: Learner, mx_quantize: Ref, name: str, x: torch.Tensor, elem: str) -> None:
    got = learner.call(mx_quantize, x.clone(), elem, watch="mx_blocks")
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, (torch.Tensor, list)) for t in got)):
        raise CheckFailed(f"{name}, {elem}: expected (exponents, elements), got {describe(got)}")
    e, p = (torch.as_tensor(t) for t in got)
    want_e, want_p = ocp_reference(x, elem)
    if e.shape != want_e.shape or p.shape != x.shape:
        raise CheckFailed(f"{name}, {elem}: expected exponents of shape {tuple(want_e.shape)} (one per block of "
                          f"{BLOCK}) and elements of shape {tuple(x.shape)}, got {tuple(e.shape)} and {tuple(p.shape)}")
    nonzero = x.reshape(*x.shape[:-1], -1, BLOCK).abs().amax(-1) > 0
    bad = (e.long() != want_e.long()) & nonzero
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        block = x.reshape(*x.shape[:-1], -1, BLOCK)[i]
        raise CheckFailed(f"{name}, {elem}: block {i} (amax {block.abs().max().item()!r}) has shared exponent "
                          f"{int(want_e[i])}, you gave {int(e[i])}"
                          + _why_exponent(block, int(e[i]), int(want_e[i]), elem))
    p = p.float()
    wrong = ~((p == want_p) | (torch.isnan(p) & torch.isnan(want_p)))
    if wrong.any():
        i = tuple(int(v) for v in wrong.nonzero()[0])
        blocks = x.double().reshape(*x.shape[:-1], -1, BLOCK)
        scaled = (blocks * torch.exp2(-want_e.double())[..., None]).reshape(x.shape)[i]
        why = ""
        vmax = ELEMENTS[elem][3]
        if abs(p[i].item()) > vmax or not math.isfinite(p[i].item()):
            why = f" (elements saturate at +-{vmax:g}: no inf in MX elements)"
        elif abs(p[i].item() - scaled.item()) == abs(want_p[i].item() - scaled.item()):
            why = " (an exact tie: round to the neighbour whose last mantissa bit is 0)"
        raise CheckFailed(f"{name}, {elem}: {int(wrong.sum())} elements wrong; first at {i}: the value {x[i].item()!r} "
                          f"is {scaled.item()!r} times the block's scale, which rounds to {want_p[i].item()!r}, "
                          f"you gave {p[i].item()!r}{why}")


@judge("check_mx_quantize")
def check_mx_quantize(learner: Learner, mx_quantize: Ref) -> str:
    n = 0
    for name, x in mx_cases(learner.generator(1)).items():
        for elem in ELEMENTS:
            _grade(learner, mx_quantize, name, x, elem)
            n += 1
    return f"{n} (input, element format) pairs: scales and elements as the OCP MX v1.0 rule gives"


@judge("check_mx_quantize_hidden")
def check_mx_quantize_hidden(learner: Learner, mx_quantize: Ref) -> str:
    n = 0
    for name, x in mx_cases(learner.generator(11), hidden=True).items():
        for elem in ELEMENTS:
            _grade(learner, mx_quantize, name, x, elem)
            n += 1
    return f"{n} more (input, element format) pairs"
