"""The time column of the course map, computed from the notebooks themselves.

    $ python course/times.py              # one row per lesson and exercise: its core path, and what is optional
    $ python course/times.py --write      # and put each core-path total in the course map's time column, and each
                                          # lesson's run time in its first cell (between <!-- run time --> marks),
                                          # naming this machine: run it where the lessons were just executed

    core minutes = words / 120 + code lines / 10 + 2 per Predict prompt + 1 per Recall question + run time
                   (+ 1 per line of code to write, for an exercise)

Reading: the markdown's words at 120 words a minute (dense technical prose, read to be understood).
Code: the code cells' non-blank lines at 10 lines a minute, read, not skimmed; a check cell the
lesson keeps collapsed (tagged `remove-cell`: its claim is stated in the text) is not counted.
Thinking: 2 minutes for each **Predict:** prompt and 1 for each **Recall:** question (a prompt an
earlier lesson answers), counted only where a line begins with one (a sentence that mentions the
word is not a prompt). Running: the seconds between each code cell's start and reply, stored in the
notebook's cell metadata when it was last executed (lessons by `jupyter nbconvert --execute`,
solutions likewise), so it is the machine that last ran it, not yours. Writing (exercises only): 1
minute per line between `### BEGIN SOLUTION` and `### END SOLUTION` in the worked solution.

A lesson's core path is everything before its "Going deeper" section (a markdown heading that starts
with "Going deeper"); the rest is optional, estimated the same way and shown beside it. These are
estimates from a rule, not timings of learners.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS_PER_MINUTE = 120
CODE_LINES_PER_MINUTE = 10
MINUTES_PER_PREDICTION = 2
MINUTES_PER_RECALL = 1
MINUTES_PER_LINE_TO_WRITE = 1
PROMPT = re.compile(r"^[>\s*-]*\*\*Predict:\*\*", flags=re.M)
RECALL = re.compile(r"^[>\s*-]*\*\*Recall:\*\*", flags=re.M)
DEEPER = re.compile(r"^#+\s*Going deeper", flags=re.I)


def _seconds(cell: dict) -> float:
    times = cell.get("metadata", {}).get("execution", {})
    start, end = times.get("iopub.execute_input"), times.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    return (datetime.fromisoformat(end.replace("Z", "+00:00"))
            - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()


def _lines_to_write(source: str) -> int:
    blocks = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, flags=re.S)
    return sum(1 for block in blocks for line in block.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def split_path(cells: list[dict]) -> tuple[list[dict], list[dict]]:
    """(core path, optional part): the cells before the first "Going deeper" heading, and the rest."""
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and DEEPER.match("".join(cell["source"]).lstrip()):
            return cells[:i], cells[i:]
    return cells, []


def _parts(cells: list[dict]) -> dict:
    text = {kind: ["".join(c["source"]) for c in cells if c["cell_type"] == kind] for kind in ("markdown", "code")}
    words = sum(len(s.split()) for s in text["markdown"])
    shown = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
             and "remove-cell" not in c.get("metadata", {}).get("tags", [])]
    code_lines = sum(1 for s in shown for line in s.splitlines() if line.strip())
    prompts = sum(len(PROMPT.findall(s)) for s in text["markdown"])
    recalls = sum(len(RECALL.findall(s)) for s in text["markdown"])
    run_s = sum(_seconds(c) for c in cells if c["cell_type"] == "code")
    write = sum(_lines_to_write(s) for s in text["code"]) * MINUTES_PER_LINE_TO_WRITE
    minutes = {"read": words / WORDS_PER_MINUTE, "code": code_lines / CODE_LINES_PER_MINUTE,
               "predict": prompts * MINUTES_PER_PREDICTION + recalls * MINUTES_PER_RECALL, "run": run_s / 60,
               "write": write}
    return {**minutes, "minutes": sum(minutes.values()), "run_s": run_s, "words": words, "code_lines": code_lines,
            "prompts": prompts, "recalls": recalls}


def estimate(path: Path) -> dict:
    """The parts of the rule for one notebook's core path, in minutes, their sum rounded to 5 minutes ("total"),
    and the optional part's rounded minutes ("optional")."""
    core, deeper = split_path(json.loads(path.read_text())["cells"])
    parts, extra = _parts(core), _parts(deeper)
    return {**parts, "total": max(5, 5 * round(parts["minutes"] / 5)),
            "optional": 5 * round(extra["minutes"] / 5) if deeper else 0, "deeper": extra}


TIME = r"\d+ min(?: \(\+\d+ optional\))?"       # "35 min", "35 min (+20 optional)"
_ROW = re.compile(r"^(\|[^|]*\| \[((?:notebooks|exercises)/[\w.-]+\.ipynb)\].*\| )(" + TIME + r")( \|)$", flags=re.M)


def time_cell(path: Path) -> str:
    """The course map's time for one notebook: its core path, and the optional part beside it."""
    e = estimate(path)
    return f"{e['total']} min" + (f" (+{e['optional']} optional)" if e["optional"] else "")


def write_map(course_map: Path = ROOT / "course" / "README.md") -> list[str]:
    """Put each notebook's total in its course-map row (an exercise's from its worked solution); the changed rows."""
    changed = []

    def fill(row: re.Match) -> str:
        cell = time_cell(ROOT / row[2].replace("exercises/", "solutions/"))
        if cell != row[3]:
            changed.append(f"{row[2]}: {row[3]} -> {cell}")
        return f"{row[1]}{cell}{row[4]}"

    text = _ROW.sub(fill, course_map.read_text())
    total, found = total_sentence(), TOTAL.search(text)
    if found and found[0] != total:
        changed.append(f"total: {total}")
    course_map.write_text(TOTAL.sub(total, text))
    return changed


TOTAL = re.compile(r"<!-- total -->.*?<!-- /total -->", flags=re.S)


def total_sentence(folder: Path = ROOT / "notebooks") -> str:
    """What the course map says under its lessons: the core paths' sum, and the optional parts' beside it."""
    core = optional = 0
    for path in sorted(folder.glob("[0-9][0-9]*.ipynb")):
        e = estimate(path)
        core, optional = core + e["total"], optional + e["optional"]
    hours = lambda m: f"{m // 60} h {m % 60} min"  # noqa: E731
    return (f"<!-- total -->The lessons' core paths add up to {hours(core)} by this rule; their optional parts to "
            f"{hours(optional)} more.<!-- /total -->")


RUN_TIME = re.compile(r"<!-- run time -->.*?<!-- /run time -->", flags=re.S)


def this_machine() -> str:
    """The machine --write runs on, in words ("a 2-core Intel Xeon with AVX512-BF16, AMX-BF16 and AVX512-FP16"):
    run it where the lessons were just executed, so the run-time sentences name the machine that timed them."""
    sys.path.insert(0, str(ROOT))
    from ampteach.training.machine import FLAG_NAMES, cpu_info

    name, flags = cpu_info()
    name = re.sub(r"\((?:R|TM)\)|\b(?:Processor|CPU)\b|@.*$", "", name, flags=re.I)
    name = " ".join(re.sub(r"\b\d+-Core\b", "", name, flags=re.I).split())
    native = [FLAG_NAMES[f] for f, on in (flags or {}).items() if on]
    if native:
        half = " with " + (f"{', '.join(native[:-1])} and {native[-1]}" if len(native) > 1 else native[0])
    elif flags is not None:
        half = " without native half-precision instructions"
    else:
        half = ""                                   # the OS does not tell
    return f"a {os.cpu_count()}-core {name}{half}"


def run_time_sentence(path: Path, machine: str) -> str:
    """What a lesson's first cell says about its run time, from its recorded cell times and the machine that ran it."""
    core, deeper = split_path(json.loads(path.read_text())["cells"])
    core_s, deeper_s = (sum(_seconds(c) for c in cells if c["cell_type"] == "code") for cells in (core, deeper))
    minutes = lambda s: "under a minute" if s < 60 else f"about {max(1, round(s / 60))} minute{'s' * (s >= 90)}"  # noqa: E731
    sentence = f"Running it takes {minutes(core_s)} on {machine} (the cells' recorded times)"
    if deeper_s:
        sentence += f", and the optional part {minutes(deeper_s)} more"
    return f"<!-- run time -->{sentence}.<!-- /run time -->"


def write_run_times(folder: Path = ROOT / "notebooks") -> list[str]:
    """Put run_time_sentence into each lesson's first markdown cell, where it holds the markers; the changed lessons."""
    changed, machine = [], this_machine()
    for path in sorted(folder.glob("[0-9][0-9]*.ipynb")):
        nb = json.loads(path.read_text())
        first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
        if first is None or not RUN_TIME.search("".join(first["source"])):
            continue
        text = RUN_TIME.sub(run_time_sentence(path, machine), "".join(first["source"]))
        if text != "".join(first["source"]):
            first["source"] = text.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path.name)
    return changed


def main() -> None:
    for folder in ("notebooks", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            e = estimate(path)
            optional = f"  +{e['optional']} optional" if e["optional"] else ""
            print(f"{folder}/{path.name:42s} {e['total']:4d} min  (read {e['read']:.0f}, code {e['code']:.0f}, "
                  f"predict {e['predict']:.0f}, run {e['run']:.1f}, write {e['write']:.0f}){optional}")
    if "--write" in sys.argv[1:]:
        print("\n".join(write_map()) or "the course map's times already agree")
        print("\n".join(f"{name}: run time written" for name in write_run_times()) or "the lessons' run times agree")


if __name__ == "__main__":
    sys.exit(main())
