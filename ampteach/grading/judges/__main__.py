"""Judge one check for a learner's kernel: `python -m ampteach.grading.judges CHECK REF...`.

The kernel (checks/visible.py) starts this process and answers its requests on this process's stdin
and stdout (checks/wire.py framing); the last message is the verdict. What the judge prints goes into
the verdict's output, not onto the channel. A visible check draws from fixed seeds (the same messages
every run); a hidden check (one the exercise does not show: exercise_checks/*.json says which) draws
new ones.
"""

from __future__ import annotations

import os
import sys

from ampteach.grading.checks import wire
from ampteach.grading.judges import Verdict, exercise_of, hidden_checks, run_check
from ampteach.grading.judges.learner import Learner, Ref


def main(argv: list[str]) -> int:
    name, refs = argv[0], [Ref(r) for r in argv[1:]]
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)                  # stray prints of libraries go to stderr, never onto the channel
    sys.stdout = sys.stderr

    def request(message: dict) -> dict:
        wire.send(proto_out, message)
        return wire.receive(proto_in)

    import torch
    torch.set_num_threads(1)
    hidden = name in hidden_checks()
    copy = exercise_of(name) or {}
    learner = Learner(request, fresh=hidden, course_cells=copy.get("given", ()))
    try:
        verdict = run_check(name, learner, refs)
    except (EOFError, wire.WireError) as exc:
        print(f"the kernel stopped answering: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a judge's own bug: reported, not hidden
        import traceback
        verdict = Verdict("failed", f"the course's judge for {name} failed ({type(exc).__name__}: {exc}); "
                                    f"this is a bug in the course, not in your answer:\n{traceback.format_exc()}")
    wire.send(proto_out, verdict.to_message())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
