"""The speed-claiming lessons run their strict nbval pass with one core kept busy (the root conftest.py).

A claim a lesson checks about speed must hold on a shared machine too, so its one strict pass in the test
command is that run. These tests check the load is real and reaches the lessons it should.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).parents[1]


def test_the_loaded_lessons_are_lessons():
    for name in conftest.LOADED_LESSONS:
        assert (ROOT / "notebooks" / name).is_file(), f"{name} is listed in conftest.LOADED_LESSONS but is not a lesson"


def test_the_busy_core_really_computes():
    load = conftest.start_busy_core()
    try:
        time.sleep(2.0)
        with open(f"/proc/{load.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu_seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    finally:
        load.terminate()
        load.wait(timeout=30)
    # a spinning process gets its share of a core even on a crowded machine; a sleeping one gets ~0.03 s
    assert cpu_seconds > 0.2, f"the busy process used only {cpu_seconds:.2f} s of CPU in 2 s"


@pytest.mark.parametrize("name, loaded", [("00_start_here.ipynb", True), ("01_float_formats.ipynb", False)])
def test_only_the_listed_lessons_run_under_load(pytestconfig, monkeypatch, name, loaded):
    monkeypatch.delenv("AMPTEACH_QUIET_LESSONS", raising=False)
    session = pytestconfig.pluginmanager.get_plugin("session") or pytest.Session.from_config(pytestconfig)
    notebook = conftest.CourseNotebook.from_parent(session, path=ROOT / "notebooks" / name, strict=True)
    assert notebook.under_load is loaded
