"""nbgrader's ClearSolutions, keeping the course's starter code: `nbgrader generate_assignment` makes the exercises.

    # nbgrader_config.py, as `ampteach export nbgrader` writes it
    from ampteach.grading.nbgrader_starter import generate_assignment_preprocessors
    c.GenerateAssignment.preprocessors = generate_assignment_preprocessors()

nbgrader replaces every `### BEGIN SOLUTION ... ### END SOLUTION` region with one stub (`# YOUR CODE
HERE` / `raise NotImplementedError()`). Some of the course's exercises give the learner code to start
from instead (a buggy loop to fix, a table of "?" to fill in), written as `# ` comments after a
`### STARTER CODE` line inside the region. In a cell that has one, this preprocessor writes the cell
as the course's exercise generator does (ampteach.grading.exercises.strip_regions): the starter code,
uncommented, where the solution was. Every other cell goes through nbgrader's own ClearSolutions.
This module imports nbgrader: only nbgrader's configuration imports it.
"""

from __future__ import annotations

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions

from ampteach.grading.exercises import STARTER, strip_regions

__all__ = ["ClearSolutionsWithStarter", "generate_assignment_preprocessors"]


class ClearSolutionsWithStarter(ClearSolutions):
    """ClearSolutions, except that a region with a `### STARTER CODE` section becomes its starter code."""

    def _replace_solution_region(self, cell, language: str) -> bool:
        if STARTER not in cell.source:
            return super()._replace_solution_region(cell, language)
        cell.source = strip_regions(cell.source, cell.cell_type == "code", where=f"cell {cell.get('id', '?')}")
        return True


def generate_assignment_preprocessors() -> list:
    """nbgrader's own list of generate_assignment steps, with ClearSolutions swapped for ClearSolutionsWithStarter."""
    default = GenerateAssignment.class_traits()["preprocessors"].default()
    return [ClearSolutionsWithStarter if step is ClearSolutions else step for step in default]
