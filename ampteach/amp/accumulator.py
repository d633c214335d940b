"""A matmul with a narrow accumulator: what fp16 and fp8 hardware does to the sum inside a dot product.

    from ampteach.amp.accumulator import emulated_matmul
    a = torch.randn(64, 4096).to(torch.float8_e4m3fn)
    b = torch.randn(4096, 64).to(torch.float8_e4m3fn)
    c14 = emulated_matmul(a, b, acc_bits=14, rounding="truncate")                   # float64, (64, 64)
    c14p = emulated_matmul(a, b, acc_bits=14, rounding="truncate", promote_every=128)
    exact = emulated_matmul(a, b, acc_bits=53)          # for fp8 inputs: a.double() @ b.double(), exactly

For each output c[i, j], in k order, one product at a time:

    s <- round_acc_bits(s + a[i, k] * b[k, j])          the product exact, the sum exact, then one rounding

round_acc_bits keeps `acc_bits` significant bits: "nearest" rounds to the nearest such number, ties
to the one whose last kept bit is 0 (IEEE's default, as an fp32 or fp16 add does); "truncate" drops
the extra bits, toward zero, as an adder that shifts the smaller operand right and keeps no guard
bits would. acc_bits=24 is an fp32 accumulator, 11 an fp16 one, 8 a bf16 one; 14 is what the
DeepSeek-V3 report (arXiv:2412.19437, section 3.3.2) observed for fp8 matmuls on H800 tensor cores.
The accumulator models precision only: its exponent is float64's, so it never overflows or goes
subnormal where a real fp16 one would.

promote_every=n adds the partial sum into a wider total every n products, then starts a new
partial sum from 0 (DeepSeek-V3's fix, with n = N_C = 128): total <- round_promote_bits(total + s),
to nearest; promote_bits=24 by default (the fp32 registers of the CUDA cores).
adder_terms=n models a multi-term adder: n products are summed exactly, then added to s with one
rounding (s <- round(s + p_k + ... + p_k+n-1)); the default, 1, is the one-at-a-time order above.

The result is a float64 tensor holding the emulated values exactly. Each product is exact in float64
because the inputs have at most 24 significant bits (fp32 and everything narrower; float64 inputs
must hold float32 values). Each sum is exact before its rounding: where the inputs' bits make every
sum fit in float64's 53 bits (fp8 inputs always do), float64's own add is exact; otherwise Knuth's
TwoSum gives the rounding error lo of hi = fl(s + p), and hi + lo is rounded once, so no value is
rounded twice.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ROUNDINGS", "emulated_matmul", "round_to_bits"]

ROUNDINGS = ("nearest", "truncate")
# significant bits of each input dtype (float64 inputs must hold float32 values)
_SIGNIFICANT_BITS = {torch.float64: 24, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11,
                     torch.float8_e4m3fn: 4, torch.float8_e5m2: 3, torch.float8_e4m3fnuz: 4, torch.float8_e5m2fnuz: 3}
_CHUNK_VALUES = 32768        # products formed per pass: below torch's grain for splitting work across threads


def _check_bits(bits: int, name: str) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 53:
        raise ValueError(f"{name} is the number of significant bits the sum keeps, an int from 2 to 53 "
                         f"(fp16: 11, fp32: 24, float64: 53), got {bits!r}")
    return bits


def _check_rounding(rounding: str) -> str:
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS} (to nearest, ties to even; or toward zero), "
                         f"got {rounding!r}")
    return rounding


def _round_(x: Tensor, bits: int, rounding: str) -> Tensor:
    """x rounded in place to `bits` significant bits, on its float64 bit pattern (sign and magnitude).

    The low 53 - bits mantissa bits are cleared: toward zero as they are, to nearest after adding half
    a kept unit (less 1 unless the last kept bit is 1: ties go to even). A carry out of the mantissa
    moves into the exponent, so crossing a power of two needs no special case.
    """
    drop = 53 - bits
    if drop == 0:
        return x
    raw = x.view(torch.int64)
    if rounding == "nearest":
        last_kept = (raw >> drop) & 1
        raw += last_kept
        raw += (1 << (drop - 1)) - 1
    raw &= -(1 << drop)                                  # -(2^drop) == ~(2^drop - 1): clears the dropped bits
    return x


def round_to_bits(x: Tensor, bits: int, rounding: str = "nearest") -> Tensor:
    """round_to_bits(torch.tensor([1 + 2**-11], dtype=torch.float64), 11) -> tensor([1.]): x kept to `bits` bits.

    x = m * 2^e with 2^(bits-1) <= |m| < 2^bits  ->  m rounded to an integer (nearest even, or toward zero)

    x: a float64 tensor of finite values in float64's normal range; returns a new float64 tensor. The
    exponent is unbounded (no overflow, no subnormals): only the format's precision is modelled.
    """
    _check_bits(bits, "bits")
    _check_rounding(rounding)
    if not isinstance(x, Tensor) or x.dtype != torch.float64:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"round_to_bits takes a float64 tensor, got {got}: pass x.double()")
    return _round_(x.clone(memory_format=torch.contiguous_format), bits, rounding)


def _add_rounded_twosum(s: Tensor, p: Tensor, bits: int, rounding: str) -> Tensor:
    """round(s + p) to `bits` bits where float64's s + p may itself round: TwoSum, then one rounding.

    hi = fl(s + p) and lo (exact) with s + p = hi + lo. lo matters only where hi is exactly on the
    kept grid (truncation: the exact sum lies just below it when lo points toward zero) or exactly
    halfway between two kept numbers (nearest: lo breaks the tie).
    """
    hi = s + p
    p_part = hi - s
    lo = (s - (hi - p_part)) + (p - p_part)            # Knuth's TwoSum: s + p == hi + lo exactly
    drop = 53 - bits
    if drop == 0 and rounding == "nearest":
        return hi                                      # float64's add is the correctly rounded sum
    raw = hi.view(torch.int64)
    unit = 1 << drop
    dropped = raw & (unit - 1)
    toward_zero = lo.ne(0) & (torch.signbit(lo) != torch.signbit(hi))   # |s + p| < |hi|
    if rounding == "truncate":
        on_grid = dropped == 0
        out = (raw - dropped) - (on_grid & toward_zero).long() * unit   # just below a kept number: the one under it
    else:
        half = unit >> 1
        away = (dropped > half) | ((dropped == half) & (((raw >> drop) & 1) == 1))   # ties to even
        away = torch.where((dropped == half) & lo.ne(0), ~toward_zero, away)       # not a tie: lo decides
        out = (raw - dropped) + away.long() * unit
    return out.view(torch.float64)


def _add_rounded_exact(s: Tensor, p: Tensor, bits: int, rounding: str) -> Tensor:
    """round(s + p) to `bits` bits, in place in s, where float64's s + p is exact."""
    return _round_(s.add_(p), bits, rounding)


def _as_exact_float64(t: Tensor, name: str) -> Tensor:
    if not isinstance(t, Tensor) or not t.is_floating_point():
        got = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a floating-point tensor (fp8, bf16, fp16 or fp32), got {got}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be a matrix (2-d), got shape {tuple(t.shape)}: for a dot product of "
                         f"vectors x and y pass x[None, :] and y[:, None]")
    if t.dtype not in _SIGNIFICANT_BITS:
        raise TypeError(f"{name} has dtype {t.dtype}; emulated_matmul takes fp32 or narrower inputs")
    if t.dtype == torch.float64 and not torch.equal(t.float().double(), t):
        raise ValueError(f"{name} holds float64 values that float32 cannot: their products would not be exact "
                         f"in float64; pass float32 (or narrower) values")
    out = t.double()
    if not torch.isfinite(out).all():
        raise ValueError(f"{name} holds inf or NaN; emulated_matmul models the rounding of finite sums only")
    return out


def _lowest_bit(t: Tensor, significant_bits: int) -> int | None:
    """An exponent E such that every value of t is a multiple of 2^E (None if t is all zeros)."""
    nonzero = t.abs()[t != 0]
    if nonzero.numel() == 0:
        return None
    return int(torch.frexp(nonzero.min())[1]) - significant_bits    # x >= 2^(e-1) holds bits down to 2^(e-sig)


def _sums_fit_float64(a: Tensor, b: Tensor, bits_a: int, bits_b: int, acc_bits: int, promote_bits: int) -> bool:
    """True when every sum the emulation forms is exact in float64, so its own add can be used.

    Every product, so every partial sum and every rounding of one, is a multiple of 2^t (t from the
    inputs' lowest bits). No sum exceeds sum_k |a_ik| |b_kj| times the growth each rounding allows,
    (1 + 2^(1 - bits)) per step. Integers times 2^t below 2^(53 + t) are all float64 numbers.
    """
    ta, tb = _lowest_bit(a, bits_a), _lowest_bit(b, bits_b)
    if ta is None or tb is None:
        return True                                   # every product is 0
    t = ta + tb
    bound = (a.abs() @ b.abs()).max().item() * (1 + 2.0**-40)      # float64's own rounding, generously
    steps = a.shape[1]
    growth = steps * (math.log1p(2.0 ** (1 - acc_bits)) + math.log1p(2.0 ** (1 - promote_bits)))
    log2_bound = math.log2(bound) + growth / math.log(2) if bound > 0 else -math.inf
    return t >= -1000 and log2_bound < 52 + t


def emulated_matmul(a: Tensor, b: Tensor, acc_bits: int = 24, rounding: str = "nearest",
                    promote_every: int | None = None, promote_bits: int = 24, adder_terms: int = 1) -> Tensor:
    """emulated_matmul(a, b, acc_bits=14, rounding="truncate", promote_every=128): a @ b, summed the narrow way.

    c[i, j] = s_K,  s_k = round_acc_bits(s_(k-1) + a[i, k] * b[k, j]),  s_0 = 0   (k in order, products exact)

    a: (M, K), b: (K, N), fp32 or narrower (fp8, fp16, bf16). Returns float64 (M, N) holding the
    emulated sums exactly. See the module docstring for promote_every, promote_bits and adder_terms.
    """
    bits_a = _SIGNIFICANT_BITS.get(getattr(a, "dtype", None), 24)
    bits_b = _SIGNIFICANT_BITS.get(getattr(b, "dtype", None), 24)
    a, b = _as_exact_float64(a, "a"), _as_exact_float64(b, "b")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must match b's rows")
    _check_bits(acc_bits, "acc_bits")
    _check_bits(promote_bits, "promote_bits")
    _check_rounding(rounding)
    if isinstance(adder_terms, bool) or not isinstance(adder_terms, int) or adder_terms < 1:
        raise ValueError(f"adder_terms is how many products the adder sums before each rounding, an int >= 1, "
                         f"got {adder_terms!r}")
    if promote_every is not None and (isinstance(promote_every, bool) or not isinstance(promote_every, int)
                                      or promote_every < 1 or promote_every % adder_terms):
        raise ValueError(f"promote_every is how many products go into a partial sum before it moves to the wide "
                         f"total: an int >= 1 and a multiple of adder_terms ({adder_terms}), or None; "
                         f"got {promote_every!r}")
    exact = _sums_fit_float64(a, b, bits_a, bits_b, acc_bits, promote_bits if promote_every else 53)
    add = _add_rounded_exact if exact else _add_rounded_twosum
    (M, K), N = a.shape, b.shape[1]
    at = a.t().contiguous()                            # row k: column k of a
    s = torch.zeros(M, N, dtype=torch.float64)
    total = torch.zeros(M, N, dtype=torch.float64)
    done = 0                                           # products summed so far
    chunk = max(1, _CHUNK_VALUES // max(1, M * N)) * adder_terms
    for start in range(0, K, chunk):
        stop = min(start + chunk, K)
        for term in _terms(at[start:stop], b[start:stop], adder_terms, exact, start):
            s = add(s, term, acc_bits, rounding)
            done = min(done + adder_terms, K)
            if promote_every and (done % promote_every == 0 or done == K):
                total = add(total, s, promote_bits, "nearest")
                s = torch.zeros_like(s)
    return total if promote_every else s


def _terms(at: Tensor, b: Tensor, adder_terms: int, exact: bool, offset: int) -> list[Tensor]:
    """What each step adds: one product at[k, :] b[k, :] (an outer product) each, or the exact sum of
    adder_terms of them."""
    products = at[:, :, None] * b[:, None, :]          # (k, M, N), every product exact
    if adder_terms == 1:
        return list(products.unbind(0))
    groups = products.split(adder_terms)
    if exact:
        return [group.sum(0) for group in groups]      # every sum fits float64: exact in any order
    sums = []
    for i, group in enumerate(groups):                 # one product at a time, checking each add is exact
        g = group[0].clone()
        for p in group[1:]:
            hi = g + p
            p_part = hi - g
            if ((g - (hi - p_part)) + (p - p_part)).ne(0).any():
                first = offset + i * adder_terms
                raise ValueError(f"products {first}..{first + len(group) - 1} do not sum exactly in float64 "
                                 f"(they span more than 53 bits), so adder_terms={adder_terms} cannot be "
                                 f"emulated exactly; use adder_terms=1, or inputs with fewer bits (fp8)")
            g = hi
        sums.append(g)
    return sums
