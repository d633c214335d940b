"""`ruff check` over the repository, as part of the test command (its rules are in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_ruff_finds_nothing():
    try:
        import ruff  # noqa: F401  (the PyPI package ships the binary)
    except ImportError:
        if not shutil.which("ruff"):
            pytest.skip("ruff is not installed: pip install -e '.[dev]' installs it")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, f"ruff found problems (fix them, or `ruff check --fix` the safe ones):\n{out.stdout}"
