"""Exercises come from solutions, fail untouched for the intended reason, and solutions pass grading.

The grader's own behaviour with a class of submissions (gaming, timeouts, corrupt files, the CSV)
is tested in tests/test_grade.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import tomllib
import torch

from ampteach.grading import exercises
from ampteach.grading.autograde import course_copy, known_exercises
from ampteach.grading.checks import CheckFailed
from ampteach.grading.grade import format_grade, grade_all

ROOT = Path(__file__).parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
# The bug hunt starts from a script that runs (with its planted bugs), not from a stub.
STARTS_FROM_CODE = {"debug_amp_bug_hunt"}
# The course's pytest run (the root conftest) runs every solution with its hidden checks in a kernel;
# every worked solution is also graded through `ampteach grade` (sandbox on) in tests/test_red_team.py.
# These are graded here from the solution files themselves: a stub, a starter script, a table.
GRADED_HERE = [ROOT / "solutions" / f"{name}.ipynb" for name in (
    "build_2_loss_scale_update", "debug_amp_bug_hunt", "predict_transformer_dtypes")]


# --- the generator ---------------------------------------------------------------------------------

def test_exercises_and_grading_copies_are_in_sync_with_solutions():
    """A learner's answers in exercises/ are reported as theirs and do not fail this; a stale generation does."""
    out = subprocess.run([sys.executable, "-m", "ampteach.grading.exercises", "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def committed(path: str) -> str | None:
    """The text of `path` as the checkout's last commit has it (None: not a git checkout, or not committed)."""
    out = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def test_the_committed_exercises_are_exactly_what_the_generator_writes(tmp_path):
    """The last commit's exercises are its solutions' generation, untouched: no hand edit, no answers. (A
    learner's uncommitted work in exercises/ does not count here; CI tests a clean clone.)"""
    if committed("pyproject.toml") is None:
        pytest.skip("not a git checkout: no commit to compare")
    differ = []
    for path in SOLUTIONS:
        solution, shipped = committed(f"solutions/{path.name}"), committed(f"exercises/{path.name}")
        if solution is None or shipped is None:
            continue                       # not committed yet
        (tmp_path / path.name).write_text(solution)
        if exercises.render(tmp_path / path.name) != shipped:
            differ.append(path.name)
    assert not differ, f"committed exercises are not their solutions' generation (regenerate, commit): {differ}"


# --- a learner's work in exercises/ is never lost ------------------------------------------------------------

def regenerate(course: Path, *flags: str) -> subprocess.CompletedProcess:
    """The regeneration command, run on a course folder of its own."""
    return subprocess.run([sys.executable, "-m", "ampteach.grading.exercises", *flags,
                           "--solutions", str(course / "solutions"), "--exercises", str(course / "exercises"),
                           "--checks", str(course / "checks")], capture_output=True, text=True, timeout=120)


@pytest.fixture
def course(tmp_path) -> Path:
    """A course folder with one real exercise, generated."""
    (tmp_path / "solutions").mkdir()
    name = "build_1_bf16_rounding.ipynb"
    shutil.copyfile(ROOT / "solutions" / name, tmp_path / "solutions" / name)
    assert regenerate(tmp_path).returncode == 0
    return tmp_path


def answer(path: Path, code: str = "    return x.to(torch.bfloat16)  # my answer") -> str:
    """Write a learner's answer into the exercise at `path` and run it (outputs saved); return the file's text."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "raise NotImplementedError()" in c.source)
    cell.source = cell.source.replace("    raise NotImplementedError()", code)
    cell.execution_count = 7
    cell.outputs = [nbformat.v4.new_output("stream", text="passed check_round_to_bf16: ...")]
    nb.metadata["language_info"] = {"name": "python", "version": "3.12.1"}     # JupyterLab's own touch
    nbformat.write(nb, path)
    return path.read_text()


def change_the_course(course: Path) -> None:
    path = course / "solutions" / "build_1_bf16_rounding.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].source += "\n\nA sentence the course added later."
    nbformat.write(nb, path)


def test_a_learners_answers_survive_every_regeneration_command(course):
    mine = course / "exercises" / "build_1_bf16_rounding.ipynb"
    work = answer(mine)
    for flags in [(), ("--check",)]:                       # the exercise itself has not changed: all is in sync
        out = regenerate(course, *flags)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "your own work" in out.stdout and "exercises/build_1_bf16_rounding.ipynb: code cell [" in out.stdout
        assert "out of date" not in out.stdout and mine.read_text() == work

    change_the_course(course)                              # now the course changed too: refused, not overwritten
    for flags in [("--check",), ()]:
        out = regenerate(course, *flags)
        assert out.returncode == 1 and mine.read_text() == work, out.stdout
    assert "NOT regenerated" in out.stdout and "ampteach start" in out.stdout and "--force" in out.stdout
    assert "exercises/build_1_bf16_rounding.ipynb" in out.stdout

    out = regenerate(course, "--force")                    # forced: the new version, and the learner's beside it
    kept = course / "exercises" / "build_1_bf16_rounding.yours.ipynb"
    assert out.returncode == 0 and kept.read_text() == work, out.stdout
    assert "A sentence the course added later" in mine.read_text() and "raise NotImplementedError()" in mine.read_text()
    assert "build_1_bf16_rounding.yours.ipynb" in out.stdout
    out = regenerate(course)                               # the kept copy is the learner's: never deleted
    assert out.returncode == 0 and kept.read_text() == work, out.stdout
    assert regenerate(course, "--check").returncode == 0


def test_running_an_exercise_is_not_a_change_but_a_stale_generation_is_rewritten(course):
    mine = course / "exercises" / "build_1_bf16_rounding.ipynb"
    nb = nbformat.read(mine, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="ran")]
    nb.cells[1].execution_count = 1
    nbformat.write(nb, mine)
    ran = mine.read_text()
    out = regenerate(course, "--check")
    assert out.returncode == 0 and "your own work" not in out.stdout, out.stdout
    assert regenerate(course).returncode == 0 and mine.read_text() == ran     # its outputs are left too

    change_the_course(course)                                                 # untouched cells: simply out of date
    out = regenerate(course, "--check")
    assert out.returncode == 1 and "out of date" in out.stdout and "your own work" not in out.stdout, out.stdout
    assert regenerate(course).returncode == 0
    assert "A sentence the course added later" in mine.read_text()


def test_only_untouched_exercises_of_a_removed_solution_are_deleted(course):
    notes = course / "exercises" / "my_notes.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), notes)
    shutil.copyfile(course / "solutions" / "build_1_bf16_rounding.ipynb", course / "solutions" / "other.ipynb")
    assert regenerate(course).returncode == 0
    other = course / "exercises" / "other.ipynb"
    answer(course / "exercises" / "build_1_bf16_rounding.ipynb")
    (course / "solutions" / "build_1_bf16_rounding.ipynb").unlink()
    (course / "solutions" / "other.ipynb").unlink()
    assert regenerate(course).returncode == 0
    assert not other.exists()                                                # generated, untouched: removed
    assert notes.is_file() and (course / "exercises" / "build_1_bf16_rounding.ipynb").is_file()


def test_solution_regions_become_stubs_keeping_indentation_and_hidden_checks_vanish():
    source = ("def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
              "### BEGIN HIDDEN CHECKS\nassert f(1) == 2\n### END HIDDEN CHECKS\n"
              "### BEGIN HIDDEN TESTS\nassert f(2) == 3\n### END HIDDEN TESTS\nprint('kept')")
    assert exercises.strip_regions(source, code=True) == \
        "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError()\nprint('kept')"
    assert exercises.strip_regions("Answer:\n### BEGIN SOLUTION\n42\n### END SOLUTION", code=False) == \
        "Answer:\nYOUR ANSWER HERE"


def test_starter_code_replaces_the_solution_uncommented():
    source = ("x = {\n    ### BEGIN SOLUTION\n    'a': 1,\n    ### STARTER CODE\n    # 'a': '?',\n    #\n"
              "    # 'b': '?',  # a note\n    ### END SOLUTION\n}")
    assert exercises.strip_regions(source, code=True) == "x = {\n    'a': '?',\n\n    'b': '?',  # a note\n}"


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a matching"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside an open"),
    ("### BEGIN HIDDEN CHECKS\nx = 1\n### END HIDDEN TESTS", "without a matching"),
    ("### STARTER CODE\n# x", "belongs inside"),
    ("### BEGIN SOLUTION\nx = 1\n### STARTER CODE\nx = 2\n### END SOLUTION", "written as '# ' comments"),
])
def test_unpaired_markers_are_reported(source, problem):
    with pytest.raises(exercises.MarkerError, match=problem):
        exercises.strip_regions(source, code=True, where="x.ipynb, cell 3")


def _solution() -> nbformat.NotebookNode:
    cells = [
        nbformat.v4.new_markdown_cell("# A title"),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                                  execution_count=3, outputs=[nbformat.v4.new_output("stream", text="hi")]),
        nbformat.v4.new_code_cell("check_one(f)"),
        nbformat.v4.new_code_cell("### BEGIN HIDDEN CHECKS\ncheck_two(f)\n### END HIDDEN CHECKS"),
    ]
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i}"
    return nbformat.v4.new_notebook(cells=cells)


def test_generated_exercise_has_no_outputs_no_hidden_cells_and_names_itself():
    solution = _solution()
    exercise = exercises.make_exercise(solution, "my_exercise.ipynb")
    assert [c.id for c in exercise.cells] == ["cell-0", "cell-1", "cell-2"]      # the all-hidden cell is gone
    assert exercise.cells[1].outputs == [] and exercise.cells[1].execution_count is None
    assert "raise NotImplementedError()" in exercise.cells[1].source
    assert exercise.metadata["ampteach"] == {"exercise": "my_exercise"}
    assert exercise.cells[2].metadata["editable"] is False and exercise.cells[2].metadata["deletable"] is False
    assert "editable" not in exercise.cells[1].metadata                          # the learner's cell stays open
    assert solution.cells[1].execution_count == 3 and "return 1" in solution.cells[1].source
    with pytest.raises(exercises.MarkerError, match="nothing to write"):
        exercises.make_exercise(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))


def test_grading_copy_holds_every_check_with_its_place_and_no_solution():
    copy = exercises.grading_copy(_solution(), "my_exercise.ipynb")
    assert copy["exercise"] == "my_exercise"
    visible, hidden = copy["checks"]
    assert (visible["id"], visible["functions"], visible["hidden"]) == ("cell-2", ["check_one"], False)
    assert (hidden["id"], hidden["functions"], hidden["hidden"]) == ("cell-3", ["check_two"], True)
    assert hidden["source"] == "check_two(f)" and hidden["after"] == ["cell-2", "cell-1", "cell-0"]
    assert "return 1" not in json.dumps(copy)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_the_package_copy_holds_no_solution_code(path):
    solution = nbformat.read(path, as_version=4)
    regions = re.findall(r"### BEGIN SOLUTION\n(.*?)### (?:STARTER CODE|END SOLUTION)",
                         "\n".join(c.source for c in solution.cells), flags=re.S)
    shipped = json.dumps(course_copy(path.stem))
    lines = {line.strip() for region in regions for line in region.splitlines()
             if len(line.strip()) > 25 and not line.strip().startswith("#")}
    assert lines and not [line for line in lines if line in shipped]


def test_every_solution_has_a_grading_copy_in_the_package_and_the_wheel_ships_it():
    assert known_exercises() == sorted(p.stem for p in SOLUTIONS)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = config["tool"]["setuptools"]["package-data"]["ampteach"]
    assert "grading/exercise_checks/*.json" in shipped


# --- exercises and solutions, graded -------------------------------------------------------------------

@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """Every exercise as the generator writes it (not exercises/, where a learner's answers may be), graded."""
    folder = tmp_path_factory.mktemp("untouched")
    for name, text in exercises.learner_notebooks(ROOT / "solutions").items():
        (folder / name).write_text(text)
    return {sub.exercise: sub for sub in grade_all([str(folder)], timeout=300, jobs=2)}


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_untouched_exercise_fails_every_check_for_the_intended_reason(untouched, path):
    sub = untouched[path.stem]
    report = format_grade(sub)
    copy = course_copy(path.stem)
    assert len(sub.checks) == len(copy["checks"]) >= 1, report
    assert sub.passed == 0 and all(c.result == "failed" for c in sub.checks), report
    for note in sub.notes:                                           # setup cells ran; demos of the
        assert "NotImplementedError" in note, report                 # learner's code wait for it
    for c in sub.checks:
        broken = r"(ImportError|ModuleNotFoundError|NameError|SyntaxError|AttributeError)"
        assert not re.match(broken, c.message), report
        if path.stem not in STARTS_FROM_CODE:
            assert c.message.startswith("NotImplementedError"), report
    assert sum("(hidden)" in c.check for c in sub.checks) == sum(c["hidden"] for c in copy["checks"]), report


@pytest.mark.slow
def test_solutions_pass_grading_hidden_checks_included():
    subs = grade_all([str(p) for p in GRADED_HERE], timeout=300, jobs=2)
    assert len(subs) == len(GRADED_HERE)
    for sub in subs:
        assert sub.total == len(course_copy(sub.exercise)["checks"]) and sub.passed == sub.total, format_grade(sub)


# --- checks that guard against borrowed answers and name common mistakes ---------------------------------

def test_torchs_own_scaler_is_refused_inside_the_build_5_check():
    from ampteach.grading.checks import check_grad_scaler

    class Borrowed:
        def __init__(self, *args, **kwargs):
            self.inner = torch.amp.GradScaler(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    with pytest.raises(CheckFailed, match="build the scaler"):
        check_grad_scaler(Borrowed)
    with pytest.raises(CheckFailed, match="inherits from a ready-made scaler"):
        check_grad_scaler(torch.amp.GradScaler)


def test_torch_autocast_is_refused_inside_the_build_6_check():
    from ampteach.grading.checks import check_autocast_mode

    class Borrowed(torch.overrides.TorchFunctionMode):
        def __init__(self, device_type, dtype):
            super().__init__()
            self.region = torch.autocast(device_type, dtype=dtype)

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with pytest.raises(CheckFailed, match="cast the inputs yourself"):
        check_autocast_mode(Borrowed)


def test_e6_2a_names_the_half_tensor_left_half_and_the_loss_left_inside_autocast():
    from ampteach.grading.checks import check_tiny_loss

    def disabled_only(logits):
        with torch.autocast(logits.device.type, enabled=False):
            return torch.log(torch.sigmoid(logits).sum())

    def float_only(logits):
        return torch.log(torch.sigmoid(logits.float()).sum())

    with pytest.raises(CheckFailed, match=r"autocast\(enabled=False\) does not upcast tensors that are already half"):
        check_tiny_loss(disabled_only)
    with pytest.raises(CheckFailed, match="ran inside the autocast region"):
        check_tiny_loss(float_only)


def test_e6_2b_asks_about_zero_grad_and_about_clipping_before_unscale():
    from ampteach.grading.checks import check_clipped_step
    from ampteach.grading.judges.when_amp_is_wrong import reference_accum_step as step

    check_clipped_step(step)
    with pytest.raises(CheckFailed, match="did you zero_grad"):
        check_clipped_step(lambda *a: step(*a, zero=False))
    with pytest.raises(CheckFailed, match="BEFORE clipping"):
        check_clipped_step(lambda *a: step(*a, unscale_first=False))
    with pytest.raises(CheckFailed, match="SUM over the micro-batches"):
        check_clipped_step(lambda *a: step(*a, mean=False))


def test_build_4_feedback_does_not_give_the_answer_away():
    from ampteach.amp.cast_lists import policy_of
    from ampteach.grading.checks import CAST_LIST_OPS, CHALLENGE_OPS, check_cast_lists

    answer = {d: {op: policy_of(op, d) for op in CAST_LIST_OPS + CHALLENGE_OPS} for d in ("cpu", "cuda")}
    answer["cuda"]["sum"] = "fp32"                   # the right family, the wrong list
    with pytest.raises(CheckFailed) as failure:
        check_cast_lists(lambda: answer)
    assert "cuda sum" in str(failure.value) and "fp32_set_opt_dtype'" not in str(failure.value)
    with pytest.raises(ValueError, match="reason out"):
        from ampteach.grading.checks import observe_autocast
        observe_autocast(CHALLENGE_OPS[0], "cpu")


def test_the_mx_check_agrees_with_the_course_library_where_it_exists():
    """The exercise's OCP rule (ampteach.grading.judges.mx_blocks) is written independently of ampteach.amp.mx."""
    mx = pytest.importorskip("ampteach.amp.mx")
    from ampteach.grading.checks.mx_blocks import ELEMENTS
    from ampteach.grading.judges.mx_blocks import mx_cases, ocp_reference

    gen = torch.Generator().manual_seed(0)
    for name, x in {**mx_cases(gen), **mx_cases(gen, hidden=True)}.items():
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        for elem in ELEMENTS:
            e, p = ocp_reference(x, elem)
            theirs = mx.mx_quantize(x, elem, block_size=32, scale_rounding="floor")
            ours = (p.double().reshape(blocks.shape) * torch.exp2(e.double())[..., None]).reshape(x.shape)
            assert torch.equal(mx.mx_dequantize(theirs).double(), ours), (name, elem)
            nonzero = blocks.abs().amax(-1) > 0
            assert torch.equal(theirs.scale_codes.long()[nonzero] - 127, e.long()[nonzero]), (name, elem)
