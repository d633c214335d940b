"""nbval on a busy machine: patience for a finished cell's output, a first cell with its own time limit.

    # conftest.py
    pytest_plugins = ["ampteach.grading.nbval_patience"]

A pytest plugin the course's conftest loads for its lessons and solutions (strict and lax nbval). nbval
gives a cell that has finished 5 s to deliver its output messages; on a busy machine (CI, a classroom
server) that fails correct cells with "Timeout of 5 seconds exceeded waiting for output", so it waits
OUTPUT_PATIENCE seconds instead (the cell's own limit, --nbval-cell-timeout, is unchanged). Two options:
--nbval-keep-going runs the next cells after one times out (nbval would mark them xfail), and
--nbval-warmup-timeout gives the first cell (imports) a limit of its own.
"""

from __future__ import annotations

import pytest

__all__ = ["OUTPUT_PATIENCE"]

_CELL_TIMEOUT = pytest.StashKey[float]()
OUTPUT_PATIENCE = 60.0  # seconds nbval waits for a finished cell's output messages (its own default: 5)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("nbval")
    group.addoption("--nbval-keep-going", action="store_true", default=False,
                    help="after a cell times out and is interrupted, run the next cells as usual "
                         "(nbval marks them xfail)")
    group.addoption("--nbval-warmup-timeout", type=float, default=None,
                    help="seconds the notebook's first cell may run (imports), instead of --nbval-cell-timeout")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if hasattr(item, "output_timeout"):
            item.output_timeout = max(item.output_timeout, OUTPUT_PATIENCE)


def pytest_runtest_setup(item) -> None:
    config = item.config
    if config.getoption("nbval_keep_going", False) and getattr(item.parent, "timed_out", False):
        item.parent.timed_out = False
    warmup = config.getoption("nbval_warmup_timeout", None)
    if warmup is not None and hasattr(config.option, "nbval_cell_timeout"):
        cell_timeout = config.stash.setdefault(_CELL_TIMEOUT, config.option.nbval_cell_timeout)
        config.option.nbval_cell_timeout = warmup if item.name == "Cell 0" else cell_timeout
