"""The lessons' measurements on a real device, for benchmarks/gpu_report.sh: what the CPU lessons could only emulate.

    python benchmarks/gpu_lessons.py --device cuda --roofline F.json --markdown F.md
    python benchmarks/gpu_lessons.py --device cpu  ...     # the same measurements on this CPU (how it is tested)

Lesson 7: the roofline (matmul GFLOP/s in fp32, tf32 where the device has it, bf16, fp16, and the measured
memory roof) and the width sweep of the course MLP (samples/s by width and precision). Lesson 9: fp16 attention
scores with outlier features on the device's own kernels (scale after q @ kᵀ, scale first, SDPA per backend,
bf16). Lesson 10: which emulated accumulator reproduces the device's half-precision matmul. Each section is a
function from the device to a markdown section; the file starts with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import torch

from ampteach import course_split, load_fashion_mnist, preload
from ampteach.amp.accumulator import emulated_matmul, round_to_bits
from ampteach.lab.accumulation_error import ACCUMULATOR_NAMES
from ampteach.lab.attention_overflow import VARIANTS, attention, outlier_qkv, overflow_size, reference
from ampteach.lab.roofline import format_table, roofline_table, speedups
from ampteach.lab.step_time import width_sweep
from ampteach.training.machine import machine_line

SIZES = {"cuda": (1024, 2048, 4096, 8192), "cpu": (256, 512)}
WIDTHS = {"cuda": (1024, 4096, 8192), "cpu": (256, 1024)}
OUTLIER_SIZES = [10 ** (i / 5) for i in range(21)]               # lesson 9's sweep: a from 1 to 10,000
MATMUL_SHAPES = {"cuda": (64, 1024, 64), "cpu": (32, 256, 32)}  # lesson 10: (M, K, N) of the matmul compared


def roofline_section(device: str, out: Path | None) -> str:
    """Lesson 7's roofline on this device; the JSON beside it holds the full table and the sweep."""
    table = roofline_table(device, sizes=SIZES[device], min_seconds=0.2 if device == "cuda" else 0.05)
    precisions = ("fp32", "bf16", "fp16") if device == "cuda" else ("fp32", "bf16")
    data = preload(course_split(load_fashion_mnist()), device=device)
    rows = width_sweep(WIDTHS[device], data, precisions=precisions, min_seconds=0.3 if device == "cuda" else 0.1)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        settings = {"model": "mlp:W,W", "batch_size": 256, "optimizer": "adamw"}
        out.write_text(json.dumps({"roofline": table, "sweep": {"settings": settings, "rows": rows}}, indent=2) + "\n")
    sweep = "\n".join(f"| {r['width']} | {r['precision']} | {r['samples_per_s']:,.0f} | {r['speedup_vs_fp32']:.2f}x |"
                      for r in rows)
    ratios = ", ".join(f"{d} {max(v.values()):.1f}x" for d, v in speedups(table).items() if d != "fp32")
    return (f"## Lesson 7: the roofline and the width sweep\n\n```\n{format_table(table)}\n```\n\n"
            f"Best half-precision matmul speed-up over fp32: {ratios or 'none measured'}.\n\n"
            f"| width | precision | samples/s | vs fp32 |\n|---|---|---|---|\n{sweep}\n")


def _sdpa_backends(device: str) -> list[tuple[str, object]]:
    """(label, backend or None for torch's own choice) of the SDPA backends to try on device."""
    from torch.nn.attention import SDPBackend
    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH") if device == "cuda" else \
        ("FLASH_ATTENTION", "MATH")
    return [("torch's choice", None)] + [(n, getattr(SDPBackend, n)) for n in names if hasattr(SDPBackend, n)]


def _largest_finite_and_error(device: str, dtype: torch.dtype, scale: str, backend=None) -> tuple[float, float]:
    """(largest outlier size a whose attention output is finite, relative error at a = 100) of one variant."""
    from torch.nn.attention import sdpa_kernel
    last, error_100 = 0.0, float("nan")
    for size in OUTLIER_SIZES:
        q, k, v = outlier_qkv(size, n_outliers=2, T=64, d=64)
        exact = reference(q, k, v)
        if backend is None:
            out, _ = attention(q.to(device), k.to(device), v.to(device), dtype, scale)
        else:
            with sdpa_kernel([backend]):
                out, _ = attention(q.to(device), k.to(device), v.to(device), dtype, scale)
        if not bool(torch.isfinite(out).all()):
            break
        last = size
        if abs(size - 100.0) < 1e-9:
            error_100 = ((out.double().cpu() - exact).norm() / exact.norm()).item()
    return last, error_100


def attention_overflow_section(device: str, out: Path | None) -> str:
    """Lesson 9: from which outlier size a each attention variant stops being finite, on the device's kernels."""
    expected = {"after": f"{overflow_size(2, 64, 'after'):,.0f}", "before": f"{overflow_size(2, 64, 'before'):,.0f}"}
    rows = []
    for name, (dtype, scale) in VARIANTS.items():
        if scale == "sdpa":
            for label, backend in _sdpa_backends(device):
                try:
                    last, err = _largest_finite_and_error(device, dtype, scale, backend)
                    rows.append(f"| fp16, SDPA ({label}) | {last:,.0f} | none | {err:.2e} |")
                except RuntimeError as exc:   # a backend that cannot run these inputs on this device
                    rows.append(f"| fp16, SDPA ({label}) | not run: {str(exc).splitlines()[0][:80]} | | |")
            continue
        last, err = _largest_finite_and_error(device, dtype, scale)
        edge = "none below 10^19" if dtype == torch.bfloat16 else expected[scale]
        rows.append(f"| {name} | {last:,.0f} | {edge} | {err:.2e} |")
    return ("## Lesson 9: fp16 attention scores with outlier features\n\n"
            "q, k, v of one head (64 tokens, d = 64), N(0, 1) with two outlier features of size a in q and k; "
            f"a swept from 1 to 10,000 in 21 steps; causal. On {machine_line(device)}.\n\n"
            "The fp16 edge is where the stored score 2a² (scale after) or 2a²/8 (scale first) reaches 65,520.\n\n"
            "| variant | finite up to a | fp16 edge | relative error at a = 100 |\n|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def _device_matmul(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    """a @ b with a, b cast to dtype, on device's own kernel, returned as float64 on the CPU."""
    return (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()


def accumulator_section(device: str, out: Path | None) -> str:
    """Lesson 10: the share of the device's half-precision matmul outputs each emulated accumulator reproduces."""
    m, k, n = MATMUL_SHAPES[device]
    gen = torch.Generator().manual_seed(0)
    a, b = torch.rand(m, k, generator=gen), torch.rand(k, n, generator=gen)
    bits_out = {torch.bfloat16: 8, torch.float16: 11}
    candidates = (8, 11, 14, 16, 20, 24, 53)
    settings = [(dtype, None) for dtype in bits_out]
    if device == "cuda":   # cuBLAS may reduce in half precision when this flag allows it (it does by default)
        settings = [(torch.bfloat16, "allow_bf16_reduced_precision_reduction"),
                    (torch.float16, "allow_fp16_reduced_precision_reduction")]
    rows = []
    for dtype, flag in settings:
        emulated = {bits: round_to_bits(emulated_matmul(a.to(dtype), b.to(dtype), acc_bits=bits), bits_out[dtype])
                    for bits in candidates}
        for allowed in ((True, False) if flag else (None,)):
            if flag:
                before = getattr(torch.backends.cuda.matmul, flag)
                setattr(torch.backends.cuda.matmul, flag, allowed)
            try:
                got = _device_matmul(a, b, dtype, device)
            finally:
                if flag:
                    setattr(torch.backends.cuda.matmul, flag, before)
            shares = " | ".join(f"{(emulated[bits] == got).double().mean().item():.1%}" for bits in candidates)
            label = str(dtype).removeprefix("torch.") + (f", {flag}={allowed}" if flag else "")
            rows.append(f"| {label} | {shares} |")
    header = " | ".join(ACCUMULATOR_NAMES[bits] for bits in candidates)
    return ("## Lesson 10: which accumulator does the device's half-precision matmul match\n\n"
            f"torch.rand inputs ({m} x {k} @ {k} x {n}), cast to the half dtype; the device's a @ b against "
            "emulated_matmul summing in k order with each accumulator width, then rounded to the output dtype. "
            f"Share of the {m * n} outputs reproduced exactly, on {machine_line(device)}.\n\n"
            f"| matmul | {header} |\n|---|" + "---|" * len(candidates) + "\n" + "\n".join(rows) + "\n")


SECTIONS: list[Callable[[str, Path | None], str]] = [roofline_section, attention_overflow_section,
                                                     accumulator_section]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--roofline", type=Path, default=None, help="write lesson 7's roofline and sweep as JSON")
    parser.add_argument("--markdown", type=Path, default=None, help="write the report as markdown")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda, but torch {torch.__version__} sees no GPU here; use --device cpu")
    parts = [f"# The lessons' measurements on {machine_line(args.device)}\n\n"
             f"Measured by `benchmarks/gpu_lessons.py --device {args.device}` on {time.strftime('%Y-%m-%d')}.\n"]
    failed = 0
    for section in SECTIONS:
        start = time.perf_counter()
        try:
            parts.append(section(args.device, args.roofline))
        except Exception as exc:  # one broken section must not cost the others' numbers on a borrowed machine
            failed += 1
            parts.append(f"## {section.__name__} failed\n\n```\n{type(exc).__name__}: {exc}\n```\n")
        print(f"{section.__name__}: {time.perf_counter() - start:.1f} s", flush=True)
    report = "\n".join(parts)
    print(report)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
