"""The course's exercises as Otter-Grader master notebooks: `ampteach export otter DIR`.

    paths = export_otter(Path("otter"))       # otter/<exercise>.ipynb, one master notebook per exercise
    # then:  otter assign otter/build_2_loss_scale_update.ipynb dist/build_2_loss_scale_update
    #        otter run -a dist/build_2_loss_scale_update/autograder/<...>-autograder_<time>.zip SUBMISSION.ipynb

Otter's notebook format (v1, Otter 5 and later): a raw `# ASSIGNMENT CONFIG` cell, then each
question between raw `# BEGIN QUESTION` / `# END QUESTION` cells, its solution between `# BEGIN
SOLUTION` / `# END SOLUTION` cells and its tests between `# BEGIN TESTS` / `# END TESTS`. Each
solution is read as ampteach.grading.export_common reads it:
    question      the solution cells from one `### BEGIN SOLUTION` cell on, with the check cells that
                  follow them; named after its first check (check_loss_scale_update -> loss_scale_update)
    solution cell the course's solution, and, in Otter's prompt markers, exactly the code the learner
                  starts from in the course's own exercise (the `# YOUR CODE HERE` stub or the starter code)
    test          one per check cell, exception-based (Otter calls it with the notebook's variables
                  of the same names), worth POINTS_PER_CHECK; a hidden check is a `# HIDDEN` test
    written answer a manually graded question worth 0 points (no check scores it)
The cells around the questions (the story, the setup, the demos) are copied as they are.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import nbformat

from ampteach.grading.export_common import (
    ExportError,
    Part,
    check_preamble,
    default_solutions,
    free_names,
    read_parts,
    solution_paths,
    without_check_imports,
    worked_code,
)

__all__ = ["export_otter", "group_questions", "otter_notebook", "otter_solution_source", "otter_test", "otter_tests"]

ASSIGNMENT_CONFIG = """\
# ASSIGNMENT CONFIG
name: {name}
init_cell: true
check_all_cell: false
export_cell: false
run_tests: true
tests:
  files: false
  ok_format: false"""


def _raw(text: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_raw_cell(text)
    cell.id = "new-" + cell.id   # numbered by position once the notebook is complete
    return cell


def _number_new_cells(cells: list[nbformat.NotebookNode]) -> None:
    """Cells the export adds get ids by position (otter-1, otter-2, ...): the same solutions, the same files."""
    for k, cell in enumerate((c for c in cells if c.get("id", "").startswith("new-")), start=1):
        cell.id = f"otter-{k}"


def otter_solution_source(part: Part, where: str) -> str:
    """A code solution cell in Otter's markers: the solution (gone from the student's notebook), then the
    course's learner version inside a string that Otter's prompt markers turn into code there."""
    learner = part.learner
    quote = "'''" if '"""' in learner else '"""'
    if quote in learner:
        raise ExportError(f"{where}: the exercise's version of this cell holds both ''' and \"\"\", which Otter's "
                          f"prompt (a string in the solution notebook) cannot carry; use one kind of triple quote")
    return "\n".join(["# BEGIN SOLUTION NO PROMPT", worked_code(part.cell.source), "# END SOLUTION",
                      f"r{quote} # BEGIN PROMPT", learner, f"{quote}; # END PROMPT"])


def otter_test(part: Part, where: str, name: str | None = None, hidden: bool | None = None,
               source: str | None = None) -> str:
    """One check cell as an Otter exception-based test: a function whose parameters are the notebook
    variables the cell reads (Otter passes them in), running the cell's code with the course's own checks.

        otter_test(part, "build_2, cell 5992be90")   # 'def test_check_loss_scale_update(update_scale): ...'
    """
    body = without_check_imports(part.hidden_source if source is None else source)
    hidden = part.role == "hidden-check" if hidden is None else hidden
    if re.search(r"^\s*(global|nonlocal)\b", body, re.M):
        raise ExportError(f"{where}: a check cell with a global statement cannot run inside an Otter test")
    functions = [f for f in part.functions if f in body]
    params = [n for n in free_names(body, where) if n not in functions]
    if "env" in params:
        raise ExportError(f"{where}: the check cell reads a variable named env, which Otter reserves")
    doc = f'"""{", ".join(functions)}: the course\'s check cell, run as `ampteach grade` runs it."""'
    lines = ["# HIDDEN"] if hidden else []
    lines.append(f"def {name or 'test_' + '_'.join(functions)[:60]}({', '.join(params)}):")
    lines.append(textwrap.indent("\n".join([doc, check_preamble(functions), body]), "    "))
    return "\n".join(lines)


def otter_tests(part: Part, where: str, taken: set[str]) -> list[tuple[str, int]]:
    """(test cell source, points) for one check cell: one test, or, for a visible check cell with a hidden
    region, a 0-point public test of what the learner sees and the whole cell as a hidden test worth its points."""
    def name(source: str) -> str:
        base = "test_" + "_".join(f for f in part.functions if f in source)[:60]
        unique, k = base, 2
        while unique in taken:
            unique, k = f"{base}_{k}", k + 1
        taken.add(unique)
        return unique

    if part.role == "check" and part.has_hidden_region:
        return [(otter_test(part, where, name(part.learner), hidden=False, source=part.learner), 0),
                (otter_test(part, where, name(part.hidden_source), hidden=True), part.points)]
    return [(otter_test(part, where, name(part.hidden_source)), part.points)]


def _question_name(parts: list[Part], taken: set[str], fallback: str) -> str:
    functions = [f for p in parts for f in p.functions]
    base = functions[0].removeprefix("check_") if functions else fallback
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def group_questions(parts: list[Part]) -> list[Part | list[Part]]:
    """The notebook as a sequence of given parts and questions (solution cells with the checks after them)."""
    out: list[Part | list[Part]] = []
    open_parts: list[Part] = []     # parts of the question being built

    def close() -> None:
        if open_parts:
            out.append(open_parts.copy())
            open_parts.clear()

    for part in parts:
        checked = any(p.functions for p in open_parts)
        if part.role == "answer":
            close()
            out.append([part])
        elif part.role == "solution":
            if checked:
                close()
            open_parts.append(part)
        elif part.role in ("check", "hidden-check"):
            open_parts.append(part)
        elif checked or not open_parts:
            close()
            out.append(part)
        else:
            open_parts.append(part)   # a given cell between a solution and its checks stays in the question
    close()
    return out


def _question_cells(group: list[Part], name: str, path: Path) -> list[nbformat.NotebookNode]:
    taken: set[str] = set()
    tests = [(p, test) for p in group if p.functions
             for test in otter_tests(p, f"{path.name}, cell {p.cell.id}", taken)]
    manual = group[0].role == "answer"
    config = ["# BEGIN QUESTION", f"name: {name}"]
    if manual:
        config += ["manual: true", "points: 0"]
    elif tests:
        config.append(f"points: [{', '.join(str(points) for _, (_, points) in tests)}]")
    cells = [_raw("\n".join(config))]
    if manual:
        part = group[0]
        answer = nbformat.v4.new_markdown_cell(worked_code(part.cell.source))
        answer.id = part.cell.id
        prompt = nbformat.v4.new_markdown_cell(part.learner)
        prompt.id = f"prompt-{part.cell.id}"
        cells += [_raw("# BEGIN PROMPT"), prompt, _raw("# END PROMPT"),
                  _raw("# BEGIN SOLUTION"), answer, _raw("# END SOLUTION")]
    else:
        in_solution = False
        for part in (p for p in group if not p.functions):
            if part.role == "solution" and not in_solution:
                cells.append(_raw("# BEGIN SOLUTION"))
            elif part.role != "solution" and in_solution:
                cells.append(_raw("# END SOLUTION"))
            in_solution = part.role == "solution"
            cell = nbformat.from_dict(part.cell)
            where = f"{path.name}, cell {part.cell.id}"
            cell.source = otter_solution_source(part, where) if part.role == "solution" else part.learner
            cells.append(cell)
        if in_solution:
            cells.append(_raw("# END SOLUTION"))
    if tests:
        cells.append(_raw("# BEGIN TESTS"))
        for k, (p, (source, _)) in enumerate(tests):
            cells.append(nbformat.v4.new_code_cell(source))
            cells[-1].id = f"test-{p.cell.id}" + ("" if k == 0 or tests[k - 1][0] is not p else "-hidden")
        cells.append(_raw("# END TESTS"))
    cells.append(_raw("# END QUESTION"))
    return cells


def otter_notebook(path: Path) -> nbformat.NotebookNode:
    """The Otter master notebook of one solution notebook (a new notebook)."""
    solution = nbformat.read(path, as_version=4)
    cells = [_raw(ASSIGNMENT_CONFIG.format(name=path.stem))]
    taken: set[str] = set()
    for item in group_questions(read_parts(path)):
        if isinstance(item, Part):
            cell = nbformat.from_dict(item.cell)
            cell.source = item.learner   # a hidden region outside a check cell: the exercise drops it, so does this
            cells.append(cell)
            continue
        fallback = "written_answer" if item[0].role == "answer" else "answer"
        cells += _question_cells(item, _question_name(item, taken, fallback), path)
    _number_new_cells(cells)
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {k: v for k, v in solution.metadata.items() if k == "language_info"}
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["ampteach"] = {"exercise": path.stem}
    return nb


def export_otter(out: Path, solutions: Path | None = None, names: list[str] | None = None,
                 force: bool = False) -> list[Path]:
    """Write one Otter master notebook per exercise into `out` (every exercise, or the ones named); return them.
    An existing master is replaced only with force=True."""
    paths = solution_paths(solutions or default_solutions(), names)
    notebooks = {p.stem: otter_notebook(p) for p in paths}
    existing = [name for name in notebooks if (out / f"{name}.ipynb").exists()]
    if existing and not force:
        raise ExportError(f"{out} already has {', '.join(existing)}: pass --force to replace them")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, nb in notebooks.items():
        target = out / f"{name}.ipynb"
        target.write_text(nbformat.writes(nb) + "\n")
        written.append(target)
    return written


