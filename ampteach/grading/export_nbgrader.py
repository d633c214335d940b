"""The course's exercises as an nbgrader course: `ampteach export nbgrader DIR`.

    paths = export_nbgrader(Path("nbgrader-course"))   # its nbgrader_config.py, source/<exercise>/<exercise>.ipynb
    # then, in nbgrader-course/:  nbgrader generate_assignment build_2_loss_scale_update
    #                             nbgrader autograde build_2_loss_scale_update && nbgrader export

One assignment per exercise, named after it, holding that one notebook (why: ampteach/README's
"Teaching with nbgrader or Otter"). Each notebook is its solution in solutions/ with nbgrader's cell
metadata, read the way ampteach.grading.export_common reads it:
    solution cell      an autograded answer: unlocked, its `### BEGIN SOLUTION` regions as they are
                       (a region with `### STARTER CODE` becomes the starter code: see nbgrader_starter)
    answer (markdown)  a manually graded answer worth 0 points (no check scores it)
    check cell         autograder tests: locked, graded, POINTS_PER_CHECK points; it first takes its
                       check functions from the course (export_common.check_preamble)
    hidden-check cell  the same, its code inside `### BEGIN HIDDEN TESTS` (nbgrader's marker), under a
                       comment the learner sees: hidden checks run when the notebook is graded
    given cell         read-only (locked): the learner runs it and cannot change it; autograde puts it back
So an nbgrader score is the number of checks passed, as `ampteach grade` reports it.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

from ampteach.grading.exercises import HIDDEN, check_functions
from ampteach.grading.export_common import (
    ExportError,
    Part,
    check_preamble,
    default_solutions,
    read_parts,
    solution_paths,
    without_check_imports,
)

__all__ = ["CELL_TIMEOUT", "HIDDEN_NOTE", "NBGRADER_CONFIG", "export_nbgrader", "nbgrader_notebook"]

CELL_TIMEOUT = 120   # seconds a cell may run under autograde: `ampteach grade --timeout`'s default
HIDDEN_NOTE = "# The course's hidden checks run in this cell when your notebook is graded."
NBGRADER_BEGIN, NBGRADER_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

NBGRADER_CONFIG = '''\
"""nbgrader's configuration for the ampteach exercises, written by `ampteach export nbgrader`.

Run nbgrader from this folder: nbgrader generate_assignment EXERCISE, nbgrader autograde EXERCISE,
nbgrader export. The grading machine needs ampteach installed: every check cell imports its checks
from it (ampteach.grading.checks).
"""

from ampteach.grading.nbgrader_starter import generate_assignment_preprocessors

c = get_config()  # noqa: F821 (nbgrader defines get_config)

c.CourseDirectory.course_id = "{course_id}"

# Solution regions with `### STARTER CODE` become the starter code, as in the course's exercises/.
c.GenerateAssignment.preprocessors = generate_assignment_preprocessors()

# A cell may run {timeout} s, as under `ampteach grade` (nbgrader's own default is 30 s; the first
# cell imports torch). A cell still running then is interrupted, and the next cells run.
c.Execute.timeout = {timeout}

# A check cell a learner deleted is put back where it was, as `ampteach grade` does.
c.OverwriteCells.add_missing_cells = True
'''


def _metadata(part: Part, grade_id: str, **fields) -> dict:
    meta = {"grade": False, "solution": False, "locked": False, "grade_id": grade_id, "schema_version": 3}
    meta.update(fields)
    if meta["grade"]:
        meta["points"] = part.points
    return meta


def _check_source(part: Part) -> str:
    """A check cell for nbgrader: the course's checks taken fresh, hidden regions in nbgrader's markers."""
    shown = check_functions(part.learner)
    hidden = [f for f in part.functions if f not in shown]
    lines = [check_preamble(shown)] if shown else []
    if part.role == "hidden-check":
        lines.append(HIDDEN_NOTE)
    placed = False
    for line in without_check_imports(part.cell.source).splitlines():
        marker = line.strip()
        if marker in HIDDEN:
            indent = re.match(r"\s*", line).group(0)
            lines.append(indent + NBGRADER_BEGIN)
            if hidden and not placed:
                lines.append(indent + check_preamble(hidden))
                placed = True
        elif marker in HIDDEN.values():
            lines.append(re.match(r"\s*", line).group(0) + NBGRADER_END)
        else:
            lines.append(line)
    return "\n".join(lines)


def nbgrader_cell(part: Part) -> nbformat.NotebookNode:
    """One cell of the nbgrader source notebook, with nbgrader's metadata for its role."""
    cell = nbformat.from_dict(part.cell)
    cell.metadata.pop("editable", None)
    cell.metadata.pop("deletable", None)
    if part.role == "solution":
        meta = _metadata(part, f"answer-{cell.id}", solution=True)
    elif part.role == "answer":
        meta = _metadata(part, f"written-{cell.id}", solution=True, grade=True)
    elif part.role in ("check", "hidden-check"):
        cell.source = _check_source(part)
        meta = _metadata(part, f"{part.role}-{cell.id}", grade=True, locked=True)
    else:
        cell.source = part.learner   # a hidden region outside a check cell: the exercise drops it, so does this
        meta = _metadata(part, f"given-{cell.id}", locked=True)
    cell.metadata["nbgrader"] = meta
    return cell


def nbgrader_notebook(path: Path) -> nbformat.NotebookNode:
    """The nbgrader source notebook of one solution notebook (a new notebook)."""
    solution = nbformat.read(path, as_version=4)
    nb = nbformat.v4.new_notebook(cells=[nbgrader_cell(p) for p in read_parts(path)])
    nb.metadata = {k: v for k, v in solution.metadata.items() if k in ("kernelspec", "language_info")}
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["ampteach"] = {"exercise": path.stem}   # `ampteach grade` can grade the same notebooks
    return nb


def export_nbgrader(out: Path, solutions: Path | None = None, names: list[str] | None = None,
                    course_id: str = "ampteach", force: bool = False) -> list[Path]:
    """Write an nbgrader course directory at `out` from solutions/ (every exercise, or the ones named);
    return the files written. An existing source/<exercise>/ is replaced only with force=True."""
    paths = solution_paths(solutions or default_solutions(), names)
    notebooks = {p.stem: nbgrader_notebook(p) for p in paths}
    existing = [name for name in notebooks if (out / "source" / name).exists()]
    if existing and not force:
        raise ExportError(f"{out / 'source'} already has {', '.join(existing)}: pass --force to replace them "
                          f"(nbgrader's gradebook and the students' folders are left alone)")
    written = []
    config = out / "nbgrader_config.py"
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(NBGRADER_CONFIG.format(course_id=course_id, timeout=CELL_TIMEOUT))
    written.append(config)
    for name, nb in notebooks.items():
        folder = out / "source" / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        nbformat.validator.normalize(nb)
        target = folder / f"{name}.ipynb"
        target.write_text(nbformat.writes(nb) + "\n")
        written.append(target)
    return written
