"""`ampteach roofline`: the shape of its table, its intensity arithmetic, its timing rule and its plot (tiny sizes)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import matplotlib
import pytest
import torch

from ampteach.lab import roofline
from ampteach.training import machine

matplotlib.use("Agg")
ROW_KEYS = {"op", "dtype", "size", "gflops", "intensity", "seconds"}
TINY = (8, 16, 32, 48)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("roofline") / "table.json"
    cmd = [sys.executable, "-m", "ampteach", "roofline", "--device", "cpu", "--sizes", ",".join(map(str, TINY)),
           "--add", "--min-seconds", "0.001", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), run.stdout


def test_a_row_per_op_dtype_and_size(table):
    data, stdout = table
    assert {(r["op"], r["dtype"], r["size"]) for r in data["rows"]} == \
        {(op, d, n) for op in ("matmul", "add") for d in ("fp32", "bf16", "fp16") for n in TINY}
    assert len(data["rows"]) == 2 * 3 * len(TINY) and data["skipped"] == []
    for row in data["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["gflops"] > 0 and math.isfinite(row["gflops"]) and row["seconds"] > 0
    assert data["device"]["type"] == "cpu" and data["device"]["torch"] == torch.__version__
    assert data["settings"]["sizes"] == list(TINY)
    assert "fp32 GFLOP/s" in stdout and "bf16/fp32" in stdout and "measured roofs: memory" in stdout


def test_the_roofs_are_the_best_matmul_and_a_copy(table):
    data, _ = table
    peaks = data["peaks"]
    assert peaks["bandwidth_gbs"] > 0
    for d in ("fp32", "bf16", "fp16"):
        measured = [r["gflops"] for r in data["rows"] if r["op"] == "matmul" and r["dtype"] == d]
        assert peaks["compute_gflops"][d] == max(measured)
    assert roofline.ridge_point(peaks, "fp32") == peaks["compute_gflops"]["fp32"] / peaks["bandwidth_gbs"]


@pytest.mark.parametrize("dtype, nbytes", [(torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2)])
def test_intensity_is_flops_over_the_least_bytes_moved(dtype, nbytes):
    for n in (16, 1000, 4096):
        assert roofline.intensity("matmul", n, dtype) == pytest.approx(2 * n**3 / (3 * n * n * nbytes))
        assert roofline.intensity("add", n, dtype) == pytest.approx(1 / (3 * nbytes))
    # half the bytes, twice the intensity: at any size a bf16 matmul sits further right than fp32's
    assert roofline.intensity("matmul", 512, torch.bfloat16) == 2 * roofline.intensity("matmul", 512, torch.float32)


def test_gflops_is_flops_over_the_timed_seconds(table):
    for row in table[0]["rows"]:
        flops = 2 * row["size"] ** 3 if row["op"] == "matmul" else row["size"] ** 2
        assert row["gflops"] == pytest.approx(flops / row["seconds"] / 1e9)


def test_speedups_divide_by_fp32_at_the_same_size(table):
    data, _ = table
    ratios = roofline.speedups(data)
    assert set(ratios) == {"bf16", "fp16"} and set(ratios["bf16"]) == set(TINY)
    fp32 = {r["size"]: r["gflops"] for r in data["rows"] if r["op"] == "matmul" and r["dtype"] == "fp32"}
    bf16 = {r["size"]: r["gflops"] for r in data["rows"] if r["op"] == "matmul" and r["dtype"] == "bf16"}
    assert ratios["bf16"][16] == pytest.approx(bf16[16] / fp32[16])


def test_best_seconds_keeps_the_fastest_call_and_times_a_slow_call_once(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(machine.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(machine.time, "thread_time", lambda: clock[0])

    def calls_taking(*durations):
        it = iter(durations)
        calls = []

        def fn():
            calls.append(1)
            clock[0] += next(it)
        return fn, calls

    slow, calls = calls_taking(0.5, 0.1, 0.1)
    # timed once, warm-up included
    assert machine.best_seconds(slow, min_seconds=0.2) == pytest.approx(0.5) and len(calls) == 1
    fast, calls = calls_taking(0.09, 0.04, 0.01, 0.03, 0.05, 0.06, 0.07, 0.08)
    assert machine.best_seconds(fast, min_seconds=0.1) == pytest.approx(0.01)  # the fastest after the warm-up call
    assert len(calls) == 5  # warm-up, then calls until 0.1 s were spent (0.04 + 0.01 + 0.03 + 0.05)
    fast, calls = calls_taking(0.001, 0.3, 0.2, 0.1, 0.9)
    # at least 3 timed calls
    assert machine.best_seconds(fast, min_seconds=0.1) == pytest.approx(0.1) and len(calls) == 4


def test_max_seconds_skips_the_larger_sizes_of_a_slow_format():
    table = roofline.roofline_table("cpu", sizes=(8, 16, 32), dtypes=("fp32",), min_seconds=0.001, max_seconds=0.0,
                                    copy_mib=1)
    assert [r["size"] for r in table["rows"]] == [8]
    assert [s["size"] for s in table["skipped"]] == [16, 32]
    assert "skipped matmul fp32 n=16" in roofline.format_table(table)


def test_plot_draws_rows_and_both_kinds_of_roof(table):
    ax = roofline.plot_roofline(table[0], quoted=roofline.A100_QUOTED)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("fp32 roof (measured)" in t for t in labels) and any("bf16 roof (quoted): 312,000" in t for t in labels)
    assert any("memory roof (quoted): 2,039 GB/s" in t for t in labels)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert roofline.plot_roofline(quoted=roofline.A100_QUOTED).get_title().startswith("NVIDIA A100")


def test_errors_say_what_to_do():
    with pytest.raises(ValueError, match="dtypes are"):
        roofline.roofline_table("cpu", sizes=(8,), dtypes=("fp8",))
    with pytest.raises(ValueError, match="positive matrix sizes"):
        roofline.roofline_table("cpu", sizes=(0, 8))
    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, "-m", "ampteach", "roofline", "--device", "cuda"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "use --device cpu" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "ampteach", "roofline", "--sizes", "8,x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--sizes must be comma-separated matrix sizes like 256,512,1024" in bad.stdout


def test_cpu_clock_needs_one_thread():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        table = roofline.roofline_table("cpu", sizes=(8, 16), dtypes=("fp32",), min_seconds=0.001, copy_mib=1,
                                        clock="cpu")
        assert table["settings"]["clock"] == "cpu" and all(r["gflops"] > 0 for r in table["rows"])
        assert "timed by CPU time" in roofline.format_table(table)
        torch.set_num_threads(2)
        with pytest.raises(ValueError, match="set_num_threads"):
            machine.best_seconds(lambda: None, clock="cpu")
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="'auto', 'wall' or 'cpu'"):
        machine.best_seconds(lambda: None, clock="gpu")
    assert machine.resolve_clock("auto", "cpu") == ("cpu" if torch.get_num_threads() == 1 else "wall")
    assert machine.resolve_clock("auto", "cuda") == "wall"
