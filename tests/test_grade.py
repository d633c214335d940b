"""`ampteach grade` with a class: only honest work scores, every submission gets rows, nothing hangs.

A folder of submissions of one small exercise (build 2): an honest one (beside a folder named
`ampteach` that is not the course's package), a blank one, ones that redefine, delete, edit or
monkeypatch the check, or hide errors from the kernel, an endless loop, a corrupt file and an unknown
notebook. The plan that puts the course's check cells back is tested without a kernel; a failed check
shown in a notebook, in a real kernel.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from ampteach.grading import exercises
from ampteach.grading.autograde import course_copy, known_exercises, plan_cells
from ampteach.grading.grade import CSV_COLUMNS, RESULTS, TOTAL, CheckResult, Submission, format_grade
from ampteach.grading.nbval_patience import OUTPUT_PATIENCE

ROOT = Path(__file__).parents[1]
EXERCISE = "build_2_loss_scale_update"
TIMEOUT = 30   # seconds a cell may run: an honest check needs a few, the endless loop is cut here


def exercise() -> nbformat.NotebookNode:
    """The exercise as the generator writes it (exercises/ may hold a learner's answers)."""
    return nbformat.reads(exercises.render(ROOT / "solutions" / f"{EXERCISE}.ipynb"), as_version=4)


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
    write("honest", nb, "the solution, metadata removed, beside a folder named ampteach")
    (folder / "honest" / "ampteach").mkdir()    # e.g. a clone of the course: must not stand in for the package
    (folder / "honest" / "ampteach" / "__init__.py").write_text('raise ImportError("not the course package")\n')

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
    """The check rows of each learner (their total row apart)."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if row["result"] != TOTAL:
            found.setdefault(row["learner"], []).append(row)
    return found


@pytest.mark.slow
def test_only_the_honest_submission_scores(gradebook):
    made, out, rows, _ = gradebook
    learners = by_learner(rows)
    assert set(learners) == set(made), out.stdout + out.stderr
    for learner, own in learners.items():
        passed = [r for r in own if r["result"] == "passed"]
        if learner == "honest":
            assert len(passed) == 2, own           # the visible check and the hidden one
        else:
            assert not passed, (learner, made[learner], own)
    assert out.returncode == 1


@pytest.mark.slow
def test_grading_beside_a_folder_named_ampteach_uses_the_installed_package(gradebook):
    made, out, rows, _ = gradebook
    honest = [r for r in by_learner(rows)["honest"] if r["submission"]]
    assert [r["result"] for r in honest] == ["passed", "passed"], (honest, out.stdout + out.stderr)
    assert "not the course package" not in out.stdout + out.stderr


@pytest.mark.slow
def test_every_submission_has_rows_with_the_gradebook_columns(gradebook):
    made, out, rows, _ = gradebook
    assert rows and list(rows[0]) == list(CSV_COLUMNS)
    assert all(r["result"] in RESULTS + (TOTAL,) for r in rows)
    learners = by_learner(rows)
    for learner in made:
        assert learners[learner], learner
        assert all(Path(r["submission"]).parent.name == learner for r in learners[learner] if r["submission"])
    handed = {learner: [r for r in own if r["submission"]] for learner, own in learners.items()}
    assert {r["result"] for r in handed["corrupt"]} == {"unreadable"}
    assert [r["exercise"] for r in handed["corrupt"]] == [EXERCISE]       # named by its file name
    assert [r["checks"] for r in handed["corrupt"]] == ["2"]              # its exercise's checks, not passed
    assert {r["result"] for r in handed["stranger"]} == {"unreadable"}
    assert [r["exercise"] for r in handed["stranger"]] == ["my_notes.ipynb"]
    assert {r["result"] for r in handed["endless"]} == {"timeout"}
    ids = {r["check_id"] for r in handed["honest"]}
    assert ids == {f"{EXERCISE}/check_loss_scale_update", f"{EXERCISE}/check_loss_scale_update_hidden"}
    assert all(r["check_id"] in ids for learner in ("blank", "deletes", "endless") for r in handed[learner])
    deleted = handed["deletes"]
    assert len(deleted) == 2 and all(r["result"] == "failed" for r in deleted)
    assert any("restored" in r["check"] for r in deleted)     # put back, run, and failed on its merits
    assert all(r["result"] == "failed" for r in handed["patches"])   # the checks never ran in its process


@pytest.mark.slow
def test_the_gradebook_has_one_total_per_learner(gradebook):
    made, _, rows, _ = gradebook
    totals = {r["learner"]: r for r in rows if r["result"] == TOTAL}
    assert rows[-len(totals):] == list(totals.values())                    # after every check row
    assert set(totals) == set(made)
    for learner, own in by_learner(rows).items():
        total = totals[learner]
        assert int(total["passed"]) == sum(int(r["passed"]) for r in own) == sum(r["result"] == "passed" for r in own)
        assert int(total["checks"]) == sum(int(r["checks"]) for r in own)
    every = sum(len(course_copy(name)["checks"]) for name in known_exercises())   # a class lists the whole course
    assert (totals["honest"]["passed"], totals["honest"]["checks"]) == ("2", str(every))
    assert "all complete" not in totals["honest"]["message"] and "(not handed in)" in totals["honest"]["message"]
    assert EXERCISE in totals["blank"]["message"]
    assert (totals["corrupt"]["passed"], totals["corrupt"]["checks"]) == ("0", str(every))


@pytest.mark.slow
def test_the_class_is_graded_in_parallel_within_the_timeouts(gradebook):
    _, out, _, elapsed = gradebook
    # 9 notebooks on 2 workers; the endless one costs two interrupted cells of TIMEOUT seconds each.
    # About 2 minutes on a quiet 2-core machine; the bound is the fixture's hard limit, so a hang fails.
    assert elapsed < 900, elapsed
    table = out.stdout[out.stdout.index("learner  "):]                                 # the summary table
    honest = next(line for line in table.splitlines() if line.startswith("honest"))
    assert honest.split()[1:3] == ["1", "2"], honest              # one notebook handed in, both its checks passed


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
    assert restored.cell.source == "check_loss_scale_update(update_scale)" and restored.check is not None
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
    long = ("CheckFailed: " + " ".join(f"word{i}" for i in range(80))
            + " expected 1.0, got 2.0 (clip AFTER scaler.unscale_)")
    sub = Submission(Path("alice/x.ipynb"), "alice", "x", [CheckResult("check_x, cell [3]", "failed", long)])
    text = format_grade(sub)
    assert "word79 expected 1.0, got 2.0 (clip AFTER scaler.unscale_)" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 100


def test_grading_works_from_another_directory(tmp_path):
    nb_path = tmp_path / "mine.ipynb"
    nbformat.write(exercise(), nb_path)
    planned, _ = plan_cells(nbformat.read(nb_path, as_version=4), course_copy(EXERCISE))
    assert any(p.label for p in planned)


def test_notebook_cells_wait_patiently_for_output_on_a_busy_machine():
    seen = []

    class Probe:
        def pytest_collection_finish(self, session):
            seen.extend(getattr(item, "output_timeout", None) for item in session.items)

    args = [str(ROOT / "solutions" / f"{EXERCISE}.ipynb"), "--collect-only", "-q", "-p",
            "ampteach.grading.nbval_patience"]
    assert pytest.main(args, plugins=[Probe()]) == 0
    assert seen and set(seen) == {OUTPUT_PATIENCE}


# --- a failed check, as a learner sees it in the notebook ------------------------------------------------------

@pytest.mark.slow
def test_a_failed_check_in_a_notebook_shows_its_message_with_the_traceback_folded():
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nfrom ampteach.grading.checks import check_round_to_bf16"),
        nbformat.v4.new_code_cell("def round_to_bf16(x):\n    return x.view(torch.int32).bitwise_and(-65536)"
                                  ".view(torch.float32)   # truncates: wrong on ties and above\n"
                                  "check_round_to_bf16(round_to_bf16)"),
        nbformat.v4.new_code_cell("1 / 0   # any other error keeps its full traceback")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbclient.NotebookClient(nb, timeout=300, allow_errors=True).execute()
    folded, error = nb.cells[1].outputs[-2:]
    assert (error.output_type, error.ename) == ("error", "CheckFailed")
    assert len(error.traceback) == 1 and error.evalue in error.traceback[0]      # the message, nothing else
    html = folded.data["text/html"]
    assert folded.output_type == "display_data" and html.startswith("<details") and "<summary>" in html
    assert "check_round_to_bf16 failed" in html and "Traceback" in html           # the traceback, folded
    assert sum(o.output_type == "display_data" for o in nb.cells[1].outputs) == 1
    other = nb.cells[2].outputs[-1]
    assert other.ename == "ZeroDivisionError" and len(other.traceback) > 1


def test_the_cells_after_a_notebook_that_stopped_answering_count_as_timed_out(monkeypatch):
    """A cell whose process stops answering (an endless loop the watchdog could not interrupt on a busy machine)
    ends the notebook: it and every cell after it are "timeout", never "missing" (which means not handed in)."""
    from ampteach.grading import autograde
    from ampteach.grading.session import SessionLost

    class Hung:
        def __init__(self, *args, **kwargs):
            self.calls = 0

        def run_cell(self, source, timeout=None):
            self.calls += 1
            raise SessionLost("the notebook's process stopped answering after 30 s")

        request = run_cell

        def close(self):
            pass

    monkeypatch.setattr(autograde, "Session", Hung)
    nb = nbformat.read(ROOT / "exercises" / f"{EXERCISE}.ipynb", as_version=4)
    outcomes, notes = autograde.autograde(nb, EXERCISE, timeout=5, sandbox=None)
    assert outcomes and {o.result for o in outcomes} == {"timeout"}, [(o.label, o.result) for o in outcomes]
    assert any("stopped answering" in n for n in notes)
