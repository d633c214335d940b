"""Refusing a borrowed answer: the library's own solution, or torch's, used where the exercise asks for yours.

    from ampteach.grading.checks.borrowed import Borrowed, package_files
    with Borrowed("round_to_bf16", package_files("ampteach.amp"), because="round from the bits yourself"):
        got = round_to_bf16(x)      # a call into any ampteach/amp/*.py function raises CheckFailed

`Borrowed` watches every call while the learner's function runs (sys.setprofile): a Python function
is recognised by the file its code lives in, however the learner reached it (a from-import, an
alias, sys.modules), and a builtin by identity or name; a TorchDispatchMode sees aten ops, even those
called as torch.ops.aten.<op>, which a TorchFunctionMode does not. A refusal the learner's code
catches is raised again when the region ends. The files are looked up when the check runs, so a
function that moves to another module of a refused package stays refused.

`notebook_uses` reads what a notebook has run (IPython's input history in its namespace): answers
computed in an earlier cell, outside the function a check calls, leave their trace there.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.grading.checks.common import CheckFailed

HALF = (torch.bfloat16, torch.float16)


def package_files(*names: str) -> frozenset[str]:
    """The real paths of the .py files of these modules or packages (a package: every module in it)."""
    files = set()
    for name in names:
        module = importlib.import_module(name)
        path = Path(module.__file__).resolve()
        if path.name == "__init__.py":
            files.update(str(p) for p in path.parent.rglob("*.py"))
        else:
            files.add(str(path))
    return frozenset(files)


def qualified(code_or_fn: Any, module: str | None = None) -> str:
    """module.qualname of a code object or a function; torch.<name> for torch's own builtins."""
    name, home = getattr(code_or_fn, "__name__", ""), getattr(code_or_fn, "__module__", None)
    if name and getattr(torch, name, None) is code_or_fn:
        return f"torch.{name}"
    if name and home in sys.modules and getattr(sys.modules[home], name, None) is code_or_fn:
        return f"{home}.{name}"
    name = getattr(code_or_fn, "co_qualname", None) or getattr(code_or_fn, "__qualname__", None) or repr(code_or_fn)
    module = module or getattr(code_or_fn, "__module__", None) or ""
    return f"{module}.{name}" if module else name


def aten_callables(names: Iterable[str]) -> dict[Any, str]:
    """Every Python-visible way to call these aten ops (torch.<op>, torch.ops.aten.<op>[.overload] and the
    builtin behind each overload), keyed by identity, with the name to report."""
    found: dict[Any, str] = {}
    for name in names:
        if callable(getattr(torch, name, None)):
            found[getattr(torch, name)] = f"torch.{name}"
        packet = getattr(torch.ops.aten, name, None)
        for overload in getattr(packet, "overloads", lambda: [])():
            found[getattr(packet, overload)._op] = f"torch.ops.aten.{name}.{overload}"
    return found


_OP_CALLS = (torch._ops.OpOverload.__call__.__code__, torch._ops.OpOverloadPacket.__call__.__code__)


class _RefuseHalf(TorchDispatchMode):
    """Refuse any aten op whose result is a 16-bit float (and the guard's aten ops), however it was called."""

    def __init__(self, guard: Borrowed) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.guard.aten_ops:
            self.guard.refuse(f"torch.ops.{func}")
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype in HALF:
                self.guard.refuse(f"torch.ops.{func} (it made a {str(t.dtype).removeprefix('torch.')} tensor)")
        return out


class Borrowed:
    """While the region runs, a call into `files` or `builtins`, or an aten op in `aten_ops` (or with a
    16-bit float result, when half_results) raises CheckFailed: "your <who> called <what>: <because>".
    Calls made from inside one of the `allowed` functions (a helper the exercise offers) are let through."""

    def __init__(self, who: str, files: Iterable[str] = (), because: str = "", *,
                 builtins: Callable[[Any], bool] | None = None, aten_ops: Iterable[str] = (),
                 half_results: bool = False, allowed: Iterable[Callable] = ()) -> None:
        self.who, self.files, self.because = who, frozenset(files), because
        self.builtins, self.aten_ops = builtins, frozenset(aten_ops)
        self.aten_callables = aten_callables(self.aten_ops)
        self.allowed = frozenset(getattr(f, "__code__", None) for f in allowed) - {None}
        self.mode = _RefuseHalf(self) if half_results else None
        self.refused: str | None = None
        self._in_files: dict[str, bool] = {}
        self._saved = None

    def refuse(self, what: str) -> None:
        if self.refused is None:
            self.refused = f"your {self.who} called {what}: {self.because}"
        raise CheckFailed(self.refused)

    def _refused_file(self, filename: str) -> bool:
        known = self._in_files.get(filename)
        if known is None:
            known = self._in_files[filename] = os.path.realpath(filename) in self.files
        return known

    def _let_through(self, frame) -> bool:
        frame = frame.f_back
        while frame is not None:
            if frame.f_code in self.allowed:
                return True
            frame = frame.f_back
        return False

    def _profile(self, frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            if code in _OP_CALLS and self.aten_ops:
                op = frame.f_locals.get("self")
                if getattr(op, "__name__", "").split(".")[0] in self.aten_ops:
                    self.refuse(f"torch.ops.aten.{op.__name__}")
            elif (code.co_name != "<module>" and self._refused_file(code.co_filename)
                  and not _serves_torch(frame.f_back) and not self._let_through(frame)):
                self.refuse(qualified(code, frame.f_globals.get("__name__")))
        elif event == "c_call":
            if arg in self.aten_callables:
                self.refuse(self.aten_callables[arg])
            if self.builtins is not None and self.builtins(arg) and not self._let_through(frame):
                self.refuse(qualified(arg, getattr(arg, "__module__", None) or "torch._C"))

    def __enter__(self) -> Borrowed:
        self._saved = sys.getprofile()
        if self.mode is not None:
            self.mode.__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, kind, value, tb) -> None:
        still_watching = sys.getprofile() == self._profile
        sys.setprofile(self._saved)
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
        if self.refused is not None and not isinstance(value, CheckFailed):
            raise CheckFailed(self.refused) from value      # the learner's code caught the refusal
        if kind is None and not still_watching and self.refused is None:
            raise CheckFailed(f"your {self.who} switched off the check's watch on its calls (sys.setprofile): "
                              f"leave it on; the check only looks at which functions your code calls")


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _serves_torch(caller) -> bool:
    """Whether a library function was called on torch's behalf: by an autocast kernel the dispatcher ran for a
    torch op (ampteach's kernels also serve torch.autocast regions once registered), or by torch's own code
    (torch.autocast.__exit__ calling the hooked torch.clear_autocast_cache). What such a call makes is still
    seen by the half-result watch, so torch's casts stay refused where the check refuses them."""
    if caller is None:
        return False
    filename = caller.f_code.co_filename
    return filename.startswith("<ampteach autocast kernel") or filename.startswith(_TORCH_DIR)


def dispatcher_introspection(fn: Any) -> bool:
    """torch._C's functions that read the dispatcher's registrations (e.g. which ops have an Autocast kernel)."""
    return getattr(fn, "__name__", "").startswith("_dispatch_") and getattr(fn, "__module__", None) == "torch._C"


# --- what a notebook has run -----------------------------------------------------------------------

def _cells(namespace: dict) -> list[str]:
    history = namespace.get("In", namespace.get("_ih"))
    return [cell for cell in history if isinstance(cell, str)] if isinstance(history, list) else []


def _parse(cell: str) -> ast.AST | None:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        cell = TransformerManager().transform_cell(cell)   # %magics and !shell lines become Python
    except ImportError:
        pass
    try:
        return ast.parse(cell)
    except SyntaxError:
        return None


def names_in(tree: ast.AST) -> set[str]:
    """Every name the code uses: variables, attributes, imported modules and their parts (comments excluded)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = getattr(node, "module", None) or ""
            found.update(module.split("."))
            for alias in node.names:
                found.update(alias.name.split("."))
    return found


def notebook_uses(namespace: dict, wanted: Callable[[str], bool]) -> list[tuple[int, str]]:
    """(cell number, name) for each name in the notebook's executed cells (In[1], In[2], ...) that
    `wanted` picks; empty outside IPython."""
    found = []
    for number, cell in enumerate(_cells(namespace)):
        tree = _parse(cell) if cell.strip() else None
        if tree is not None:
            found += [(number, name) for name in sorted(names_in(tree)) if wanted(name)]
    return found


def caller_namespace(depth: int = 2) -> dict:
    """The globals of the notebook (or script) that called the check: the nearest `__main__` frame."""
    frame = sys._getframe(depth)
    while frame is not None:
        if frame.f_globals.get("__name__") == "__main__":
            return frame.f_globals
        frame = frame.f_back
    return {}


__all__ = ["Borrowed", "package_files", "dispatcher_introspection", "notebook_uses", "names_in", "caller_namespace",
           "qualified", "aten_callables", "HALF"]
