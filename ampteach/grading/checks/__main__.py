"""The sandbox's entry point: `python -m ampteach.grading.checks EXERCISE` runs a notebook for the grader.

`ampteach grade` starts this inside its sandbox (ampteach/grading/session.py): it keeps stdin and stdout
for the grader's requests (the notebook's own prints go to a file in its private /tmp), imports what a
notebook needs, seals itself (checks/guard.py: one thread, no new process, the watch always on), says it
is ready, and answers until the grader is done (checks/driver.py).
"""

from __future__ import annotations

import os
import sys

from ampteach.grading import checks
from ampteach.grading.checks import guard, wire
from ampteach.grading.checks.driver import Driver, Watchdog, grading_shell, quiet_streams
from ampteach.grading.checks.watches import PROFILER


def main(argv: list[str] | None = None) -> int:
    """Serve the grader for one notebook of EXERCISE (argv[0]), sealed."""
    argv = sys.argv[1:] if argv is None else argv
    exercise = argv[0] if argv else ""
    proto_in, proto_out = quiet_streams()
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib
    import matplotlib.pyplot  # noqa: F401  (its font cache is built now, before the guard refuses subprocesses)
    import numpy  # noqa: F401
    import torch

    import ampteach.lab.plots  # noqa: F401  (what a notebook imports, now, before the guard's watch is on)
    import ampteach.training.train  # noqa: F401

    try:
        import tqdm
        tqdm.tqdm.monitor_interval = 0                # tqdm's monitor is a thread
    except ImportError:
        pass
    matplotlib.use("Agg")
    torch.set_num_threads(int(os.environ.get("AMPTEACH_GRADE_THREADS", "1")))
    shell = grading_shell()
    watchdog = Watchdog()
    sealed = checks.sealed_watch(exercise)
    if sealed is not None:
        PROFILER.push(sealed)
    guard.seal(PROFILER.reinstall)
    PROFILER.seal()
    wire.send(proto_out, {"op": "ready", "python": sys.version.split()[0], "torch": torch.__version__,
                          "exercise": exercise})
    driver = Driver(namespace=shell.user_ns, shell=shell, watchdog=watchdog, sealed=sealed)
    try:
        driver.serve(proto_in, proto_out)
    except (EOFError, wire.WireError):
        pass
    os._exit(0)   # skip interpreter teardown: nothing of the notebook's runs after the grader is done


if __name__ == "__main__":
    sys.exit(main())
