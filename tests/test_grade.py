"""`ampteach grade` with a class: only honest work scores, every submission gets rows, nothing hangs.

A folder of submissions of one small exercise (build 2): an honest one, a blank one, ones that
redefine, delete, edit or monkeypatch the check, or hide errors from the kernel, an endless loop,
a corrupt file and an unknown notebook. The plan that puts the course's check cells back is tested
without a kernel.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from ampteach.grading.autograde import OUTPUT_PATIENCE, course_copy, plan_cells
from ampteach.grading.grade import CSV_COLUMNS, RESULTS, CheckResult, Submission, format_grade

ROOT = Path(__file__).parents[1]
EXERCISE = "build_2_loss_scale_update"
TIMEOUT = 30   # seconds a cell may run: an honest check needs a few, the endless loop is cut here


def exercise() -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "exercises" / f"{EXERCISE}.ipynb", as_version=4)


def answer_cell(nb) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if "raise NotImplementedError" in c.source)


def check_cell(nb) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.source.startswith("check_loss_scale_update("))


def honest_answer() -> str:
    solution = nbformat.read(ROOT / "solutions" / f"{EXERCISE}.ipynb", as_version=4)
    source = next(c.source for c in solution.cells if "### BEGIN SOLUTION" in c.source)
    return "\n".join(line for line in source.splitlines() if "### " not in line)


def submissions(folder: Path) -> dict[str, str]:
    """Write the class's notebooks; return learner -> what the submission does."""
    made = {}

    def write(learner: str, nb, what: str, name: str = f"{EXERCISE}.ipynb") -> None:
        (folder / learner).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / learner / name)
        made[learner] = what

    nb = exercise()
    answer_cell(nb).source = honest_answer()
    nb.metadata.pop("ampteach")          # found by its file name instead
    write("honest", nb, "the solution, metadata removed")

    write("blank", exercise(), "untouched")

    nb = exercise()
    check_cell(nb).source = "def check_loss_scale_update(f):\n    return True\n\ncheck_loss_scale_update(update_scale)"
    write("redefines", nb, "the check cell redefined to pass")

    nb = exercise()
    answer_cell(nb).source += "\n\ndef check_loss_scale_update(f):\n    return True"
    check_cell(nb).id = "moved-elsewhere"
    write("shadows", nb, "a fake check defined in the answer cell, the check cell's id changed")

    nb = exercise()
    nb.cells.remove(check_cell(nb))
    write("deletes", nb, "the check cell deleted")

    nb = exercise()
    answer_cell(nb).source += ("\n\nimport ampteach.grading.checks.loss_scale_update as module\n"
                               "module.check_loss_scale_update = lambda f: None\n"
                               "get_ipython().set_custom_exc((Exception,), lambda *args, **kwargs: None)")
    write("patches", nb, "monkeypatches the check and silences the kernel's errors")

    nb = exercise()
    answer_cell(nb).source = answer_cell(nb).source.replace("raise NotImplementedError()", "while True:\n        pass")
    write("endless", nb, "an endless loop in the answer")

    (folder / "corrupt").mkdir()
    (folder / "corrupt" / f"{EXERCISE}.ipynb").write_text('{"cells": [ this is not json')
    made["corrupt"] = "not JSON"

    write("stranger", nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), "no exercise",
          name="my_notes.ipynb")
    return made


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class") / "submissions"
    made = submissions(folder)
    book = folder.parent / "gradebook.csv"
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ampteach", "grade", str(folder), "--csv", str(book),
                          "--timeout", str(TIMEOUT), "--jobs", "2"], capture_output=True, text=True, timeout=900,
                         cwd=folder.parent)
    elapsed = time.monotonic() - start
    with open(book, newline="") as f:
        rows = list(csv.DictReader(f))
    return made, out, rows, elapsed


def by_learner(rows: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for row in rows:
        found.setdefault(Path(row["submission"]).parent.name, []).append(row)
    return found


@pytest.mark.slow
def test_only_the_honest_submission_scores(gradebook):
    made, out, rows, _ = gradebook
    learners = by_learner(rows)
    assert set(learners) == set(made), out.stdout + out.stderr
    for learner, own in learners.items():
        passed = [r for r in own if r["result"] == "passed"]
        if learner == "honest":
            assert len(passed) == len(own) == 2, own           # the visible check and the hidden one
        else:
            assert not passed, (learner, made[learner], own)
    assert out.returncode == 1


@pytest.mark.slow
def test_every_submission_has_rows_with_the_gradebook_columns(gradebook):
    made, out, rows, _ = gradebook
    assert rows and list(rows[0]) == list(CSV_COLUMNS)
    assert all(r["result"] in RESULTS for r in rows)
    learners = by_learner(rows)
    for learner in made:
        assert learners[learner], learner
    assert {r["result"] for r in learners["corrupt"]} == {"unreadable"}
    assert {r["result"] for r in learners["stranger"]} == {"unreadable"}
    assert {r["result"] for r in learners["endless"]} == {"timeout"}
    deleted = learners["deletes"]
    assert len(deleted) == 2 and all(r["result"] == "failed" for r in deleted)
    assert any("restored" in r["check"] for r in deleted)     # put back, run, and failed on its merits
    assert any("replaced by code from your notebook" in r["message"] for r in learners["patches"])


@pytest.mark.slow
def test_the_class_is_graded_in_parallel_within_the_timeouts(gradebook):
    _, out, _, elapsed = gradebook
    # 9 notebooks on 2 workers; the endless one costs two interrupted cells of TIMEOUT seconds each.
    # About 2 minutes on a quiet 2-core machine; the bound is the fixture's hard limit, so a hang fails.
    assert elapsed < 900, elapsed
    assert "learner" in out.stdout and "honest" in out.stdout and "100%" in out.stdout   # the summary table


# --- the plan that restores the course's checks (no kernel) ------------------------------------------------

def labels(nb) -> list[str | None]:
    planned, _ = plan_cells(nb, course_copy(EXERCISE))
    return [p.label for p in planned if p.cell.cell_type == "code"]


def test_check_cells_are_named_as_jupyterlab_numbers_them_and_hidden_ones_are_added():
    nb = exercise()
    position = [c for c in nb.cells if c.cell_type == "code"].index(check_cell(nb)) + 1
    got = [label for label in labels(nb) if label]
    assert got == [f"check_loss_scale_update, cell [{position}]",
                   f"check_loss_scale_update_hidden (hidden), after cell [{position}]"]


def test_an_edited_check_is_replaced_and_a_deleted_one_put_back_in_place():
    nb = exercise()
    check_cell(nb).source = "print('no check here')"
    planned, notes = plan_cells(nb, course_copy(EXERCISE))
    restored = next(p for p in planned if p.label and "hidden" not in p.label)
    assert "course_check" in restored.cell.source and "check_loss_scale_update(update_scale)" in restored.cell.source
    assert not notes

    nb = exercise()
    before = [c.id for c in nb.cells if c.cell_type == "code"].index(check_cell(nb).id)
    nb.cells.remove(check_cell(nb))
    planned, notes = plan_cells(nb, course_copy(EXERCISE))
    code = [p for p in planned if p.cell.cell_type == "code"]
    assert code[before].label == f"check_loss_scale_update, restored after cell [{before}]"
    assert notes and "missing" in notes[0]


def test_a_notebook_without_cell_ids_still_gets_its_checks_back():
    nb = exercise()
    for cell in nb.cells:
        cell.pop("id")
    assert sum(bool(label) for label in labels(nb)) == 2


def test_failure_messages_are_printed_in_full_wrapped():
    long = "CheckFailed: " + " ".join(f"word{i}" for i in range(80)) + " expected 1.0, got 2.0 (clip AFTER scaler.unscale_)"
    sub = Submission(Path("alice/x.ipynb"), "alice", "x", [CheckResult("check_x, cell [3]", "failed", long)])
    text = format_grade(sub)
    assert "word79 expected 1.0, got 2.0 (clip AFTER scaler.unscale_)" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 100


def test_grading_works_from_another_directory(tmp_path):
    nb_path = tmp_path / "mine.ipynb"
    shutil.copyfile(ROOT / "exercises" / f"{EXERCISE}.ipynb", nb_path)
    planned, _ = plan_cells(nbformat.read(nb_path, as_version=4), course_copy(EXERCISE))
    assert any(p.label for p in planned)


def test_notebook_cells_wait_patiently_for_output_on_a_busy_machine():
    seen = []

    class Probe:
        def pytest_collection_finish(self, session):
            seen.extend(getattr(item, "output_timeout", None) for item in session.items)

    args = [str(ROOT / "solutions" / f"{EXERCISE}.ipynb"), "--collect-only", "-q", "-p", "ampteach.grading.autograde"]
    assert pytest.main(args, plugins=[Probe()]) == 0
    assert seen and set(seen) == {OUTPUT_PATIENCE}
