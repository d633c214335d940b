"""The course's order, as the course map (course/README.md) gives it: each lesson, then its exercises.

    sections = course_sections(map_text, lessons=["00_start_here", ...], exercises=["build_1_bf16_rounding", ...])
    [(s.lesson, s.exercises) for s in sections]   # [("00_start_here", []), ("01_float_formats", ["build_1_..."]), ...]

A lesson's place is the map's first link to it (`notebooks/NAME.ipynb`). An exercise belongs to the
lesson its table row names in its first column ("after lesson" N: the lesson whose file name starts
with N_; a lesson split in two has a lettered part, 06b_scale_out is lesson "6b", after 6). A lesson
the map does not name goes before the first lesson with a higher number; exercises it does not place
come last, in a section of their own (lesson None). Only the names passed in count, so a map that
names a notebook not written yet, or misses a new one, still gives every notebook one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Section", "course_sections", "lesson_label", "lesson_number", "LINK"]

# A Markdown link [label](target "title"), with one level of brackets in the label.
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*([^)\s]+)(\s+\"[^\"]*\")?\s*\)")
COURSE_LINK = re.compile(r"(?:^|/)(notebooks|exercises)/([\w.-]+)\.ipynb$")


@dataclass
class Section:
    """A lesson and the exercises the course map places after it (lesson None: exercises it places nowhere)."""

    lesson: str | None
    exercises: list[str] = field(default_factory=list)


NUMBERED = re.compile(r"(\d+)([a-z]?)(?:_|$)")


def lesson_number(name: str) -> int | None:
    """03_master_weights -> 3, 06b_scale_out -> 6; None for a name without a leading number."""
    m = NUMBERED.match(name)
    return int(m.group(1)) if m else None


def lesson_label(name: str) -> str | None:
    """What the course calls a lesson: 03_master_weights -> "3", 06b_scale_out -> "6b"; None without a number."""
    m = NUMBERED.match(name)
    return f"{int(m.group(1))}{m.group(2)}" if m else None


def _order(name: str) -> tuple[int, str]:
    m = NUMBERED.match(name)
    return (int(m.group(1)), m.group(2)) if m else (-1, "")


def _row_label(line: str) -> str | None:
    """The lesson a table row's first column names ("| 2 | [exercises/...] |" -> "2", "| 6b | ..." -> "6b")."""
    cells = line.strip().strip("|").split("|")
    if not line.lstrip().startswith("|") or not cells:
        return None
    return lesson_label(cells[0].strip())


def course_sections(map_text: str, lessons: list[str], exercises: list[str]) -> list[Section]:
    """The lessons in the map's order, each with its exercises; see the module's docstring."""
    sections: dict[str, Section] = {}
    placed: list[tuple[str, str | None]] = []   # (exercise, its row's lesson label), in the map's order
    for line in map_text.splitlines():
        for _, _, target, _ in LINK.findall(line):
            found = COURSE_LINK.search(target.split("#", 1)[0])
            if not found:
                continue
            folder, name = found.groups()
            if folder == "notebooks" and name in lessons and name not in sections:
                sections[name] = Section(name)
            elif folder == "exercises" and name in exercises and name not in (e for e, _ in placed):
                placed.append((name, _row_label(line)))
    order = list(sections)
    for name in sorted(set(lessons) - set(sections)):      # not on the map (yet): placed by its number
        key = _order(name)
        later = [i for i, other in enumerate(order) if key[0] >= 0 and _order(other) > key]
        order.insert(later[0] if later else len(order), name)
    sections = {name: sections.get(name, Section(name)) for name in order}
    by_label = {lesson_label(name): section for name, section in sections.items() if lesson_label(name) is not None}
    leftover = Section(None)
    for name, label in placed:
        by_label.get(label, leftover).exercises.append(name)
    leftover.exercises += sorted(set(exercises) - {name for name, _ in placed})
    return list(sections.values()) + ([leftover] if leftover.exercises else [])
