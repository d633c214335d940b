"""Refusing a borrowed answer while the learner's code runs: the library's own solution, or torch's.

    from ampteach.grading.checks.watches import Borrowed, package_files
    with Borrowed("round_to_bf16", package_files("ampteach.amp"), because="round from the bits yourself"):
        got = round_to_bf16(x)      # a call into any ampteach/amp/*.py function raises CheckFailed

This module runs in the learner's process (their kernel while they work, the sandbox when a teacher
grades): it can only refuse, never decide a verdict. `Borrowed` watches every call while the region
runs, with one profile function per thread (`PROFILER`): a Python function is recognised by the file
its code lives in, however the learner reached it (a from-import, an alias, a copy of a method, under
DisableTorchFunction), a builtin by identity or name; a TorchDispatchMode sees aten ops, even those
called as torch.ops.aten.<op>, which a TorchFunctionMode does not. A refusal the learner's code
catches is raised again when the region ends, and a watch switched off (sys.setprofile) fails it.
Under grading the profile function stays on for the whole run and the sandbox's guard refuses
switching it off (ampteach/grading/checks/guard.py). The files are looked up when the check runs,
so a function that moves to another module of a refused package stays refused.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampteach.grading.checks.common import CheckFailed

__all__ = ["Borrowed", "PROFILER", "package_files", "module_files", "dispatcher_introspection", "qualified",
           "aten_callables", "refusing", "RefuseOps", "HALF", "trusted_callers", "library_function"]

HALF = (torch.bfloat16, torch.float16)
_getprofile, _setprofile = sys.getprofile, sys.setprofile   # taken before any learner code can replace them


@functools.lru_cache(maxsize=None)
def package_files(*names: str) -> frozenset[str]:
    """The real paths of the .py files of these modules or packages (a package: every module in it)."""
    files = set()
    for name in names:
        path = _module_path(name)
        if path.name == "__init__.py":
            files.update(str(p) for p in path.parent.rglob("*.py"))
        else:
            files.add(str(path))
    return frozenset(files)


def _module_path(name: str) -> Path:
    """Where module `name` lives, found without importing it: in a sealed notebook (checks/guard.py) an import
    may load C code (torchao's does), which the guard refuses."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None):
        return Path(module.__file__).resolve()
    top, *parts = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no module named {name!r}")
    path = Path(spec.origin).resolve()
    for part in parts:
        package = path.parent / part
        path = package / "__init__.py" if (package / "__init__.py").exists() else path.parent / f"{part}.py"
        if not path.exists():
            raise ModuleNotFoundError(f"no module named {name!r}")
    return path


@functools.lru_cache(maxsize=None)
def module_files(*names: str) -> frozenset[str]:
    """package_files of the modules that exist here (torch.cuda.amp, say, may not in every torch)."""
    return package_files(*(n for n in names if _exists(n)))


def _exists(name: str) -> bool:
    try:
        _module_path(name)
    except ModuleNotFoundError:
        return False
    return True


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
    return dict(_aten_callables(tuple(sorted(names))))


@functools.lru_cache(maxsize=None)
def _aten_callables(names: tuple[str, ...]) -> tuple[tuple[Any, str], ...]:
    """Every Python-visible way to call these aten ops (torch.<op>, torch.ops.aten.<op>[.overload] and the
    builtin behind each overload), keyed by identity, with the name to report."""
    found: dict[Any, str] = {}
    for name in names:
        if callable(getattr(torch, name, None)):
            found[getattr(torch, name)] = f"torch.{name}"
        packet = getattr(torch.ops.aten, name, None)
        for overload in getattr(packet, "overloads", lambda: [])():
            found[getattr(packet, overload)._op] = f"torch.ops.aten.{name}.{overload}"
    return tuple(found.items())


def dispatcher_introspection(fn: Any) -> bool:
    """torch._C's functions that read the dispatcher's registrations (e.g. which ops have an Autocast kernel)."""
    return getattr(fn, "__name__", "").startswith("_dispatch_") and getattr(fn, "__module__", None) == "torch._C"


_OP_CALLS = (torch._ops.OpOverload.__call__.__code__, torch._ops.OpOverloadPacket.__call__.__code__)
_OP_TYPES = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)
_TRUSTED: set = set()    # code objects that call the library on torch's behalf (see trusted_callers)


def trusted_callers(*codes: Any) -> None:
    """Code objects whose calls into a refused library are made on torch's behalf: ampteach's autocast kernels
    (the dispatcher runs them for a torch op once registered) and torch.autocast.__exit__ (which calls the
    hooked torch.clear_autocast_cache). Trusted by identity, which no learner's code can take on."""
    _TRUSTED.update(c for c in codes if c is not None)


def _callbacks() -> frozenset:
    """The library's functions that torch itself calls back (ampteach.autocast's weight-cast cache is emptied by a
    weak reference's callback when torch's cache is): they run on torch's behalf wherever they interrupt."""
    try:
        from ampteach.amp import autocast_cache
    except ImportError:
        return frozenset()
    return frozenset(getattr(getattr(autocast_cache, name, None), "__code__", None)
                     for name in ("_torch_cache_emptied",)) - {None}


_CALLBACKS = _callbacks()


def _serves_torch(caller) -> bool:
    """Whether a library function was called on torch's behalf: by one of ampteach's autocast kernels (the
    dispatcher runs them for a torch op once they are registered; their code is generated under the file name
    `<ampteach autocast kernel ...>`, which the grading guard lets no other code take) or by a code object in
    trusted_callers. What such a call makes is still seen by the half-result watch, so torch's casts stay
    refused where the check refuses them."""
    if caller is None:
        return False
    code = caller.f_code
    return code in _TRUSTED or code in _CALLBACKS or code.co_filename.startswith("<ampteach autocast kernel")


def _autocast_codes() -> list:
    """The code objects of torch.autocast's methods: its __exit__ clears the weight-cast cache, ampteach's too."""
    cls = torch.amp.autocast_mode.autocast
    return [getattr(v, "__code__", None) for v in vars(cls).values()]


trusted_callers(*_autocast_codes())


class _Profiler:
    """The one profile function of this process's main thread while any Borrowed region is open (always,
    once sealed for grading): it hands every event to the open regions, innermost last."""

    def __init__(self) -> None:
        self.active: list[Borrowed] = []
        self.sealed = False
        self._saved = None

    def __call__(self, frame, event, arg) -> None:
        for region in self.active:
            region._on(frame, event, arg)

    def intact(self) -> bool:
        return _getprofile() is self

    def reinstall(self) -> None:
        """Put the profile function back (a refusal raised inside it makes Python drop it): the one call to
        sys.setprofile the sealed guard lets through, and it always installs this profiler."""
        _setprofile(self)

    def seal(self) -> None:
        self.sealed = True
        self.reinstall()

    def push(self, region: Borrowed) -> None:
        if not self.active and not self.sealed:
            self._saved = _getprofile()
            _setprofile(self)
        self.active.append(region)

    def pop(self, region: Borrowed) -> bool:
        """Close a region; whether the profile function was still ours at that moment."""
        intact = self.intact()
        if region in self.active:
            self.active.remove(region)
        if self.sealed:
            self.reinstall()
        elif not self.active:
            _setprofile(self._saved)
        elif not intact:
            _setprofile(self)
        return intact


PROFILER = _Profiler()


class _RefuseHalf(TorchDispatchMode):
    """Refuse any aten op whose result is a 16-bit float (and the guard's aten ops), however it was called."""

    def __init__(self, guard: Borrowed) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.guard.aten_ops:
            self.guard.refuse(f"torch.ops.{func}")
        out = func(*args, **(kwargs or {}))
        if self.guard.half_results:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.dtype in HALF:
                    self.guard.refuse(f"torch.ops.{func} (it made a {str(t.dtype).removeprefix('torch.')} tensor)")
        return out


def library_function(relative: str, name: str) -> tuple[str, str]:
    """(real path, function name) of a function of ampteach, by its file under the package (no import):
    library_function("training/train.py", "train_step")."""
    root = Path(__file__).resolve().parents[2]
    return str(root / relative), name


class Borrowed:
    """While the region runs, a call into `files` or one of `functions` ((file, name) pairs), or a builtin
    that `builtins` picks, or an aten op in `aten_ops` (or with a 16-bit float result, when half_results)
    raises CheckFailed: "your <who> called <what>: <because>". Calls made from inside one of the `allowed`
    functions (a helper the exercise offers) are let through."""

    def __init__(self, who: str, files: Iterable[str] = (), because: str = "", *,
                 builtins: Callable[[Any], bool] | None = None, aten_ops: Iterable[str] = (),
                 half_results: bool = False, allowed: Iterable[Callable] = (),
                 functions: Iterable[tuple[str, str]] = ()) -> None:
        self.who, self.files, self.because = who, frozenset(files), because
        self.functions = frozenset(functions)
        self._function_files = frozenset(f for f, _ in self.functions)
        self.builtins, self.aten_ops, self.half_results = builtins, frozenset(aten_ops), half_results
        self.aten_callables = aten_callables(self.aten_ops)
        self.allowed = frozenset(getattr(f, "__code__", None) for f in allowed) - {None}
        self.mode = _RefuseHalf(self) if half_results or self.aten_ops else None
        self.refused: str | None = None
        self._in_files: dict[str, bool] = {}

    def refuse(self, what: str) -> None:
        if self.refused is None:
            self.refused = f"your {self.who} called {what}: {self.because}"
        raise CheckFailed(self.refused)

    def _refused_file(self, code) -> bool:
        filename = code.co_filename
        known = self._in_files.get(filename)
        if known is None:
            real = os.path.realpath(filename)
            known = self._in_files[filename] = 2 if real in self.files else (1 if real in self._function_files else 0)
        if known == 1:
            return (os.path.realpath(filename), code.co_name) in self.functions
        return known == 2

    def _let_through(self, frame) -> bool:
        frame = frame.f_back
        while frame is not None:
            if frame.f_code in self.allowed:
                return True
            frame = frame.f_back
        return False

    def _on(self, frame, event, arg) -> None:
        if event == "call":
            code = frame.f_code
            if code in _OP_CALLS and self.aten_ops:
                op = frame.f_locals.get("self")
                name = op.__name__ if type(op) in _OP_TYPES else ""
                if name.split(".")[0] in self.aten_ops:
                    self.refuse(f"torch.ops.aten.{name}")
            elif (code.co_name != "<module>" and code not in _CALLBACKS and self._refused_file(code)
                  and not _serves_torch(frame.f_back) and not self._let_through(frame)):
                self.refuse(qualified(code, frame.f_globals.get("__name__")))
        elif event == "c_call":
            if arg in self.aten_callables:
                self.refuse(self.aten_callables[arg])
            if self.builtins is not None and self.builtins(arg) and not self._let_through(frame):
                self.refuse(qualified(arg, getattr(arg, "__module__", None) or "torch._C"))

    def __enter__(self) -> Borrowed:
        if self.mode is not None:
            self.mode.__enter__()
        PROFILER.push(self)
        return self

    def __exit__(self, kind, value, tb) -> None:
        still_watching = PROFILER.pop(self)
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
        if self.refused is not None and not isinstance(value, CheckFailed):
            raise CheckFailed(self.refused) from value      # the learner's code caught the refusal
        if kind is None and not still_watching and self.refused is None:
            raise CheckFailed(f"your {self.who} switched off the check's watch on its calls (sys.setprofile): "
                              f"leave it on; the check only looks at which functions your code calls")


@contextlib.contextmanager
def refusing(owner: Any, names: tuple[str, ...] | str, because: str) -> Iterator[None]:
    """Inside the region, calling owner.<name> raises CheckFailed(because): the exercise is to write it.
    (A method copied before the region is not refused: for that, watch its file with Borrowed.)"""
    names = (names,) if isinstance(names, str) else names
    saved = {name: owner.__dict__[name] for name in names if name in getattr(owner, "__dict__", {})}

    def refuse(name: str) -> Callable:
        @functools.wraps(saved[name])
        def refused(*args, **kwargs):
            raise CheckFailed(f"your code called {getattr(owner, '__name__', owner)}.{name}: {because}")
        return refused

    for name in saved:
        setattr(owner, name, refuse(name))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(owner, name, original)


class RefuseOps(torch.overrides.TorchFunctionMode):
    """Inside the region, calling one of `ops` (torch functions) raises CheckFailed(because)."""

    def __init__(self, ops: dict[Callable, str]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.ops:
            raise CheckFailed(f"your code called {getattr(func, '__name__', func)}: {self.ops[func]}")
        return func(*args, **(kwargs or {}))
