"""`ampteach export nbgrader|otter`: the exercises in the graders teachers run, end to end.

Cheap checks first, on every solution: both exports are written, nbgrader's metadata validates, the
points add up to the checks `ampteach grade` counts, and the learner's version of every cell under
each grader is the course's own exercise. Then, in a temporary folder, the graders' own commands
on two exercises (build 1, no hidden checks; build 2, one hidden check): nbgrader generate_assignment,
autograde and export, and otter assign and otter run. A worked solution scores full marks, the
untouched student notebook scores 0, a submission that passes the visible check but not the hidden
one scores exactly that, and under nbgrader a submission that edits the locked check cell (and
defines a fake check) is caught by the checksum and scores 0, and a hidden check's cell that a learner
deleted is put back (the worked build 2 deletes it) and scored. Expected scores are computed here from
the course's checks, not typed in. Skips only where nbgrader or otter-grader is not installed (the
`teach` extra; CI installs it through `dev`).
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from ampteach.grading.autograde import course_copy
from ampteach.grading.checks import course_check
from ampteach.grading.export_common import POINTS_PER_CHECK, free_names, read_parts, worked_code
from ampteach.grading.export_nbgrader import CELL_TIMEOUT, export_nbgrader, nbgrader_notebook
from ampteach.grading.export_otter import export_otter, otter_notebook

ROOT = Path(__file__).parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
PLAIN, HIDDEN = "build_1_bf16_rounding", "build_2_loss_scale_update"   # two quick exercises; build 2 hides a check
HAVE_NBGRADER = importlib.util.find_spec("nbgrader") is not None
HAVE_OTTER = importlib.util.find_spec("otter") is not None
needs_nbgrader = pytest.mark.skipif(not HAVE_NBGRADER, reason="nbgrader is not installed (pip install -e '.[teach]')")
needs_otter = pytest.mark.skipif(not HAVE_OTTER, reason="otter-grader is not installed (pip install -e '.[teach]')")


def exercise(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "exercises" / f"{name}.ipynb", as_version=4)


def n_checks(name: str) -> int:
    """The checks `ampteach grade` scores for this exercise (its score is checks passed / checks)."""
    return len(course_copy(name)["checks"])


# --- every solution, no grader run ---------------------------------------------------------------------

@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_nbgrader_notebook_carries_metadata_and_the_course_points(path):
    nb = nbgrader_notebook(path)
    meta = [c.metadata["nbgrader"] for c in nb.cells]
    assert len({m["grade_id"] for m in meta}) == len(meta), "grade ids must be unique"
    graded = [m for m in meta if m["grade"] and not m["solution"]]
    assert all(m["locked"] for m in graded) and all(m["points"] == POINTS_PER_CHECK for m in graded)
    assert len(graded) == n_checks(path.stem)
    assert sum(m.get("points", 0) for m in meta) == POINTS_PER_CHECK * n_checks(path.stem)
    for cell, m in zip(nb.cells, meta):
        if m["solution"]:
            assert not m["locked"] and "### BEGIN SOLUTION" in cell.source
        else:
            assert m["locked"], f"{m['grade_id']} must be read-only"
    hidden = [c for c in nb.cells if c.metadata["nbgrader"]["grade_id"].startswith("hidden-check-")]
    assert all("### BEGIN HIDDEN TESTS" in c.source and "### END HIDDEN TESTS" in c.source for c in hidden)
    assert len(hidden) == sum(c["hidden"] for c in course_copy(path.stem)["checks"])
    if HAVE_NBGRADER:
        from nbgrader.nbgraderformat import MetadataValidator
        MetadataValidator().validate_nb(nb)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_otter_master_has_one_test_per_check_with_its_points(path):
    nb = otter_notebook(path)
    raw = [c.source for c in nb.cells if c.cell_type == "raw"]
    assert raw[0].startswith("# ASSIGNMENT CONFIG") and f"name: {path.stem}" in raw[0]
    tests = [c for c in nb.cells if c.id.startswith("test-")]
    checks = [p for p in read_parts(path) if p.functions]
    mixed = sum(p.role == "check" and p.has_hidden_region for p in checks)   # a public and a hidden test each
    assert len(tests) == n_checks(path.stem) + mixed
    assert sum(c.source.startswith("# HIDDEN\n") for c in tests) == sum(
        c["hidden"] for c in course_copy(path.stem)["checks"]) + mixed
    points = [json.loads(line.split(":", 1)[1]) for r in raw for line in r.splitlines() if line.startswith("points: [")]
    assert sum(map(sum, points)) == POINTS_PER_CHECK * n_checks(path.stem)
    for begin, end in (("QUESTION", "QUESTION"), ("SOLUTION", "SOLUTION"), ("TESTS", "TESTS")):
        assert sum(r.startswith(f"# BEGIN {begin}\n") or r == f"# BEGIN {begin}" for r in raw) == \
            sum(r == f"# END {end}" for r in raw)


@needs_otter
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_otter_student_code_is_the_course_exercise(path):
    """Otter's own solution stripping, applied to the master, gives exactly the course's exercise cell."""
    from otter.assign.solutions import replace_solutions

    learner = {c.id: c.source for c in exercise(path.stem).cells}
    solved = {p.cell.id: p for p in read_parts(path)}
    masters = [c for c in otter_notebook(path).cells if c.id in solved and solved[c.id].role == "solution"]
    assert masters, "every exercise has something to write"
    for cell in masters:
        assert "\n".join(replace_solutions(cell.source.split("\n"), "python")) == learner[cell.id]
        assert worked_code(solved[cell.id].cell.source) in cell.source


@needs_nbgrader
def test_nbgrader_keeps_the_course_starter_code():
    """nbgrader's ClearSolutions would put its stub where the buggy loop is; the course's subclass keeps it."""
    from nbgrader.preprocessors import ClearSolutions

    from ampteach.grading.nbgrader_starter import ClearSolutionsWithStarter, generate_assignment_preprocessors

    assert ClearSolutionsWithStarter in generate_assignment_preprocessors()
    assert ClearSolutions not in generate_assignment_preprocessors()
    starters = [p for p in SOLUTIONS if "### STARTER CODE" in p.read_text()]
    assert starters, "some solution gives starter code"
    for path in starters:
        learner = {c.id: c.source for c in exercise(path.stem).cells}
        nb = nbgrader_notebook(path)
        nb, _ = ClearSolutionsWithStarter().preprocess(nb, {})
        for cell in nb.cells:
            if cell.metadata["nbgrader"]["solution"]:
                assert cell.source == learner[cell.id], f"{path.stem}, cell {cell.id}"


def test_a_check_cell_with_a_hidden_region_keeps_it_hidden_in_both(tmp_path):
    """No solution has one yet: a visible check cell whose second half is hidden. nbgrader keeps one graded
    cell with a HIDDEN TESTS region; Otter gets a 0-point public test of the visible half and the whole cell
    as a hidden test worth the check's point, so the points stay the course's."""
    nb = nbformat.read(ROOT / "solutions" / f"{HIDDEN}.ipynb", as_version=4)
    visible = next(c for c in nb.cells if c.source.startswith("check_loss_scale_update("))
    hidden = next(c for c in nb.cells if "### BEGIN HIDDEN CHECKS" in c.source)
    visible.source += "\n" + hidden.source
    nb.cells.remove(hidden)
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / f"{HIDDEN}.ipynb"
    nbformat.write(nb, path)
    cell = next(c for c in nbgrader_notebook(path).cells if c.id == visible.id)
    assert cell.metadata["nbgrader"]["points"] == POINTS_PER_CHECK
    shown = cell.source.split("### BEGIN HIDDEN TESTS")[0]
    assert "check_loss_scale_update(update_scale)" in shown and "_hidden" not in shown
    assert "_hidden(update_scale)" in cell.source.split("### BEGIN HIDDEN TESTS")[1]
    master = otter_notebook(path)
    tests = [c.source for c in master.cells if c.id.startswith("test-")]
    assert [t.startswith("# HIDDEN\n") for t in tests] == [False, True]
    assert "_hidden" not in tests[0] and "check_loss_scale_update_hidden(update_scale)" in tests[1]
    assert f"points: [0, {POINTS_PER_CHECK}]" in "\n".join(c.source for c in master.cells if c.cell_type == "raw")


def test_free_names_are_what_a_check_cell_reads_from_the_notebook():
    src = ("rows = {p: measure(p, data) for p in PRECISIONS}\ncheck_table(rows, device)\n"
           "import math\nprint(len(rows), math.pi)\ndef later():\n    return helper(rows)\n")
    assert sorted(free_names(src)) == sorted(["check_table", "device", "PRECISIONS", "measure", "data", "helper"])


def test_nbgrader_cell_timeout_is_the_course_graders():
    from ampteach.grading.grade import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.get_default("timeout") == CELL_TIMEOUT


def test_export_command_writes_both_and_refuses_to_overwrite(tmp_path, capsys):
    from ampteach.tools.cli import main

    assert main(["export", "nbgrader", str(tmp_path / "course"), "--exercise", HIDDEN]) == 0
    assert (tmp_path / "course" / "nbgrader_config.py").is_file()
    assert (tmp_path / "course" / "source" / HIDDEN / f"{HIDDEN}.ipynb").is_file()
    assert main(["export", "otter", str(tmp_path / "otter")]) == 0
    assert sorted(p.stem for p in (tmp_path / "otter").glob("*.ipynb")) == [p.stem for p in SOLUTIONS]
    capsys.readouterr()
    assert main(["export", "otter", str(tmp_path / "otter"), "--exercise", HIDDEN]) == 2
    assert "--force" in capsys.readouterr().out
    assert main(["export", "otter", str(tmp_path / "otter"), "--exercise", "no_such_exercise"]) == 2
    assert HIDDEN in capsys.readouterr().out      # the message lists the exercises there are
    assert main(["export", "otter", str(tmp_path / "otter"), "--exercise", HIDDEN, "--force"]) == 0


# --- the graders themselves, end to end --------------------------------------------------------------------

def run(*cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    """A grader's command, in this Python's environment; fails the test with its output if it fails."""
    done = subprocess.run([sys.executable, "-m", *cmd], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def worked(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """A copy of a student notebook with every solution cell written as the course's solution has it."""
    solution = {c.id: c.source for c in nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4).cells}
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in solution.get(cell.id, ""):
            cell.source = worked_code(solution[cell.id])
    return nb


SNEAKY = "    if growth_interval == 1 and not found_inf:\n        return scale, 0   # forgets to grow\n"


def sneaky(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Build 2 worked, with a bug only the hidden check's plans (growth_interval=1) reach."""
    nb = worked(nb, HIDDEN)
    cell = next(c for c in nb.cells if c.source.startswith("def update_scale("))
    head, body = cell.source.split('"""One step of dynamic loss scaling: returns (new_scale, new_growth_tracker)."""\n')
    cell.source = head + '"""One step of dynamic loss scaling."""\n' + SNEAKY + body
    return nb


@functools.cache
def sneaky_expected() -> tuple[int, ...]:
    """Points the sneaky answer earns per check cell, by the course's checks run here."""
    namespace: dict = {}
    nb = sneaky(exercise(HIDDEN))
    exec("import torch\n" + next(c.source for c in nb.cells if c.source.startswith("def update_scale(")), namespace)
    points = []
    for check in course_copy(HIDDEN)["checks"]:
        try:
            for name in check["functions"]:
                course_check(name)(namespace["update_scale"])
            points.append(POINTS_PER_CHECK)
        except AssertionError:
            points.append(0)
    assert 0 < sum(points) < POINTS_PER_CHECK * len(points), "the sneaky answer must pass some checks and fail others"
    return tuple(points)


def nbgrader_pipeline(course: Path) -> dict:
    """An nbgrader course of the two exercises: generated, a class's submissions autograded, grades exported."""
    export_nbgrader(course, names=[PLAIN, HIDDEN])
    for name in (PLAIN, HIDDEN):
        run("nbgrader", "generate_assignment", name, cwd=course)
    release = {name: nbformat.read(course / "release" / name / f"{name}.ipynb", as_version=4)
               for name in (PLAIN, HIDDEN)}

    def submit(student: str, name: str, nb) -> None:
        folder = course / "submitted" / student / name
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{name}.ipynb")

    for name in (PLAIN, HIDDEN):
        done = worked(release[name], name)
        if name == HIDDEN:   # and the hidden check's cell deleted (all it shows is a comment): nbgrader puts it back
            done.cells = [c for c in done.cells if not c.metadata["nbgrader"]["grade_id"].startswith("hidden-check-")]
        submit("worked", name, done)
        submit("untouched", name, release[name])
    submit("sneaky", HIDDEN, sneaky(release[HIDDEN]))
    cheat = nbformat.from_dict(release[HIDDEN])   # edits the locked check cell, and brings its own checks
    answer = next(c for c in cheat.cells if c.metadata["nbgrader"]["solution"])
    answer.source = answer.source.replace("raise NotImplementedError()", "return scale, growth_tracker") + \
        "\n\ndef check_loss_scale_update(f):\n    pass\n\ndef check_loss_scale_update_hidden(f):\n    pass\n"
    check = next(c for c in cheat.cells if c.metadata["nbgrader"]["grade_id"].startswith("check-"))
    check.source = "pass  # the check cell, edited"
    submit("cheat", HIDDEN, cheat)
    logs = {}
    for name in (PLAIN, HIDDEN):
        done = run("nbgrader", "autograde", name, cwd=course)
        logs[name] = done.stdout + done.stderr
    run("nbgrader", "export", cwd=course)
    with open(course / "grades.csv", newline="") as f:
        grades = list(csv.DictReader(f))
    return {"course": course, "release": release, "logs": logs, "grades": grades, "check_id": check.id,
            "students": ["worked", "untouched", "sneaky", "cheat"]}


def otter_run(zipfile: Path, notebook: nbformat.NotebookNode, where: Path) -> dict[str, tuple[float, float]]:
    """`otter run` on one submission: {question: (score, max score)}."""
    where.mkdir(parents=True)
    submission = where / zipfile.name.split("-autograder_")[0]
    nbformat.write(notebook, submission.with_suffix(".ipynb"))
    run("otter", "run", "-a", str(zipfile), "-o", str(where), "--no-logo", str(submission.with_suffix(".ipynb")),
        cwd=where)
    results = json.loads((where / "results.json").read_text())
    return {t["name"]: (t["score"], t["max_score"]) for t in results["tests"] if "score" in t}


def otter_pipeline(folder: Path) -> dict:
    """The two exercises through otter assign, then otter run on a worked, an untouched and a sneaky notebook."""
    export_otter(folder / "masters", names=[PLAIN, HIDDEN])
    out: dict = {"student": {}, "scores": {}}
    for name in (PLAIN, HIDDEN):
        dist = folder / "dist" / name
        # --no-run-tests: the solution is graded below with `otter run`, as a teacher's submission would be
        run("otter", "assign", "--no-run-tests", str(folder / "masters" / f"{name}.ipynb"), str(dist), cwd=folder)
        (zipfile,) = (dist / "autograder").glob(f"{name}-autograder_*.zip")
        student = nbformat.read(dist / "student" / f"{name}.ipynb", as_version=4)
        solution = nbformat.read(dist / "autograder" / f"{name}.ipynb", as_version=4)
        out["student"][name] = student
        out["scores"][name, "worked"] = otter_run(zipfile, solution, folder / "runs" / name / "worked")
        out["scores"][name, "untouched"] = otter_run(zipfile, student, folder / "runs" / name / "untouched")
        if name == HIDDEN:
            out["scores"][name, "sneaky"] = otter_run(zipfile, sneaky(student), folder / "runs" / name / "sneaky")
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """Both graders' pipelines, run side by side (each is mostly kernels starting and importing torch)."""
    pipelines = {"nbgrader": (HAVE_NBGRADER, nbgrader_pipeline), "otter": (HAVE_OTTER, otter_pipeline)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {key: pool.submit(fn, tmp_path_factory.mktemp(key)) for key, (have, fn) in pipelines.items() if have}
    results = {}
    for key, job in jobs.items():
        try:
            results[key] = job.result()
        except Exception as exc:   # reported by each test that needs this grader
            results[key] = exc
    return results


def grader(graded: dict, key: str) -> dict:
    if isinstance(graded.get(key), Exception):
        raise graded[key]
    return graded[key]


def cell_scores(course: Path, name: str, student: str) -> list[float]:
    """nbgrader's score of each graded cell of one submission, in notebook order."""
    from nbgrader.api import Gradebook

    order = [c.metadata["nbgrader"]["grade_id"] for c in nbgrader_notebook(ROOT / "solutions" / f"{name}.ipynb").cells]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        scores = {g.name: g.score for g in gb.find_submission_notebook(name, name, student).grades}
    return [scores[g] for g in order if g in scores]


@needs_nbgrader
def test_nbgrader_release_is_the_course_exercise(graded):
    for name, nb in grader(graded, "nbgrader")["release"].items():
        course_cells = {c.id: c.source for c in exercise(name).cells}
        for cell in nb.cells:
            if cell.id in course_cells and not cell.metadata["nbgrader"]["grade"]:
                assert cell.source == course_cells[cell.id]
        assert "check_loss_scale_update_hidden" not in nbformat.writes(nb), "the hidden check must not ship"


@needs_nbgrader
def test_nbgrader_scores_worked_untouched_sneaky_and_cheat(graded):
    nbg = grader(graded, "nbgrader")
    course = nbg["course"]
    for name in (PLAIN, HIDDEN):
        assert cell_scores(course, name, "worked") == [float(POINTS_PER_CHECK)] * n_checks(name)
        assert cell_scores(course, name, "untouched") == [0.0] * n_checks(name)
    assert cell_scores(course, HIDDEN, "sneaky") == [float(p) for p in sneaky_expected()]
    assert cell_scores(course, HIDDEN, "cheat") == [0.0] * n_checks(HIDDEN)
    assert f"Attribute 'checksum' for cell check-{nbg['check_id']} has changed" in nbg["logs"][HIDDEN]
    assert "Missing grade cell hidden-check-" in nbg["logs"][HIDDEN]


@needs_nbgrader
def test_nbgrader_export_has_a_row_per_student_and_assignment(graded):
    """nbgrader export writes every (assignment, student) pair; a student with no submission scores 0."""
    nbg = grader(graded, "nbgrader")
    rows = [(r["assignment"], r["student_id"], float(r["score"]), float(r["max_score"])) for r in nbg["grades"]]
    top = {name: float(POINTS_PER_CHECK * n_checks(name)) for name in (PLAIN, HIDDEN)}
    score = {(PLAIN, "worked"): top[PLAIN], (HIDDEN, "worked"): top[HIDDEN],
             (HIDDEN, "sneaky"): float(sum(sneaky_expected()))}
    expected = [(name, student, score.get((name, student), 0.0), top[name])
                for name in (PLAIN, HIDDEN) for student in nbg["students"]]
    assert sorted(rows) == sorted(expected)


@needs_otter
@pytest.mark.parametrize("name", [PLAIN, HIDDEN])
def test_otter_run_gives_the_solution_full_marks_and_the_student_notebook_zero(graded, name):
    ott = grader(graded, "otter")
    top = float(POINTS_PER_CHECK * n_checks(name))
    for who, want in (("worked", top), ("untouched", 0.0)):
        scores = ott["scores"][name, who]
        assert (sum(s for s, _ in scores.values()), sum(m for _, m in scores.values())) == (want, top), who
    student = ott["student"][name]
    course_cells = {c.id: c.source for c in exercise(name).cells}
    answers = [c for c in student.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    assert answers and all(c.source == course_cells[c.id] for c in answers)
    assert "_hidden" not in json.dumps(student.metadata), "hidden tests must not ship in the student notebook"


@needs_otter
def test_otter_run_scores_the_hidden_check_on_its_own(graded):
    scores = grader(graded, "otter")["scores"][HIDDEN, "sneaky"]
    assert sum(s for s, _ in scores.values()) == float(sum(sneaky_expected()))
