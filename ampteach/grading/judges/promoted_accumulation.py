"""Judge of build it yourself 8: the learner's narrow accumulator against exact integer arithmetic.

    @judge("check_round_to_bits"), @judge("check_round_to_bits_hidden")
    @judge("check_accumulate"), @judge("check_accumulate_hidden")

The rule, on exact rationals: x = q * 2^(e - bits + 1) with 2^e <= |x| < 2^(e + 1) and q rounded to an
integer, to the nearest (a tie to the even q) or toward zero. accumulate sums each column of products
in k order, s <- round(s + p_k); with promote_every = n, after every n products (and after the last)
the total takes the partial sum, total <- round_24(total + s) to nearest (fp32), and s starts again.
Random inputs are new under grading; the hidden checks' are drawn each time.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref, describe

ROUNDINGS = ("nearest", "truncate")
PROMOTED_BITS = 24          # the wide total: fp32


def _unit(x: Fraction, bits: int) -> Fraction:
    """The value of the last kept bit of x (x != 0): 2^(e - bits + 1) with 2^e <= |x| < 2^(e + 1)."""
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if x < Fraction(2) ** e:
        e -= 1
    return Fraction(2) ** (e - bits + 1)


def exact_round(x: Fraction, bits: int, rounding: str) -> Fraction:
    """x rounded to `bits` significant bits, in exact arithmetic."""
    if x == 0:
        return x
    sign, x, unit = (-1 if x < 0 else 1), abs(x), _unit(x, bits)
    q, r = divmod(x, unit)
    if rounding == "nearest" and (r > unit / 2 or (r == unit / 2 and q % 2)):
        q += 1
    return sign * q * unit


def exact_accumulate(products: torch.Tensor, acc_bits: int, rounding: str, promote_every: int | None) -> list[Fraction]:
    """Each column of products (K, M) summed the narrow way, in exact arithmetic."""
    columns = [[Fraction(v) for v in column] for column in products.double().t().tolist()]
    out = []
    for column in columns:
        s = total = Fraction(0)
        for k, p in enumerate(column, start=1):
            s = exact_round(s + p, acc_bits, rounding)
            if promote_every and (k % promote_every == 0 or k == len(column)):
                total, s = exact_round(total + s, PROMOTED_BITS, "nearest"), Fraction(0)
        out.append(total if promote_every else s)
    return out


# --- inputs ----------------------------------------------------------------------------------------------

def rounding_cases(gen: torch.Generator, hidden: bool = False) -> dict[str, torch.Tensor]:
    """float64 values: ties of every kind, carries into the next power of two, signs, random exponents."""
    u = 2.0**-10                                   # one unit of the last kept bit of 11 bits, at 1
    named = torch.tensor([1.0, 1 + u / 2, 1 + 3 * u / 2, -(1 + u / 2), -(1 + 3 * u / 2), 1 + u / 2 + 2.0**-40,
                          2 - 2.0**-52, -(2 - 2.0**-52), 2048.0 + 1, 2049.0 + 2, -(2049.0 + 2), 0.0, 0.1, -0.1,
                          1.5 * 2.0**-300, 3.0 * 2.0**200, 1 - 2.0**-53], dtype=torch.float64)
    mantissas = torch.rand(600, generator=gen, dtype=torch.float64) + 1
    exponents = torch.randint(-60, 60, (600,), generator=gen)
    signs = torch.where(torch.rand(600, generator=gen) < 0.5, -1.0, 1.0).double()
    random = signs * mantissas * torch.exp2(exponents.double())
    short = torch.randint(-(2**20), 2**20, (400,), generator=gen).double() * 2.0**-7   # few bits: many exact ties
    cases = {"ties, carries, signs and zero": named, "600 random values from 2^-60 to 2^61": random,
             "400 multiples of 2^-7 (many ties)": short}
    if hidden:
        cases = {f"hidden: {name}": -3 * x for name, x in cases.items()}
        raw = torch.randint(-(2**62), 2**62, (500,), generator=gen, dtype=torch.int64).view(torch.float64)
        ordinary = raw.isfinite() & (raw.abs() > 2.0**-900) & (raw.abs() < 2.0**900)
        cases["500 random float64 bit patterns"] = raw[ordinary]
    return cases


def products_of_fp8(k: int, m: int, generator: torch.Generator, positive: bool = True) -> torch.Tensor:
    """(k, m) products of two e4m3 numbers, as float64: each has at most 8 significant bits and is a
    multiple of 2^-18 below 2^18, so every sum of a few thousand of them is exact in float64."""
    draw = torch.rand if positive else torch.randn
    x = draw(k, m, generator=generator).to(torch.float8_e4m3fn).double()
    y = draw(k, m, generator=generator).to(torch.float8_e4m3fn).double()
    return x * y


def accumulate_cases(gen: torch.Generator, hidden: bool = False) -> list[tuple[str, torch.Tensor, int, str,
                                                                              int | None]]:
    """(name, products, acc_bits, rounding, promote_every)."""
    ones = torch.ones(4096, 1, dtype=torch.float64)
    positive = products_of_fp8(300, 8, gen)
    signed = products_of_fp8(300, 8, gen, positive=False)
    cases = [("4096 products of 1.0, 11-bit accumulator", ones, 11, "nearest", None),
             ("300 positive products, 14 bits, truncate", positive, 14, "truncate", None),
             ("300 positive products, 14 bits, nearest", positive, 14, "nearest", None),
             ("300 positive products, 14 bits, truncate, promoted every 128", positive, 14, "truncate", 128),
             ("300 signed products, 8 bits, nearest, promoted every 32", signed, 8, "nearest", 32),
             ("300 signed products, 11 bits, truncate", signed, 11, "truncate", None),
             ("no products (K = 0), promoted every 16", signed[:0], 14, "truncate", 16),
             ("one product, 3 bits, nearest", signed[:1, :4] * 3, 3, "nearest", None)]
    if hidden:
        more = products_of_fp8(517, 5, gen)
        cases = [("hidden: 517 positive products, 14 bits, truncate, promoted every 128", more, 14, "truncate", 128),
                 ("hidden: 517 positive products, 5 bits, nearest, promoted every 7", more, 5, "nearest", 7),
                 ("hidden: 517 positive products, 24 bits, nearest, promoted every 1000", more, 24, "nearest", 1000),
                 ("hidden: 200 signed products, 3 bits, truncate, promoted every 1", signed[:200], 3, "truncate", 1),
                 ("hidden: 1 product, 2 bits, nearest", signed[:1, :3] * 3, 2, "nearest", None),
                 ("hidden: 0 products", signed[:0], 14, "truncate", 16)]
    return cases


# --- grading -----------------------------------------------------------------------------------------------

def _as_float64(got, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name}: expected a float64 tensor, got {describe(got)}")
    if got.dtype != torch.float64:
        raise CheckFailed(f"{name}: expected a float64 tensor (the rounded values, held exactly), got {got.dtype}")
    if tuple(got.shape) != shape:
        raise CheckFailed(f"{name}: expected shape {shape}, got {tuple(got.shape)}")
    return got


def _why_rounded(x: Fraction, got: Fraction, want: Fraction, bits: int, rounding: str) -> str:
    toward_zero, nearest = exact_round(x, bits, "truncate"), exact_round(x, bits, "nearest")
    if rounding == "nearest":
        if got == toward_zero != want:
            return " (that is x truncated: to nearest, it goes up when the dropped part is over half a unit)"
        unit = _unit(x, bits)
        if unit and abs(x - toward_zero) * 2 == unit:
            return " (an exact tie: it goes to the neighbour whose last kept bit is 0, ties to even)"
        return ""
    if got == nearest != want:
        return " (that is x rounded to nearest: truncation drops the extra bits)"
    if x < 0 and got < want:
        return " (truncation goes toward zero: a negative value moves up, not down as floor would)"
    return ""


def _grade_rounding(learner: Learner, fn: Ref, hidden: bool) -> int:
    n = 0
    for name, x in rounding_cases(learner.generator(21 if hidden else 20), hidden).items():
        for bits in (2, 4, 8, 11, 14, 24, 53):
            for rounding in ROUNDINGS:
                got = learner.call(fn, x.clone(), bits, rounding, watch="promoted_accumulation")
                got = _as_float64(got, f"{name}, {bits} bits, {rounding}", tuple(x.shape))
                want = [float(exact_round(Fraction(v), bits, rounding)) for v in x.tolist()]
                wrong = [i for i, (g, w) in enumerate(zip(got.tolist(), want)) if g != w]
                if wrong:
                    i, v = wrong[0], x[wrong[0]].item()
                    raise CheckFailed(
                        f"{name}, {bits} bits, {rounding}: {len(wrong)} of {len(want)} values wrong; first: "
                        f"{v!r} ({v.hex()}) should become {want[i]!r} ({want[i].hex()}), you gave {got[i].item()!r}"
                        + _why_rounded(Fraction(v), Fraction(got[i].item()), Fraction(want[i]), bits, rounding))
                n += len(want)
    return n


def _grade_accumulate(learner: Learner, fn: Ref, hidden: bool) -> int:
    cases = accumulate_cases(learner.generator(31 if hidden else 30), hidden)
    for name, products, bits, rounding, promote_every in cases:
        got = learner.call(fn, products.clone(), bits, rounding, promote_every, watch="promoted_accumulation")
        got = _as_float64(got, name, (products.shape[1],))
        want = exact_accumulate(products, bits, rounding, promote_every)
        for j, (g, w) in enumerate(zip(got.tolist(), want)):
            if Fraction(g) != w:
                why = ""
                if promote_every and Fraction(g) == exact_accumulate(products[:, j:j + 1], bits, rounding, None)[0]:
                    why = " (that is the sum without promotion: move the partial sum into the total every n products)"
                elif promote_every and products.shape[0] % promote_every:
                    why = (f" ({products.shape[0]} is not a multiple of {promote_every}: the last partial sum "
                           f"must reach the total too)")
                elif not promote_every and Fraction(g) == sum(Fraction(v) for v in products[:, j].tolist()):
                    why = " (that is the exact sum: round after every add)"
                raise CheckFailed(f"{name}: column {j} should sum to {float(w)!r}, you gave {g!r}{why}")
    return len(cases)



@judge("check_round_to_bits")
def check_round_to_bits(learner: Learner, round_to_bits: Ref) -> str:
    n = _grade_rounding(learner, round_to_bits, hidden=False)
    return f"{n:,} (value, width, rounding) cases, exact"


@judge("check_round_to_bits_hidden")
def check_round_to_bits_hidden(learner: Learner, round_to_bits: Ref) -> str:
    n = _grade_rounding(learner, round_to_bits, hidden=True)
    return f"{n:,} more cases"


@judge("check_accumulate")
def check_accumulate(learner: Learner, accumulate: Ref) -> str:
    n = _grade_accumulate(learner, accumulate, hidden=False)
    return f"{n} cases (widths 8 to 14, both roundings, with and without promotion), exact"


@judge("check_accumulate_hidden")
def check_accumulate_hidden(learner: Learner, accumulate: Ref) -> str:
    n = _grade_accumulate(learner, accumulate, hidden=True)
    return f"{n} more cases"
