"""`ampteach start`: a course folder of the learner's own, whose work no later run overwrites.

The folder is prepared from this checkout (lessons as committed, exercises generated from solutions/),
from a copy laid out as a plain install lays it out (share/ampteach/), and by the command itself; a
real JupyterLab is started the way the command starts it, and asked for the lesson and an exercise.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from ampteach.grading.exercises import learner_notebooks
from ampteach.tools import cli, start
from ampteach.tools.course_map import LINK

ROOT = Path(__file__).parents[1]
EXERCISE = "exercises/build_1_bf16_rounding.ipynb"


@pytest.fixture(scope="module")
def course() -> start.CourseFiles:
    return start.checkout_files(ROOT)


def answer(path: Path) -> str:
    """Write an answer into an exercise as a learner does (and run it); return the file's text."""
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "raise NotImplementedError()" in c.source)
    cell.source = cell.source.replace("raise NotImplementedError()", "return x  # my answer")
    cell.outputs, cell.execution_count = [nbformat.v4.new_output("stream", text="ran")], 3
    nbformat.write(nb, path)
    return path.read_text()


def newer(course: start.CourseFiles, *paths: str) -> start.CourseFiles:
    """The same course with a later version of `paths` (a sentence added to their first cell)."""
    files = dict(course.files)
    for path in paths:
        nb = nbformat.reads(files[path], as_version=4)
        nb.cells[0].source += "\n\nAdded in a later version of the course."
        files[path] = nbformat.writes(nb) + "\n"
    return start.CourseFiles("a later course", files)


def test_the_folder_holds_the_lessons_and_the_exercises_as_generated(course, tmp_path):
    done = start.prepare(tmp_path / "mine", course)
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (tmp_path / "mine/notebooks").glob("*.ipynb")) == lessons
    for name, text in learner_notebooks(ROOT / "solutions").items():
        assert (tmp_path / "mine/exercises" / name).read_text() == text          # never a copy of exercises/
    assert (tmp_path / "mine/notebooks/00_start_here.ipynb").read_bytes() == \
        (ROOT / "notebooks/00_start_here.ipynb").read_bytes()
    assert len(done.written) == len(course.files) and not (done.kept or done.updated or done.fresh)


def test_its_readme_lists_every_lesson_then_its_exercises_with_links_that_resolve(course, tmp_path):
    start.prepare(tmp_path, course)
    readme = (tmp_path / "README.md").read_text()
    targets = [target for _, _, target, _ in LINK.findall(readme)]
    assert sorted(targets) == sorted(course.files.keys() - {"README.md"})
    assert all((tmp_path / target).is_file() for target in targets)
    lessons = [t for t in targets if t.startswith("notebooks/")]
    assert lessons == sorted(lessons)                                             # in course order
    assert readme.index("notebooks/01_float_formats") < readme.index(EXERCISE) < readme.index("notebooks/02_")


def test_the_lessons_links_to_lessons_and_exercises_resolve_inside_the_folder(course, tmp_path):
    """Every link a lesson has to a lesson or an exercise of the course works in the learner's folder too."""
    start.prepare(tmp_path, course)
    exercises = {f"{p.stem}.ipynb" for p in (ROOT / "solutions").glob("*.ipynb")}
    checked, broken = 0, []
    for lesson in sorted((tmp_path / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(lesson, as_version=4).cells:
            for _, _, target, _ in LINK.findall(cell.source) if cell.cell_type == "markdown" else []:
                path = (ROOT / "notebooks" / target.split("#")[0]).resolve()
                in_course = path.parent == (ROOT / "notebooks").resolve() and path.is_file() or \
                    path.parent == (ROOT / "exercises").resolve() and path.name in exercises
                if in_course and target.endswith(".ipynb"):
                    checked += 1
                    if not (lesson.parent / target).resolve().is_file():
                        broken.append(f"{lesson.name}: {target}")
    assert checked >= 10 and not broken, broken


def test_a_learners_changes_survive_every_later_run(course, tmp_path):
    start.prepare(tmp_path, course)
    mine, other = tmp_path / EXERCISE, tmp_path / "exercises/build_2_loss_scale_update.ipynb"
    work = answer(mine)

    again = start.prepare(tmp_path, course)                     # the course has not changed: nothing to offer
    assert mine.read_text() == work and again.kept == [EXERCISE] and not again.fresh and not again.written

    later = newer(course, EXERCISE, "exercises/build_2_loss_scale_update.ipynb")
    done = start.prepare(tmp_path, later)                       # it has: yours stays, the new one goes beside it
    fresh = tmp_path / "exercises/build_1_bf16_rounding.fresh.ipynb"
    assert mine.read_text() == work and fresh.read_text() == later.files[EXERCISE]
    assert done.fresh == [(EXERCISE, "exercises/build_1_bf16_rounding.fresh.ipynb")]
    assert done.updated == ["exercises/build_2_loss_scale_update.ipynb"]                # untouched: brought up to date
    assert other.read_text() == later.files["exercises/build_2_loss_scale_update.ipynb"]
    assert "exercises/build_1_bf16_rounding.fresh.ipynb" in done.describe("x")

    assert not start.prepare(tmp_path, later).fresh             # no second copy of the same version
    answer(fresh)                                               # the learner starts over in the fresh copy ...
    latest = newer(later, EXERCISE)
    done = start.prepare(tmp_path, latest)                      # ... and neither copy is overwritten
    assert done.fresh == [(EXERCISE, "exercises/build_1_bf16_rounding.fresh-2.ipynb")]
    assert mine.read_text() == work and "my answer" in fresh.read_text()


def test_a_deleted_file_comes_back_and_a_ran_lesson_is_kept(course, tmp_path):
    start.prepare(tmp_path, course)
    (tmp_path / EXERCISE).unlink()
    lesson = tmp_path / "notebooks/00_start_here.ipynb"
    lesson.write_text(lesson.read_text().replace('"execution_count": 1', '"execution_count": 11', 1))
    done = start.prepare(tmp_path, course)
    assert done.written == [EXERCISE] and (tmp_path / EXERCISE).read_text() == course.files[EXERCISE]
    assert done.kept == ["notebooks/00_start_here.ipynb"] and '"execution_count": 11' in lesson.read_text()


def test_answers_in_a_checkouts_exercises_are_never_handed_out(tmp_path):
    root = tmp_path / "clone"
    for folder in ("notebooks", "solutions", "exercises", "course"):
        (root / folder).mkdir(parents=True)
    (root / "course/README.md").write_text("| # | notebook |\n|---|---|\n| 0 | [x](../notebooks/00_a.ipynb) |\n"
                                           "| 0 | [e](../exercises/e.ipynb) |\n")
    lesson = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 0. A")])
    nbformat.write(lesson, root / "notebooks/00_a.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# E"), nbformat.v4.new_code_cell(
        "### BEGIN SOLUTION\nanswer = 42  # the secret\n### END SOLUTION")]), root / "solutions/e.ipynb")
    (root / "exercises/e.ipynb").write_text(learner_notebooks(root / "solutions")["e.ipynb"].replace(
        "raise NotImplementedError()", "answer = 42  # the secret"))
    files = start.checkout_files(root).files
    assert "the secret" not in files["exercises/e.ipynb"]
    assert "raise NotImplementedError()" in files["exercises/e.ipynb"]
    assert "- Lesson 0: [0. A](notebooks/00_a.ipynb)\n  - exercise: [E](exercises/e.ipynb)" in files["README.md"]


def test_an_installed_copy_hands_out_only_exercises_as_generated(tmp_path):
    share = tmp_path / "share/ampteach"
    for folder in ("notebooks", "exercises", "course"):
        (share / folder).mkdir(parents=True)
    (share / "notebooks/00_start_here.ipynb").write_text((ROOT / "notebooks/00_start_here.ipynb").read_text())
    (share / "course/README.md").write_text((ROOT / "course/README.md").read_text())
    generated = learner_notebooks(ROOT / "solutions")
    (share / "exercises/build_1_bf16_rounding.ipynb").write_text(generated["build_1_bf16_rounding.ipynb"])
    (share / "exercises/build_2_loss_scale_update.ipynb").write_text(generated["build_2_loss_scale_update.ipynb"])
    answer(share / "exercises/build_2_loss_scale_update.ipynb")
    course = start.installed_files(share)
    assert set(course.files) == {"notebooks/00_start_here.ipynb", EXERCISE, "README.md"}
    assert course.skipped == ["build_2_loss_scale_update.ipynb"]
    assert EXERCISE in course.files["README.md"]


def test_the_command_prepares_the_folder_keeps_work_and_refuses_the_checkout(tmp_path, capsys):
    folder = tmp_path / "ampteach-course"
    assert cli.main(["start", str(folder), "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert str(folder) in out and (folder / EXERCISE).is_file() and "jupyter lab" in out
    work = answer(folder / EXERCISE)
    assert cli.main(["start", str(folder), "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert (folder / EXERCISE).read_text() == work
    assert f"kept 1 file(s) you changed, as they are:\n    {EXERCISE}" in out
    assert cli.main(["start", str(ROOT), "--no-lab"]) == 2
    assert "own checkout" in capsys.readouterr().err


def test_what_it_says_names_every_file_it_kept_and_every_fresh_copy(course, tmp_path):
    first = start.prepare(tmp_path / "mine", course)
    assert "up to date" in start.prepare(tmp_path / "mine", course).describe("x")
    tmp_path = tmp_path / "mine"
    lessons = sum(p.startswith("notebooks/") for p in course.files)
    assert f"copied the course: {lessons} lesson(s) into notebooks/" in first.describe("x")
    mine = ["notebooks/00_start_here.ipynb", EXERCISE, "exercises/build_2_loss_scale_update.ipynb"]
    for path in mine:
        answer(tmp_path / path) if path.startswith("exercises/") else (tmp_path / path).write_text(
            (tmp_path / path).read_text().replace('"execution_count": 1', '"execution_count": 11', 1))
    (tmp_path / "exercises/build_3_master_weight_step.ipynb").unlink()
    said = start.prepare(tmp_path, newer(course, EXERCISE)).describe("x")
    after = said.split("as they are:\n", 1)[1].splitlines()
    kept = [line.strip() for line in itertools.takewhile(lambda line: line.startswith("    "), after)]
    assert sorted(kept) == sorted(mine), said
    assert f"    {EXERCISE} -> exercises/build_1_bf16_rounding.fresh.ipynb" in said
    assert "copied 1 file(s) that were missing:\n    exercises/build_3_master_weight_step.ipynb" in said


def test_run_again_inside_the_folder_or_below_it_updates_that_folder(tmp_path, monkeypatch, capsys):
    """The folder's README says to run `ampteach start` there again: that updates it, never nests a second copy."""
    folder = tmp_path / "ampteach-course"
    monkeypatch.chdir(tmp_path)
    assert cli.main(["start", "--no-lab"]) == 0 and (folder / EXERCISE).is_file()
    work = answer(folder / EXERCISE)
    for where in (folder, folder / "exercises", folder / ".ampteach"):
        monkeypatch.chdir(where)
        capsys.readouterr()
        assert cli.main(["start", "--no-lab"]) == 0
        out = capsys.readouterr().out
        assert f"you are in your course folder {folder}" in out and f"    {EXERCISE}" in out, out
        assert not list(folder.rglob("ampteach-course")) and (folder / EXERCISE).read_text() == work
    assert start.course_folder_of(folder / "notebooks") == folder and start.course_folder_of(tmp_path) is None


def test_a_dir_inside_a_course_folder_is_refused_with_what_to_do(course, tmp_path, capsys):
    start.prepare(tmp_path / "mine", course)
    for inside in (tmp_path / "mine/ampteach-course", tmp_path / "mine/exercises/new"):
        with pytest.raises(FileExistsError, match="inside your course folder"):
            start.prepare(inside, course)
        assert cli.main(["start", str(inside), "--no-lab"]) == 2 and not inside.exists()
        assert "without DIR" in capsys.readouterr().err
    start.prepare(tmp_path / "mine", course)                   # the folder itself: updated as ever


def test_options_after_a_double_dash_go_to_jupyterlab(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(start.subprocess, "call", lambda cmd, cwd: calls.append(cmd) or 0)
    extra = ["--allow-root", "--port", "8890", "--no-browser"]
    assert cli.main(["start", str(tmp_path / "c"), "--", *extra]) == 0
    assert calls[-1][-4:] == extra and calls[-1][:4] == [sys.executable, "-m", "jupyter", "lab"]
    assert cli.main(["start", "--no-lab", str(tmp_path / "c"), "--", "--allow-root"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("jupyter lab --allow-root")
    assert cli.split_passed_on(["grade", "--", "-odd.ipynb"]) == (["grade", "--", "-odd.ipynb"], [])  # argparse's


def test_as_root_a_failed_jupyterlab_says_to_pass_allow_root(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(start.subprocess, "call", lambda cmd, cwd: 1)
    monkeypatch.setattr(start, "_is_root", lambda: True)
    assert cli.main(["start", str(tmp_path / "c")]) == 1
    assert f"ampteach start {tmp_path / 'c'} -- --allow-root`" in capsys.readouterr().err
    assert cli.main(["start", str(tmp_path / "c"), "--", "--port", "8890"]) == 1
    assert f"ampteach start {tmp_path / 'c'} -- --port 8890 --allow-root`" in capsys.readouterr().err
    assert cli.main(["start", str(tmp_path / "c"), "--", "--allow-root"]) == 1
    assert "--allow-root" not in capsys.readouterr().err


def test_in_a_checkout_the_default_course_folder_is_ignored_by_git():
    """Else JupyterLab and git in a checkout show a second, untracked copy of every lesson."""
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    for path in (f"{start.DEFAULT_FOLDER}/{EXERCISE}", f"notebooks/{start.DEFAULT_FOLDER}/README.md"):
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT)
        assert ignored.returncode == 0, f"{path} is not ignored by git: add {start.DEFAULT_FOLDER}/ to .gitignore"
    assert subprocess.run(["git", "check-ignore", "-q", "--no-index", EXERCISE], cwd=ROOT).returncode == 1


def test_without_no_lab_it_starts_jupyterlab_at_the_folders_root_on_lesson_0(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(start.subprocess, "call", lambda cmd, cwd: calls.append((cmd, cwd)) or 0)
    assert cli.main(["start", str(tmp_path / "c")]) == 0
    (cmd, cwd), = calls
    assert cwd == tmp_path / "c" and cmd[:4] == [sys.executable, "-m", "jupyter", "lab"]
    assert f"--ServerApp.root_dir={(tmp_path / 'c').resolve()}" in cmd
    assert "--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb" in cmd


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_jupyterlab_started_that_way_opens_lesson_0_and_reaches_the_exercises(course, tmp_path):
    start.prepare(tmp_path / "c", course)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    cmd = start.lab_command(tmp_path / "c", ["--no-browser", "--ip=127.0.0.1", f"--port={port}",
                                             "--ServerApp.port_retries=0", "--IdentityProvider.token=",
                                             "--allow-root"])
    server = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "JupyterLab did not start"
                time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as redirect:
            urllib.request.build_opener(NoRedirect).open(f"http://127.0.0.1:{port}/", timeout=10)
        assert redirect.value.headers["Location"].split("?")[0].endswith("/lab/tree/notebooks/00_start_here.ipynb")
        for path in ("notebooks/00_start_here.ipynb", EXERCISE):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/{path}?content=0", timeout=10) as r:
                assert json.load(r)["path"] == path
    finally:
        server.terminate()
        server.wait(timeout=30)
