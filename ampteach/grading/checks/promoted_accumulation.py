"""Build it yourself 8: a narrow accumulator and its promotion, graded against exact integer arithmetic.

    from ampteach.grading.checks import check_round_to_bits, check_accumulate
    check_round_to_bits(round_to_bits)     # round_to_bits(x, bits, rounding) -> x kept to `bits` bits
    check_accumulate(accumulate)           # accumulate(products, acc_bits, rounding, promote_every) -> sums

The rule, stated here independently of the course's library (ampteach.amp.accumulator), on exact
rationals: x = q * 2^(e - bits + 1) with 2^e <= |x| < 2^(e + 1) and q rounded to an integer, to the
nearest (a tie to the even q) or toward zero. accumulate sums each column of products in k order,
s <- round(s + p_k); with promote_every = n, after every n products (and after the last) the total
takes the partial sum, total <- round_24(total + s) to nearest (fp32), and s starts again from 0.
While the learner's code runs, ampteach's own emulated_matmul and round_to_bits, and torch's matrix
products, are switched off: the exercise is to write the loop and the rounding.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from fractions import Fraction
from typing import Callable, Iterator

import torch

from ampteach.grading.checks.common import CheckFailed, RefuseOps
from ampteach.grading.checks.common import passed as _passed

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

def rounding_cases(hidden: bool = False) -> dict[str, torch.Tensor]:
    """float64 values: ties of every kind, carries into the next power of two, signs, random exponents."""
    gen = torch.Generator().manual_seed(21 if hidden else 20)
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


def accumulate_cases(hidden: bool = False) -> list[tuple[str, torch.Tensor, int, str, int | None]]:
    """(name, products, acc_bits, rounding, promote_every)."""
    gen = torch.Generator().manual_seed(31 if hidden else 30)
    ones = torch.ones(4096, 1, dtype=torch.float64)
    positive = products_of_fp8(300, 8, gen)
    signed = products_of_fp8(300, 8, gen, positive=False)
    cases = [("4096 products of 1.0, 11-bit accumulator", ones, 11, "nearest", None),
             ("300 positive products, 14 bits, truncate", positive, 14, "truncate", None),
             ("300 positive products, 14 bits, nearest", positive, 14, "nearest", None),
             ("300 positive products, 14 bits, truncate, promoted every 128", positive, 14, "truncate", 128),
             ("300 signed products, 8 bits, nearest, promoted every 32", signed, 8, "nearest", 32),
             ("300 signed products, 11 bits, truncate", signed, 11, "truncate", None)]
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

def _refused(*args, **kwargs):
    raise RuntimeError("ampteach's own accumulator is switched off while your code is graded: "
                       "the exercise is to write the rounding and the loop yourself")


@contextlib.contextmanager
def _own_work() -> Iterator[None]:
    """ampteach's emulated_matmul and round_to_bits, under every name they go by, raise while the learner's
    code runs (their code objects are swapped, so a reference taken before the check is refused too), and
    so do torch's matrix products."""
    saved = {}
    try:
        library = importlib.import_module("ampteach.amp.accumulator")
        for name in ("emulated_matmul", "round_to_bits"):
            fn = getattr(library, name, None)
            if isinstance(fn, types.FunctionType):
                saved[fn] = fn.__code__
                fn.__code__ = _refused.__code__
    except ImportError:
        pass
    because = "the exercise is to add the products one at a time, rounding after each"
    ops = {op: because for op in (torch.matmul, torch.mm, torch.bmm, torch.mv, torch.dot, torch.einsum,
                                  torch.tensordot, torch.inner, torch.addmm, torch.Tensor.__matmul__,
                                  torch.Tensor.matmul, torch.Tensor.mm, torch.nn.functional.linear)}
    try:
        with RefuseOps(ops):
            yield
    finally:
        for fn, code in saved.items():
            fn.__code__ = code


def _as_float64(got, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name}: expected a float64 tensor, got {type(got).__name__}")
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


def _grade_rounding(fn: Callable, hidden: bool) -> int:
    n = 0
    for name, x in rounding_cases(hidden).items():
        for bits in (2, 4, 8, 11, 14, 24, 53):
            for rounding in ROUNDINGS:
                with _own_work():
                    got = fn(x.clone(), bits, rounding)
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


def check_round_to_bits(round_to_bits: Callable[[torch.Tensor, int, str], torch.Tensor]) -> None:
    """round_to_bits(x: float64 tensor, bits, rounding) -> the float64 values x becomes when kept to `bits`
    significant bits, rounding "nearest" (ties to even) or "truncate" (toward zero)."""
    n = _grade_rounding(round_to_bits, hidden=False)
    _passed("check_round_to_bits", f"{n:,} (value, width, rounding) cases, exact")


def check_round_to_bits_hidden(round_to_bits: Callable[[torch.Tensor, int, str], torch.Tensor]) -> None:
    """Values the exercise does not show: other ties and carries, random float64 bit patterns."""
    n = _grade_rounding(round_to_bits, hidden=True)
    _passed("check_round_to_bits_hidden", f"{n:,} more cases")


def _grade_accumulate(fn: Callable, hidden: bool) -> int:
    cases = accumulate_cases(hidden)
    for name, products, bits, rounding, promote_every in cases:
        with _own_work():
            got = fn(products.clone(), bits, rounding, promote_every)
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


def check_accumulate(accumulate: Callable) -> None:
    """accumulate(products: (K, M) float64, acc_bits, rounding, promote_every) -> (M,) float64: each column
    summed in k order, rounded to acc_bits after every add, promoted into an fp32 total every n products."""
    n = _grade_accumulate(accumulate, hidden=False)
    _passed("check_accumulate", f"{n} cases (widths 8 to 14, both roundings, with and without promotion), exact")


def check_accumulate_hidden(accumulate: Callable) -> None:
    """Settings the exercise does not show: 2, 3, 5 and 24 bits, promotion every 1, 7 and 1000, 0 and 1 products."""
    n = _grade_accumulate(accumulate, hidden=True)
    _passed("check_accumulate_hidden", f"{n} more cases")
