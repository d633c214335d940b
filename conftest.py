"""Let plain `pytest` run the whole course: unit tests, lessons (strict nbval), solutions (lax nbval).

nbval's --nbval / --nbval-lax flags apply to every notebook of a run at once, but the course needs
both: a lesson's stored outputs are part of the lesson and must reproduce (strict), while a solution
is checked only for running without error and for its check cells passing (lax, as grading does).
So this file collects each folder with the mode it needs. Exercises are not collected here: an
untouched exercise must FAIL, and tests/test_exercises.py checks exactly that.

When you pass --nbval or --nbval-lax yourself (e.g. to grade one exercise), nbval collects as usual.

The lessons that time things (LOADED_LESSONS) run their one strict pass with another process keeping one core
busy, as on a shared machine: a speed claim a lesson checks must hold there too. AMPTEACH_QUIET_LESSONS=1 turns
the load off (to re-execute a lesson's stored outputs on a quiet machine, not to pass a test).
"""

from __future__ import annotations

import importlib.resources
import os
import subprocess
import sys
from pathlib import Path

from nbval.plugin import IPyNbFile

# Patience for cell output on a busy machine (ampteach/grading/nbval_patience.py).
pytest_plugins = ["ampteach.grading.nbval_patience"]

ROOT = Path(__file__).parent
STRICT_BY_FOLDER = {ROOT / "notebooks": True, ROOT / "solutions": False}
# What nbval replaces before comparing outputs (memory addresses, tqdm rates), shipped with the package.
SANITIZE = importlib.resources.files("ampteach").joinpath("nbval-sanitize.cfg")
SUBSET = ROOT.parent / "shared" / "data" / "fashion-mnist-subset"


# Lessons whose checked claims are about speed: their strict pass runs with one core kept busy.
LOADED_LESSONS = ("00_start_here.ipynb", "06_debugging.ipynb", "07_when_it_pays_off.ipynb",
                  "08_fp8_and_microscaling.ipynb", "11_fp4_training.ipynb")
BUSY_LOOP = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end:\n    pass\n"


def start_busy_core() -> subprocess.Popen:
    """A process that keeps one core busy (a pure-Python spin, at most an hour) until it is terminated."""
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP])


class CourseNotebook(IPyNbFile):
    """nbval's notebook collector with the output check chosen per folder instead of per run."""

    def __init__(self, *args, strict: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.compare_outputs = strict
        self.under_load = (strict and self.path.name in LOADED_LESSONS
                           and os.environ.get("AMPTEACH_QUIET_LESSONS") != "1")
        self.load: subprocess.Popen | None = None

    def setup(self):
        if self.under_load:
            self.load = start_busy_core()
        super().setup()

    def teardown(self):
        try:
            super().teardown()
        finally:
            if self.load is not None:
                self.load.terminate()
                self.load.wait(timeout=30)
                self.load = None


def pytest_configure(config):
    if config.option.nbval_sanitize_with is None:
        config.option.nbval_sanitize_with = str(SANITIZE)
    # A checkout beside ../shared (CI, the course machines) tests against the offline subset.
    if "AMPTEACH_DATA" not in os.environ and SUBSET.is_dir():
        os.environ["AMPTEACH_DATA"] = str(SUBSET)


def pytest_collect_file(file_path, parent):
    option = parent.config.option
    if file_path.suffix != ".ipynb" or option.nbval or option.nbval_lax:
        return None
    strict = STRICT_BY_FOLDER.get(file_path.parent)
    if strict is None:
        return None
    return CourseNotebook.from_parent(parent, path=file_path, strict=strict)


def pytest_runtest_setup(item):
    """Tests marked `sandbox` need a working sandbox (bubblewrap): without one they skip and say why, except where
    AMPTEACH_REQUIRE_SANDBOX=1 (CI), where a skipped sandbox test would hide that grading ran unisolated: they fail."""
    if item.get_closest_marker("sandbox") is None:
        return
    import pytest

    from ampteach.grading.sandbox import find_sandbox

    box = find_sandbox("auto")
    if not box.isolated:
        message = f"needs the grading sandbox: {box.note}"
        if os.environ.get("AMPTEACH_REQUIRE_SANDBOX") == "1":
            pytest.fail(message)
        pytest.skip(message)
