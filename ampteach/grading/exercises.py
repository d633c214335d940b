"""Generate exercises/ and the grader's copy of the checks from solutions/: one source for every exercise.

    python -m ampteach.grading.exercises            # write exercises/*.ipynb, ampteach/grading/exercise_checks/*.json
    python -m ampteach.grading.exercises --check    # exit 1 (and say which) if either is out of date
    python -m ampteach.grading.exercises --force    # also replace exercises holding changes (kept as NAME.yours.ipynb)

In a solution notebook (nbgrader's markers, plus one for starter code):
    ### BEGIN SOLUTION ... ### END SOLUTION         -> `# YOUR CODE HERE` + `raise NotImplementedError()`
                                                       (markdown cells: "YOUR ANSWER HERE")
    ### BEGIN SOLUTION ... ### STARTER CODE ... ### END SOLUTION
                                                    -> the starter lines (written as `# ` comments in the
                                                       solution), uncommented: code the learner fixes
    ### BEGIN HIDDEN CHECKS ... ### END HIDDEN CHECKS -> removed (a cell left empty goes); the grader runs them
                                                       (nbgrader's HIDDEN TESTS markers work the same way)
Outputs, execution counts and widget state are cleared, so a learner starts from a clean notebook.
The notebook's metadata names its exercise (`metadata.ampteach.exercise`), and its check cells (cells
that call a `check_...` function) are marked read-only and undeletable for JupyterLab, and carry
nbgrader's metadata of a graded test, so that where nbgrader is installed its Validate button runs
the course's checks (and fails an unfinished exercise) instead of reporting success.

A learner's work is never overwritten. Each exercise file records a fingerprint of its cells as they
were written (`metadata.ampteach.generated`: a hash of every cell's type and source), which tells the
two reasons a file in exercises/ can differ from what the generator would write apart:
    stale   its cells are as generated and the solution changed since: rewritten (--check: exit 1)
    yours   someone changed its cells (a learner's answers): left alone. If the solution changed too,
            the file is refused (exit 1, saying how to keep the work) unless --force, which writes
            the new version and keeps yours beside it as NAME.yours.ipynb
Running an exercise (outputs, JupyterLab's metadata) changes nothing that counts. A notebook in
exercises/ that the generator did not write, or that holds changes, is never deleted.

What `ampteach grade` needs goes into the package as ampteach/grading/exercise_checks/<exercise>.json: every
check cell's code as the course wrote it (hidden checks included), its cell id, and the ids of the
cells before it (to put a deleted check back where it was). No solution code goes there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

__all__ = ["BEGIN", "END", "STARTER", "HIDDEN", "ROOT", "CHECKS_DIR", "MarkerError", "strip_regions",
           "without_markers", "check_functions",
           "code_fingerprint", "worked_code", "exercise_name", "make_exercise", "grading_copy", "fingerprint",
           "learner_version", "render", "render_checks", "learner_notebooks", "Exercise", "compare",
           "is_untouched_exercise", "SyncReport", "sync", "describe", "main"]

ROOT = Path(__file__).resolve().parents[2]
CHECKS_DIR = Path(__file__).resolve().parent / "exercise_checks"
BEGIN, END, STARTER = "### BEGIN SOLUTION", "### END SOLUTION", "### STARTER CODE"
HIDDEN = {"### BEGIN HIDDEN CHECKS": "### END HIDDEN CHECKS", "### BEGIN HIDDEN TESTS": "### END HIDDEN TESTS"}
CHECK_CALL = re.compile(r"(?<![\w.])(?<!def )(check_\w+)\s*\(")


class MarkerError(ValueError):
    """A solution notebook's BEGIN/END markers do not pair up."""


def strip_regions(source: str, code: bool, where: str = "cell") -> str:
    """The learner's version of a cell: solution regions become a stub (or the starter code), hidden ones go."""
    out: list[str] = []
    inside: str | None = None     # the open region's BEGIN marker
    starter: str | None = None    # indentation of an open STARTER CODE section
    for line in source.splitlines():
        marker = line.strip()
        if marker in (BEGIN, *HIDDEN):
            if inside:
                raise MarkerError(f"{where}: '{marker}' inside an open '{inside}' region; close it first")
            inside = marker
        elif marker == STARTER:
            if inside != BEGIN or starter is not None:
                raise MarkerError(f"{where}: '{STARTER}' belongs inside one '{BEGIN}' region")
            starter = re.match(r"\s*", line).group(0)
        elif marker in (END, *HIDDEN.values()):
            expected = BEGIN if marker == END else next(b for b, e in HIDDEN.items() if e == marker)
            if inside != expected:
                raise MarkerError(f"{where}: '{marker}' without a matching '{expected}'")
            if marker == END and starter is None:
                indent = re.match(r"\s*", line).group(0)
                stub = [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError()"]
                out += stub if code else ["YOUR ANSWER HERE"]
            inside, starter = None, None
        elif starter is not None:
            if line.strip() and not line.startswith(starter + "#"):
                raise MarkerError(f"{where}: starter code must be written as '# ' comments, found {line!r}")
            text = line[len(starter) + 1:] if line.strip() else ""
            text = text[1:] if text.startswith(" ") else text
            out.append(starter + text if text else "")
        elif inside is None:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: '{inside}' is never closed")
    return "\n".join(out)


def without_markers(source: str) -> str:
    """The hidden-check cell as the grader runs it: hidden code kept, marker lines dropped."""
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in (*HIDDEN, *HIDDEN.values()))


def check_functions(source: str) -> list[str]:
    """The check_... functions a cell calls, in order of first use."""
    return list(dict.fromkeys(CHECK_CALL.findall(source)))


def exercise_name(path: str | Path) -> str:
    return Path(path).stem


def make_exercise(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The exercise version of a solution notebook (a new notebook; the solution is not modified).

    Its check cells carry nbgrader's metadata for a graded test worth one point, so that where nbgrader is
    installed, JupyterLab's Validate button (and `nbgrader validate`) runs the course's checks and reports
    a failed one as a failure, never "Success" for an untouched exercise.
    """
    nb = nbformat.from_dict(solution)
    nb.metadata.pop("widgets", None)
    nb.metadata["ampteach"] = {"exercise": exercise_name(name)}
    regions, cells = 0, []
    for i, cell in enumerate(nb.cells):
        regions += cell.source.count(BEGIN)
        source = strip_regions(cell.source, cell.cell_type == "code", where=f"{name}, cell {i}")
        if not source.strip() and cell.source.strip():
            continue   # a cell that was all hidden checks
        cell.source = source
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            if check_functions(source):
                cell.metadata.update({"editable": False, "deletable": False, "nbgrader": {
                    "grade": True, "grade_id": f"check-{cell.id}", "locked": True, "points": 1,
                    "schema_version": 3, "solution": False, "task": False}})
        cell.metadata.pop("execution", None)
        cells.append(cell)
    if regions == 0:
        raise MarkerError(f"{name} has no '{BEGIN}' region: an exercise with nothing to write")
    nb.cells = cells
    return nb


def code_fingerprint(source: str) -> str:
    """A cell's code, fingerprinted as Python reads it (comments, blank lines and layout do not count):
    the sha256 of its syntax tree, or of its stripped text where it is not Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        source = TransformerManager().transform_cell(source)
    except ImportError:
        pass
    try:
        text = ast.dump(ast.parse(source))
    except SyntaxError:
        text = "\n".join(line.strip() for line in source.splitlines() if line.strip())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def worked_code(source: str) -> str:
    """A solution cell as a learner who solved it would write it: the course's markers and starter code dropped."""
    out, starter = [], False
    for line in source.splitlines():
        marker = line.strip()
        if marker == STARTER:
            starter = True
        elif marker == END:
            starter = False
        elif marker != BEGIN and not starter:
            out.append(line)
    return "\n".join(out)


def grading_copy(solution: nbformat.NotebookNode, name: str) -> dict:
    """What the grader needs of one exercise: its check cells (hidden ones too) and where each sits; the
    fingerprints of the cells the course gives (a scan of the learner's code skips them) and of the worked
    solution's answer cells (a submission that hands those in is flagged)."""
    exercise = make_exercise(solution, name)
    visible = {cell.id for cell in exercise.cells}
    checks, before = [], []
    for cell in solution.cells:
        functions = check_functions(cell.source) if cell.cell_type == "code" else []
        if functions:
            checks.append({"id": cell.id, "functions": functions, "hidden": cell.id not in visible,
                           "source": without_markers(cell.source), "after": list(reversed(before))})
        if cell.id in visible:
            before.append(cell.id)
    given = [code_fingerprint(cell.source) for cell in exercise.cells
             if cell.cell_type == "code" and not any(BEGIN in c.source for c in solution.cells if c.id == cell.id)]
    answers = [code_fingerprint(worked_code(cell.source)) for cell in solution.cells
               if cell.cell_type == "code" and BEGIN in cell.source]
    return {"exercise": exercise_name(name), "checks": checks, "given": sorted(set(given)),
            "solution": answers}


def fingerprint(nb: nbformat.NotebookNode) -> str:
    """A short hash of a notebook's cells (type and source), all a learner's work can change."""
    cells = [[cell.cell_type, cell.source] for cell in nb.cells]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()[:16]


def learner_version(solution_path: Path) -> nbformat.NotebookNode:
    """The exercise of one solution notebook, as exercises/NAME.ipynb holds it (fingerprint included)."""
    nb = make_exercise(nbformat.read(solution_path, as_version=4), name=solution_path.name)
    nb.metadata["ampteach"]["generated"] = fingerprint(nb)
    return nb


def render(solution_path: Path) -> str:
    nb = learner_version(solution_path)
    nbformat.validator.normalize(nb)
    return nbformat.writes(nb) + "\n"


def render_checks(solution_path: Path) -> str:
    copy = grading_copy(nbformat.read(solution_path, as_version=4), solution_path.name)
    return json.dumps(copy, indent=1) + "\n"


def learner_notebooks(solutions: Path) -> dict[str, str]:
    """{file name: text} of every exercise generated from the solutions in `solutions`, in memory."""
    return {p.name: render(p) for p in sorted(Path(solutions).glob("*.ipynb"))}


# --- what a file in exercises/ holds ------------------------------------------------------------------

CURRENT, STALE, YOURS, CHANGED_BOTH = "current", "stale", "yours", "yours, and the course changed"


@dataclass
class Exercise:
    """One file of exercises/ compared with what the generator would write there."""

    path: Path
    state: str              # CURRENT, STALE, YOURS or CHANGED_BOTH (see the module's docstring)
    changed: str = ""       # which cells differ from the course's version, as a learner finds them


def changed_cells(nb: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> str:
    """The cells of `nb` whose source differs from `fresh`'s, named as JupyterLab shows them."""
    sources = {cell.get("id"): cell.source for cell in fresh.cells}
    code, markdown, position = [], 0, 0
    for cell in nb.cells:
        position += cell.cell_type == "code"
        if sources.get(cell.get("id")) != cell.source:
            if cell.cell_type == "code":
                code.append(f"[{position}]")
            else:
                markdown += 1
    parts = ([f"code cell{'s' * (len(code) > 1)} {', '.join(code)}"] if code else []) + (
        [f"{markdown} text cell{'s' * (markdown > 1)}"] if markdown else [])
    return " and ".join(parts) + " changed" if parts else "cells added or removed"


def compare(path: Path, text: str) -> Exercise:
    """What the file at `path` holds compared with `text`, the exercise the generator writes now."""
    if path.read_text(encoding="utf-8") == text:
        return Exercise(path, CURRENT)
    fresh = nbformat.reads(text, as_version=4)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # not a notebook any more (a broken save): someone's file all the same
        return Exercise(path, CHANGED_BOTH, "the file cannot be read as a notebook")
    ours = nb.metadata.get("ampteach") if isinstance(nb.metadata.get("ampteach"), dict) else {}
    recorded, now, wanted = ours.get("generated"), fingerprint(nb), fingerprint(fresh)
    ran = any(cell.get("outputs") or cell.get("execution_count") for cell in nb.cells)
    if now == wanted:   # the same cells: only outputs or metadata differ
        return Exercise(path, CURRENT if ran else STALE)
    if now == recorded:
        return Exercise(path, STALE)
    return Exercise(path, YOURS if recorded == wanted else CHANGED_BOTH, changed_cells(nb, fresh))


def is_untouched_exercise(path: Path) -> bool:
    """A notebook the generator wrote and nobody changed since (safe to delete when its solution goes)."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:
        return False
    ours = nb.metadata.get("ampteach")
    return isinstance(ours, dict) and "exercise" in ours and ours.get("generated") == fingerprint(nb)


def kept_name(path: Path) -> Path:
    """Where --force keeps a learner's version: NAME.yours.ipynb (NAME.yours-2.ipynb, ... if taken)."""
    for n in range(1, 1000):
        candidate = path.with_name(f"{path.stem}.yours{'' if n == 1 else f'-{n}'}.ipynb")
        if not candidate.exists():
            return candidate
    raise FileExistsError(f"too many kept versions of {path.name} in {path.parent}")


# --- the sync -----------------------------------------------------------------------------------------

@dataclass
class SyncReport:
    """What sync found (and, unless check=True, did): file names as `exercises/NAME.ipynb`."""

    stale: list[str] = field(default_factory=list)        # written (or, with check, to write): out of date
    yours: list[Exercise] = field(default_factory=list)   # holding changes, course unchanged: left alone
    refused: list[Exercise] = field(default_factory=list)  # holding changes, course changed: not written
    kept: list[tuple[str, str]] = field(default_factory=list)  # --force: (learner's file, where it was kept)

    @property
    def out_of_date(self) -> bool:
        return bool(self.stale or self.refused)


def _label(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _sync_exercises(wanted: dict[str, str], folder: Path, check: bool, force: bool, report: SyncReport) -> None:
    for name, text in wanted.items():
        target = folder / name
        found = compare(target, text) if target.exists() else Exercise(target, STALE)
        if found.state == YOURS:
            report.yours.append(found)
        elif found.state == CHANGED_BOTH and not force:
            report.refused.append(found)
        elif found.state != CURRENT:
            report.stale.append(_label(target))
            if check:
                continue
            if found.state == CHANGED_BOTH:
                kept = kept_name(target)
                target.rename(kept)
                report.kept.append((_label(target), _label(kept)))
            folder.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    for orphan in sorted(p for p in folder.glob("*.ipynb") if p.name not in wanted):
        if is_untouched_exercise(orphan):    # generated from a solution that is gone
            report.stale.append(_label(orphan))
            if not check:
                orphan.unlink()


def _sync_checks(wanted: dict[str, str], folder: Path, check: bool, report: SyncReport) -> None:
    for name, text in wanted.items():
        target = folder / name
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            report.stale.append(_label(target))
            if not check:
                folder.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
    for orphan in sorted(p for p in folder.glob("*.json") if p.name not in wanted):
        report.stale.append(_label(orphan))
        if not check:
            orphan.unlink()


def sync(solutions: Path = ROOT / "solutions", exercises: Path = ROOT / "exercises", checks: Path = CHECKS_DIR,
         check: bool = False, force: bool = False) -> SyncReport:
    """Write (or, with check=True, only compare) every exercise and grading copy; a learner's changes are kept."""
    paths = sorted(Path(solutions).glob("*.ipynb"))
    report = SyncReport()
    _sync_exercises({p.name: render(p) for p in paths}, Path(exercises), check, force, report)
    _sync_checks({f"{p.stem}.json": render_checks(p) for p in paths}, Path(checks), check, report)
    return report


def describe(report: SyncReport, check: bool) -> str:
    """What sync did or would do, for a person: stale files, a learner's work kept, what to do about refusals."""
    lines = []
    if report.stale and check:
        lines += ["out of date with solutions/ (run `python -m ampteach.grading.exercises`):",
                  *(f"  {name}" for name in report.stale)]
    elif report.stale:
        lines.append(f"regenerated {len(report.stale)} file(s): {', '.join(report.stale)}")
    else:
        lines.append("exercises/ and the grader's copy of the checks are in sync with solutions/")
    if report.yours:
        lines.append("your own work, left as it is (its exercise has not changed since it was generated):")
        lines += [f"  {_label(e.path)}: {e.changed}" for e in report.yours]
    for learner, kept in report.kept:
        lines.append(f"kept your version of {learner} as {kept}, then wrote the new exercise")
    if report.refused:
        lines.append("NOT regenerated, because these hold your own work and their exercise changed since:")
        lines += [f"  {_label(e.path)}: {e.changed}" for e in report.refused]
        lines += ["To keep your work and get the new versions, either",
                  "  - do the exercises in a folder of your own: `ampteach start` copies the current ones there",
                  "    and leaves these files as they are; or",
                  "  - run `python -m ampteach.grading.exercises --force`: it keeps each of these as",
                  "    exercises/NAME.yours.ipynb beside the new exercises/NAME.ipynb."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if anything is out of date")
    parser.add_argument("--force", action="store_true",
                        help="also replace exercises that hold changes, keeping each as NAME.yours.ipynb")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions", help=argparse.SUPPRESS)
    parser.add_argument("--exercises", type=Path, default=ROOT / "exercises", help=argparse.SUPPRESS)
    parser.add_argument("--checks", type=Path, default=CHECKS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    report = sync(args.solutions, args.exercises, args.checks, check=args.check, force=args.force)
    print(describe(report, args.check))
    return 1 if (report.out_of_date if args.check else report.refused) else 0


if __name__ == "__main__":
    sys.exit(main())
