"""The sandbox a notebook runs in under `ampteach grade`, promise by promise, and the guard inside it.

The sandbox (ampteach/grading/sandbox.py) promises: no network; its own PID namespace (no other process
visible); a read-only system and package, a private writable /tmp; an unprivileged user; limits; and
everything it started ended when it ends, so nothing outlives the grader to change the gradebook. The
guard (checks/guard.py) promises that the notebook's own process runs in one thread with the grader's
watch on. Each is tested by running code in a real sandboxed notebook process (`Session`), the first
line of defence (the grader reading the notebook's code) left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import ampteach
from ampteach.grading.sandbox import find_sandbox
from ampteach.grading.session import Session

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def box():
    return find_sandbox("required")


@pytest.fixture(scope="module")
def session(box):
    with Session("build_1_bf16_rounding", box, timeout=60) as s:
        yield s


def run(session: Session, source: str) -> tuple[str, str]:
    return session.run_cell(source, 60)


def value(session: Session, source: str):
    """Run `source` (which sets `result`) in the notebook's process; the value it left."""
    outcome = run(session, source)
    assert outcome[0] == "passed", outcome
    return session.request({"op": "value", "ref": "result"}, 30)["value"]


# --- the sandbox -----------------------------------------------------------------------------------------

def test_the_network_is_refused(session):
    result = value(session, "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
                            "    result = 'connected'\nexcept OSError as exc:\n"
                            "    result = type(exc).__name__ + str(exc)")
    assert result != "connected" and "unreachable" in result.lower(), result


def test_no_other_process_is_visible(session):
    pids = value(session, "import os\nresult = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    assert len(pids) <= 3 and os.getpid() not in pids[2:], pids   # bubblewrap's init and the notebook's process
    assert value(session, "import os\nresult = os.getuid()") == 65534


def test_writes_outside_the_private_tmp_are_refused(session):
    package = os.path.dirname(ampteach.__file__)
    home = str(Path.home())
    result = value(session, f"results = []\nfor path in ({package!r} + '/x', '/usr/x', '/x', {home!r} + '/x'):\n"
                            "    try:\n        open(path, 'w').write('x')\n        results.append('wrote ' + path)\n"
                            "    except OSError as exc:\n        results.append(type(exc).__name__)\n"
                            "open('/tmp/ok', 'w').write('x')\nresult = results")
    assert not any(r.startswith("wrote") for r in result), result


def test_the_grader_and_the_other_submissions_are_not_in_view(session, tmp_path):
    secret = tmp_path / "gradebook.csv"
    secret.write_text("learner,passed\n")
    judges = Path(ampteach.__file__).parent / "grading" / "judges"
    result = value(session, f"import os\nresult = [os.path.exists({str(secret)!r}), "
                            f"sorted(os.listdir({str(judges)!r})), os.path.exists({str(Path(__file__))!r})]")
    assert result == [False, [], False], result
    outcome = run(session, "from ampteach.grading.judges.fp16_attention import careful_fp16_attention")
    assert outcome[0] == "failed" and "ModuleNotFoundError" in outcome[1] or "ImportError" in outcome[1], outcome


def test_a_process_left_behind_is_ended_with_the_sandbox(box, tmp_path):
    """Run through the sandbox as the grader does, a command that starts a detached process that waits for the
    grader to be done and then writes the gradebook: it never gets to write, and no trace of it survives."""
    book = tmp_path / "gradebook.csv"
    book.write_text("learner,passed\nhonest,2\n")
    marker = f"ampteach-left-behind-{uuid.uuid4().hex}"
    script = f"(exec -a {marker} sleep 3; echo attacker,2 > {book}) > /dev/null 2>&1 &\necho started"
    out = subprocess.run(box.wrap(["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}), capture_output=True,
                         text=True, timeout=60)
    assert "started" in out.stdout, out.stderr
    time.sleep(5)
    assert book.read_text() == "learner,passed\nhonest,2\n"
    alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert alive.stdout.strip() == "", f"a process outlived its sandbox: {alive.stdout}"


def test_memory_is_limited(box):
    code = "x = bytearray(8 << 30)\nprint('allocated')"
    out = subprocess.run(box.wrap([sys.executable, "-c", code], {"PATH": "/usr/bin:/bin"}), capture_output=True,
                         text=True, timeout=120, preexec_fn=box.limits(60))
    assert "allocated" not in out.stdout and "MemoryError" in out.stderr, out.stdout + out.stderr


def test_required_refuses_where_there_is_no_sandbox(monkeypatch):
    from ampteach.grading import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="install bubblewrap"):
        sandbox.find_sandbox("required")
    plain = sandbox.find_sandbox("auto")
    assert not plain.isolated and plain.note.startswith("NOT isolated")


def test_folders_added_by_pth_files_are_in_view_but_not_a_checkout(monkeypatch, tmp_path):
    """An environment stacked on another (a .pth line naming its site-packages) imports torch from there: the
    sandbox must show that folder, or the notebook cannot start; a checkout named by a .pth line stays hidden."""
    from ampteach.grading import sandbox

    site_dir, packages, checkout = tmp_path / "site", tmp_path / "elsewhere", tmp_path / "checkout"
    for folder in (site_dir, packages, checkout / "ampteach"):
        folder.mkdir(parents=True)
    (site_dir / "stack.pth").write_text(f"# stacked\nimport os\n{packages}\n{checkout}\n{tmp_path / 'gone'}\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(packages), str(checkout)])
    assert sandbox._pth_folders([str(site_dir)]) == {str(packages)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(packages)])
    assert sandbox._pth_folders([str(site_dir)]) == set()      # what Python here did not import from: not shown


# --- the guard, alone ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, refused", [
    ("import threading\nthreading.Thread(target=print).start()", "one thread"),
    ("from concurrent.futures import ThreadPoolExecutor\nThreadPoolExecutor(1).submit(print).result()", "one thread"),
    ("import _thread\n_thread.start_new_thread(print, ())", "one thread"),
    ("import subprocess\nsubprocess.run(['true'])", "start a new process"),
    ("import os\nos.fork()", "start a new process"),
    ("import os\nos.system('true')", "start a new process"),
    ("import sys\nsys.setprofile(None)", "switch the grader's watch off"),
    ("import sys\nsys.settrace(lambda *a: None)", "set a trace function"),
    ("import sys\nsys._getframe().f_back", "take a frame"),
    ("import inspect\ninspect.currentframe()", "take a frame"),
    ("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame", "take a frame"),
    ("import gc\ngc.get_objects()", "walk every object"),
    ("import ctypes\nctypes.pythonapi.Py_IsInitialized()", "ctypes"),
    ("def f():\n    pass\nf.__code__ = (lambda: 1).__code__", "replace a function's code"),
    ("import torch, os\ncompile('x = 1', os.path.join(os.path.dirname(torch.__file__), 'x.py'), 'exec')",
     "make code under the file name"),
    ("compile('x = 1', '<ampteach autocast kernel cpu mm>', 'exec')", "make code under the file name"),
])
def test_the_guard_alone_refuses_what_a_graded_notebook_may_not_do(session, source, refused):
    result, message = run(session, source)
    assert result == "failed" and "GuardRefused" in message and refused in message, (result, message)


@pytest.mark.parametrize("source", [
    "from collections import namedtuple\nP = namedtuple('P', 'a b')\nP(1, 2)",
    "from dataclasses import dataclass\n@dataclass\nclass A:\n    x: int\nA(1)",
    "import traceback\ntry:\n    1 / 0\nexcept Exception:\n    traceback.format_exc()",
    "import warnings\nwarnings.warn('a warning')",
    "import json, fractions, statistics, math\nimport torch.nn.functional as F\nimport torch\nF.relu(torch.ones(2))",
    "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.close('all')",
    "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass",
    "import ampteach\nampteach.mlp((8,))",
])
def test_the_guard_lets_honest_code_run(session, source):
    assert run(session, source) == ("passed", ""), source


def test_an_audit_hook_of_the_notebook_is_never_added(session):
    """Python swallows the guard's refusal of sys.addaudithook (the new hook is just not added): a hook that would
    refuse every open() leaves open() working."""
    source = ("import sys\ndef refuse(event, args):\n    if event == 'open':\n        raise RuntimeError('refused')\n"
              "sys.addaudithook(refuse)\nopen('/tmp/still-works', 'w').write('x')")
    assert run(session, source) == ("passed", "")


def test_a_watch_switched_off_by_the_notebook_fails_the_check(box, tmp_path):
    """Torch's cast in a worker thread, with the grader's reading of the notebook taken out of the way: the
    thread is refused inside the sandbox, so the check fails."""
    from ampteach.grading.judges import run_check
    from ampteach.grading.judges.learner import Learner, Ref

    with Session("build_1_bf16_rounding", box, timeout=60) as s:
        assert run(s, "import threading, torch\ndef round_to_bf16(x):\n    out = {}\n"
                      "    t = threading.Thread(target=lambda: out.setdefault('y', x.to(torch.bfloat16).float()))\n"
                      "    t.start()\n    t.join()\n    return out['y']")[0] == "passed"
        learner = Learner(lambda m: s.request(m, m.get("timeout")), fresh=True, sources=[], timeout=60)
        verdict = run_check("check_round_to_bf16", learner, [Ref("round_to_bf16")])
    assert verdict.result == "failed" and "one thread" in verdict.message, verdict
