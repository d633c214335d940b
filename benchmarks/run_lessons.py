"""Execute every lesson on one device, as a learner with AMPTEACH_DEVICE set would: the whole course in one command.

    python benchmarks/run_lessons.py --device cuda                 # -> ampteach/results/gpu/<machine>/
    python benchmarks/run_lessons.py --device cpu --out /tmp/run   # the same on this CPU (how it is tested)
    python benchmarks/run_lessons.py --device cuda --only 07 09    # some lessons (file name prefixes)

Each lesson in notebooks/ runs top to bottom in a fresh kernel (nbclient) with AMPTEACH_DEVICE=<device>,
each cell with its own time limit (--cell-timeout) and the whole run with a budget (--budget): a lesson
that would start after the budget is spent is listed as not run. A cell that fails is recorded and the
next cells still run (allow_errors). Written to the output folder:
    <lesson>.ipynb     the executed copy, outputs as they came on this device
    summary.json       per lesson: seconds, cells run / failed (each failure's cell number and error),
                       the device's name, torch's version, the machine line, the date
    summary.md         the same as a table, for people (the website shows it beside the lessons)
<machine> is ampteach.training.machine.machine_tag(device), e.g. cuda-nvidia-h100-80gb-hbm3.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET = 8 * 60.0


def lessons(only: list[str] | None = None, folder: Path = ROOT / "notebooks") -> list[Path]:
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    return [p for p in found if not only or any(p.name.startswith(prefix) for prefix in only)]


def run_one(path: Path, out: Path, cell_timeout: float) -> dict:
    """Execute one lesson; its row of the summary."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    problem = ""
    try:
        client.execute()
    except Exception as exc:  # a cell past its time, a dead kernel: the lesson stops there, the run goes on
        problem = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
    seconds = time.perf_counter() - start
    failed, ran, position = [], 0, 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        position += 1
        if cell.get("execution_count") is not None or cell.get("outputs"):
            ran += 1
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            failed.append({"cell": position, "error": f"{errors[0].get('ename')}: {errors[0].get('evalue', '')}"[:300]})
    nbformat.write(nb, out / path.name)
    code = sum(c.cell_type == "code" for c in nb.cells)
    return {"lesson": path.stem, "seconds": round(seconds, 1), "cells": code, "ran": ran, "failed": failed,
            "stopped": problem}


def markdown(summary: dict) -> str:
    lines = [f"# The lessons on {summary['device_name']}", "",
             f"{summary['machine']}; torch {summary['torch']}; AMPTEACH_DEVICE={summary['device']}; "
             f"{summary['date']}; {summary['seconds']:.0f} s in all.", "",
             "| lesson | seconds | cells run | cells failed | what stopped it |", "|---|---|---|---|---|"]
    for row in summary["lessons"]:
        failed = "; ".join(f"[{f['cell']}] {f['error'][:80]}" for f in row.get("failed", [])) or "-"
        lines.append(f"| {row['lesson']} | {row.get('seconds', '-')} | {row.get('ran', 0)}/{row.get('cells', '?')} | "
                     f"{failed} | {row.get('stopped') or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="default: ampteach/results/gpu/<machine>/")
    parser.add_argument("--cell-timeout", type=float, default=300.0)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for the whole run")
    parser.add_argument("--only", nargs="*", default=None, help="lesson file name prefixes (00, 07, ...)")
    parser.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    from ampteach.training.machine import machine_line, machine_tag

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"--device cuda, but torch {torch.__version__} sees no GPU here; use --device cpu")
        return 2
    out = args.out or ROOT / "ampteach" / "results" / "gpu" / machine_tag(args.device)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["AMPTEACH_DEVICE"] = args.device        # the kernels inherit it: every lesson's first cell reads it
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    name = torch.cuda.get_device_name() if args.device == "cuda" else machine_line("cpu").split(" | ")[0]
    summary = {"device": args.device, "device_name": name, "torch": torch.__version__,
               "machine": machine_line(args.device), "date": dt.date.today().isoformat(), "lessons": []}
    start = time.perf_counter()
    for path in lessons(args.only, args.notebooks):
        spent = time.perf_counter() - start
        if spent > args.budget:
            summary["lessons"].append({"lesson": path.stem, "stopped": f"not run: the {args.budget:.0f} s budget "
                                                                          f"was spent ({spent:.0f} s)"})
            continue
        row = run_one(path, out, args.cell_timeout)
        print(f"{row['lesson']}: {row['seconds']:.0f} s, {row['ran']}/{row['cells']} cells, {len(row['failed'])} "
              f"failed{'; ' + row['stopped'] if row['stopped'] else ''}", flush=True)
        summary["lessons"].append(row)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print(f"wrote {out}/summary.md")
    return 0 if all(not r.get("failed") and not r.get("stopped") for r in summary["lessons"]) else 1


if __name__ == "__main__":
    sys.exit(main())
