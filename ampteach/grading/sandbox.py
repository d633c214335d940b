"""Where a learner's notebook runs when a teacher grades it: a sandbox of its own, or, where none exists, a warning.

    box = find_sandbox("auto")          # bubblewrap when it works here, else an unisolated run (box.note says so)
    argv = box.wrap([python, "-m", "ampteach.grading.checks", exercise])
    proc = subprocess.Popen(argv, preexec_fn=box.limits(timeout), ...)

On Linux with bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; it uses unprivileged user
namespaces, no daemon and no root), each notebook runs:
    - with no network (its own, empty network namespace) and its own PID namespace: it sees no other
      process, not the grader's nor another learner's, and when it ends everything it started ends too
      (--die-with-parent, and the namespace's first process taking every other down with it);
    - as an unprivileged user (uid 65534), with a read-only view of the system's libraries, the Python
      installation and the installed packages, and a private writable /tmp (SANDBOX_TMP_BYTES) as its
      home and working folder. Nothing else of the machine is in it: not the teacher's files, not the
      other submissions, not the gradebook;
    - without the grader's own code: the judges (ampteach/grading/judges) and the grader's copy of the
      checks are hidden under empty folders, so no notebook can import a reference answer;
    - under resource limits: address space (`--memory`), CPU time, file size, open files, no core dumps.
Without bubblewrap (macOS, Windows, a Linux without user namespaces) `ampteach grade` still grades,
in a plain subprocess in a fresh temporary folder, and prints one line saying the run is not
isolated; `--sandbox required` refuses instead, `--sandbox off` skips the sandbox on purpose.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["MODES", "SandboxUnavailable", "Sandbox", "find_sandbox", "SANDBOX_TMP_BYTES", "DEFAULT_MEMORY_GB"]

MODES = ("auto", "required", "off")
SANDBOX_TMP_BYTES = 1 << 30          # the notebook's private /tmp
DEFAULT_MEMORY_GB = 6.0
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
                "bubblewrap`), or grade on a Linux machine that has it")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group", "localtime",
             "alternatives", "mime.types")


class SandboxUnavailable(RuntimeError):
    """`--sandbox required` on a machine where no sandbox works: says why and what to install."""


@dataclass
class Sandbox:
    tool: str | None             # path of bwrap, or None: not isolated
    note: str                    # one line for the teacher: what the run is (not) protected by
    memory_gb: float = DEFAULT_MEMORY_GB
    hidden: list[str] = field(default_factory=list)   # folders shown empty inside

    @property
    def isolated(self) -> bool:
        return self.tool is not None

    def wrap(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The command that runs argv inside the sandbox (argv itself when not isolated)."""
        if self.tool is None:
            return list(argv)
        return [self.tool, *_bwrap_args(env or {}, self.hidden), "--", *argv]

    def limits(self, seconds: float) -> Callable[[], None] | None:
        """A preexec_fn setting the process's resource limits (None on Windows, which has no setrlimit)."""
        try:
            import resource
        except ImportError:
            return None
        memory = int(self.memory_gb * (1 << 30))

        def apply() -> None:
            for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, max(60, int(seconds))),
                                 (resource.RLIMIT_FSIZE, 256 << 20), (resource.RLIMIT_NOFILE, 1024),
                                 (resource.RLIMIT_CORE, 0)):
                try:
                    resource.setrlimit(limit, (value, value))
                except (ValueError, OSError):
                    pass
        return apply


def _python_roots() -> list[str]:
    """The folders a Python process here needs to read: the interpreter and the standard library (the prefixes),
    the installed packages (site-packages and the folders their .pth files add), and ampteach itself (a checkout's,
    for an editable install). Not the other entries of sys.path: one of them is the folder the grader was started
    from."""
    import site

    package = str(Path(__file__).resolve().parents[1])      # ampteach/: a checkout's, for an editable install
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)), package}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    if user and user in sys.path:
        roots.add(user)
    roots.update(_pth_folders(sorted(roots)))
    found: list[str] = []
    for root in sorted({os.path.realpath(r) for r in roots} | {os.path.abspath(r) for r in roots}):
        if os.path.exists(root) and not any(root.startswith(other + os.sep) for other in found):
            found.append(root)
    return found


def _pth_folders(site_dirs: list[str]) -> set[str]:
    """The folders that .pth files in site_dirs add to sys.path (the lines that name a folder, as `site` reads
    them: packages installed elsewhere, an environment stacked on another), where Python here imported them."""
    folders = set()
    for site_dir in site_dirs:
        try:
            names = [n for n in os.listdir(site_dir) if n.endswith(".pth")]
        except OSError:
            continue
        for name in names:
            try:
                lines = Path(site_dir, name).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                folder = os.path.abspath(os.path.join(site_dir, line))
                if os.path.isdir(folder) and folder in sys.path and not os.path.isdir(os.path.join(folder, "ampteach")):
                    folders.add(folder)     # not a checkout's root (an editable install): ampteach/ is bound alone
    return folders


def hidden_folders() -> list[str]:
    """The grader's own folders a notebook must not see: the judges and the grader's copy of the checks."""
    here = Path(__file__).resolve().parent
    return [str(here / "judges"), str(here / "exercise_checks")]


def _bwrap_args(env: dict[str, str], hidden: list[str]) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534",
            "--hostname", "ampteach-grade", "--proc", "/proc", "--dev", "/dev",
            "--size", str(SANDBOX_TMP_BYTES), "--tmpfs", "/tmp", "--dir", "/tmp/work", "--chdir", "/tmp/work"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        path = f"/etc/{name}"
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for root in _python_roots():
        if not root.startswith(("/usr/", "/bin/", "/lib")) or root in ("/usr", "/bin"):
            args += ["--ro-bind", root, root]
    data = env.get("AMPTEACH_DATA")
    if data and os.path.isdir(data):
        args += ["--ro-bind", os.path.realpath(data), os.path.realpath(data)]
    for folder in hidden:
        if os.path.isdir(folder):
            args += ["--tmpfs", folder, "--remount-ro", folder]
    args += ["--remount-ro", "/"]      # the sandbox's own root too: only /tmp is writable
    args.append("--clearenv")
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


@functools.lru_cache(maxsize=None)
def _bwrap_works(tool: str) -> str | None:
    """None if bubblewrap can start an isolated process here, else what went wrong (user namespaces off, ...)."""
    try:
        probe = subprocess.run([tool, "--unshare-all", "--die-with-parent", "--uid", "65534", "--ro-bind", "/", "/",
                                "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if probe.returncode == 0 else (probe.stderr.strip() or f"exit status {probe.returncode}")


def _version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "bubblewrap"


def find_sandbox(mode: str = "auto", memory_gb: float = DEFAULT_MEMORY_GB) -> Sandbox:
    """The sandbox `ampteach grade --sandbox MODE` runs notebooks in (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"--sandbox {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return Sandbox(None, "sandbox off (--sandbox off): notebooks run NOT isolated, with this account's access "
                             "to files and network", memory_gb)
    tool = shutil.which("bwrap") if sys.platform.startswith("linux") else None
    problem = "no bubblewrap (bwrap) on this machine" if tool is None else _bwrap_works(tool)
    if problem is None:
        return Sandbox(tool, f"sandbox: {_version(tool)}: no network, own PID namespace, uid 65534, read-only system "
                             f"and packages, private /tmp, {memory_gb:g} GiB address space; the grader's judges "
                             f"hidden", memory_gb, hidden_folders())
    if mode == "required":
        raise SandboxUnavailable(f"--sandbox required, but no sandbox works here ({problem}): {INSTALL_HINT}")
    return Sandbox(None, f"NOT isolated ({problem}): each notebook runs as this account, with its files and network; "
                         f"for a class's grades, {INSTALL_HINT} and use --sandbox required", memory_gb)
