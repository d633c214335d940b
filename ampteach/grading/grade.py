"""Grade exercise notebooks, one or a whole class: the course's checks, restored, run with nbval.

    $ ampteach grade exercises/build_2_loss_scale_update.ipynb        # your own copy
    $ ampteach grade submissions/ --csv gradebook.csv --jobs 4        # submissions/<learner>/<exercise>.ipynb
    $ ampteach grade --timeout 60 alice.ipynb bob.ipynb

Before a notebook runs, every check cell is put back as the course wrote it (as nbgrader's
autograder overwrites its test cells): a check cell you edited or deleted is restored, the check
function is taken from ampteach.grading.checks even if your notebook defined one of the same name, and the
hidden checks (which the exercise does not show) are added where the course has them. The course's
copy of the checks ships inside the package (ampteach/grading/exercise_checks/), so grading works from any
directory. Which exercise a notebook is comes from its metadata (the exercise generator writes it),
else from its file name.

Each code cell runs as its own test in one fresh kernel (`pytest --nbval-lax`, see
ampteach/grading/autograde.py), in a fresh temporary folder, so a folder beside your notebook (one
named `ampteach`, a clone of the course) cannot stand in for the installed package. A wrong answer
fails only its check. A cell that runs longer than --timeout seconds (an endless loop) is
interrupted and the next cells run. A check's result is one of
    passed      it ran without an error
    failed      it raised: the message says what was expected and what came back
    timeout     it ran past --timeout and was interrupted
    missing     it never ran: the kernel died, or stopped answering, before it
    unreadable  the file is not a notebook of a known exercise (one row for the whole file)
Cells are named as you see them: the check's name and `cell [k]`, k counting code cells from the
top, as JupyterLab numbers them after Run All. The score counts every check, hidden ones included.

--csv writes the gradebook: one row per (submission, check) with the columns
    learner, submission, exercise, check, result, passed, checks, message
(passed: 1 if the check passed, else 0; checks: 1, or for an unreadable file the number of checks its
exercise has, each counted as not passed), then one row per learner with check "all checks", result
"total", passed and checks summed over their submissions, and the exercises not yet complete as the
message. An unreadable file's exercise is the one its file name says (else the file's name).
The learner is the first folder below PATH (submissions/<learner>/...), or a single notebook's folder.
Grading runs your notebook's code on this machine: it stops honest mistakes and the obvious ways of
gaming a check, it is not a sandbox against code written to attack the grader.
"""

from __future__ import annotations

import csv
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ampteach.grading.autograde import autograde, course_copy, exercise_from_name, known_exercises, which_exercise

__all__ = ["RESULTS", "TOTAL", "CSV_COLUMNS", "CheckResult", "Submission", "grade_notebook", "find_submissions",
           "grade_all", "format_grade", "summary_table", "gradebook_rows", "write_csv", "add_arguments", "run"]

RESULTS = ("passed", "failed", "timeout", "missing", "unreadable")
TOTAL = "total"        # the result column of a learner's total row
CSV_COLUMNS = ("learner", "submission", "exercise", "check", "result", "passed", "checks", "message")


# --- results ------------------------------------------------------------------------------------------

@dataclass
class CheckResult:
    check: str          # "check_loss_scale_update, cell [3]": the name a learner can find
    result: str         # one of RESULTS
    message: str = ""


@dataclass
class Submission:
    path: Path
    learner: str
    exercise: str = "?"
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # other cells that failed (not scored), restorations

    @property
    def passed(self) -> int:
        return sum(c.result == "passed" for c in self.checks)

    @property
    def total(self) -> int:
        """Checks counted: those that ran, or all of the exercise's when the file could not be graded."""
        return sum(self.checks_of(c) for c in self.checks)

    def checks_of(self, c: CheckResult) -> int:
        """How many checks a row stands for: 1, or an unreadable file's whole exercise (none if unknown)."""
        if c.result != "unreadable":
            return 1
        return len(course_copy(self.exercise)["checks"]) if self.exercise in known_exercises() else 0

    @property
    def unreadable(self) -> bool:
        return any(c.result == "unreadable" for c in self.checks)


def grade_notebook(path: str | Path, timeout: float = 120.0, learner: str | None = None) -> Submission:
    """Restore the course's checks in one notebook, run it in a fresh kernel, and collect each check's result."""
    path = Path(path)
    sub = Submission(path, learner or path.resolve().parent.name, exercise_from_name(path) or path.name)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook: a row in the gradebook, not a crash
        sub.checks.append(CheckResult("-", "unreadable", f"cannot read {path.name} as a notebook: {exc}"))
        return sub
    exercise = which_exercise(nb, path)
    if exercise is None:
        sub.checks.append(CheckResult("-", "unreadable", f"{path.name} is not one of the course's exercises "
                                      f"(its metadata names none, nor does its file name): "
                                      f"{', '.join(known_exercises())}"))
        return sub
    sub.exercise = exercise
    cells, sub.notes = autograde(nb, exercise, timeout)
    for cell in cells:
        if cell.check is not None:
            sub.checks.append(CheckResult(cell.check, cell.result, cell.message))
        elif cell.result in ("failed", "timeout"):
            first = cell.message.splitlines()[0] if cell.message else ""
            sub.notes.append(f"cell [{cell.position}] (not a check) {cell.result}: {first}")
    return sub


# --- finding submissions, reporting ----------------------------------------------------------------------------

def find_submissions(paths: list[str]) -> list[tuple[Path, str]]:
    """(notebook, learner) for each PATH: a notebook (learner: its folder's name) or a folder of them
    (submissions/<learner>/<exercise>.ipynb: learner = the first folder below PATH)."""
    found = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            for nb in sorted(path.rglob("*.ipynb")):
                if ".ipynb_checkpoints" in nb.parts:
                    continue
                rel = nb.relative_to(path)
                found.append((nb, rel.parts[0] if len(rel.parts) > 1 else path.resolve().name))
        else:
            found.append((path, path.resolve().parent.name))
    return found


def grade_all(paths: list[str], timeout: float = 120.0, jobs: int | None = None) -> list[Submission]:
    """Grade every notebook found under paths, `jobs` at a time (default: one per CPU core)."""
    found = find_submissions(paths)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(found) or 1))

    def one(item: tuple[Path, str]) -> Submission:
        path, learner = item
        if not path.is_file():
            sub = Submission(path, learner, exercise_from_name(path) or path.name)
            sub.checks.append(CheckResult("-", "unreadable", f"no such file: {path}"))
            return sub
        return grade_notebook(path, timeout, learner)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, found))


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    lines = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width, initial_indent=indent, subsequent_indent=indent + "  ",
                               break_long_words=False, break_on_hyphens=False) or [indent]
    return lines


def format_grade(sub: Submission, width: int = 100) -> str:
    """A submission's checks, each failure's message in full (wrapped), then its score."""
    lines = [f"{sub.path}  ({sub.exercise}, {sub.learner})"]
    for c in sub.checks:
        lines.append(f"  {c.result.upper() if c.result != 'passed' else 'passed':10s} {c.check}")
        if c.result != "passed" and c.message:
            lines += _wrap(c.message, " " * 13, width)
    for note in sub.notes:
        lines += _wrap(f"note: {note}", "  ", width)
    if not sub.unreadable:
        lines.append(f"  score {sub.passed}/{sub.total} checks passed")
    return "\n".join(lines)


def summary_table(subs: list[Submission]) -> str:
    """One line per learner: notebooks, checks passed, and the exercises not yet complete."""
    learners = _by_learner(subs)
    name_width = max([len(name) for name in learners] + [7])
    lines = [f"{'learner':<{name_width}}  notebooks  passed  checks  score  not complete"]
    for name, own in learners.items():
        passed, total = sum(s.passed for s in own), sum(s.total for s in own)
        todo = _not_complete(own)
        score = f"{100 * passed / total:4.0f}%" if total else "   -"
        lines.append(f"{name:<{name_width}}  {len(own):9d}  {passed:6d}  {total:6d}  {score}  {', '.join(todo) or '-'}")
    return "\n".join(lines)


def _by_learner(subs: list[Submission]) -> dict[str, list[Submission]]:
    learners: dict[str, list[Submission]] = {}
    for sub in subs:
        learners.setdefault(sub.learner, []).append(sub)
    return dict(sorted(learners.items()))


def _not_complete(own: list[Submission]) -> list[str]:
    return [s.exercise if not s.unreadable else f"{s.path.name} (unreadable)" for s in own
            if s.unreadable or s.passed < s.total]


def gradebook_rows(subs: list[Submission]) -> list[dict]:
    """The CSV's rows (CSV_COLUMNS): every check of every submission, then each learner's total."""
    rows = [{"learner": sub.learner, "submission": str(sub.path), "exercise": sub.exercise, "check": c.check,
             "result": c.result, "passed": int(c.result == "passed"), "checks": sub.checks_of(c), "message": c.message}
            for sub in subs for c in sub.checks]
    for learner, own in _by_learner(subs).items():
        passed, total = sum(s.passed for s in own), sum(s.total for s in own)
        todo = _not_complete(own)
        message = (f"{passed} of {total} checks passed in {len(own)} notebook(s); "
                   + (f"not complete: {', '.join(todo)}" if todo else "all complete"))
        rows.append({"learner": learner, "submission": "", "exercise": "", "check": "all checks", "result": TOTAL,
                     "passed": passed, "checks": total, "message": message})
    return rows


def write_csv(subs: list[Submission], path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(gradebook_rows(subs))


def add_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="exercise notebooks, or folders of them (submissions/<learner>/<exercise>.ipynb)")
    parser.add_argument("--csv", metavar="FILE",
                        help="write the gradebook: one row per (submission, check), then one total per learner")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a cell may run (default 120)")
    parser.add_argument("--jobs", type=int, default=None, help="notebooks graded at once (default: one per CPU core)")


def run(args) -> int:
    subs = grade_all(args.paths, timeout=args.timeout, jobs=args.jobs)
    if not subs:
        print("no notebooks found in " + ", ".join(args.paths))
        return 1
    for sub in subs:
        print(format_grade(sub))
        print()
    if len({s.learner for s in subs}) > 1 or len(subs) > 1:
        print(summary_table(subs))
    if args.csv:
        write_csv(subs, args.csv)
        learners = len({s.learner for s in subs})
        print(f"\ngradebook: {args.csv} ({sum(len(s.checks) for s in subs)} check rows, {learners} learner total(s))")
    complete = all(s.total and s.passed == s.total and not s.unreadable for s in subs)
    return 0 if complete else 1
