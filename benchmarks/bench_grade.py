"""Target: grading a class costs at most 1.5x what it cost before the sandbox and the out-of-process judge.

    python benchmarks/bench_grade.py                       # 16 learners x 2 exercises, --jobs 2
    python benchmarks/bench_grade.py --learners 4 --jobs 1 # a smaller class
    python benchmarks/bench_grade.py --sandbox off         # the same class without the sandbox

Writes a class of submissions (each learner hands in the course's worked solutions of two exercises,
build_2_loss_scale_update and fix_fp16_attention), then runs `ampteach grade submissions/ --jobs J
--csv gradebook.csv` as a teacher does, in a new process. Prints the wall time, the CPU time of the
grader and everything it started (user + system), the CPU time per notebook, the machine's load, and
whether every submission got full marks on what it handed in.

CPU time is read from the processes the benchmark waits for (RUSAGE_CHILDREN): a process inside
bubblewrap's PID namespace is reaped inside it and never counted there, so with the sandbox on the CPU
figure leaves the notebooks' own processes out. Measure CPU with `--sandbox off` (the same processes,
unisolated: the namespaces themselves cost next to nothing) and compare wall times on and off.
Before the sandbox and the judge (nbval in one unsandboxed kernel per notebook, checks in the
learner's kernel), on the machine and day named in benchmarks/README.md, the same class took the
figures recorded there; the target is at most 1.5x that CPU time per notebook.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ("build_2_loss_scale_update", "fix_fp16_attention")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def write_class(folder: Path, learners: int) -> int:
    """submissions/<learner>/<exercise>.ipynb: every learner hands in the worked solutions."""
    n = 0
    for i in range(learners):
        own = folder / f"learner{i:02d}"
        own.mkdir(parents=True)
        for name in EXERCISES:
            shutil.copy(ROOT / "solutions" / f"{name}.ipynb", own / f"{name}.ipynb")
            n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sandbox", default=None, help="passed to `ampteach grade --sandbox` when given")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "submissions"
        notebooks = write_class(subs, args.learners)
        book = Path(tmp) / "gradebook.csv"
        cmd = [sys.executable, "-m", "ampteach", "grade", str(subs), "--jobs", str(args.jobs), "--csv", str(book)]
        if args.sandbox:
            cmd += ["--sandbox", args.sandbox]
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) before grading; "
              f"{notebooks} notebooks, --jobs {args.jobs}")
        cpu, start = children_cpu(), time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu
        rows = [row for row in csv.DictReader(book.open())] if book.exists() else []
        handed = {}                  # learner -> (passed, checks) over the exercises handed in
        for row in rows:
            if row["exercise"] in EXERCISES and row["submission"]:
                passed, checks = handed.get(row["learner"], (0, 0))
                handed[row["learner"]] = (passed + int(row["passed"]), checks + int(row["checks"]))
        full = sum(passed == checks > 0 for passed, checks in handed.values())
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (grader and everything it started), {cpu / notebooks:.1f} s CPU "
          f"per notebook; load average {os.getloadavg()[0]:.1f} after")
    print(f"{full} of {len(handed)} learners with full marks on the exercises they handed in; {notebooks} notebooks "
          f"(exit status {run.returncode}: 1, since nobody handed in the whole course)")
    print(run.stdout.splitlines()[0] if run.stdout else "")
    if full != args.learners:
        print(run.stdout[-3000:], run.stderr[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
