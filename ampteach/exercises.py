"""Generate exercises/ from solutions/: one source of truth for every exercise.

    python -m ampteach.exercises            # rewrite exercises/*.ipynb from solutions/*.ipynb
    python -m ampteach.exercises --check    # exit 1 (and say which) if exercises/ is out of date

In a solution notebook (nbgrader's markers):
    ### BEGIN SOLUTION ... ### END SOLUTION         -> `# YOUR CODE HERE` + `raise NotImplementedError()`
                                                       (markdown cells: "YOUR ANSWER HERE")
    ### BEGIN HIDDEN TESTS ... ### END HIDDEN TESTS -> removed
Outputs, execution counts and widget state are cleared, so a learner starts from a clean notebook.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


class MarkerError(ValueError):
    """A solution notebook's BEGIN/END markers do not pair up."""


def strip_regions(source: str, code: bool, where: str = "cell") -> str:
    """Replace solution regions with a stub and drop hidden-test regions, keeping indentation."""
    out: list[str] = []
    inside: str | None = None
    for line in source.splitlines():
        marker = line.strip()
        if marker in (BEGIN, BEGIN_HIDDEN):
            if inside:
                raise MarkerError(f"{where}: '{marker}' inside an open '{inside}' region; close it first")
            inside = marker
            if marker == BEGIN:
                indent = re.match(r"\s*", line).group(0)
                out += [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError()"] if code else ["YOUR ANSWER HERE"]
        elif marker in (END, END_HIDDEN):
            expected = BEGIN if marker == END else BEGIN_HIDDEN
            if inside != expected:
                raise MarkerError(f"{where}: '{marker}' without a matching '{expected}'")
            inside = None
        elif inside is None:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: '{inside}' is never closed")
    return "\n".join(out)


def make_exercise(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The exercise version of a solution notebook (a new notebook; the solution is not modified)."""
    nb = nbformat.from_dict(solution)
    nb.metadata.pop("widgets", None)
    regions = 0
    for i, cell in enumerate(nb.cells):
        regions += cell.source.count(BEGIN)
        cell.source = strip_regions(cell.source, cell.cell_type == "code", where=f"{name}, cell {i}")
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    if regions == 0:
        raise MarkerError(f"{name} has no '{BEGIN}' region: an exercise with nothing to write")
    return nb


def render(solution_path: Path) -> str:
    nb = make_exercise(nbformat.read(solution_path, as_version=4), name=str(solution_path.name))
    nbformat.validator.normalize(nb)
    return nbformat.writes(nb) + "\n"


def sync(solutions: Path = ROOT / "solutions", exercises: Path = ROOT / "exercises", check: bool = False) -> list[str]:
    """Write (or, with check=True, only compare) every exercise; return the names that were out of date."""
    stale = []
    wanted = {p.name: render(p) for p in sorted(solutions.glob("*.ipynb"))}
    for name, text in wanted.items():
        target = exercises / name
        if not target.exists() or target.read_text() != text:
            stale.append(name)
            if not check:
                target.write_text(text)
    for orphan in sorted(p.name for p in exercises.glob("*.ipynb") if p.name not in wanted):
        stale.append(orphan)
        if not check:
            (exercises / orphan).unlink()
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if exercises/ is out of date")
    args = parser.parse_args(argv)
    stale = sync(check=args.check)
    if args.check and stale:
        print("exercises/ is out of date with solutions/ (run `python -m ampteach.exercises`):")
        print("\n".join(f"  exercises/{name}" for name in stale))
        return 1
    verb = "would change" if args.check else "regenerated"
    print(f"{verb} {len(stale)} exercise(s)" + (": " + ", ".join(stale) if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
