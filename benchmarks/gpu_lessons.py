"""The lessons' measurements on a real device, for benchmarks/gpu_report.sh: what the CPU lessons could only emulate.

    python benchmarks/gpu_lessons.py --device cuda --roofline F.json --markdown F.md
    python benchmarks/gpu_lessons.py --device cpu  ...     # the same measurements on this CPU (how it is tested)

Lesson 7: the roofline (matmul GFLOP/s in fp32, tf32 where the device has it, bf16, fp16, and the measured
memory roof) and the width sweep of the course MLP (samples/s by width and precision). Each section is a
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
from ampteach.lab.roofline import format_table, roofline_table, speedups
from ampteach.lab.step_time import width_sweep
from ampteach.training.machine import machine_line

SIZES = {"cuda": (1024, 2048, 4096, 8192), "cpu": (256, 512)}
WIDTHS = {"cuda": (1024, 4096, 8192), "cpu": (256, 1024)}


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


SECTIONS: list[Callable[[str, Path | None], str]] = [roofline_section]


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
