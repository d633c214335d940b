"""Grade exercise notebooks, one or a whole class: each in a sandbox, every check judged outside it.

    $ ampteach grade exercises/build_2_loss_scale_update.ipynb        # your own copy
    $ ampteach grade submissions/ --csv gradebook.csv --jobs 4        # submissions/<learner>/<exercise>.ipynb
    $ ampteach grade --sandbox required --timeout 60 alice.ipynb      # refuse to grade without a sandbox

Before a notebook runs, every check cell is put back as the course wrote it (as nbgrader's autograder
overwrites its test cells): a check cell you edited or deleted is restored, and the hidden checks (which
the exercise does not show) are added where the course has them. Which exercise a notebook is comes
from its metadata (the exercise generator writes it), else from its file name.

The notebook's cells run in a process of their own, in a sandbox (ampteach/grading/sandbox.py: no
network, its own PID namespace, a read-only view of the system, an unprivileged user, memory and time
limits, everything it started ended with it); the checks are judged in the grader's process
(ampteach/grading/autograde.py, ampteach/grading/judges/), which draws new inputs for every check, asks
the notebook's process to run the learner's functions on them, and compares. So no notebook can see
a check's expected answer, change a verdict, another submission or the gradebook. Without bubblewrap
the notebook runs unisolated and the grader says so in one line; `--sandbox required` refuses then.

A check's result is one of
    passed      the judge found the answer right
    failed      it did not: the message says what was expected and what came back
    timeout     a cell or a check ran past --timeout and was interrupted
    missing     it never ran: the notebook's process ended, or stopped answering, before it; or the
                exercise was not handed in (a class graded as a folder lists every exercise)
    unreadable  the file is not a notebook of a known exercise (one row for the whole file)
Cells are named as you see them: the check's name and `cell [k]`, k counting code cells from the
top, as JupyterLab numbers them after Run All. The score counts every check, hidden ones included.

--csv writes the gradebook: one row per (submission, check) with the columns CSV_COLUMNS: check_id
names the check the same way for every learner (exercise/check_function), check as the learner sees
it; passed is 1 if the check passed, else 0; checks is 1, or for an unreadable or missing notebook the
number of checks its exercise has, each counted as not passed; copied_solution is "yes" when the
submission's answer cells are the course's own worked solution as published in solutions/. Then one
row per learner with check "all checks", result "total", passed and checks summed over every exercise
of the course (when grading a folder) and the exercises not complete as the message. The learner is
the first folder below PATH (submissions/<learner>/...); for single notebooks, --learner NAME, else
the folder that holds the notebook (or, for a course folder's exercises/, the course folder).
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ampteach.grading.autograde import (
    autograde,
    copied_solution,
    course_copy,
    exercise_from_name,
    known_exercises,
    which_exercise,
)
from ampteach.grading.sandbox import DEFAULT_MEMORY_GB, MODES, Sandbox, SandboxUnavailable, find_sandbox

__all__ = ["RESULTS", "TOTAL", "CSV_COLUMNS", "CheckResult", "Submission", "grade_notebook", "find_submissions",
           "grade_all", "format_grade", "summary_table", "gradebook_rows", "write_csv", "add_arguments", "run",
           "check_id", "learner_of"]

RESULTS = ("passed", "failed", "timeout", "missing", "unreadable")
TOTAL = "total"        # the result column of a learner's total row
CSV_COLUMNS = ("learner", "submission", "exercise", "check_id", "check", "result", "passed", "checks",
               "copied_solution", "message")


# --- results ------------------------------------------------------------------------------------------

def check_id(exercise: str, functions) -> str:
    """The same name for a check in every learner's rows: exercise/check_a+check_b."""
    return f"{exercise}/{'+'.join(functions) or '-'}"


@dataclass
class CheckResult:
    check: str          # "check_loss_scale_update, cell [3]": the name a learner can find
    result: str         # one of RESULTS
    message: str = ""
    check_id: str = ""  # "build_2_loss_scale_update/check_loss_scale_update": the same for every learner


@dataclass
class Submission:
    path: Path
    learner: str
    exercise: str = "?"
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # other cells that failed (not scored), restorations
    copied: bool = False      # the answer cells are the course's worked solution, as published

    @property
    def passed(self) -> int:
        return sum(c.result == "passed" for c in self.checks)

    @property
    def total(self) -> int:
        """Checks counted: those that ran, or all of the exercise's when the file could not be graded."""
        return sum(self.checks_of(c) for c in self.checks)

    def checks_of(self, c: CheckResult) -> int:
        """How many checks a row stands for: 1, or an unreadable or missing file's whole exercise (none if unknown)."""
        if c.result != "unreadable" and c.check != "-":
            return 1
        return len(course_copy(self.exercise)["checks"]) if self.exercise in known_exercises() else 0

    @property
    def unreadable(self) -> bool:
        return any(c.result == "unreadable" for c in self.checks)

    @property
    def handed_in_nothing(self) -> bool:
        """A row the grader added for an exercise of the course this learner did not hand in."""
        return bool(self.checks) and all(c.check == "-" and c.result == "missing" for c in self.checks)


def learner_of(path: Path) -> str:
    """Whose notebook this is, when nothing else says: the folder that holds it, or, for the exercises/ folder of
    a course folder (`ampteach start`), the course folder."""
    folder = path.resolve().parent
    return folder.parent.name if folder.name == "exercises" and folder.parent.name else folder.name


def grade_notebook(path: str | Path, timeout: float = 120.0, learner: str | None = None,
                   sandbox: Sandbox | None = None) -> Submission:
    """Restore the course's checks in one notebook, run it in a sandbox, judge each check, collect the results."""
    path = Path(path)
    sandbox = sandbox if sandbox is not None else find_sandbox("auto")
    sub = Submission(path, learner or learner_of(path), exercise_from_name(path) or path.name)
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
    sub.copied = copied_solution(nb, course_copy(exercise))
    cells, sub.notes = autograde(nb, exercise, timeout, sandbox)
    for cell in cells:
        if cell.check is not None:
            sub.checks.append(CheckResult(cell.check, cell.result, cell.message, check_id(exercise, cell.functions)))
        elif cell.result in ("failed", "timeout"):
            first = cell.message.splitlines()[0] if cell.message else ""
            sub.notes.append(f"cell [{cell.position}] (not a check) {cell.result}: {first}")
    return sub


# --- finding submissions, reporting ----------------------------------------------------------------------------

def find_submissions(paths: list[str], learner: str | None = None) -> list[tuple[Path, str]]:
    """(notebook, learner) for each PATH: a notebook (learner: --learner, else learner_of) or a folder of them
    (submissions/<learner>/<exercise>.ipynb: learner = the first folder below PATH)."""
    found = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            for nb in sorted(path.rglob("*.ipynb")):
                if ".ipynb_checkpoints" in nb.parts:
                    continue
                rel = nb.relative_to(path)
                found.append((nb, rel.parts[0] if len(rel.parts) > 1 else learner or learner_of(nb)))
        else:
            found.append((path, learner or learner_of(path)))
    return found


def _one(item: tuple[Path, str, float, Sandbox]) -> Submission:
    path, learner, timeout, sandbox = item
    if not path.is_file():
        sub = Submission(path, learner, exercise_from_name(path) or path.name)
        sub.checks.append(CheckResult("-", "unreadable", f"no such file: {path}"))
        return sub
    try:
        return grade_notebook(path, timeout, learner, sandbox)
    except Exception as exc:  # a grader's own failure on one file: a row in the gradebook, not a lost class
        sub = Submission(path, learner, exercise_from_name(path) or path.name)
        sub.checks.append(CheckResult("-", "unreadable", f"the grader could not grade {path.name}: "
                                                         f"{type(exc).__name__}: {exc}"))
        return sub


def _worker_setup() -> None:
    import torch
    torch.set_num_threads(1)      # judges replay on one thread, as the notebooks run


def missing_exercises(subs: list[Submission]) -> list[Submission]:
    """A `missing` row for every exercise of the course a learner did not hand in (class grading)."""
    known = known_exercises()
    out = []
    for learner in sorted({s.learner for s in subs}):
        handed = {s.exercise for s in subs if s.learner == learner}
        for exercise in known:
            if exercise not in handed:
                sub = Submission(Path(f"{exercise}.ipynb"), learner, exercise)
                sub.checks.append(CheckResult("-", "missing", "not handed in", check_id(exercise, [])))
                out.append(sub)
    return out


def grade_all(paths: list[str], timeout: float = 120.0, jobs: int | None = None, sandbox: Sandbox | None = None,
              learner: str | None = None, whole_course: bool | None = None) -> list[Submission]:
    """Grade every notebook found under paths, `jobs` at a time (default: one per CPU core), each in its sandbox.
    A class graded as a folder (or whole_course=True) also lists every exercise a learner did not hand in."""
    sandbox = sandbox if sandbox is not None else find_sandbox("auto")
    found = find_submissions(paths, learner)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(found) or 1))
    items = [(path, who, timeout, sandbox) for path, who in found]
    if jobs == 1:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)        # as in the pool's workers: judges replay on one thread, as notebooks run
        try:
            subs = [_one(item) for item in items]
        finally:
            torch.set_num_threads(threads)
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_setup) as pool:
            subs = list(pool.map(_one, items))
    if whole_course if whole_course is not None else any(Path(p).is_dir() for p in paths):
        subs += missing_exercises(subs)
    return subs


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
    if sub.copied:
        lines += _wrap("flagged: the answer cells are the course's own worked solution, as published in solutions/",
                       "  ", width)
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
        handed = sum(not s.handed_in_nothing for s in own)
        lines.append(f"{name:<{name_width}}  {handed:9d}  {passed:6d}  {total:6d}  {score}  {', '.join(todo) or '-'}")
    return "\n".join(lines)


def _by_learner(subs: list[Submission]) -> dict[str, list[Submission]]:
    learners: dict[str, list[Submission]] = {}
    for sub in subs:
        learners.setdefault(sub.learner, []).append(sub)
    return dict(sorted(learners.items()))


def _not_complete(own: list[Submission]) -> list[str]:
    def why(s: Submission) -> str:
        if s.unreadable:
            return f"{s.path.name} (unreadable)"
        if s.handed_in_nothing:
            return f"{s.exercise} (not handed in)"
        return s.exercise
    return [why(s) for s in own if s.unreadable or s.passed < s.total or not s.total]


def gradebook_rows(subs: list[Submission]) -> list[dict]:
    """The CSV's rows (CSV_COLUMNS): every check of every submission, then each learner's total."""
    rows = [{"learner": sub.learner, "submission": str(sub.path) if sub.path.is_file() else "",
             "exercise": sub.exercise, "check_id": c.check_id or check_id(sub.exercise, []), "check": c.check,
             "result": c.result, "passed": int(c.result == "passed"), "checks": sub.checks_of(c),
             "copied_solution": "yes" if sub.copied else "", "message": c.message}
            for sub in subs for c in sub.checks]
    for learner, own in _by_learner(subs).items():
        passed, total = sum(s.passed for s in own), sum(s.total for s in own)
        todo = _not_complete(own)
        handed = [s for s in own if not s.handed_in_nothing]
        copied = [s.exercise for s in own if s.copied]
        message = (f"{passed} of {total} checks passed in {len(handed)} notebook(s); "
                   + (f"not complete: {', '.join(todo)}" if todo else "all complete"))
        rows.append({"learner": learner, "submission": "", "exercise": "", "check_id": "all checks",
                     "check": "all checks", "result": TOTAL, "passed": passed, "checks": total,
                     "copied_solution": ", ".join(copied), "message": message})
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
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a cell or a check may run (default 120)")
    parser.add_argument("--jobs", type=int, default=None, help="notebooks graded at once (default: one per CPU core)")
    parser.add_argument("--sandbox", choices=MODES, default="auto",
                        help="auto (default): bubblewrap where it works, else an unisolated run, said in one line; "
                             "required: refuse to grade without it (for a class's grades); off: no sandbox")
    parser.add_argument("--memory", type=float, default=DEFAULT_MEMORY_GB,
                        help=f"GiB of address space a notebook may use (default {DEFAULT_MEMORY_GB:g})")
    parser.add_argument("--learner", metavar="NAME", help="whose notebooks these are (single notebooks; a class "
                                                           "folder names them by their folders)")


def run(args) -> int:
    try:
        sandbox = find_sandbox(args.sandbox, memory_gb=args.memory)
    except SandboxUnavailable as exc:
        print(f"ampteach grade: {exc}")
        return 2
    print(sandbox.note)
    subs = grade_all(args.paths, timeout=args.timeout, jobs=args.jobs, sandbox=sandbox, learner=args.learner)
    if not subs:
        print("no notebooks found in " + ", ".join(args.paths))
        return 1
    for sub in subs:
        if sub.path.is_file() or sub.unreadable:
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
