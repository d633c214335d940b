"""Grading that needs understanding: an answer borrowed from the course library or from torch fails its
check with a message that says what the exercise asks instead, and the worked solution still passes.

Each answer runs as a learner's notebook would run it: its cells executed in a `__main__` namespace
whose `In` list is the cells' history, as IPython keeps it; each check then starts its judge in another
process, as in a notebook. One submission is graded end to end (`ampteach grade`), where the sandbox
refuses an autocast region the notebook's own code enters, however it was reached.
"""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch

from ampteach.grading.checks import (
    CAST_LIST_OPS,
    CHALLENGE_OPS,
    CheckFailed,
    check_cast_lists,
    check_cast_lists_reasoned,
    check_e6_1_measure,
    check_loss_scale_update,
    check_loss_scale_update_hidden,
    check_pre_norm_output,
    check_round_to_bf16,
    check_scale_log_diagnosis,
    check_scale_log_unseen,
    check_transformer_dtypes,
    observe_autocast,
)

ROOT = Path(__file__).parents[1]


def solution(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / f"{name}.ipynb", as_version=4)


def worked(name: str, cell_id: str) -> str:
    """A solution cell as a learner who solved it would have it: the grading markers and starter lines gone."""
    source = next(c.source for c in solution(name).cells if c.get("id") == cell_id)
    if "### STARTER CODE" in source:
        head, _, rest = source.partition("### STARTER CODE")
        source = head + rest.partition("### END SOLUTION")[2]
    return "\n".join(line for line in source.splitlines() if "### " not in line)


def notebook(*cells: str, **names) -> dict:
    """Run cells as a notebook does: one __main__ namespace, IPython's input history in `In`."""
    namespace = {"__name__": "__main__", "In": [""], **names}
    for cell in cells:
        namespace["In"].append(cell)
        exec(compile(cell, f"<cell {len(namespace['In']) - 1}>", "exec"), namespace)
    return namespace


def run_check(namespace: dict, call: str) -> None:
    """A check cell, run in the notebook's namespace (as the grader runs it)."""
    namespace["In"].append(call)
    exec(compile(call, "<check cell>", "exec"), namespace)


# --- build 1: bf16 rounding ------------------------------------------------------------------------

def test_build_1_worked_solution_passes():
    check_round_to_bf16(notebook("import torch", worked("build_1_bf16_rounding", "bb7a7a64"))["round_to_bf16"])


@pytest.mark.parametrize("borrowed, named", [
    ("from ampteach.amp.formats import round_to_format\n"
     "def round_to_bf16(x):\n    return round_to_format(x, 'bf16')", "ampteach.amp.formats.round_to_format"),
    ("import sys\n"      # the module reached without importing any of its names
     "def round_to_bf16(x):\n    return sys.modules['ampteach.amp.formats'].round_to_format(x, 'bf16')",
     "ampteach.amp.formats.round_to_format"),
    ("import torch\n"    # a TorchFunctionMode does not see torch.ops.aten calls
     "def round_to_bf16(x):\n    return torch.ops.aten._to_copy.default(x, dtype=torch.bfloat16).float()",
     "torch.ops.aten._to_copy.default (it made a bfloat16 tensor)"),
    ("import torch\n"    # autocast makes the cast inside torch: only the dispatcher level sees it
     "def round_to_bf16(x):\n    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
     "        y = torch.mm(x[:, None], torch.ones(1, 1))\n    return y[:, 0].float()", "it made a bfloat16 tensor"),
])
@pytest.mark.parametrize("kernels", ["torch's", "ampteach's"])
def test_build_1_refuses_the_librarys_rounding_and_torchs_casts(borrowed, named, kernels):
    if kernels == "ampteach's":     # once ampteach.autocast has run, its kernels serve torch.autocast regions too
        from ampteach.amp.autocast import autocast
        with autocast("cpu", dtype=torch.bfloat16):
            torch.mm(torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(CheckFailed) as failure:
        check_round_to_bf16(notebook(borrowed)["round_to_bf16"])
    message = str(failure.value)
    assert named in message and "round from the float32 bits yourself" in message, message


def test_build_1_a_refusal_caught_by_the_answer_still_fails():
    answer = notebook("import torch", worked("build_1_bf16_rounding", "bb7a7a64"),
                      "from ampteach.amp.formats import round_to_format\n"
                      "honest = round_to_bf16\n"
                      "def round_to_bf16(x):\n    try:\n        return round_to_format(x, 'bf16')\n"
                      "    except Exception:\n        return honest(x)")["round_to_bf16"]
    with pytest.raises(CheckFailed, match="called ampteach.amp.formats.round_to_format"):
        check_round_to_bf16(answer)


def test_build_1_a_lost_nan_is_reported_as_any_nan_expected():
    answer = notebook("import torch", worked("build_1_bf16_rounding", "bb7a7a64"),
                      "honest = round_to_bf16\n"
                      "def round_to_bf16(x):\n    y = honest(x)\n"
                      "    return torch.where(torch.isnan(y), torch.zeros_like(y), y)")["round_to_bf16"]
    with pytest.raises(CheckFailed) as failure:
        check_round_to_bf16(answer)
    message = str(failure.value)
    assert "expected any NaN, got 0.0" in message and "expected nan" not in message, message


# --- build 2: the loss-scale update ------------------------------------------------------------------

def build_2_answer(body: str) -> str:
    return ("import torch\n"
            "def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, "
            "growth_interval=2000):\n" + body)


def test_build_2_worked_solution_passes_the_visible_and_hidden_plans():
    answer = notebook("import torch", worked("build_2_loss_scale_update", "b6183d38"))
    check_loss_scale_update(answer["update_scale"])
    check_loss_scale_update_hidden(answer["update_scale"])


TENSORS = ("    s = torch.tensor(scale, dtype=torch.float32)\n    t = torch.tensor(growth_tracker, dtype=torch.int32)\n"
           "    f = torch.tensor(float(found_inf))\n")


@pytest.mark.parametrize("borrowed, named", [
    ("from ampteach.amp.scaler import next_scale\n" + build_2_answer(
        "    s, t = next_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)\n"
        "    return float(s), int(t)"), "ampteach.amp.scaler.next_scale"),
    (build_2_answer(TENSORS + "    torch._amp_update_scale_(s, t, f, growth_factor, backoff_factor, growth_interval)\n"
                    "    return s.item(), t.item()"), "torch._amp_update_scale_"),
    (build_2_answer(TENSORS + "    torch.ops.aten._amp_update_scale_.default(s, t, f, growth_factor, backoff_factor, "
                    "growth_interval)\n    return s.item(), t.item()"), "torch.ops.aten._amp_update_scale_"),
    (build_2_answer("    scaler = torch.amp.GradScaler('cpu', init_scale=scale)\n    return scale, 0"),
     "torch.amp.grad_scaler.GradScaler.__init__"),
])
def test_build_2_refuses_the_librarys_rule_and_torchs_update(borrowed, named):
    with pytest.raises(CheckFailed) as failure:
        check_loss_scale_update(notebook(borrowed)["update_scale"])
    message = str(failure.value)
    assert named in message and "write the rule yourself" in message, message


# --- build 4: the cast lists ---------------------------------------------------------------------------

GIVEN_4 = dict(CAST_LIST_OPS=CAST_LIST_OPS, CHALLENGE_OPS=CHALLENGE_OPS, observe_autocast=observe_autocast)


def test_build_4_worked_solution_passes_even_when_it_observes_autocast_inside():
    honest = notebook(worked("build_4_cast_lists", "ab83d7f1"), **GIVEN_4)["sort_into_cast_lists"]
    check_cast_lists(honest)
    check_cast_lists_reasoned(honest)
    observing = notebook(worked("build_4_cast_lists", "ab83d7f1"),
                         "honest = sort_into_cast_lists\n"
                         "def sort_into_cast_lists():\n    observe_autocast('exp', 'cpu')\n    return honest()",
                         **GIVEN_4)
    check_cast_lists(observing["sort_into_cast_lists"])


EVERY_OP = "{d: {op: policy_of(op, d) for op in CAST_LIST_OPS + CHALLENGE_OPS} for d in ('cpu', 'cuda')}"


@pytest.mark.parametrize("borrowed, history, named", [
    ("from ampteach.amp.cast_lists import policy_of\n"
     f"def sort_into_cast_lists():\n    return {EVERY_OP}", True,
     "your notebook holds ampteach.amp.cast_lists.policy_of"),
    ("import ampteach.amp\n"    # computed in an earlier cell: its trace is in the notebook's history
     f"policy_of = lambda op, d: ampteach.amp.cast_lists.policy_of(op, d)\nANSWER = {EVERY_OP}\n"
     "def sort_into_cast_lists():\n    return ANSWER", True, "`cast_lists` in cell In[1]"),
    # without a history to read (a function from a file), the call itself is refused
    ("import sys\n"
     f"def sort_into_cast_lists():\n    policy_of = sys.modules['ampteach.amp.cast_lists'].policy_of\n"
     f"    return {EVERY_OP}", False, "your sort_into_cast_lists called ampteach.amp.cast_lists.policy_of"),
    ("import torch\n"
     "def sort_into_cast_lists():\n"
     "    cpu = torch._C._dispatch_get_registrations_for_dispatch_key('AutocastCPU')\n    return {}", False,
     "your sort_into_cast_lists called torch._C._dispatch_get_registrations_for_dispatch_key"),
])
def test_build_4_refuses_the_librarys_tables_and_torchs_registrations(borrowed, history, named):
    namespace = notebook(borrowed, **GIVEN_4)
    if not history:
        del namespace["In"]
    with pytest.raises(CheckFailed) as failure:
        check_cast_lists(namespace["sort_into_cast_lists"])
    message = str(failure.value)
    assert named in message and "sort the ops yourself" in message, message


# --- predicting the dtypes through a Transformer layer ----------------------------------------------------

def dtypes_notebook(*extra: str) -> dict:
    """The exercise's first cell, the learner's extra cells, then the worked predictions."""
    first = next(c.source for c in solution("predict_transformer_dtypes").cells if c.get("id") == "83d02fb1")
    return notebook(first, *extra, worked("predict_transformer_dtypes", "6d2951cd"),
                    worked("predict_transformer_dtypes", "fdfdb206"),
                    check_transformer_dtypes=check_transformer_dtypes, check_pre_norm_output=check_pre_norm_output)


def test_predicted_dtypes_pass():
    namespace = dtypes_notebook()
    run_check(namespace, "check_transformer_dtypes(predicted)")
    run_check(namespace, "check_pre_norm_output(pre_norm_output)")


@pytest.mark.parametrize("learner_cell", [
    "x = torch.randn(2, 5, 16)\nwith torch.autocast('cpu'):\n    layer(x)",
    "import ampteach\nwith ampteach.autocast('cpu'):\n    layer(torch.randn(2, 5, 16))",
])
def test_a_layer_run_under_autocast_is_refused_by_both_dtype_checks(learner_cell):
    namespace = dtypes_notebook(learner_cell)
    for call in ("check_transformer_dtypes(predicted)", "check_pre_norm_output(pre_norm_output)"):
        with pytest.raises(CheckFailed) as failure:
            run_check(namespace, call)
        message = str(failure.value)
        assert "`autocast` in cell In[2]" in message and "predict the dtypes" in message, message


def test_the_checks_own_measurement_is_not_in_the_learners_reach():
    with pytest.raises(ImportError):
        dtypes_notebook("from ampteach.grading.checks.transformer_dtypes import measure")


@pytest.mark.slow
def test_a_notebook_that_reads_the_dtypes_off_a_run_fails_grading_in_a_real_kernel(tmp_path):
    """Under grading, a hooked layer run under an autocast reached without its name (a region taken from torch's
    namespace by a loop over its names) is refused by the sandbox as it runs; the worked answers do not save it."""
    from ampteach.grading import exercises
    from ampteach.grading.grade import format_grade, grade_notebook

    nb = nbformat.reads(exercises.render(ROOT / "solutions" / "predict_transformer_dtypes.ipynb"), as_version=4)
    answers = {"6d2951cd": "predicted", "fdfdb206": "pre_norm_output"}
    for cell in nb.cells:
        if cell.get("id") in answers:
            cell.source = worked("predict_transformer_dtypes", cell.id)
    peek = nbformat.v4.new_code_cell(
        "seen = {}\nlayer.linear1.register_forward_hook(lambda m, i, o: seen.setdefault('linear1', o.dtype))\n"
        "region = [v for k, v in torch.__dict__.items() if k.startswith('auto') and k.endswith('cast')][0]\n"
        "with region('cpu'):\n    layer(torch.randn(2, 5, 16))\nprint(seen)")
    nb.cells.insert(2, peek)
    nbformat.write(nb, tmp_path / "predict_transformer_dtypes.ipynb")
    sub = grade_notebook(tmp_path / "predict_transformer_dtypes.ipynb", timeout=120)
    report = format_grade(sub)
    assert sub.total == 2 and sub.passed == 0, report
    assert all("__dict__" in c.message for c in sub.checks), report     # the grader read the cell first
    from ampteach.grading import autograde
    from ampteach.grading.judges import scan

    original = scan.forbidden
    try:                                                                 # and without that reading, the sandbox
        scan.forbidden = lambda sources: []                              # refuses the region as it runs
        sub = grade_notebook(tmp_path / "predict_transformer_dtypes.ipynb", timeout=120)
    finally:
        scan.forbidden = original
    del autograde
    report = format_grade(sub)
    assert sub.total == 2 and sub.passed == 0, report
    assert any("predict the dtypes" in n for n in sub.notes + [c.message for c in sub.checks]), report


# --- E.6.1: is measure measuring what it says? ----------------------------------------------------------

@pytest.fixture(scope="module")
def e6_1() -> dict:
    """The E.6.1 notebook's setup (data, mlp, ...) with the worked amp_step and measure."""
    nb = solution("e6_1_amp_throughput")
    setup = next(c.source for c in nb.cells if c.get("id") == "fb6c3a67")
    return notebook(setup, worked("e6_1_amp_throughput", "f05fd7e8"), worked("e6_1_amp_throughput", "d3b55342"))


def variant(e6_1: dict, old: str, new: str):
    source = worked("e6_1_amp_throughput", "d3b55342")
    assert old in source, old
    namespace = dict(e6_1, In=list(e6_1["In"]) + [source.replace(old, new)])
    exec(source.replace(old, new), namespace)
    return namespace["measure"]


def test_e6_1_worked_measure_passes(e6_1):
    check_e6_1_measure(e6_1["measure"], e6_1["data"])


@pytest.mark.parametrize("old, new, named", [
    ("if step == warmup_steps:", "if step == 0:", "slowed down with them"),           # times the warm-up
    ("        seconds += time.perf_counter() - start\n",                               # times the evaluation
     "        evaluate(model, data, precision)\n        seconds += time.perf_counter() - start\n",
     "slowed down with them"),
    ("torch.cuda.synchronize()", "pass", "never calls torch.cuda.synchronize()"),
    ('"samples_per_s": samples / seconds', '"samples_per_s": 10 * samples / seconds', "faster than the"),
    ("peak = saved_activation_bytes(model, x, y, precision)", "peak = data.train_x.nbytes",
     "not what one batch's saved activations take"),
])
def test_e6_1_implausible_timing_and_memory_are_named(e6_1, old, new, named):
    with pytest.raises(CheckFailed, match=named):
        check_e6_1_measure(variant(e6_1, old, new), e6_1["data"])


def test_e6_1_a_cuda_peak_below_the_weights_is_named():
    from ampteach.grading.judges.amp_throughput import _plausible_memory

    weights = [((256, 784), 4), ((256,), 4)]
    assert _plausible_memory(4 * (256 * 784 + 256), weights, cuda=True) is None
    assert "less than the model's own parameters" in _plausible_memory(4 * 256 * 784 - 1, weights, cuda=True)


# --- reading a scale log: one real run among the unseen ---------------------------------------------------

def test_the_real_run_is_a_real_normal_calibration():
    from ampteach.lab.scale_logs import real_run

    log = real_run(seed=101)
    late = log[len(log) // 4:]
    assert all(math.isfinite(row["loss"]) for row in log)           # fp16 never overflowed the forward pass
    assert any(row["skipped"] for row in late)                       # scaled gradients overflowed, late too
    assert max(row["scale"] for row in log) > log[0]["scale"] == 2.0**16   # S grew before it backed off
    assert log[-1]["loss"] < log[0]["loss"] / 2                      # and the model learned


def test_a_rule_that_only_reads_simulations_misreads_the_real_run():
    honest = notebook("import math", worked("read_scale_log", "d0e6e72f"))["diagnose"]
    check_scale_log_diagnosis(honest)
    check_scale_log_unseen(honest)
    simulated_only = notebook("import math", worked("read_scale_log", "d0e6e72f"),   # normal S settles below 2^16
                              "honest = diagnose\n"
                              "def diagnose(log):\n    cause = honest(log)\n"
                              "    if cause == 'normal calibration' and log[-1]['scale'] >= 2**16:\n"
                              "        return 'growth too slow'\n    return cause")["diagnose"]
    check_scale_log_diagnosis(simulated_only)
    with pytest.raises(CheckFailed, match=r"unseen run 9 \(a real fp16 training run\) was 'normal calibration'"):
        check_scale_log_unseen(simulated_only)
