"""What the nbgrader and Otter exports share: each solution read as the parts a grader needs, and the points.

    parts = read_parts(Path("solutions/build_2_loss_scale_update.ipynb"))
    [p.role for p in parts]      # ['given', 'given', 'given', 'solution', 'check', 'hidden-check', 'given']
    sum(p.points for p in parts) # 2: one per check cell, as `ampteach grade` counts them
    parts[3].learner             # 'def update_scale(...):\\n ... # YOUR CODE HERE\\n    raise NotImplementedError()'

A solution notebook's cells fall in five roles, found the way the exercise generator finds them
(ampteach.grading.exercises): a `solution` cell has a `### BEGIN SOLUTION` region in code, an `answer` cell
has one in markdown (a written answer, which no check scores), a `check` cell calls a `check_...`
function, a `hidden-check` cell is a check cell the exercise does not show, and a `given` cell is
everything else (the story, the setup, the demos), which the learner reads and runs but does not change.

Points, stated once: every check cell is worth POINTS_PER_CHECK, hidden ones included, so the score
is the number of checks passed, as `ampteach grade` counts it (score = checks passed / checks). A
written answer is worth 0 points: no check scores it, so a teacher who grades it by hand gives it
points in their grader.
"""

from __future__ import annotations

import builtins
import symtable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ampteach.grading.exercises import (
    BEGIN,
    HIDDEN,
    ROOT,
    MarkerError,
    check_functions,
    make_exercise,
    strip_regions,
    without_markers,
    worked_code,
)

__all__ = ["POINTS_PER_CHECK", "ExportError", "Part", "check_preamble", "default_solutions", "free_names",
           "read_parts", "solution_paths", "worked_code", "without_check_imports"]

POINTS_PER_CHECK = 1      # every check cell, hidden ones included: `ampteach grade` scores checks passed / checks
ROLES = ("solution", "answer", "check", "hidden-check", "given")


class ExportError(ValueError):
    """A solution notebook that a grader's format cannot carry; the message says which cell and why."""


@dataclass
class Part:
    cell: nbformat.NotebookNode   # the solution's cell (outputs and execution counts cleared)
    role: str                     # one of ROLES
    learner: str                  # what the learner's notebook shows (ampteach's exercise version of the cell)
    functions: list[str] = field(default_factory=list)   # check functions the cell calls
    points: int = 0

    @property
    def hidden_source(self) -> str:
        """A check cell as the grader runs it: hidden regions kept, their marker lines dropped."""
        return without_markers(self.cell.source)

    @property
    def has_hidden_region(self) -> bool:
        return any(marker in self.cell.source for marker in HIDDEN)


def default_solutions() -> Path:
    """solutions/ of the checkout ampteach runs from (the exports are written from a checkout)."""
    return ROOT / "solutions"


def solution_paths(solutions: Path, names: list[str] | None = None) -> list[Path]:
    """Every solution notebook in `solutions` (or the ones named), sorted; an unknown name is an error."""
    if not solutions.is_dir():
        raise ExportError(f"no solutions folder at {solutions}: run from a checkout of the course "
                          f"(its solutions/ folder), or pass --solutions DIR")
    paths = sorted(solutions.glob("*.ipynb"))
    if names:
        known = {p.stem: p for p in paths}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ExportError(f"no solution named {', '.join(unknown)} in {solutions}; "
                              f"the exercises are: {', '.join(known)}")
        paths = [known[n] for n in names]
    if not paths:
        raise ExportError(f"{solutions} holds no solution notebooks (*.ipynb)")
    return paths


def read_parts(path: Path) -> list[Part]:
    """The cells of one solution notebook, each with its role, the learner's version and its points."""
    nb = nbformat.read(path, as_version=4)
    try:
        exercise = make_exercise(nb, path.name)   # the generator's own reading: markers pair up, something to write
    except MarkerError as exc:
        raise ExportError(str(exc)) from exc
    shown = {cell.id for cell in exercise.cells}
    parts = []
    for i, cell in enumerate(nb.cells):
        cell = nbformat.from_dict(cell)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
        where = f"{path.name}, cell {i}"
        learner = strip_regions(cell.source, cell.cell_type == "code", where=where)   # markers already checked
        functions = check_functions(cell.source) if cell.cell_type == "code" else []
        if functions:
            role = "check" if cell.id in shown else "hidden-check"
            if BEGIN in cell.source:
                raise ExportError(f"{where} both calls {functions[0]} and holds a '{BEGIN}' region: "
                                  f"put the learner's code and the check in separate cells")
        elif BEGIN in cell.source:
            role = "solution" if cell.cell_type == "code" else "answer"
        else:
            role = "given"
        parts.append(Part(cell, role, learner, functions, POINTS_PER_CHECK if functions else 0))
    return parts


def without_check_imports(source: str) -> str:
    """A check cell's code without its own `from ampteach.grading.checks import check_...` lines: the exports put
    check_preamble in their place, so each check is defined once."""
    return "\n".join(line for line in source.splitlines()
                     if not line.strip().startswith("from ampteach.grading.checks import check_"))


def check_preamble(functions: list[str]) -> str:
    """The lines that make a check cell call the course's own checks, as `ampteach grade` does: a function of
    the same name that the learner's notebook defined does not count.

        check_preamble(["check_loss_scale_update"])
        # 'from ampteach.grading.checks import course_check  # ...\ncheck_loss_scale_update = course_check("...")'
    """
    lines = ["from ampteach.grading.checks import course_check  # the course's own checks, not a redefinition"]
    return "\n".join(lines + [f'{name} = course_check("{name}")' for name in functions])


def free_names(source: str, where: str = "cell") -> list[str]:
    """The global names a cell reads but does not define: what it needs from the notebook.

        free_names("rows = {p: measure(p, data) for p in ALL}\ncheck_table(rows)")
        # ['ALL', 'check_table', 'measure', 'data']: not rows (assigned), p (the comprehension's), or builtins
    """
    try:
        table = symtable.symtable(source, where, "exec")
    except SyntaxError as exc:
        raise ExportError(f"{where} is not valid Python: {exc}") from exc
    defined = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    found: list[str] = []

    def visit(t: symtable.SymbolTable, top: bool) -> None:
        for s in t.get_symbols():
            name = s.get_name()
            read_global = s.is_referenced() and (top or s.is_global()) and not s.is_assigned() and not s.is_imported()
            if read_global and name not in defined and not hasattr(builtins, name) and name not in found:
                found.append(name)
        for child in t.get_children():
            visit(child, False)

    visit(table, True)
    return found
