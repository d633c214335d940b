"""Targets on a CPU with AMX-BF16: a bf16 matmul at n = 2048 runs >= 3x fp32's GFLOP/s, and bf16 autocast
trains the course MLP 784-2048-2048-10 (batch 256, AdamW) at >= 1.5x fp32's samples/s.

    python benchmarks/bench_roofline.py              # prints the device, the ratios and each target's status
    python benchmarks/bench_roofline.py --out F.json # also writes the roofline table and the sweep rows
    OMP_NUM_THREADS=1 python benchmarks/bench_roofline.py     # one core, timed by its CPU time (shared machine)

On other CPUs the targets do not apply (the script says why, from the doctor's findings) and it prints what
it measured. Timings are the fastest of repeated calls or steps; on a shared machine run it when it is quiet.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ampteach import course_split, load_fashion_mnist, preload
from ampteach.lab.roofline import format_table, roofline_table, speedups
from ampteach.lab.step_time import width_sweep
from ampteach.tools.doctor import collect

MATMUL_TARGET, TRAIN_TARGET = 3.0, 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--clock", default="auto", choices=("auto", "wall", "cpu"),
                        help="cpu: CPU time, needs one thread; auto: cpu where torch has one thread")
    args = parser.parse_args()
    report = collect()
    print(f"{report.cpu_name}, torch {report.torch}, {report.threads} threads; doctor: {report.recommendation}")
    table = roofline_table("cpu", sizes=(256, 512, 1024, 2048), ops=("matmul", "add"), max_seconds=30.0,
                           clock=args.clock)
    print(format_table(table))
    rows = width_sweep((256, 1024, 2048, 4096), preload(course_split(load_fashion_mnist())), clock=args.clock)
    for r in rows:
        print(f"W={r['width']:5d} {r['precision']}: {r['samples_per_s']:10,.0f} samples/s "
              f"({r['speedup_vs_fp32']:.2f}x)")
    matmul = speedups(table).get("bf16", {}).get(2048)
    train = next(r["speedup_vs_fp32"] for r in rows if r["width"] == 2048 and r["precision"] == "bf16")
    if args.out:
        settings = {"model": "mlp:W,W", "batch_size": 256, "optimizer": "adamw", "clock": args.clock}
        sweep = {"settings": settings, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"roofline": table, "sweep": sweep}, indent=2) + "\n")
    if not report.cpu_flags.get("amx_bf16"):
        print(f"targets apply to AMX-BF16 CPUs; this one has none (bf16 matmul at 2048: "
              f"{'not measured (too slow)' if matmul is None else f'{matmul:.2f}x'}, training at W=2048: {train:.2f}x)")
        return 0
    ok = matmul is not None and matmul >= MATMUL_TARGET and train >= TRAIN_TARGET
    print(f"bf16 matmul at 2048: {matmul:.2f}x (target >= {MATMUL_TARGET}x); "
          f"training at W=2048: {train:.2f}x (target >= {TRAIN_TARGET}x): {'MET' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
