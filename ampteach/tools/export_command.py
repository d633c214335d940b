"""`ampteach export`: the exercises for the graders schools already run, nbgrader and Otter-Grader.

    $ ampteach export nbgrader nbgrader-course/  # its nbgrader_config.py + source/<exercise>/<exercise>.ipynb
    $ ampteach export otter otter/              # otter/<exercise>.ipynb: one Otter master notebook per exercise
    $ ampteach export otter otter/ --exercise build_2_loss_scale_update --force

Both are written from solutions/, as exercises/ is: a change to a solution reaches ampteach grade,
nbgrader and Otter alike. Every check cell is worth one point (hidden ones too), so the three
graders give the same score. Then run the grader's own commands (README: "Teaching with nbgrader
or Otter").
"""

from __future__ import annotations

from pathlib import Path

from ampteach.grading.export_common import ExportError

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("grader", choices=("nbgrader", "otter"), help="which grader's format to write")
    parser.add_argument("out", type=Path, metavar="DIR", help="the folder to write (nbgrader: the course directory)")
    parser.add_argument("--exercise", action="append", metavar="NAME",
                        help="export only this exercise (repeat for more; default: every solution)")
    parser.add_argument("--solutions", type=Path, default=None, metavar="DIR",
                        help="the solution notebooks to export (default: the checkout's solutions/)")
    parser.add_argument("--force", action="store_true", help="replace exercises the folder already has")


def run(args) -> int:
    try:
        if args.grader == "nbgrader":
            from ampteach.grading.export_nbgrader import export_nbgrader
            written = export_nbgrader(args.out, args.solutions, args.exercise, force=args.force)
            nxt = (f"next, in {args.out}: nbgrader generate_assignment EXERCISE; after collecting submissions into "
                   f"submitted/<student>/EXERCISE/: nbgrader autograde EXERCISE; nbgrader export")
        else:
            from ampteach.grading.export_otter import export_otter
            written = export_otter(args.out, args.solutions, args.exercise, force=args.force)
            nxt = ("next: otter assign MASTER.ipynb dist/EXERCISE; then otter run -a dist/EXERCISE/autograder/"
                   "EXERCISE-autograder_*.zip SUBMISSION.ipynb")
    except ExportError as exc:
        print(f"ampteach export: {exc}")
        return 2
    notebooks = [p for p in written if p.suffix == ".ipynb"]
    print(f"wrote {len(notebooks)} exercise notebook(s) for {args.grader} under {args.out}")
    for path in written:
        print(f"  {path}")
    print(nxt)
    return 0
