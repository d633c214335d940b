"""`ampteach roofline`: matmul GFLOP/s in fp32, bf16 and fp16 against this machine's measured roofs.

    $ ampteach roofline --device cpu --sizes 256,512,1024,2048 --out roofline.json

The command-line front of ampteach.lab.roofline (roofline_table measures, format_table prints).
"""

from __future__ import annotations

from pathlib import Path

from ampteach.lab.roofline import DEFAULT_SIZES, DTYPES, format_table, roofline_table
from ampteach.tools.command import run_command

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--sizes", default=None, help=f"comma-separated matrix sizes (default {DEFAULT_SIZES})")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of fp32,bf16,fp16")
    parser.add_argument("--add", action="store_true", help="also time an elementwise add (memory-bound) per size")
    parser.add_argument("--min-seconds", type=float, default=0.2, help="timing window per measurement")
    parser.add_argument("--max-seconds", type=float, default=20.0,
                        help="skip a dtype's larger sizes once one matmul takes longer than this (emulated formats)")
    parser.add_argument("--clock", default="auto", choices=("auto", "wall", "cpu"),
                        help="cpu: one thread's CPU time (needs OMP_NUM_THREADS=1), for a shared machine; "
                             "auto: cpu where torch has one thread, else wall")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON")


def run(args) -> int:
    def measure() -> dict:
        try:
            sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
        except ValueError:
            raise ValueError(f"--sizes must be comma-separated matrix sizes like 256,512,1024, "
                             f"got {args.sizes!r}") from None
        ops = ("matmul", "add") if args.add else ("matmul",)
        return roofline_table(args.device, sizes, tuple(args.dtypes.split(",")), ops, args.min_seconds,
                              args.max_seconds, clock=args.clock)

    return run_command("roofline", measure, format_table, args.out)
