"""Autograde one notebook: its cells run in a sandbox, every check judged in the grader's own process.

    copy = course_copy("build_2_loss_scale_update")          # shipped in ampteach/grading/exercise_checks/
    planned, notes = plan_cells(learner_nb, copy)            # the learner's cells + the course's checks
    outcomes, notes = autograde(learner_nb, "build_2_loss_scale_update", timeout=120, sandbox=find_sandbox())

As nbgrader's autograder overwrites its test cells, every check cell is put back as the course wrote it
(an edited one included), a deleted one after the nearest course cell the notebook still has, and the
hidden checks where the course has them. Then, in order:
    - each of the learner's code cells runs in the notebook's own process, a sandbox (sandbox.py,
      session.py), with its time limit; a cell that runs past it is interrupted and the next ones run;
    - at each check cell, the grader judges: ampteach.grading.judges draws the inputs (new ones each
      time), asks the notebook's process to run the learner's functions on them (checks/driver.py),
      computes what is expected and compares, here, where the notebook cannot reach. A check cell's
      other statements (`rows = {...}` before check_e6_1_table) run in the sandbox first.
Before anything runs, the learner's code is read here (judges/scan.py): a notebook that uses what no
graded notebook may use (a name reached through a string, frames, threads, ...) fails every check.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import nbformat

from ampteach.grading.exercises import check_functions, code_fingerprint, worked_code
from ampteach.grading.sandbox import Sandbox
from ampteach.grading.session import Session, SessionLost

__all__ = ["known_exercises", "course_copy", "which_exercise", "exercise_from_name", "plan_cells", "CellOutcome",
           "autograde", "check_calls", "copied_solution", "learner_sources"]


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
    check: dict | None = None     # the course's check (its functions and source) for a check cell


def plan_cells(nb: nbformat.NotebookNode, copy: dict) -> tuple[list[_Planned], list[str]]:
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
            planned.append(_Planned(_check_cell(check), f"{', '.join(check['functions'])}, cell [{position}]",
                                    position, check))
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
        planned.insert(at, _Planned(_check_cell(check), label, None, check))
        placed.add(check["id"])
    return planned, notes


def _check_cell(check: dict) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(check["source"])
    cell.id = check["id"]
    return cell


def check_calls(source: str) -> tuple[str, list[tuple[str, list[str]]]]:
    """A check cell split in two: its other statements (run in the notebook's process first), and each
    check_...(a, b) call with the notebook names it passes (judged here)."""
    tree = ast.parse(source)
    rest, calls = [], []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        if call is not None and isinstance(call.func, ast.Name) and call.func.id.startswith("check_"):
            calls.append((call.func.id, [arg.id if isinstance(arg, ast.Name) else ast.unparse(arg)
                                         for arg in call.args]))
        elif not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ampteach.grading")):
            rest.append(ast.get_source_segment(source, node) or ast.unparse(node))
    return "\n".join(rest), calls


def learner_sources(planned: list[_Planned], copy: dict) -> list[tuple[str, str]]:
    """(cell [k], code) of the learner's own code cells: not the course's checks, not its cells left unchanged."""
    given = set(copy.get("given", ()))
    return [(f"cell [{p.learner_position}]", p.cell.source) for p in planned
            if p.cell.cell_type == "code" and p.label is None and p.cell.source.strip()
            and code_fingerprint(p.cell.source) not in given]


def copied_solution(nb: nbformat.NotebookNode, copy: dict) -> bool:
    """Whether the notebook's answer cells are the course's own worked solution, as published in solutions/
    (compared as Python reads them: comments and layout do not count)."""
    answers = set(copy.get("solution", ()))
    if not answers:
        return False
    handed_in = {code_fingerprint(worked_code(cell.source)) for cell in nb.cells if cell.cell_type == "code"}
    return answers <= handed_in


# --- running ------------------------------------------------------------------------------------------------

@dataclass
class CellOutcome:
    check: str | None         # the check's name as the learner sees it; None for the learner's own cells
    position: int | None      # 1-based among the learner's code cells (None: a cell the grader added)
    result: str               # passed / failed / timeout / missing
    message: str = ""
    functions: tuple[str, ...] = ()   # the check functions a check cell calls


def _forbidden_message(hits: list[tuple[str, str, str]]) -> str:
    label, what, why = hits[0]
    more = f" (and {len(hits) - 1} more: {', '.join(f'{w} in {c}' for c, w, _ in hits[1:4])})" if len(hits) > 1 else ""
    return (f"{label} uses `{what}`, which no graded notebook may use: {why}{more}. Take it out: an answer needs "
            f"none of it")


def _judge_cell(session: Session, planned: _Planned, sources: list[tuple[str, str]], copy: dict,
                timeout: float) -> tuple[str, str]:
    from ampteach.grading.judges import run_check
    from ampteach.grading.judges.learner import Learner, Ref

    rest, calls = check_calls(planned.check["source"])
    if rest.strip():
        result, message = session.run_cell(rest, timeout)
        if result != "passed":
            return result, f"{message} (in the check cell's own code: {rest.splitlines()[0][:60]}...)"
    for name, args in calls:
        learner = Learner(lambda m: session.request(m, m.get("timeout")), fresh=True, sources=sources,
                          course_cells=copy.get("given", ()), timeout=timeout)
        verdict = run_check(name, learner, [Ref(a) for a in args])
        if verdict.result != "passed":
            return verdict.result, verdict.message
    return "passed", ""


def autograde(nb: nbformat.NotebookNode, exercise: str, timeout: float,
              sandbox: Sandbox) -> tuple[list[CellOutcome], list[str]]:
    """Run a learner's notebook with the course's checks of `exercise` restored: every code cell's outcome
    (checks judged here), and notes (checks that had to be put back, what stopped the notebook)."""
    from ampteach.grading.judges.scan import forbidden

    copy = course_copy(exercise)
    planned, notes = plan_cells(nb, copy)
    code = [p for p in planned if p.cell.cell_type == "code"]
    sources = learner_sources(planned, copy)
    hits = forbidden(sources)
    if hits:
        message = _forbidden_message(hits)
        return [CellOutcome(p.label, p.learner_position, "failed" if p.label else "missing", message,
                            tuple(p.check["functions"]) if p.check else ()) for p in code], notes + [message]
    outcomes: list[CellOutcome] = []
    lost: str | None = None
    lost_as = "missing"            # what the cells after a lost process count as: "timeout" if it stopped answering
    refused: str | None = None     # a cell did what the exercise refuses for the whole notebook
    try:
        session = Session(exercise, sandbox, timeout, total=(len(code) + 2) * (timeout + 60) + 300)
    except SessionLost as exc:
        session, lost = None, f"not run: {exc}"
    try:
        for p in code:
            functions = tuple(p.check["functions"]) if p.check else ()
            if lost is not None:
                outcomes.append(CellOutcome(p.label, p.learner_position, lost_as, lost, functions))
                continue
            try:
                if p.check is None:
                    result, message = session.run_cell(p.cell.source, timeout)
                    if result == "refused":
                        refused = refused or f"cell [{p.learner_position}]: {message}"
                        result = "failed"
                elif refused is not None:
                    result, message = "failed", f"{refused} (a refusal in a cell before this check fails it)"
                else:
                    result, message = _judge_cell(session, p, sources, copy, timeout)
            except SessionLost as exc:
                lost = f"not run: {exc}"
                result, message = ("timeout" if "stopped answering" in str(exc) else "missing"), str(exc)
                lost_as = result
            outcomes.append(CellOutcome(p.label, p.learner_position, result, message, functions))
    finally:
        if session is not None:
            session.close()
    if lost:
        notes.append(lost)
    return outcomes, notes
