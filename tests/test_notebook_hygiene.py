"""Every notebook is stored the way the course promises: lessons executed and seeded, exercises clean."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:root|home|tmp|work|Users)/")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/"):
                parts.append("".join(value))
        parts.append("".join(out.get("traceback", [])))
    return "\n".join(parts)


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("path", LESSONS + SOLUTIONS + EXERCISES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kernel_and_seed(path):
    nb = load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    first = "".join(code_cells(nb)[0]["source"])
    assert "seed_everything(" in first, "seed every notebook in its first code cell"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_every_lesson_takes_its_device_from_the_switch_in_its_first_code_cell(path):
    """AMPTEACH_DEVICE=cuda runs a lesson on the GPU only if the lesson asks ampteach.course_device() first
    (issue 36): a lesson that builds its tensors before reading the switch keeps them on the CPU."""
    first = "".join(code_cells(load(path))[0]["source"])
    assert re.search(r"^device = (ampteach\.)?course_device\(\)", first, re.M), \
        f"{path.name}: its first code cell should set `device = course_device()` (ampteach's AMPTEACH_DEVICE switch)"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lessons_are_stored_executed_without_errors_or_machine_paths(path):
    nb = load(path)
    for i, cell in enumerate(code_cells(nb)):
        assert cell["execution_count"] is not None, f"code cell {i} was not executed before committing"
        errors = [o for o in cell.get("outputs", []) if o["output_type"] == "error"]
        if errors:
            assert "raises-exception" in tags(cell), f"code cell {i} stores an error but is not tagged raises-exception"
        assert not MACHINE_PATH.search(output_text(cell)), f"code cell {i} shows a path of the machine that ran it"
        for out in cell.get("outputs", []):
            assert "image/svg+xml" not in out.get("data", {}), f"code cell {i}: SVG output embeds dates; use PNG"
    assert any("image/png" in o.get("data", {}) for c in code_cells(nb) for o in c.get("outputs", [])), \
        "a lesson shows at least one figure"


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_exercises_are_stored_without_outputs(path):
    for cell in code_cells(load(path)):
        assert cell["outputs"] == [] and cell["execution_count"] is None
