"""Autograde one notebook: the course's check cells put back into it, run by nbval in a fresh kernel.

    copy = course_copy("build_2_loss_scale_update")          # shipped in ampteach/grading/exercise_checks/
    planned, notes = plan_cells(learner_nb, copy, ledger)    # the learner's cells + the course's checks
    results = run_cells([p.cell for p in planned], metadata, timeout=120, tmp=folder)   # {cell: (result, message)}

As nbgrader's autograder overwrites its test cells, every check cell is replaced by the course's own
(an edited one included), a deleted one is put back after the nearest course cell the notebook still
has, and hidden checks are added where the course has them. Each restored cell takes its check
functions fresh from ampteach.grading.checks (a same-named function in the notebook does not count) and,
as its last line, notes its cell id in a ledger file with a fresh random name: a check passes only
when nbval saw no error AND the ledger has its note, because a kernel interrupted in the middle of
an import can fail a later cell without sending the error.

nbval runs each code cell as a test, in a fresh temporary folder (pytest and the kernel both start
there), so nothing beside the learner's notebook (a folder named `ampteach`, a clone of the course)
can stand in for the installed package. A warm-up cell first imports torch and ampteach with its own
time limit, so a busy machine does not spend a learner's cell limit on imports; a cell that runs
past its limit is interrupted and the next cells still run (nbval would mark them xfail). This
module is also a pytest plugin (`-p ampteach.grading.autograde`, and the course's conftest loads it) for
those two options and for nbval's patience with cell output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import nbformat
import pytest

from ampteach.grading.exercises import check_functions

__all__ = ["known_exercises", "course_copy", "which_exercise", "exercise_from_name", "plan_cells", "run_cells",
           "CellOutcome", "autograde", "OUTPUT_PATIENCE", "WARMUP"]

_CELL_TIMEOUT = pytest.StashKey[float]()
ANSI = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failed|Interrupt|Exit)): ?(.*)$", re.M)
TIMEOUT = re.compile(r"Timeout of ([\d.]+) seconds exceeded")
OUTPUT_PATIENCE = 60.0  # seconds nbval waits for a finished cell's output messages (its own default: 5)
KERNEL_STARTUP = 300.0  # seconds a kernel may take to start on a busy machine (nbval's default: 60)
WARMUP = ("import torch, torch._dynamo, ampteach, ampteach.grading.checks  # ampteach grade: the slow imports first, "
          "with their own time limit")
WARMUP_TIMEOUT = 600.0


# --- pytest plugin: loaded with `-p ampteach.grading.autograde` (and by the course's conftest) ---- -------------------

def pytest_addoption(parser) -> None:
    group = parser.getgroup("nbval")
    group.addoption("--nbval-keep-going", action="store_true", default=False,
                    help="after a cell times out and is interrupted, run the next cells as usual "
                         "(nbval marks them xfail)")
    group.addoption("--nbval-warmup-timeout", type=float, default=None,
                    help="seconds the notebook's first cell may run (the grader's import warm-up), instead of "
                         "--nbval-cell-timeout")


def pytest_collection_modifyitems(items) -> None:
    """nbval gives a cell that has finished 5 s to deliver its output messages; on a busy machine
    (CI, a classroom server) that fails correct cells with "Timeout of 5 seconds exceeded waiting
    for output". The cell's own time limit (--nbval-cell-timeout) is unchanged.
    """
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = max(item.output_timeout, OUTPUT_PATIENCE)


def pytest_runtest_setup(item) -> None:
    """With --nbval-keep-going, one interrupted cell does not turn the rest of the notebook into xfails;
    with --nbval-warmup-timeout, the first cell has its own time limit."""
    config = item.config
    if config.getoption("nbval_keep_going", False) and getattr(item.parent, "timed_out", False):
        item.parent.timed_out = False
    warmup = config.getoption("nbval_warmup_timeout", None)
    if warmup is not None and hasattr(config.option, "nbval_cell_timeout"):
        cell_timeout = config.stash.setdefault(_CELL_TIMEOUT, config.option.nbval_cell_timeout)
        config.option.nbval_cell_timeout = warmup if item.name == "Cell 0" else cell_timeout


# --- the course's copy of the checks ------------------------------------------------------------------

def known_exercises() -> list[str]:
    folder = resources.files("ampteach.grading") / "exercise_checks"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def course_copy(exercise: str) -> dict:
    """The checks of one exercise as the course wrote them (ampteach/grading/exercise_checks/<exercise>.json)."""
    return json.loads((resources.files("ampteach.grading") / "exercise_checks" / f"{exercise}.json").read_text())


def which_exercise(nb: nbformat.NotebookNode, path: Path) -> str | None:
    """The exercise a notebook is: its metadata, else its file name (alice_build_2_loss_scale_update.ipynb works)."""
    named = nb.metadata.get("ampteach", {}).get("exercise") if isinstance(nb.metadata.get("ampteach"), dict) else None
    return named if named in known_exercises() else exercise_from_name(path)


def exercise_from_name(path: Path) -> str | None:
    """The exercise a file's name says it is: NAME.ipynb, alice_NAME.ipynb, NAME.yours.ipynb; None if none."""
    known = known_exercises()
    stem = Path(path).name.removesuffix(".ipynb")
    if stem in known:
        return stem
    inside = [name for name in known if name in stem]
    return max(inside, key=len) if inside else None


# --- building the notebook that runs ----------------------------------------------------------------------

@dataclass
class _Planned:
    cell: nbformat.NotebookNode
    label: str | None             # the check's name for the report; None for the learner's own cells
    learner_position: int | None  # 1-based among the learner's code cells


def _check_cell(check: dict, ledger: str) -> nbformat.NotebookNode:
    """The course's check cell, its check functions taken fresh from ampteach.grading.checks, and a last line
    that notes in `ledger` that the cell ran to its end: a pass needs that note, not only the absence
    of an error message (which an interrupted kernel can fail to send)."""
    names = check["functions"]
    preamble = ("from ampteach.grading.checks import course_check as _course_check; "
                + "; ".join(f'{n} = _course_check("{n}")' for n in names) + "  # the course's checks")
    done = f"open({ledger!r}, 'a').write({check['id']!r} + '\\n')  # ran to the end"
    cell = nbformat.v4.new_code_cell(preamble + "\n" + check["source"] + "\n" + done)
    cell.id = check["id"]
    return cell


def plan_cells(nb: nbformat.NotebookNode, copy: dict,
               ledger: str = "checks-done.txt") -> tuple[list[_Planned], list[str]]:
    """The learner's cells with every course check cell put back (edited: replaced; deleted or hidden:
    inserted after the nearest course cell before it that the notebook still has)."""
    checks = {c["id"]: c for c in copy["checks"]}
    has_ids = any(cell.get("id") for cell in nb.cells)
    planned: list[_Planned] = []
    placed: set[str] = set()
    notes: list[str] = []
    position = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            planned.append(_Planned(cell, None, None))
            continue
        position += 1
        check = checks.get(cell.get("id"))
        if check is None and not has_ids:   # an old notebook without cell ids: match by the checks it calls
            called = check_functions(cell.source)
            check = next((c for c in copy["checks"] if not c["hidden"] and c["id"] not in placed
                          and c["functions"] == called), None)
        if check is not None and check["id"] not in placed:
            placed.add(check["id"])
            planned.append(_Planned(_check_cell(check, ledger), f"{', '.join(check['functions'])}, cell [{position}]",
                                    position))
        else:
            planned.append(_Planned(cell, None, position))
    for check in copy["checks"]:
        if check["id"] in placed:
            continue
        ids = [p.cell.get("id") for p in planned]
        anchor = next((ids.index(i) for i in check["after"] if i in ids), None)
        if anchor is None:
            at, where = len(planned), "at the end"
        else:
            at = anchor + 1
            while at < len(planned) and planned[at].learner_position is None and planned[at].label:
                at += 1   # after the checks already put back at this anchor, in the course's order
            before = [p.learner_position for p in planned[:at] if p.learner_position]
            where = f"after cell [{before[-1]}]" if before else "at the top"
        name = ", ".join(check["functions"])
        label = f"{name} (hidden), {where}" if check["hidden"] else f"{name}, restored {where}"
        if not check["hidden"]:
            notes.append(f"the check cell {name} was missing from the notebook; the course's copy ran {where}")
        planned.insert(at, _Planned(_check_cell(check, ledger), label, None))
        placed.add(check["id"])
    return planned, notes


# --- running ------------------------------------------------------------------------------------------------

def _failure(text: str) -> tuple[str, str]:
    """(result, message) from nbval's report of one failed cell."""
    text = ANSI.sub("", text)
    timeout = TIMEOUT.search(text)
    if timeout and "waiting for output" not in text:
        return "timeout", f"ran longer than {float(timeout.group(1)):g} s and was interrupted (an endless loop?)"
    if "Kernel dead on test start" in text or ("waiting for output" in text and timeout):
        return "missing", "not run: the kernel had died or stopped answering before this cell"
    if "Kernel didn't respond" in text or "jupyter_client/client.py" in text:
        return "missing", "not run: the kernel did not start (a machine too busy? grade again with fewer --jobs)"
    matches = list(EXCEPTION_LINE.finditer(text))
    if not matches:
        return "failed", text.strip().splitlines()[-1] if text.strip() else "failed"
    last = matches[-1]
    kind, message = last.group(1), text[last.start(2):].strip()
    if kind == "NotImplementedError":
        return "failed", "NotImplementedError: not done yet (a `# YOUR CODE HERE` is still to write)"
    return "failed", f"{kind}: {message}" if message else kind


def run_cells(cells: list[nbformat.NotebookNode], metadata: dict, timeout: float,
              tmp: str) -> dict[int, tuple[str, str]] | str:
    """{code cell index: (result, message)} for a notebook made of `cells`, or the reason it did not run.

    pytest runs in `tmp` and nbval starts the kernel there (beside the notebook it runs): a fresh folder,
    so no module beside the learner's notebook shadows the installed ampteach."""
    nb = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook = Path(tmp) / "graded.ipynb"
    nbformat.write(nb, notebook)
    (Path(tmp) / "pytest.ini").write_text("[pytest]\n")  # ignore any project's pytest settings
    report = Path(tmp) / "report.xml"
    cmd = [sys.executable, "-m", "pytest", str(notebook), "--nbval-lax", "--nbval-current-env",
           f"--nbval-cell-timeout={timeout:g}", f"--nbval-warmup-timeout={max(timeout, WARMUP_TIMEOUT):g}",
           f"--nbval-kernel-startup-timeout={KERNEL_STARTUP:g}",
           "--nbval-keep-going", "-p", "no:cacheprovider",
           "-p", "ampteach.grading.autograde", "-c", str(Path(tmp) / "pytest.ini"), "--rootdir", tmp,
           f"--junitxml={report}", "-q"]
    n_code = sum(c.cell_type == "code" for c in cells)
    try:
        run = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True,
                             timeout=(timeout + OUTPUT_PATIENCE) * (n_code + 1) + WARMUP_TIMEOUT + 120)
    except subprocess.TimeoutExpired:
        return "the notebook did not finish (the kernel stopped answering)"
    if not report.exists():
        return f"nbval could not run the notebook:\n{run.stdout[-2000:]}{run.stderr[-2000:]}"
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        m = re.fullmatch(r"Cell (\d+)", case.get("name", ""))
        if not m:
            continue
        result, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                result, message = _failure((child.get("message") or "") + "\n" + (child.text or ""))
            elif child.tag == "skipped" and result == "passed":
                result, message = "missing", "not run: " + ANSI.sub("", child.get("message") or "skipped")
        results[int(m.group(1))] = (result, message)
    return results


@dataclass
class CellOutcome:
    check: str | None         # the check's name as the learner sees it; None for the learner's own cells
    position: int | None      # 1-based among the learner's code cells (None: a cell the grader added)
    result: str               # passed / failed / timeout / missing
    message: str = ""


def autograde(nb: nbformat.NotebookNode, exercise: str, timeout: float) -> tuple[list[CellOutcome], list[str]]:
    """Run a learner's notebook with the course's checks of `exercise` restored: every code cell's
    outcome, and notes (checks that had to be put back, imports that failed)."""
    for attempt in range(2):   # once more if the kernel did not even start (a machine too busy)
        with tempfile.TemporaryDirectory() as tmp:
            ledger = Path(tmp) / f"done-{uuid.uuid4().hex}.txt"    # a fresh name: no notebook can know it
            planned, notes = plan_cells(nb, course_copy(exercise), str(ledger))
            metadata = {k: v for k, v in nb.metadata.items() if k == "language_info"}
            results = run_cells([nbformat.v4.new_code_cell(WARMUP)] + [p.cell for p in planned], metadata,
                                timeout, tmp)
            done = set(ledger.read_text().split()) if ledger.exists() else set()
        started = not isinstance(results, str) and "did not start" not in results.get(0, ("", ""))[1]
        if started or attempt:
            break
    if isinstance(results, str):
        notes.append(results)
        results = {}
    if results.get(0, ("passed",))[0] != "passed":
        notes.append(f"the imports before the notebook failed: {results[0][1]}")
    outcomes = []
    code = [p for p in planned if p.cell.cell_type == "code"]
    for index, p in enumerate(code, start=1):   # cell 0 is the warm-up
        result, message = results.get(index, ("missing", "not run: the notebook stopped before this cell"))
        if p.label is not None and result == "passed" and p.cell.id not in done:
            result, message = "failed", ("the check did not run to its end, and the kernel reported no error "
                                         "(an earlier cell was interrupted mid-import?): grade it again")
        outcomes.append(CellOutcome(p.label, p.learner_position, result, message))
    return outcomes, notes
