"""benchmarks/gpu_report.sh, the one command a lent GPU machine runs: its arguments, and its lessons' sections on
the CPU at tiny sizes (the whole report on a CPU takes minutes; it was run with --device cpu by hand)."""

from __future__ import annotations

import importlib.util
import subprocess
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
