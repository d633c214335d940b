"""course/README.md and the notebooks stay in sync: every notebook is on the map, every map entry exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
FOLDERS = ("notebooks", "exercises", "solutions")


def named_in_map() -> set[str]:
    text = (ROOT / "course" / "README.md").read_text()
    return set(re.findall(r"\b((?:notebooks|exercises|solutions)/[\w.-]+\.ipynb)", text))


def on_disk() -> set[str]:
    return {f"{folder}/{p.name}" for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb")}


def test_every_notebook_named_in_the_course_map_exists():
    missing = sorted(named_in_map() - on_disk())
    assert not missing, f"course/README.md names notebooks that do not exist: {missing}"


def test_every_notebook_is_named_in_the_course_map():
    unnamed = sorted(on_disk() - named_in_map())
    assert not unnamed, f"add these to course/README.md: {unnamed}"


def test_every_exercise_has_its_solution_and_the_other_way_round():
    exercises = {p.name for p in (ROOT / "exercises").glob("*.ipynb")}
    solutions = {p.name for p in (ROOT / "solutions").glob("*.ipynb")}
    assert exercises == solutions


def test_lessons_are_numbered_in_order():
    """Lessons 00, 01, ... N, each number once; a lesson split in two adds a part with a letter (06b after 06)."""
    names = [p.name for p in (ROOT / "notebooks").glob("*.ipynb")]
    parts = [re.match(r"(\d\d)([b-z]?)_", name) for name in names]
    assert all(parts), f"a lesson's file name starts with two digits, and a letter for a second part: {names}"
    numbers = sorted(int(m[1]) for m in parts if not m[2])
    assert numbers == list(range(len(numbers)))
    for m in parts:
        if m[2]:                                   # 06b needs 06 (and 06c needs 06b)
            before = m[1] + (chr(ord(m[2]) - 1) if m[2] > "b" else "")
            assert any(re.match(before + "_", name) for name in names), f"lesson {m[0]} has no {before} before it"


def test_the_time_column_is_the_rule_course_times_computes():
    """The map's times come from course/times.py (reading, code, predictions, run time, code to write), not by hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_times", ROOT / "course" / "times.py")
    times = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(times)
    rows = re.findall(r"^\|[^|]*\| \[((?:notebooks|exercises)/[\w.-]+\.ipynb)\].*\| (" + times.TIME + r") \|$",
                      (ROOT / "course" / "README.md").read_text(), flags=re.M)
    assert len(rows) == len(on_disk()) - len(list((ROOT / "solutions").glob("*.ipynb")))
    for path, cell in rows:
        computed = times.time_cell(ROOT / path.replace("exercises/", "solutions/"))
        assert cell == computed, f"{path}: the map says {cell}, course/times.py says {computed}"
    assert times.total_sentence() in (ROOT / "course" / "README.md").read_text(), \
        "the map's total under its lessons is not the sum course/times.py computes: run python course/times.py --write"
