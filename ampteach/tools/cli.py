"""The `ampteach` command: doctor, bench, grade, data.

    ampteach start [DIR]             # your own course folder (lessons, exercises), opened in JupyterLab
    ampteach doctor                  # what this machine can do with mixed precision, and what to use
    ampteach bench --device auto     # E.6.1: fp32 vs fp16 vs bf16, torch.amp vs ampteach
    ampteach grade exercises/*.ipynb # run the check cells, print a per-check table and a score
    ampteach data [download]         # where the dataset comes from; fetch the full one on request
    ampteach roofline --device cpu   # matmul GFLOP/s in fp32, bf16, fp16 against this machine's measured roofs
    ampteach site --out site/        # the course as a static website (stored outputs), then open site/index.html
    ampteach export nbgrader DIR     # the exercises as an nbgrader course (or `otter DIR`: Otter master notebooks)
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with add_arguments(parser) and run(args) -> exit code
COMMANDS = {
    "start": "ampteach.tools.start",
    "doctor": "ampteach.tools.doctor",
    "bench": "ampteach.tools.bench",
    "grade": "ampteach.grading.grade",
    "data": "ampteach.tools.data_command",
    "roofline": "ampteach.tools.roofline_command",
    "site": "ampteach.tools.website",
    "export": "ampteach.tools.export_command",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ampteach", description="Mixed-precision training, taught from scratch.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.__doc__.strip().splitlines()[0], description=module.__doc__)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
