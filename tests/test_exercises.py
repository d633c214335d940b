"""Exercises come from solutions, fail untouched for the intended reason, and grade cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ampteach import exercises
from ampteach.grade import format_grade, grade_notebook

ROOT = Path(__file__).parents[1]
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_exercises_are_in_sync_with_solutions():
    out = subprocess.run([sys.executable, "-m", "ampteach.exercises", "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_solution_regions_become_stubs_keeping_indentation_and_hidden_tests_vanish():
    source = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n" \
             "### BEGIN HIDDEN TESTS\nassert f(1) == 2\n### END HIDDEN TESTS\nprint('kept')"
    assert exercises.strip_regions(source, code=True) == \
        "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\nprint('kept')"
    assert exercises.strip_regions("Answer:\n### BEGIN SOLUTION\n42\n### END SOLUTION", code=False) == \
        "Answer:\nYOUR ANSWER HERE"


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a matching"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside an open"),
])
def test_unpaired_markers_are_reported(source, problem):
    with pytest.raises(exercises.MarkerError, match=problem):
        exercises.strip_regions(source, code=True, where="x.ipynb, cell 3")


def test_generated_exercise_has_no_outputs_and_the_solution_is_untouched():
    solution = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                                  execution_count=3, outputs=[nbformat.v4.new_output("stream", text="hi")]),
    ])
    exercise = exercises.make_exercise(solution)
    assert exercise.cells[0].outputs == [] and exercise.cells[0].execution_count is None
    assert "raise NotImplementedError()" in exercise.cells[0].source
    assert solution.cells[0].execution_count == 3 and "return 1" in solution.cells[0].source
    with pytest.raises(exercises.MarkerError, match="nothing to write"):
        exercises.make_exercise(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_untouched_exercise_fails_in_its_check_cells_because_of_not_implemented(path):
    grade = grade_notebook(path, timeout=300)
    report = format_grade(grade)
    assert not grade.error, report
    assert grade.total >= 1, report
    for cell in grade.cells:
        if cell.checks:
            assert cell.status == "failed" and cell.message.startswith("NotImplementedError"), report
        else:
            assert cell.status == "passed", report  # setup, demos: never an import error
    assert grade.passed == 0


def test_grading_a_solution_scores_every_check(capsys):
    grade = grade_notebook(ROOT / "solutions" / "build_2_loss_scale_update.ipynb")
    assert grade.total >= 1 and grade.passed == grade.total, format_grade(grade)


def test_an_endless_loop_fails_cleanly_at_the_cell_timeout(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from ampteach.checks import check_loss_scale_update"),
        nbformat.v4.new_code_cell("def update_scale(*args):\n    while True:\n        pass"),
        nbformat.v4.new_code_cell("check_loss_scale_update(update_scale)"),
        nbformat.v4.new_code_cell("print('the kernel is still alive')"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "loop.ipynb"
    nbformat.write(nb, path)
    out = subprocess.run([sys.executable, "-m", "ampteach", "grade", "--timeout", "10", str(path)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 1
    assert "TIMEOUT" in out.stdout and "score 0/1 checks passed" in out.stdout


def test_notebook_cells_wait_patiently_for_output_on_a_busy_machine():
    import pytest as _pytest

    from ampteach.grade import OUTPUT_PATIENCE

    seen = []

    class Probe:
        def pytest_collection_finish(self, session):
            seen.extend(getattr(item, "output_timeout", None) for item in session.items)

    args = [str(ROOT / "solutions" / "build_2_loss_scale_update.ipynb"), "--collect-only", "-q", "-p", "ampteach.grade"]
    assert _pytest.main(args, plugins=[Probe()]) == 0
    assert seen and set(seen) == {OUTPUT_PATIENCE}
