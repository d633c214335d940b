"""Generate exercises/ and the grader's copy of the checks from solutions/: one source for every exercise.

    python -m ampteach.grading.exercises            # rewrite exercises/*.ipynb and ampteach/grading/exercise_checks/*.json
    python -m ampteach.grading.exercises --check    # exit 1 (and say which) if either is out of date

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
that call a `check_...` function) are marked read-only and undeletable for JupyterLab.

What `ampteach grade` needs goes into the package as ampteach/grading/exercise_checks/<exercise>.json: every
check cell's code as the course wrote it (hidden checks included), its cell id, and the ids of the
cells before it (to put a deleted check back where it was). No solution code goes there.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

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
                out += [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError()"] if code else ["YOUR ANSWER HERE"]
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
    """The exercise version of a solution notebook (a new notebook; the solution is not modified)."""
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
                cell.metadata.update({"editable": False, "deletable": False})
        cell.metadata.pop("execution", None)
        cells.append(cell)
    if regions == 0:
        raise MarkerError(f"{name} has no '{BEGIN}' region: an exercise with nothing to write")
    nb.cells = cells
    return nb


def grading_copy(solution: nbformat.NotebookNode, name: str) -> dict:
    """What the grader needs of one exercise: its check cells (hidden ones too) and where each sits."""
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
    return {"exercise": exercise_name(name), "checks": checks}


def render(solution_path: Path) -> str:
    nb = make_exercise(nbformat.read(solution_path, as_version=4), name=solution_path.name)
    nbformat.validator.normalize(nb)
    return nbformat.writes(nb) + "\n"


def render_checks(solution_path: Path) -> str:
    copy = grading_copy(nbformat.read(solution_path, as_version=4), solution_path.name)
    return json.dumps(copy, indent=1) + "\n"


def _sync_folder(wanted: dict[str, str], folder: Path, pattern: str, check: bool) -> list[str]:
    stale = []
    for name, text in wanted.items():
        target = folder / name
        if not target.exists() or target.read_text() != text:
            stale.append(f"{folder.name}/{name}")
            if not check:
                folder.mkdir(exist_ok=True)
                target.write_text(text)
    for orphan in sorted(p.name for p in folder.glob(pattern) if p.name not in wanted):
        stale.append(f"{folder.name}/{orphan}")
        if not check:
            (folder / orphan).unlink()
    return stale


def sync(solutions: Path = ROOT / "solutions", exercises: Path = ROOT / "exercises", checks: Path = CHECKS_DIR,
         check: bool = False) -> list[str]:
    """Write (or, with check=True, only compare) every exercise and grading copy; return what was out of date."""
    paths = sorted(solutions.glob("*.ipynb"))
    stale = _sync_folder({p.name: render(p) for p in paths}, exercises, "*.ipynb", check)
    stale += _sync_folder({f"{p.stem}.json": render_checks(p) for p in paths}, checks, "*.json", check)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if anything is out of date")
    args = parser.parse_args(argv)
    stale = sync(check=args.check)
    if args.check and stale:
        print("out of date with solutions/ (run `python -m ampteach.grading.exercises`):")
        print("\n".join(f"  {name}" for name in stale))
        return 1
    verb = "would change" if args.check else "regenerated"
    print(f"{verb} {len(stale)} file(s)" + (": " + ", ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
