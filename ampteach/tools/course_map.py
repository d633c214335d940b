"""The course's order, as the course map (course/README.md) gives it: each lesson, then its exercises.

    sections = course_sections(map_text, lessons=["00_start_here", ...], exercises=["build_1_bf16_rounding", ...])
    [(s.lesson, s.exercises) for s in sections]   # [("00_start_here", []), ("01_float_formats", ["build_1_..."]), ...]

A lesson's place is the map's first link to it (`notebooks/NAME.ipynb`). An exercise belongs to the
lesson its table row names in its first column ("after lesson" N: the lesson whose file name starts
with N_), in the order the map lists them. A lesson the map does not name goes before the first
lesson with a higher number; exercises it does not place come last, in a section of their own
(lesson None). Only the names passed in count, so a map
that names a notebook not written yet, or misses a new one, still gives every notebook one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Section", "course_sections", "lesson_number", "LINK"]

# A Markdown link [label](target "title"), with one level of brackets in the label.
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*([^)\s]+)(\s+\"[^\"]*\")?\s*\)")
COURSE_LINK = re.compile(r"(?:^|/)(notebooks|exercises)/([\w.-]+)\.ipynb$")


@dataclass
class Section:
    """A lesson and the exercises the course map places after it (lesson None: exercises it places nowhere)."""

    lesson: str | None
    exercises: list[str] = field(default_factory=list)


def lesson_number(name: str) -> int | None:
    """03_master_weights -> 3; None for a name without a leading number."""
    m = re.match(r"(\d+)_", name)
    return int(m.group(1)) if m else None


def _row_number(line: str) -> int | None:
    """The integer in a table row's first column ("| 2 | [exercises/...] |" -> 2), else None."""
    cells = line.strip().strip("|").split("|")
    if not line.lstrip().startswith("|") or not cells:
        return None
    first = cells[0].strip()
    return int(first) if first.isdigit() else None


def course_sections(map_text: str, lessons: list[str], exercises: list[str]) -> list[Section]:
    """The lessons in the map's order, each with its exercises; see the module's docstring."""
    sections: dict[str, Section] = {}
    placed: list[tuple[str, int | None]] = []   # (exercise, its row's lesson number), in the map's order
    for line in map_text.splitlines():
        for _, _, target, _ in LINK.findall(line):
            found = COURSE_LINK.search(target.split("#", 1)[0])
            if not found:
                continue
            folder, name = found.groups()
            if folder == "notebooks" and name in lessons and name not in sections:
                sections[name] = Section(name)
            elif folder == "exercises" and name in exercises and name not in (e for e, _ in placed):
                placed.append((name, _row_number(line)))
    order = list(sections)
    for name in sorted(set(lessons) - set(sections)):      # not on the map (yet): placed by its number
        number = lesson_number(name)
        later = [i for i, other in enumerate(order) if number is not None and (lesson_number(other) or -1) > number]
        order.insert(later[0] if later else len(order), name)
    sections = {name: sections.get(name, Section(name)) for name in order}
    by_number = {lesson_number(name): section for name, section in sections.items() if lesson_number(name) is not None}
    leftover = Section(None)
    for name, number in placed:
        by_number.get(number, leftover).exercises.append(name)
    leftover.exercises += sorted(set(exercises) - {name for name, _ in placed})
    return list(sections.values()) + ([leftover] if leftover.exercises else [])
