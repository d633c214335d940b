"""benchmarks/gpu_report.sh, the one command a lent GPU machine runs: its arguments, and its lessons' sections on
the CPU at tiny sizes (the whole report on a CPU takes minutes; it was run with --device cpu by hand)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_report.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_script_parses_and_explains_itself():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    out = run("--help")
    assert out.returncode == 0 and "--device cpu" in out.stdout and "machine_tag" in out.stdout


def test_wrong_arguments_say_what_to_do():
    out = run("--device", "tpu")
    assert out.returncode == 2 and "--device must be cpu or cuda" in out.stdout
    out = run("--fast")
    assert out.returncode == 2 and "unknown argument --fast" in out.stdout


def test_the_lessons_sections_run_on_the_cpu(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_lessons", ROOT / "benchmarks" / "gpu_lessons.py")
    gpu_lessons = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_lessons)
    monkeypatch.setitem(gpu_lessons.SIZES, "cpu", (32, 64))
    monkeypatch.setitem(gpu_lessons.WIDTHS, "cpu", (16,))
    for section in gpu_lessons.SECTIONS:
        text = section("cpu", tmp_path / "roofline.json")
        assert text.startswith("## ") and "|" in text, section.__name__
    assert (tmp_path / "roofline.json").is_file()


def _table(text: str) -> dict[str, list[str]]:
    """A markdown table's rows as label -> cells."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def test_lesson_9_and_10_sections_measure_what_the_lessons_claim_on_the_cpu():
    spec = importlib.util.spec_from_file_location("gpu_lessons", ROOT / "benchmarks" / "gpu_lessons.py")
    gpu_lessons = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_lessons)
    attention = _table(gpu_lessons.attention_overflow_section("cpu", None))
    after, before = (float(attention[f"fp16, scale {w}"][0].replace(",", "")) for w in ("after", "before"))
    assert after < gpu_lessons.overflow_size(2, 64, "after") < before < gpu_lessons.overflow_size(2, 64, "before")
    assert attention["bf16, scale after"][0] == "10,000"
    accumulators = _table(gpu_lessons.accumulator_section("cpu", None))
    for dtype in ("bfloat16", "float16"):   # the CPU sums in fp32 (lesson 10); a bf16 accumulator reproduces little
        shares = dict(zip(("bf16", "fp16", "14", "16", "20", "fp32", "float64"), accumulators[dtype]))
        assert float(shares["fp32"].rstrip("%")) >= 95 and float(shares["bf16"].rstrip("%")) <= 5, shares


def test_every_lesson_runs_on_the_chosen_device_and_is_summarised(tmp_path):
    """benchmarks/run_lessons.py on two tiny lessons with --device cpu: each runs in a kernel that sees
    AMPTEACH_DEVICE, a failing cell is recorded and the next still runs, and the summary says it all."""
    import json

    import nbformat

    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    first = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os, ampteach\ndevice = ampteach.course_device()\n"
                                  "print(os.environ['AMPTEACH_DEVICE'], device)"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("after = 1")])
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")])
    for name, nb in (("00_first.ipynb", first), ("01_second.ipynb", second)):
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, lessons / name)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_lessons.py"), "--device", "cpu",
                           "--out", str(out), "--notebooks", str(lessons), "--cell-timeout", "120"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr            # a cell failed
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["lesson"]: r for r in summary["lessons"]}
    assert rows["00_first"]["failed"] == [{"cell": 2, "error": "ZeroDivisionError: division by zero"}]
    assert rows["00_first"]["ran"] == 3 and rows["01_second"]["failed"] == []
    executed = nbformat.read(out / "00_first.ipynb", as_version=4)
    assert "cpu cpu" in executed.cells[0].outputs[0]["text"]
    assert "| 00_first |" in (out / "summary.md").read_text() and summary["device"] == "cpu"
