"""The time column of the course map, computed from the notebooks themselves.

    $ python course/times.py              # one row per lesson and exercise
    $ python course/times.py --write      # and put each total in the course map's time column

    minutes = words / 200  +  2 per Predict prompt  +  run time  (+ 1 per line of code to write)

Reading: the markdown's words at 200 words per minute. Thinking: 2 minutes for each **Predict:**
prompt. Running: the seconds between each code cell's start and reply, stored in the notebook's
cell metadata when it was last executed (lessons by `jupyter nbconvert --execute`, solutions
likewise), so it is the machine that last ran it, not yours. Writing (exercises only): 1 minute per
line between `### BEGIN SOLUTION` and `### END SOLUTION` in the worked solution. These are
estimates from a rule, not timings of learners.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS_PER_MINUTE = 200
MINUTES_PER_PREDICTION = 2
MINUTES_PER_LINE_TO_WRITE = 1


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


def estimate(path: Path) -> dict:
    """The parts of the rule for one notebook, in minutes, and their sum rounded to 5 minutes."""
    cells = json.loads(path.read_text())["cells"]
    text = {kind: ["".join(c["source"]) for c in cells if c["cell_type"] == kind] for kind in ("markdown", "code")}
    words = sum(len(s.split()) for s in text["markdown"])
    predictions = sum(s.count("**Predict:**") for s in text["markdown"])
    run_s = sum(_seconds(c) for c in cells if c["cell_type"] == "code")
    write = sum(_lines_to_write(s) for s in text["code"]) * MINUTES_PER_LINE_TO_WRITE
    parts = {"read": words / WORDS_PER_MINUTE, "predict": predictions * MINUTES_PER_PREDICTION,
             "run": run_s / 60, "write": write}
    return {**parts, "total": max(5, 5 * round(sum(parts.values()) / 5)), "run_s": run_s}


_ROW = re.compile(r"^(\|[^|]*\| \[((?:notebooks|exercises)/[\w.-]+\.ipynb)\].*\| )(\d+)( min \|)$", flags=re.M)


def write_map(course_map: Path = ROOT / "course" / "README.md") -> list[str]:
    """Put each notebook's total in its course-map row (an exercise's from its worked solution); the changed rows."""
    changed = []

    def fill(row: re.Match) -> str:
        total = estimate(ROOT / row[2].replace("exercises/", "solutions/"))["total"]
        if total != int(row[3]):
            changed.append(f"{row[2]}: {row[3]} -> {total} min")
        return f"{row[1]}{total}{row[4]}"

    course_map.write_text(_ROW.sub(fill, course_map.read_text()))
    return changed


def main() -> None:
    for folder in ("notebooks", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            e = estimate(path)
            print(f"{folder}/{path.name:42s} {e['total']:4d} min  (read {e['read']:.0f}, predict {e['predict']:.0f}, "
                  f"run {e['run']:.1f}, write {e['write']:.0f})")
    if "--write" in sys.argv[1:]:
        print("\n".join(write_map()) or "the course map's times already agree")


if __name__ == "__main__":
    sys.exit(main())
