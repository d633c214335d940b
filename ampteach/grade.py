"""Grade exercise notebooks with nbval: a per-check table (passed / failed with the message) and a score.

    $ ampteach grade exercises/build_1_bf16_rounding.ipynb exercises/e6_2_when_amp_is_wrong.ipynb
    $ ampteach grade --timeout 60 my_copy.ipynb

Under the hood this is the raw command, which works too:
    pytest --nbval-lax --nbval-current-env exercises/NAME.ipynb -rA
Each code cell runs as its own test in one kernel, so a wrong answer fails only its check cell.
A check cell is a cell that calls a `check_...` function from `ampteach.checks`; the score is the
fraction of check cells that pass. A cell that runs longer than --timeout seconds (an endless
loop, say) is interrupted and fails; the notebook carries on with the next cell.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

CHECK_CALL = re.compile(r"(?<!def )\b(check_\w+)\s*\(")
ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failed|Interrupt|Exit)): ?(.*)$", re.M)
TIMEOUT = re.compile(r"Timeout of ([\d.]+) seconds exceeded")
OUTPUT_PATIENCE = 60.0  # seconds nbval waits for a finished cell's output messages (its own default: 5)


def pytest_collection_modifyitems(items) -> None:
    """pytest hook (this module is loaded as a plugin: `-p ampteach.grade`, and by the course's conftest).

    nbval gives a cell that has finished 5 s to deliver its output messages; on a busy machine
    (CI, a classroom server) that fails correct cells with "Timeout of 5 seconds exceeded waiting
    for output". The cell's own time limit (--nbval-cell-timeout) is unchanged.
    """
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = max(item.output_timeout, OUTPUT_PATIENCE)


@dataclass
class CellResult:
    cell: int                      # position in the notebook, counting every cell from 1 (as you scroll)
    checks: list[str]              # the ampteach.checks functions this cell calls (empty: not a check cell)
    status: str                    # "passed", "failed", "timeout" or "skipped"
    message: str = ""              # "ExceptionType: message" when it did not pass


@dataclass
class NotebookGrade:
    path: Path
    cells: list[CellResult] = field(default_factory=list)
    error: str = ""                # the run itself broke (no kernel, not a notebook, ...)

    @property
    def check_cells(self) -> list[CellResult]:
        return [c for c in self.cells if c.checks]

    @property
    def passed(self) -> int:
        return sum(c.status == "passed" for c in self.check_cells)

    @property
    def total(self) -> int:
        return len(self.check_cells)


def _failure_message(text: str) -> tuple[str, str]:
    """(status, 'Type: message') from nbval's failure report of one cell."""
    text = ANSI.sub("", text)
    timeout = TIMEOUT.search(text)
    if timeout:
        return "timeout", f"took longer than {float(timeout.group(1)):g} s and was interrupted (an endless loop?)"
    matches = list(EXCEPTION_LINE.finditer(text))
    if not matches:
        return "failed", text.strip().splitlines()[-1] if text.strip() else "failed"
    last = matches[-1]
    kind, message = last.group(1), text[last.start(2):].strip()
    if kind == "NotImplementedError":
        return "failed", "NotImplementedError: not done yet (a `# YOUR CODE HERE` is still to write)"
    return "failed", f"{kind}: {message}" if message else kind


def grade_notebook(path: str | Path, timeout: float = 120.0) -> NotebookGrade:
    """Run one notebook under `pytest --nbval-lax` in a fresh kernel and collect each cell's result."""
    path = Path(path).resolve()
    grade = NotebookGrade(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook: say so instead of a traceback
        grade.error = f"cannot read {path.name} as a notebook: {exc}"
        return grade
    code_cells = [(i + 1, cell) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")  # ignore any project's pytest settings
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", str(path), "--nbval-lax", "--nbval-current-env",
               f"--nbval-cell-timeout={timeout}", "-p", "no:cacheprovider", "-p", "ampteach.grade", "-c", str(Path(tmp) / "pytest.ini"),
               "--rootdir", tmp, f"--junitxml={report}", "-q"]
        try:
            run = subprocess.run(cmd, cwd=path.parent, capture_output=True, text=True,
                                 timeout=timeout * (len(code_cells) + 1) + 120)
        except subprocess.TimeoutExpired:
            grade.error = "the notebook did not finish (the kernel stopped answering); no score"
            return grade
        if not report.exists():
            grade.error = f"nbval could not run the notebook:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
            return grade
        results = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            m = re.fullmatch(r"Cell (\d+)", case.get("name", ""))
            if not m:
                continue
            status, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error"):
                    status, message = _failure_message((child.get("message") or "") + "\n" + (child.text or ""))
                elif child.tag == "skipped" and status == "passed":
                    status, message = "skipped", ANSI.sub("", child.get("message") or "")
            results[int(m.group(1))] = (status, message)
    for index, (position, cell) in enumerate(code_cells):
        status, message = results.get(index, ("skipped", "not run"))
        grade.cells.append(CellResult(position, sorted(set(CHECK_CALL.findall(cell.source))), status, message))
    return grade


def format_grade(grade: NotebookGrade, width: int = 100) -> str:
    lines = [str(grade.path)]
    if grade.error:
        return "\n".join(lines + [f"  ERROR  {grade.error}"])
    name_width = max([len(", ".join(c.checks)) for c in grade.check_cells] + [5])
    lines.append(f"  {'check':<{name_width}}  cell  result")
    for c in grade.check_cells:
        result = "passed" if c.status == "passed" else f"{c.status.upper():7s} {c.message}"
        first, *rest = result.splitlines() or [""]
        lines.append(f"  {', '.join(c.checks):<{name_width}}  {c.cell:>4}  {first[:width]}")
        lines += [f"  {'':<{name_width}}        {line[:width]}" for line in rest[:8]]
    other = [c for c in grade.cells if not c.checks and c.status in ("failed", "timeout")]
    for c in other:
        lines.append(f"  (cell {c.cell}, not a check, {c.status}: {c.message.splitlines()[0][:width] if c.message else ''})")
    if grade.total:
        lines.append(f"  score {grade.passed}/{grade.total} checks passed")
    else:
        lines.append("  no check cells found (a check cell calls a check_... function from ampteach.checks)")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="exercise notebooks to grade")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a cell may run (default 120)")


def run(args) -> int:
    grades = []
    for path in args.paths:
        if not Path(path).is_file():
            print(f"{path}\n  ERROR  no such file")
            grades.append(NotebookGrade(Path(path), error="no such file"))
            continue
        grades.append(grade_notebook(path, timeout=args.timeout))
        print(format_grade(grades[-1]))
        print()
    passed, total = sum(g.passed for g in grades), sum(g.total for g in grades)
    if len(grades) > 1 and total:
        print(f"Total: {passed}/{total} checks passed ({100 * passed / total:.0f}%)")
    return 0 if total and passed == total and not any(g.error for g in grades) else 1
