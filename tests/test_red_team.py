"""The course's own red team: notebooks written to get a grade without the work, graded as a teacher grades them.

One submission per technique an attacker tried against the grader of before (checks run in the
learner's kernel): replacing the checks' code, cutting check cells down, rebinding hidden checks,
importing the answer key, borrowing the library piece that does the work, reaching torch from another
thread, switching torch's autocast on directly, calling torch's GradScaler under DisableTorchFunction,
looking up "unseen" cases, rewriting the class gradebook from a process left behind, poisoning the
installed package. Each is a notebook of the exercise as the course hands it out, with the attack
added; all are graded together (`ampteach grade --sandbox required`, two at a time), and none may earn
full marks; the worked solutions, graded beside them, all do.

Some attacks are stopped twice (the notebook's code is read by the grader before it runs, and the
sandboxed process refuses the same thing when it happens): `test_the_guard_alone_refuses_...` in
tests/test_sandbox.py take away the first line of defence and show the second holding on its own.
"""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import ampteach
from ampteach.grading import exercises
from ampteach.grading.autograde import course_copy

ROOT = Path(__file__).parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.sandbox]


def exercise(name: str) -> nbformat.NotebookNode:
    """The exercise as the generator writes it (exercises/ may hold someone's answers)."""
    return nbformat.reads(exercises.render(ROOT / "solutions" / f"{name}.ipynb"), as_version=4)


def worked(name: str) -> nbformat.NotebookNode:
    """The exercise with every answer cell replaced by the worked solution (as a learner who solved it has it)."""
    nb = exercise(name)
    solution = nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    answers = {c.id: exercises.worked_code(c.source) for c in solution.cells if exercises.BEGIN in c.source}
    for cell in nb.cells:
        if cell.get("id") in answers:
            cell.source = answers[cell.id]
    return nb


def answer_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and "raise NotImplementedError" in c.source]


def with_cell(nb: nbformat.NotebookNode, source: str, after: int = 1) -> nbformat.NotebookNode:
    """nb with a code cell added after its `after`-th code cell."""
    cell = nbformat.v4.new_code_cell(source)
    codes = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells.insert(codes[min(after, len(codes)) - 1] + 1, cell)
    return nb


def answered(name: str, *sources: str) -> nbformat.NotebookNode:
    """The exercise with its answer cells (in order) replaced by `sources`."""
    nb = exercise(name)
    for cell, source in zip(answer_cells(nb), sources):
        cell.source = source
    return nb


# --- the attacks --------------------------------------------------------------------------------------

CODE_SWAP = """import ampteach.grading.checks as checks
noop = (lambda *args, **kwargs: None).__code__
for name in dir(checks):
    if name.startswith("check_"):
        getattr(checks, name).__code__ = noop"""
TRANSFORMER = """def keep_last_line(lines):
    return lines[-1:] if any("check_" in line for line in lines) else lines
get_ipython().input_transformers_post.append(keep_last_line)"""
REBIND = """import ampteach.grading.checks as checks
checks.check_loss_scale_update = lambda f: None
checks.check_loss_scale_update_hidden = lambda f: None"""
THREAD_CAST = """import threading, torch
def round_to_bf16(x):
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault("y", x.to(torch.bfloat16).float()))
    worker.start()
    worker.join()
    return out["y"]"""
THREAD_KERNEL = """import torch
from concurrent.futures import ThreadPoolExecutor
def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    s, t = torch.tensor(scale), torch.tensor(growth_tracker, dtype=torch.int32)
    f = torch.tensor(float(found_inf))
    with ThreadPoolExecutor(1) as pool:
        pool.submit(torch._amp_update_scale_, s, t, f, growth_factor, backoff_factor, growth_interval).result()
    return s.item(), t.item()"""
AUTOCAST_FLAGS = """import torch
class MyAutocast(torch.overrides.TorchFunctionMode):
    def __init__(self, device_type, dtype):
        super().__init__()
        self.device, self.dtype = device_type, dtype
    def __enter__(self):
        self.saved = (torch.is_autocast_enabled(self.device), torch.get_autocast_dtype(self.device))
        torch.set_autocast_enabled(self.device, True)
        torch.set_autocast_dtype(self.device, self.dtype)
        torch.autocast_increment_nesting()
        return super().__enter__()
    def __exit__(self, *exc):
        torch.autocast_decrement_nesting()
        torch.set_autocast_enabled(self.device, self.saved[0])
        torch.set_autocast_dtype(self.device, self.saved[1])
        return super().__exit__(*exc)
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))"""
DELEGATE = """import torch
_G = torch.amp.GradScaler
class MyGradScaler:
    def __init__(self, *args, **kwargs):
        with CONTEXT:
            self._g = _G(*args, **kwargs)
    def scale(self, loss):
        with CONTEXT:
            return _G.scale(self._g, loss)
    def unscale_(self, opt):
        with CONTEXT:
            return _G.unscale_(self._g, opt)
    def step(self, opt):
        with CONTEXT:
            return _G.step(self._g, opt)
    def update(self, new_scale=None):
        with CONTEXT:
            return _G.update(self._g, new_scale)
    def get_scale(self):
        return _G.get_scale(self._g)
    def state_dict(self):
        return _G.state_dict(self._g)
    def load_state_dict(self, state):
        return _G.load_state_dict(self._g, state)"""
MASTER_3 = """from ampteach import MasterWeights
def make_master_copies(model):
    global MASTER
    MASTER = MasterWeights(model)
    return [(p, m) for p, m in MASTER.pairs]
def master_step(pairs, optimizer, scaler):
    MASTER.grads_to_master()
    scaler.step(optimizer)
    scaler.update()
    MASTER.master_to_model()"""
TRAIN_STEP = """from ampteach.training.train import TrainConfig, train_step
def amp_step(model, x, y, optimizer, scaler, precision):
    return train_step(model, x, y, optimizer, scaler, TrainConfig(precision=precision, impl="torch", progress=False))"""
POLICY_BY_STRING = """import importlib
_lists = importlib.import_module("ampteach.amp." + "cast_" + "lists")
def sort_into_cast_lists():
    return {d: {op: _lists.policy_of(op, d) for op in CAST_LIST_OPS + CHALLENGE_OPS} for d in ("cpu", "cuda")}"""
POLICY_BY_GETATTR = """import ampteach.amp
def sort_into_cast_lists():
    lists = getattr(ampteach.amp, "cast_" + "lists")
    return {d: {op: lists.policy_of(op, d) for op in CAST_LIST_OPS + CHALLENGE_OPS} for d in ("cpu", "cuda")}"""
MEASURE_DTYPES = """from ampteach.grading.checks.transformer_dtypes import measure
predicted = {c: {p: str(d).removeprefix("torch.") for p, d in measure(c).items()} for c in CONFIGS}"""
RUN_THE_LAYER = """seen = {}
layer.linear1.register_forward_hook(lambda m, i, o: seen.setdefault("linear1", o.dtype))
region = torch.autocast
with region("cpu"):
    layer(torch.randn(2, 5, 16))
predicted = {c: {p: "bfloat16" if p != "output" else "float32" for p in POINTS} for c in CONFIGS}"""
LOOKUP_LOGS = """from ampteach.lab.scale_logs import CAUSES, causes_of_examples, example_logs, real_run, simulate
TABLE = {}
for cause in CAUSES:
    for seed in (101, 202):
        TABLE[tuple(row["scale"] for row in simulate(cause, seed))] = cause
TABLE[tuple(row["scale"] for row in real_run(seed=101))] = "normal calibration"
for name, log in example_logs().items():
    TABLE[tuple(row["scale"] for row in log)] = causes_of_examples()[name]
def diagnose(log):
    return TABLE.get(tuple(row["scale"] for row in log), "normal calibration")"""
GRADEBOOK_WRITER = """import os, subprocess
BOOK = {book!r}
subprocess.Popen(["/bin/sh", "-c", f"sleep 4; echo gradebook_writer,,,,,total,37,37,,all complete > {{BOOK}}"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    import time
    time.sleep(4)
    open(BOOK, "w").write("gradebook_writer,,,,,total,37,37,,all complete\\n")
    os._exit(0)"""
INSTALL_POISON = """import json, pathlib, ampteach
target = pathlib.Path(ampteach.__file__).parent / "grading" / "exercise_checks" / "build_1_bf16_rounding.json"
copy = json.loads(target.read_text())
copy["checks"] = []
target.write_text(json.dumps(copy))"""
ANSWER_KEYS = {   # exercise -> an answer that imports the check module's own reference
    "fix_fp16_attention": ("from ampteach.grading.judges.fp16_attention import careful_fp16_attention\n"
                           "def attention(q, k, v, mask=None):\n    return careful_fp16_attention(q, k, v, mask)",),
    "build_7_mx_quantize": ("from ampteach.grading.judges.mx_blocks import ocp_reference\n"
                            "def mx_quantize(x, elem):\n    return ocp_reference(x, elem)",),
    "build_8_promoted_accumulation": (
        "import torch\nfrom fractions import Fraction\n"
        "from ampteach.grading.judges.promoted_accumulation import exact_accumulate, exact_round\n"
        "def round_to_bits(x, bits, rounding='nearest'):\n"
        "    return torch.tensor([float(exact_round(Fraction(v), bits, rounding)) for v in x.tolist()],"
        " dtype=torch.float64)",
        "import torch\ndef accumulate(products, acc_bits, rounding='nearest', promote_every=None):\n"
        "    return torch.tensor([float(v) for v in exact_accumulate(products, acc_bits, rounding, promote_every)],"
        " dtype=torch.float64)"),
    "choose_static_scale": ("from ampteach.grading.judges.static_scale import true_fractions\n"
                            "def fractions(grads, scale):\n    return true_fractions(grads, scale)",
                            "from ampteach.grading.judges.static_scale import best_scale\n"
                            "def choose_static_scale(grads, headroom):\n    return best_scale(grads, headroom)"),
    "debug_amp_bug_hunt": ("from ampteach.grading.judges.bug_hunt import reference_loop\n"
                           "def train_loop(model, batches, optimizer, scaler, accum_steps=4, max_norm=1.0):\n"
                           "    return reference_loop(model, batches, optimizer, scaler, accum_steps, max_norm)",),
    "fix_bf16_weight_decay": ("from ampteach.grading.judges.bf16_weight_decay import torch_decay_is_lost\n"
                              "def decay_is_lost(w, lr, weight_decay):\n"
                              "    return torch_decay_is_lost(w, lr, weight_decay)",),
}
OLD_ANSWER_KEY = ("from ampteach.grading.checks.fp16_attention import careful_fp16_attention\n"
                  "def attention(q, k, v, mask=None):\n    return careful_fp16_attention(q, k, v, mask)")


def attacks(book: Path | None = None) -> dict[str, tuple[nbformat.NotebookNode, str]]:
    """learner -> (notebook, what it tries); `book` is the class gradebook's path (for the attack on it)."""
    found = {
        "code_swap": (with_cell(exercise("build_1_bf16_rounding"), CODE_SWAP), "check functions' __code__ replaced"),
        "code_swap_2": (with_cell(exercise("build_2_loss_scale_update"), CODE_SWAP), "the same, with a hidden check"),
        "transformer": (with_cell(exercise("build_2_loss_scale_update"), TRANSFORMER),
                        "an input transformer cuts check cells to their last line"),
        "rebind_hidden": (with_cell(exercise("build_2_loss_scale_update"), REBIND),
                          "the checks rebound in ampteach.grading.checks"),
        "thread_cast": (answered("build_1_bf16_rounding", THREAD_CAST), "torch's cast in a worker thread"),
        "thread_kernel": (answered("build_2_loss_scale_update", THREAD_KERNEL),
                          "torch's _amp_update_scale_ in a thread pool"),
        "autocast_flags": (answered("build_6_autocast_mode", AUTOCAST_FLAGS), "torch's autocast flags set directly"),
        "disabled_copies": (answered("build_5_grad_scaler", DELEGATE.replace(
            "import torch\n", "import torch\nfrom torch._C import DisableTorchFunction\n"
                             "CONTEXT = DisableTorchFunction()\n")),
            "torch's GradScaler methods called under DisableTorchFunction"),
        "plain_copies": (answered("build_5_grad_scaler", DELEGATE.replace(
            "import torch\n", "import torch, contextlib\nCONTEXT = contextlib.nullcontext()\n")),
            "torch's GradScaler methods, copied"),
        "master_weights_3": (answered("build_3_master_weight_step", MASTER_3), "ampteach.MasterWeights does the step"),
        "train_step": (answered("e6_1_amp_throughput", TRAIN_STEP), "ampteach's train_step does the AMP step"),
        "policy_by_string": (answered("build_4_cast_lists", POLICY_BY_STRING), "policy_of imported by a string"),
        "policy_by_getattr": (answered("build_4_cast_lists", POLICY_BY_GETATTR), "policy_of reached by getattr"),
        "measure_dtypes": (answered("predict_transformer_dtypes", MEASURE_DTYPES),
                           "the check's own measure() imported"),
        "run_the_layer": (answered("predict_transformer_dtypes", RUN_THE_LAYER), "the layer run under autocast"),
        "lookup_logs": (answered("read_scale_log", LOOKUP_LOGS), "the unseen logs regenerated and looked up"),
        "install_poison": (with_cell(exercise("build_1_bf16_rounding"), INSTALL_POISON),
                           "the installed grading copy rewritten"),
        "old_answer_key": (answered("fix_fp16_attention", OLD_ANSWER_KEY), "the reference's old home imported"),
        "gradebook_writer": (with_cell(exercise("build_1_bf16_rounding"),
                                       GRADEBOOK_WRITER.format(book=str(book or "gradebook.csv"))),
                             "a detached process rewrites the gradebook after the grader exits"),
    }
    for name, sources in ANSWER_KEYS.items():
        found[f"key_{name}"] = (answered(name, *sources), "the judge's reference imported")
    return found


def package_digest() -> dict[str, str]:
    """A hash of every file of the installed ampteach package (its code and its data), by path."""
    root = Path(ampteach.__file__).parent
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The attacks and every worked solution, graded as one class: (rows by learner, the run, digests)."""
    folder = tmp_path_factory.mktemp("class")
    book = folder.parent / "gradebook.csv"
    made = attacks(book)
    for learner, (nb, _) in made.items():
        exercise_name = nb.metadata["ampteach"]["exercise"]
        (folder / learner).mkdir()
        nbformat.write(nb, folder / learner / f"{exercise_name}.ipynb")
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        (folder / "worked").mkdir(exist_ok=True)
        nbformat.write(worked(path.stem), folder / "worked" / path.name)
    before = package_digest()
    run = subprocess.run([sys.executable, "-m", "ampteach", "grade", str(folder), "--csv", str(book), "--jobs", "2",
                          "--sandbox", "required", "--timeout", "240"], capture_output=True, text=True, timeout=7200)
    written = book.read_bytes()
    time.sleep(8)                                   # past the detached writer's 4 s
    assert book.read_bytes() == written, "the gradebook changed after the grader exited"
    rows: dict[str, list[dict]] = {}
    for row in csv.DictReader(book.open()):
        rows.setdefault(row["learner"], []).append(row)
    return rows, run, before, made


@pytest.mark.parametrize("learner", sorted(attacks()))
def test_no_attack_earns_the_checks_it_attacks(graded, learner):
    rows, run, _, made = graded
    exercise_name = made[learner][0].metadata["ampteach"]["exercise"]
    own = [r for r in rows[learner] if r["exercise"] == exercise_name and r["result"] != "total"]
    assert own, run.stdout[-3000:] + run.stderr[-3000:]
    passed = sum(int(r["passed"]) for r in own)
    total = sum(int(r["checks"]) for r in own)
    report = "\n".join(f"{r['result']:8s} {r['check']}: {r['message'][:200]}" for r in own)
    assert passed < total, f"{learner} ({made[learner][1]}) earned {passed}/{total}:\n{report}"
    if learner != "lookup_logs":      # the lookup passes the exercise's own four logs, and only those
        assert passed == 0, f"{learner} ({made[learner][1]}) earned {passed}/{total}:\n{report}"


def test_every_worked_solution_earns_full_marks(graded):
    rows, run, _, _ = graded
    own = [r for r in rows["worked"] if r["result"] != "total"]
    failed = [f"{r['exercise']}: {r['check']}: {r['message'][:300]}" for r in own if r["result"] != "passed"]
    assert not failed, "\n".join(failed) + "\n" + run.stdout[-2000:]
    exercises_graded = {r["exercise"] for r in own}
    assert exercises_graded == {p.stem for p in (ROOT / "solutions").glob("*.ipynb")}
    total = next(r for r in rows["worked"] if r["result"] == "total")
    assert total["passed"] == total["checks"] and "all complete" in total["message"], total
    assert all(r["copied_solution"] == "yes" for r in own), "the worked solutions are flagged as copied"


def test_an_attacker_who_handed_in_one_exercise_is_not_complete(graded):
    rows, _, _, made = graded
    total = next(r for r in rows["code_swap"] if r["result"] == "total")
    assert "all complete" not in total["message"] and "not handed in" in total["message"], total
    expected = sum(len(course_copy(p.stem)["checks"]) for p in (ROOT / "solutions").glob("*.ipynb"))
    assert int(total["checks"]) == expected and int(total["passed"]) == 0, total


def test_the_gradebook_is_the_graders_after_it_exits(graded):
    rows, _, _, _ = graded
    total = next(r for r in rows["gradebook_writer"] if r["result"] == "total")
    assert total["passed"] == "0" and "all complete" not in total["message"], total


def test_the_installed_package_is_byte_identical_after_grading(graded):
    _, run, before, _ = graded
    after = package_digest()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"grading changed the installed package: {changed}"
    assert "install_poison" in run.stdout


def test_the_check_ids_are_the_same_for_every_learner(graded):
    rows, _, _, _ = graded
    ids = {r["exercise"]: set() for r in rows["worked"]}
    for r in rows["worked"]:
        if r["result"] != "total":
            ids[r["exercise"]].add(r["check_id"])
    for learner, own in rows.items():
        for r in own:
            if r["result"] in ("passed", "failed", "timeout") and r["exercise"] in ids:
                assert r["check_id"] in ids[r["exercise"]], (learner, r)
