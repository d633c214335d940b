"""Module paths from before the sub-packages still import, with a warning that names the new path.

    import ampteach.checks        # DeprecationWarning: ampteach.checks is now ampteach.grading.checks
    from ampteach.formats import round_to_format                                  # still works

Notebooks a learner started before the library was split into ampteach.amp, .training, .lab, .grading
and .tools import the old paths (ampteach.checks above all). Each old name is the new module itself
(the same object, so a check found through either path is the course's own), found by a finder at the
end of sys.meta_path, so it never shadows a real module. Two old names cannot come back:
ampteach.autocast and ampteach.train are the public autocast and train themselves, so importing them
as modules raises an ImportError that names the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED = {
    "formats": "amp.formats", "scaler": "amp.scaler", "master": "amp.master", "half_weights": "amp.half_weights",
    "kahan": "amp.kahan", "stochastic_rounding": "amp.stochastic_rounding", "cast_lists": "amp.cast_lists",
    "autocast": "amp.autocast", "fp8": "amp.fp8", "mx": "amp.mx",
    "data": "training.data", "models": "training.models", "seeding": "training.seeding", "train": "training.train",
    "checkpoint": "training.checkpoint",
    "underflow": "lab.underflow", "lost_updates": "lab.lost_updates", "memory": "lab.memory",
    "dtype_flow": "lab.dtype_flow", "nan_spread": "lab.nan_spread", "side_by_side": "lab.side_by_side",
    "reference": "lab.compare_torch", "accumulation": "lab.grad_accumulation", "clipping": "lab.clipping",
    "distributed": "lab.distributed", "plots": "lab.plots", "widgets": "lab.widgets", "fp8_plots": "lab.fp8_plots",
    "scale_logs": "lab.scale_logs", "roofline": "lab.roofline", "step_time": "lab.step_time",
    "checks": "grading.checks", "grade": "grading.grade", "autograde": "grading.autograde",
    "exercises": "grading.exercises",
    "cli": "tools.cli", "doctor": "tools.doctor", "bench": "tools.bench", "site": "tools.website",
}
SHADOWED = ("autocast", "train")  # old module names that are now the public function or class of that name


def new_path(fullname: str) -> str | None:
    """'ampteach.checks.common' -> 'ampteach.grading.checks.common'; None for a name that did not move."""
    head, _, rest = fullname.partition(".")
    first, _, tail = rest.partition(".")
    if head != "ampteach" or first not in MOVED:
        return None
    return f"ampteach.{MOVED[first]}" + (f".{tail}" if tail else "")


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.real_spec  # the import system stamped the old name's spec on it: put the real one back


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_path(fullname)
        if new is None:
            return None
        if fullname.split(".")[1] in SHADOWED:
            raise ImportError(f"the module {fullname} is now {new} (ampteach.{fullname.split('.')[1]} itself is "
                              f"the public function): import from {new}, or use ampteach.{fullname.split('.')[1]}")
        warnings.warn(f"{fullname} is now {new}; the old path still works but will go: import {new} instead",
                      DeprecationWarning, stacklevel=3)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder at the end of sys.meta_path (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
