"""nbgrader's Validate on the course's exercises: an untouched exercise fails, a worked one passes.

Where nbgrader is installed (the `teach` extra, part of `dev`: a teacher's or a course developer's
environment, never the learner's Quickstart), JupyterLab shows a Validate button on every notebook. It
runs the notebook and reports the cells nbgrader knows as graded tests; a notebook with none "passes".
So every check cell of an exercise carries nbgrader's metadata for a graded test (written by the
generator, ampteach.grading.exercises.make_exercise), and nbgrader's own `nbgrader validate` is run here
on build 1 as it is handed out and as a learner who solved it would hand it in. The same through
JupyterLab's button, in Chromium: tests/test_browser.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ampteach.grading.exercises import BEGIN, check_functions, worked_code

ROOT = Path(__file__).parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
EXERCISE = "build_1_bf16_rounding"
needs_nbgrader = pytest.mark.skipif(importlib.util.find_spec("nbgrader") is None,
                                    reason="nbgrader is not installed (pip install -e '.[teach]')")


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_every_check_cell_is_an_nbgrader_test_worth_one_point(path):
    nb = nbformat.read(path, as_version=4)
    checks = [c for c in nb.cells if c.cell_type == "code" and check_functions(c.source)]
    assert checks, f"{path.name} has no check cell"
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader")
        if cell in checks:
            assert meta == {"grade": True, "grade_id": f"check-{cell.id}", "locked": True, "points": 1,
                            "schema_version": 3, "solution": False, "task": False}, cell.source
        else:
            assert meta is None, f"{path.name}: only check cells are nbgrader tests, not {cell.source[:60]!r}"


def solved(exercise: Path) -> nbformat.NotebookNode:
    """The exercise as a learner who solved it hands it in: each answer cell holds the worked solution."""
    solution = nbformat.read(ROOT / "solutions" / exercise.name, as_version=4)
    answers = {c.id: worked_code(c.source) for c in solution.cells if BEGIN in c.source}
    nb = nbformat.read(exercise, as_version=4)
    for cell in nb.cells:
        cell.source = answers.get(cell.id, cell.source)
    return nb


def validate(path: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "nbgrader", "validate", path.name], cwd=path.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_nbgrader
@pytest.mark.slow      # two notebooks run, each with a judge per check: about 30 s
def test_nbgrader_validate_fails_the_untouched_exercise_and_passes_the_worked_one(tmp_path):
    untouched = tmp_path / "untouched" / f"{EXERCISE}.ipynb"
    untouched.parent.mkdir()
    untouched.write_bytes((ROOT / "exercises" / untouched.name).read_bytes())
    out = validate(untouched)
    assert "VALIDATION FAILED ON 1 CELL(S)" in out and "Success" not in out, out
    assert "check_round_to_bf16(round_to_bf16)" in out and "NotImplementedError" in out, out

    worked = tmp_path / "worked" / f"{EXERCISE}.ipynb"
    worked.parent.mkdir()
    nbformat.write(solved(ROOT / "exercises" / worked.name), worked)
    out = validate(worked)
    assert "Success! Your notebook passes all the tests." in out, out
