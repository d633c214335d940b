"""A plain (non-editable) install works from any directory, with no network and no AMPTEACH_DATA.

The package is built into a wheel (what `pip install .` builds too), installed into a fresh virtual
environment, and run from a temporary directory far from this checkout. The new environment reuses
this one's third-party packages through a .pth line (no downloads), but not its editable ampteach:
a .pth file in an added directory is not executed, so only the installed copy can be imported.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from ampteach.grading.exercises import learner_notebooks, render

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(bin folder of a new venv holding a wheel install of ampteach, an environment without AMPTEACH_DATA)."""
    tmp = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("AMPTEACH_DATA", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(tmp / "empty-cache")          # no earlier full download either
    build = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                 "--wheel-dir", str(tmp / "dist"), str(ROOT)], cwd=tmp, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "parent-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = next((tmp / "dist").glob("ampteach-*.whl"))
    install = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                   "--no-deps", "--no-index", str(wheel)], cwd=tmp, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin", env


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working directory with nothing of the course in it."""
    return tmp_path


def test_the_installed_copy_is_the_one_imported(installed, elsewhere):
    bin_dir, env = installed
    out = run([str(bin_dir / "python"), "-c", "import ampteach; print(ampteach.__file__)"], elsewhere, env)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(bin_dir.parent), out.stdout
    assert not Path(out.stdout.strip()).is_relative_to(ROOT)


def test_data_comes_from_the_bundled_split(installed, elsewhere):
    bin_dir, env = installed
    code = ("import ampteach; ds = ampteach.load_fashion_mnist(); "
            "print(ds.source, len(ds.train_images), len(ds.test_images))")
    out = run([str(bin_dir / "python"), "-c", code], elsewhere, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bundled", "7000", "1226"]
    where = run([str(bin_dir / "ampteach"), "data"], elsewhere, env)
    assert where.returncode == 0 and "bundled with ampteach" in where.stdout, where.stdout + where.stderr


def test_shakespeare_and_the_gpt_come_with_the_package(installed, elsewhere):
    bin_dir, env = installed
    code = ("import ampteach, torch; t = ampteach.load_shakespeare(); m = ampteach.gpt(len(t.vocab)); "
            "print(ampteach.training.text.bundled_text_path().is_relative_to(ampteach.__file__.rsplit('/', 1)[0]), "
            "len(t.text), len(t.vocab), tuple(m(t.encode('ROMEO:')[None]).shape))")
    out = run([str(bin_dir / "python"), "-c", code], elsewhere, env)
    assert out.returncode == 0, out.stderr
    from ampteach.training.text import load_shakespeare

    here = load_shakespeare()                                    # the checkout's copy, for comparison
    n, v = str(len(here.text)), str(len(here.vocab))
    assert out.stdout.split() == ["True", n, v, "(1,", "6,", f"{v})"], out.stdout


def test_bench_runs_from_any_directory(installed, elsewhere):
    bin_dir, env = installed
    out = run([str(bin_dir / "ampteach"), "bench", "--epochs", "1", "--configs", "fp32,bf16", "--impls", "ampteach",
               "--no-progress", "--out", str(elsewhere / "table.json")], elsewhere, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fp32" in out.stdout and "bf16" in out.stdout and (elsewhere / "table.json").is_file()


def test_the_results_tables_ship_with_the_package(installed, elsewhere):
    bin_dir, env = installed
    code = "from ampteach.tools.bench import load_results; print(sorted(r['device']['name'] for r in load_results()))"
    out = run([str(bin_dir / "python"), "-c", code], elsewhere, env)
    assert out.returncode == 0, out.stderr
    in_source = sorted(json.loads(p.read_text())["device"]["name"]
                       for p in (ROOT / "ampteach" / "results").glob("*.json"))
    assert in_source and out.stdout.strip() == str(in_source)


def test_start_prepares_a_course_folder_from_the_installed_copy(installed, elsewhere):
    bin_dir, env = installed
    out = run([str(bin_dir / "ampteach"), "start", "--no-lab"], elsewhere, env)
    assert out.returncode == 0, out.stdout + out.stderr
    folder = elsewhere / "ampteach-course"
    assert "installed with ampteach" in out.stdout and str(bin_dir.parent) in out.stdout, out.stdout
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (folder / "notebooks").glob("*.ipynb")) == lessons
    generated = learner_notebooks(ROOT / "solutions")
    handed_out = {p.name: p.read_text() for p in (folder / "exercises").glob("*.ipynb")}
    assert len(handed_out) >= 13 and all(text == generated.get(name) for name, text in handed_out.items())
    mine = folder / "exercises" / "build_2_loss_scale_update.ipynb"
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return 1.0  # mine"))
    again = run([str(bin_dir / "ampteach"), "start", "--no-lab"], elsewhere, env)
    assert again.returncode == 0 and "kept 1 file(s) you changed" in again.stdout, again.stdout + again.stderr
    assert "# mine" in mine.read_text()


def test_grade_runs_from_any_directory(installed, elsewhere):
    bin_dir, env = installed
    exercise = elsewhere / "build_2_loss_scale_update.ipynb"
    exercise.write_text(render(ROOT / "solutions" / exercise.name))
    out = run([str(bin_dir / "ampteach"), "grade", exercise.name], elsewhere, env)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text                      # an untouched exercise does not pass...
    assert "NotImplementedError" in text, text            # ...because its code is still to write,
    assert "ERROR" not in text and "Traceback" not in text, text   # not because the grader broke
