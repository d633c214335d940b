"""What the measuring commands (`ampteach bench`, `ampteach roofline`) share: measure, print, save as JSON.

    return run_command("roofline", measure, format_table, args.out)
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["run_command"]


def run_command(name: str, measure, describe, out: Path | None) -> int:
    """A measuring command's CLI: print describe(measure()) and write it as JSON to out (when given); a
    ValueError or RuntimeError (a bad option, no GPU) is printed as `ampteach NAME: ...` with exit code 2."""
    try:
        result = measure()
    except (ValueError, RuntimeError) as exc:
        print(f"ampteach {name}: {exc}")
        return 2
    print(describe(result))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")
    return 0
