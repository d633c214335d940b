"""The learner's side of a check: run what the judge asks for in the learner's process, and send back what came out.

    # in a learner's kernel, inside check_round_to_bf16(round_to_bf16) (see checks/visible.py):
    Driver({"arg0": round_to_bf16}, namespace=notebook_globals).serve(judge.stdout, judge.stdin)
    # in the sandbox `ampteach grade` starts: `python -m ampteach.grading.checks EXERCISE` (checks/__main__.py)

A check's verdict is never decided here: the judge (ampteach.grading.judges, another process) sends
requests and decides. The driver only answers them:
    {"op": "call", "ref": name, "args": [...], "watch": W}  call the learner's function, under watch W
    {"op": "plan", "plan": P, "refs": {...}, "args": [...]} run one of the course's plans (PLANS) with
                                                            the learner's objects: a training loop, a
                                                            GradScaler driven step by step
    {"op": "value", "ref": name}                            a value the notebook defined
    {"op": "cell", "source": code}                          run one of the notebook's cells (sandbox only)
    {"op": "sources"}                                       the cells the kernel has run (its In list)
    {"op": "verdict", ...}                                  the judge is done: its last message
Each answer is {"value": v}, {"raised": error} (the learner's code raised), {"failed": message} (a
refusal or a plan's own check), {"missing": name}, or {"timeout": seconds}. Values travel as
checks/wire.py encodes them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, ContextManager

from ampteach.grading.checks import wire
from ampteach.grading.checks.common import CheckFailed

__all__ = ["PLANS", "WATCHES", "plan", "watch", "Driver", "Watchdog", "quiet_streams", "grading_shell"]

PLANS: dict[str, Callable[..., Any]] = {}
WATCHES: dict[str, Callable[[str], ContextManager]] = {}


def plan(name: str) -> Callable:
    """Register a plan: a function of the course that drives the learner's objects and returns observations."""
    def register(fn: Callable) -> Callable:
        PLANS[name] = fn
        return fn
    return register


def watch(name: str) -> Callable:
    """Register a watch: a factory (who -> context manager) of the refusals a call to the learner's code runs under."""
    def register(factory: Callable) -> Callable:
        WATCHES[name] = factory
        return factory
    return register


class Missing(LookupError):
    """The notebook defines no such name (yet)."""


class Timeout(BaseException):
    """The grader's time for one request ran out (raised in the main thread by the Watchdog)."""


class Watchdog:
    """A thread, started before the notebook runs, that interrupts the main thread when a request's time is up."""

    def __init__(self) -> None:
        import _thread

        self._interrupt = _thread.interrupt_main
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self.fired = False
        threading.Thread(target=self._run, name="ampteach-watchdog", daemon=True).start()

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline, self.fired = None, True
                self._interrupt()

    @contextlib.contextmanager
    def limit(self, seconds: float | None):
        if seconds is None:
            yield
            return
        with self._cond:
            self.fired, self._deadline = False, time.monotonic() + seconds
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None
                self._cond.notify()


class Driver:
    """Answers one judge's requests (see the module docstring). `objects` are the check's arguments as the
    notebook passed them (arg0, arg1, ... and kw:NAME); other names are looked up in `namespace`."""

    def __init__(self, objects: dict[str, Any] | None = None, namespace: dict | None = None, shell=None,
                 watchdog: Watchdog | None = None, sealed: Any = None) -> None:
        self.objects = dict(objects or {})
        self.namespace = namespace if namespace is not None else {}
        self.shell, self.watchdog, self.sealed = shell, watchdog, sealed
        self.raised: BaseException | None = None     # the learner's own exception, for the kernel to raise again

    # --- the requests ---------------------------------------------------------------------------------

    def resolve(self, ref: str) -> Any:
        if ref in self.objects:
            return self.objects[ref]
        if ref in self.namespace:
            return self.namespace[ref]
        raise Missing(ref)

    def _learner_call(self, fn: Callable, args: list, kwargs: dict, watch_name: str | None, who: str) -> dict:
        region = WATCHES[watch_name](who) if watch_name else contextlib.nullcontext()
        with region:
            value = fn(*args, **kwargs)
        report = getattr(region, "report", None)
        return {"value": value, "report": report() if callable(report) else None}

    def _answer(self, message: dict) -> dict:
        op = message.get("op")
        if op == "value":
            return {"value": self.resolve(message["ref"])}
        if op == "call":
            fn = self.resolve(message["ref"])
            who = message.get("who") or message["ref"]
            return self._learner_call(fn, message.get("args", []), message.get("kwargs", {}), message.get("watch"),
                                      who)
        if op == "plan":
            fn = PLANS[message["plan"]]
            learner = {param: self.resolve(ref) for param, ref in message.get("refs", {}).items()}
            return {"value": fn(*message.get("args", []), **learner, **message.get("kwargs", {}))}
        if op == "sources":
            return {"value": _cell_sources(self.namespace)}
        if op == "cell":
            return self._cell(message["source"])
        raise ValueError(f"unknown request {op!r}")

    def _cell(self, source: str) -> dict:
        if self.shell is None:
            raise ValueError("cells run only in the grader's sandbox")
        result = self.shell.run_cell(source, store_history=False, silent=True)
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            return {"value": None}
        if isinstance(error, Timeout) or (isinstance(error, KeyboardInterrupt) and self.watchdog and
                                          self.watchdog.fired):
            raise Timeout()
        if isinstance(error, CheckFailed):
            return {"failed": str(error)}
        return {"raised": wire.RemoteError.of(error, _learner_traceback(error))}

    def answer(self, message: dict) -> dict:
        """One request's answer; every exception the learner's code raises becomes part of it."""
        limit = message.get("timeout") if self.watchdog is not None else None
        try:
            with self.watchdog.limit(limit) if self.watchdog is not None else contextlib.nullcontext():
                reply = self._answer(message)
        except Missing as exc:
            return {"missing": str(exc.args[0])}
        except CheckFailed as exc:
            return {"failed": str(exc)}
        except Timeout:
            return {"timeout": limit}
        except KeyboardInterrupt as exc:
            if self.watchdog is not None and self.watchdog.fired:
                return {"timeout": limit}
            return self._raised(exc)
        except Exception as exc:  # the learner's code raised: part of the answer, never the driver's end
            return self._raised(exc)
        finally:
            self._reseal()
        sealed = getattr(self.sealed, "refused", None)
        if sealed:
            self.sealed.refused = None
            return {"failed": sealed, "sealed": True}    # a whole-notebook refusal: the grader fails the checks
        return reply

    def _raised(self, exc: BaseException) -> dict:
        self.raised = exc
        return {"raised": wire.RemoteError.of(exc, _learner_traceback(exc))}

    def _reseal(self) -> None:
        from ampteach.grading.checks.watches import PROFILER

        if PROFILER.sealed and not PROFILER.intact():
            PROFILER.reinstall()

    def serve(self, reader, writer) -> dict:
        """Answer requests until the judge sends its verdict (returned) or goes away (EOFError)."""
        while True:
            message = wire.receive(reader)
            if not isinstance(message, dict):
                raise wire.WireError("a request must be a dict")
            if message.get("op") in ("verdict", "bye"):
                return message
            reply = self.answer(message)
            try:
                wire.send(writer, reply)
            except wire.WireError as exc:
                wire.send(writer, {"failed": f"the answer could not be sent back: {exc}"})


def _cell_sources(namespace: dict) -> list[str]:
    """The code of the cells this kernel ran: its In list, or, where cells ran without history (nbval runs them
    with store_history=False), the cells IPython keeps in linecache for tracebacks."""
    history = namespace.get("In", namespace.get("_ih"))
    cells = [c if isinstance(c, str) else "" for c in history] if isinstance(history, list) else []
    if any(c.strip() for c in cells):
        return cells           # In[n] is cells[n]: the numbers JupyterLab shows
    import linecache

    return ["".join(entry[2]) for name, entry in list(linecache.cache.items())
            if ("<ipython-input-" in name or "ipykernel_" in name) and isinstance(entry, tuple) and len(entry) > 2]


def _learner_traceback(exc: BaseException) -> str:
    """The frames of the learner's own code (cells), for the grader's note: not the driver's or the course's."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<ipython-input-")] \
        if exc.__traceback__ is not None else []
    return "".join(traceback.format_list(frames[-5:]))


# --- the sandbox's entry point ---------------------------------------------------------------------------

def quiet_streams() -> tuple:
    """The protocol keeps the process's stdin/stdout; the notebook's prints go to a file in its own /tmp."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    out = os.open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "notebook-output.txt"),
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    return proto_in, proto_out


def grading_shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False          # no history thread, no sqlite file
    shell = InteractiveShell.instance(config=config)
    shell.showtraceback = lambda *args, **kwargs: None
    shell.showsyntaxerror = lambda *args, **kwargs: None
    return shell
