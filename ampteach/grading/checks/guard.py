"""The grading guard: what a notebook under `ampteach grade` may not do in its own process, from the first cell on.

    from ampteach.grading.checks.guard import seal
    seal()     # in the sandboxed driver, after its own imports, before the learner's first cell

A check's refusals (watches.Borrowed) run in the learner's process, so they hold only while nothing
else runs beside them and nothing switches them off. Once sealed, for the rest of the process:
    - no new thread (threading, _thread, concurrent.futures): torch's ops reached from another thread
      would run where the watch cannot see;
    - no new process (subprocess, os.system, os.fork, multiprocessing, os.exec*, os.posix_spawn);
    - no sys.setprofile / sys.settrace but the watch's own (PROFILER.reinstall), no new audit hooks;
    - no ctypes calls into C, no gc walks over every object (gc.get_objects / get_referrers /
      get_referents), no sys._current_frames;
    - no frames taken by notebook code (sys._getframe, a traceback's tb_frame, a generator's gi_frame
      reached from a cell, or from inspect / traceback called by one): the grader's own frames hold the
      watch;
    - no code objects made under a file name of the library, torch or Python's import system (compile,
      types.CodeType, code.replace) and no function's __code__ replaced.
Each refusal raises GuardRefused (a RuntimeError) where it was tried, names what was refused, and is
written down in REFUSALS for the grader's report. Python's audit hooks (PEP 578) cannot be removed once
added, which is why this runs only in the sandbox the grader starts, never in a learner's own kernel.
"""

from __future__ import annotations

import _thread
import os
import sys
from typing import Callable

__all__ = ["GuardRefused", "REFUSALS", "seal", "LEARNER_FILES", "is_learner_code"]

REFUSALS: list[str] = []
LEARNER_FILES = ("<ipython-input-",)       # the file names IPython gives a cell's code


class GuardRefused(RuntimeError):
    """Something a notebook under grading may not do (see the module docstring)."""


REFUSED_EVENTS = {
    "os.fork": "start a new process", "os.forkpty": "start a new process", "os.system": "start a new process",
    "os.exec": "start a new process", "os.posix_spawn": "start a new process", "os.spawn": "start a new process",
    "subprocess.Popen": "start a new process", "pty.spawn": "start a new process",
    "os.kill": "signal a process", "os.killpg": "signal a process", "signal.pthread_kill": "signal a thread",
    "ctypes.dlopen": "load C code with ctypes", "ctypes.dlsym": "call C code with ctypes",
    "ctypes.dlsym/handle": "call C code with ctypes", "ctypes.call_function": "call C code with ctypes",
    "ctypes.cdata": "read memory with ctypes", "ctypes.cdata/buffer": "read memory with ctypes",
    "ctypes.addressof": "read memory with ctypes", "ctypes.PyObj_FromPtr": "read memory with ctypes",
    "ctypes.string_at": "read memory with ctypes", "ctypes.wstring_at": "read memory with ctypes",
    "gc.get_objects": "walk every object (gc)", "gc.get_referrers": "walk every object (gc)",
    "gc.get_referents": "walk every object (gc)", "sys._current_frames": "take other threads' frames",
    "sys.addaudithook": "add an audit hook", "sys.settrace": "set a trace function",
}
FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"}
FORGED_PREFIXES = ("<ampteach", "<frozen", "<ipython-input-")


def is_learner_code(code) -> bool:
    return code.co_filename.startswith(LEARNER_FILES)


def _trusted_paths() -> tuple[str, ...]:
    import torch

    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # ampteach/
    roots = {package, os.path.dirname(torch.__file__), os.path.dirname(os.__file__)}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def _refuse_threads() -> None:
    """Replace every reference to the builtins that start a thread (taken before sealing: none are left)."""
    def refused(*args, **kwargs):
        _note("start a thread")
        raise GuardRefused("a notebook under grading runs in one thread: the grader refused to start a new one "
                           "(threading, _thread, concurrent.futures); run the work in the notebook's own thread")

    names = ("start_new_thread", "start_new", "_start_new_thread", "start_joinable_thread",
             "_start_joinable_thread")
    originals = {id(getattr(_thread, n)) for n in names if hasattr(_thread, n)}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if id(value) in originals and callable(value):
                namespace[name] = refused


def _note(what: str) -> None:
    REFUSALS.append(what)


def _imported(frame) -> bool:
    """Whether a compile() of a library file comes from Python's import system reading that file: frames named
    source_to_code then get_code in importlib's frozen bootstrap (file names no other code can take), past
    _call_with_frames_removed."""
    frozen = ("<frozen importlib._bootstrap_external>", "<frozen importlib._bootstrap>")
    while frame is not None and frame.f_code.co_name == "_call_with_frames_removed" and \
            frame.f_code.co_filename in frozen:
        frame = frame.f_back
    return (frame is not None and frame.f_code.co_name == "source_to_code" and frame.f_code.co_filename in frozen
            and frame.f_back is not None and frame.f_back.f_code.co_name == "get_code"
            and frame.f_back.f_code.co_filename in frozen)


def seal(reinstall: Callable[[], None] | None = None) -> None:
    """Refuse, from now on, what the module docstring lists. `reinstall` (PROFILER.reinstall) is the one
    caller allowed to set the profile function."""
    trusted = _trusted_paths()
    function = getattr(reinstall, "__func__", reinstall)
    allowed_profile = {function.__code__} if function is not None else set()
    getframe = sys._getframe
    busy = [False]

    def from_learner(frame) -> bool:
        """The frame that raised the event is a cell's code, or a stdlib helper (inspect, traceback, ...) that
        a cell's code called."""
        for _ in range(3):
            if frame is None:
                return False
            if is_learner_code(frame.f_code):
                return True
            if frame.f_globals.get("__name__", "") not in ("inspect", "traceback", "operator", "functools"):
                return False
            frame = frame.f_back
        return False

    def refuse(event: str, what: str) -> None:
        _note(what)
        raise GuardRefused(f"the grader refused to let a notebook under grading {what} ({event}): a graded "
                           f"notebook runs only its own code, in one thread, with the grader's watch on")

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            if event in REFUSED_EVENTS:
                refuse(event, REFUSED_EVENTS[event])
            elif event.startswith("sys.monitoring"):
                refuse(event, "set a monitoring callback")
            elif event == "sys.setprofile":
                if getframe(1).f_code not in allowed_profile:
                    refuse(event, "switch the grader's watch off or replace it")
            elif event == "sys._getframe":
                if from_learner(getframe(1)):
                    refuse(event, "take a frame of the running code")
            elif event == "object.__getattr__" and len(args) > 1 and args[1] in FRAME_ATTRIBUTES:
                if from_learner(getframe(1)):
                    refuse(event, f"take a frame ({args[1]})")
            elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
                refuse(event, "replace a function's code")
            elif event in ("compile", "code.__new__") and len(args) > 1:
                filename = args[1] if isinstance(args[1], str) else str(args[1] or "")
                forged = filename.startswith(FORGED_PREFIXES) and not filename.startswith(LEARNER_FILES)
                if not forged and os.path.isabs(filename) and os.path.realpath(filename).startswith(trusted):
                    here = getframe(1)
                    parsing = event == "compile" and here.f_globals.get("__name__") == "ast" and \
                        here.f_code.co_name == "parse"      # ast.parse makes a tree, no code
                    forged = event == "code.__new__" or not (_imported(here) or parsing)
                if forged:
                    refuse(event, f"make code under the file name {filename!r}")
        finally:
            busy[0] = False

    _refuse_threads()
    sys.addaudithook(hook)
