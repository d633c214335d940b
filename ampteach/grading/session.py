"""One notebook's process under `ampteach grade`: the sandboxed driver, spoken to over its stdin and stdout.

    with Session("build_2_loss_scale_update", find_sandbox("auto"), timeout=120) as session:
        session.run_cell("def update_scale(...): ...")          # ("passed", "") or ("failed", "ZeroDivisionError: ...")
        reply = session.request({"op": "call", "ref": "update_scale", "args": [...]}, timeout=120)

The process is `python -m ampteach.grading.checks EXERCISE` inside the sandbox (sandbox.py); it
imports torch and the learner-side checks, seals itself (checks/guard.py), says it is ready, then
answers one request at a time (checks/driver.py). A reader thread turns what it writes into messages;
a request that gets no answer within its time plus GRACE seconds ends the process, and so does close().
Everything the process sends is untrusted: it is only ever decoded as data (checks/wire.py).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ampteach.grading.checks import wire
from ampteach.grading.sandbox import Sandbox

__all__ = ["Session", "SessionLost", "GRACE", "STARTUP"]

GRACE = 30.0        # seconds past a request's own time before the process is ended
STARTUP = 300.0     # seconds the process may take to import torch and say it is ready (a busy machine)


class SessionLost(RuntimeError):
    """The notebook's process ended, or stopped answering, before the request was answered."""


class Session:
    def __init__(self, exercise: str, sandbox: Sandbox, timeout: float, threads: int = 1,
                 total: float | None = None) -> None:
        self.exercise, self.sandbox, self.timeout = exercise, sandbox, timeout
        self._workdir = tempfile.TemporaryDirectory(prefix="ampteach-grade-")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib", "PYTHONDONTWRITEBYTECODE": "1",
               "OMP_NUM_THREADS": str(threads), "AMPTEACH_GRADE_THREADS": str(threads), "AMPTEACH_GRADING": "1",
               "PYTHONPATH": str(Path(__file__).resolve().parents[2])}     # the folder that holds ampteach/
        if os.environ.get("AMPTEACH_DATA"):
            env["AMPTEACH_DATA"] = os.path.realpath(os.environ["AMPTEACH_DATA"])
        if not sandbox.isolated:       # a plain subprocess: its own temporary folder as home and /tmp
            env.update(HOME=self._workdir.name, TMPDIR=self._workdir.name,
                       MPLCONFIGDIR=os.path.join(self._workdir.name, "matplotlib"), PATH=os.environ.get("PATH", ""))
            if sys.platform == "win32":
                env.update({k: v for k, v in os.environ.items() if k.upper() in ("SYSTEMROOT", "WINDIR")})
        argv = sandbox.wrap([sys.executable, "-m", "ampteach.grading.checks", exercise], env)
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     cwd=self._workdir.name, env=env, start_new_session=sys.platform != "win32",
                                     preexec_fn=sandbox.limits(total or STARTUP + 100 * timeout))
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._next(STARTUP)
        if not isinstance(self.ready, dict) or self.ready.get("op") != "ready":
            raise SessionLost(f"the notebook's process did not start: {self.ready!r:.200}")

    def _read(self) -> None:
        try:
            while True:
                self._replies.put(wire.receive(self.proc.stdout))
        except (EOFError, wire.WireError, OSError, ValueError) as exc:
            self._replies.put(SessionLost(f"the notebook's process ended ({self._ended()}): {exc}"))

    def _ended(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by signal {-code}"
        return f"exit status {code}"

    def _next(self, seconds: float) -> Any:
        try:
            reply = self._replies.get(timeout=seconds)
        except queue.Empty:
            self.kill()
            raise SessionLost(f"the notebook's process stopped answering (no answer in {seconds:.0f} s); it was "
                              f"ended") from None
        if isinstance(reply, SessionLost):
            self._replies.put(reply)       # every later request sees it too
            raise reply
        return reply

    def request(self, message: dict, timeout: float | None = None) -> Any:
        """Send one request and wait for its answer (its own time, then GRACE more before the process is ended)."""
        limit = self.timeout if timeout is None else timeout
        message = dict(message, timeout=limit)
        try:
            wire.send(self.proc.stdin, message)
        except (OSError, ValueError) as exc:
            raise SessionLost(f"the notebook's process ended ({self._ended()}): {exc}") from None
        return self._next(limit + GRACE)

    def run_cell(self, source: str, timeout: float | None = None) -> tuple[str, str]:
        """(result, message) of one of the notebook's cells: passed, failed (with the error), timeout, or refused
        (it did what the exercise refuses for the whole notebook: reading an answer off a run)."""
        limit = self.timeout if timeout is None else timeout
        reply = self.request({"op": "cell", "source": source}, limit)
        if not isinstance(reply, dict):
            return "failed", "the notebook's process answered with something else"
        if "timeout" in reply:
            return "timeout", f"ran longer than {limit:g} s and was interrupted (an endless loop?)"
        if "raised" in reply and isinstance(reply["raised"], wire.RemoteError):
            error = reply["raised"]
            if error.short_type == "NotImplementedError":
                return "failed", "NotImplementedError: not done yet (a `# YOUR CODE HERE` is still to write)"
            return "failed", str(error)
        if "failed" in reply:
            return ("refused" if reply.get("sealed") else "failed"), str(reply["failed"])
        return "passed", ""

    def stderr_tail(self, n: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-n:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                if sys.platform != "win32":
                    os.killpg(self.proc.pid, 9)
                else:
                    self.proc.kill()
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                wire.send(self.proc.stdin, {"op": "bye"})
                self.proc.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._log.close()
        self._workdir.cleanup()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
