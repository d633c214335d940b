"""The `ampteach` command: doctor, bench, grade, data.

    ampteach start [DIR]             # your own course folder (lessons, exercises), opened in JupyterLab
    ampteach start -- --allow-root   # options after `--` go to JupyterLab (--allow-root, --port N, --no-browser)
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


def split_passed_on(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own arguments, the ones after `--` it hands on), for a command whose module names
    where they go (PASSES_ON: `ampteach start DIR -- --allow-root` passes `--allow-root` to JupyterLab).
    For any other command `--` is argparse's own end of options and stays."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    command = next((a for a in argv[:cut] if not a.startswith("-")), None)
    if command not in COMMANDS or not hasattr(importlib.import_module(COMMANDS[command]), "PASSES_ON"):
        return argv, []
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    own, passed_on = split_passed_on(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(own)
    args.passed_on = passed_on
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
