"""`ampteach bench`, the E.6.1 harness: its JSON rows, its memory measure in plain words, its one-line
conclusion, its progress bars (none when the output is not a terminal) and its errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from ampteach import mlp
from ampteach.tools import bench

ROW_KEYS = {"impl", "config", "samples_per_s", "peak_mem_bytes", "accuracy", "speedup_vs_fp32", "mem_measure"}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "result.json"
    cmd = [sys.executable, "-m", "ampteach", "bench", "--device", "cpu", "--epochs", "1", "--model", "mlp:64,32",
           "--batch-size", "500", "--warmup-steps", "2", "--repeat", "2", "--out", str(out)]   # bars left to it
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), run.stdout, run.stderr


def test_json_has_a_row_per_impl_and_config_and_the_device(result):
    data, stdout, _ = result
    assert data["device"]["type"] == "cpu" and data["device"]["torch"] == torch.__version__
    assert {(r["impl"], r["config"]) for r in data["rows"]} == {(i, c) for i in bench.IMPLS for c in bench.CONFIGS}
    for row in data["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["samples_per_s"] > 0 and math.isfinite(row["samples_per_s"])
        assert 0 <= row["accuracy"] <= 100 and row["peak_mem_bytes"] > 0
    assert data["settings"]["model"] == "mlp:64,32" and data["settings"]["train_images"] == 7000
    assert data["settings"]["repeat"] == 2 and "best of 2 runs" in stdout
    assert "samples/s" in stdout and "ampteach / torch" in stdout


def test_rows_are_consistent(result):
    rows = {(r["impl"], r["config"]): r for r in result[0]["rows"]}
    for row in rows.values():
        assert row["activation_bytes"] + row["weight_copy_bytes"] == row["peak_mem_bytes"]
    for impl in bench.IMPLS:
        fp32 = rows[(impl, "fp32")]
        assert fp32["speedup_vs_fp32"] == 1.0
        for config in ("fp16", "bf16"):
            row = rows[(impl, config)]
            assert row["speedup_vs_fp32"] == pytest.approx(row["samples_per_s"] / fp32["samples_per_s"])
            assert row["peak_mem_bytes"] < fp32["peak_mem_bytes"]  # half-precision activations
            assert abs(row["accuracy"] - fp32["accuracy"]) < 3.0
        assert fp32["accuracy"] > 60  # one epoch learns something: not chance (10%)
    # fp32 runs no autocast at all, so both implementations compute the same thing
    assert rows[("torch", "fp32")]["accuracy"] == rows[("ampteach", "fp32")]["accuracy"]


def test_no_progress_bars_when_the_output_is_not_a_terminal(result):
    _, stdout, stderr = result
    assert "step/s" not in stderr + stdout and "%|" not in stderr + stdout, stderr[-500:]


def test_the_table_ends_with_memory_in_plain_words_and_a_one_line_conclusion(result):
    data, stdout, _ = result
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("memory: what one training batch"))
    memory = " ".join(line.strip() for line in lines[start:])
    assert "saved_for_backward" not in stdout and "parameters excluded" not in stdout
    rows = {(r["impl"], r["config"]): r for r in data["rows"]}
    bf16, fp32 = rows[("torch", "bf16")], rows[("torch", "fp32")]
    assert f"bf16: {bf16['peak_mem_bytes'] / 2**20:.2f} MB = {bf16['activation_bytes'] / 2**20:.2f} MB of activations" \
        in memory
    assert "Why not half: autocast casts each weight to 16 bits" in memory
    conclusions = [line for line in lines if line.startswith("conclusion: ")]
    tail = lines[lines.index(conclusions[0]):]                    # the last line, wrapped, then `wrote F.json`
    assert len(conclusions) == 1 and all(line.startswith(("  ", "wrote ")) for line in tail[1:])
    speed = bf16["samples_per_s"] / fp32["samples_per_s"]
    assert f"bf16 {speed:.2f}x" in " ".join(tail)


def test_the_conclusion_follows_the_numbers():
    def table(bf16_speed, bf16_acc):
        rows = [{"impl": "torch", "config": "fp32", "samples_per_s": 100.0, "accuracy": 80.0},
                {"impl": "torch", "config": "bf16", "samples_per_s": 100.0 * bf16_speed, "accuracy": bf16_acc}]
        return {"rows": rows}

    assert "train in bf16 here" in bench.conclusion(table(1.6, 79.8))
    assert "stay in fp32 here" in bench.conclusion(table(0.3, 80.0))
    assert "no speed to gain" in bench.conclusion(table(1.0, 80.0))
    assert "train in bf16" not in bench.conclusion(table(1.6, 70.0))         # faster, but it learns less


def test_the_split_counts_autocasts_weight_copies_apart_from_activations():
    torch.manual_seed(0)
    model = mlp((8, 6))           # 784-8-6-10: the 2nd and 3rd matmuls keep a weight for their input's gradient
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    fp32 = bench.saved_for_backward(model, x, y, "fp32")
    assert fp32["weight_copies"] == 0                                        # fp32 keeps the weights themselves
    bf16 = bench.saved_for_backward(model, x, y, "bf16")
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert bf16["weight_copies"] == sum(m.weight.numel() * 2 for m in linears[1:])   # bf16: 2 bytes each
    assert sum(bf16.values()) == bench.saved_activation_bytes(model, x, y, "bf16")


def test_cpu_memory_measure_counts_saved_activations_not_parameters():
    torch.manual_seed(0)
    model = mlp((8,))
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    fp32 = bench.saved_activation_bytes(model, x, y, "fp32")
    # at least: the input (saved by the first matmul), the ReLU output, log_softmax's output
    known = x.numel() * 4 + 4 * 8 * 4 + 4 * 10 * 4
    assert known <= fp32 <= known + 64  # plus the int64 targets and a scalar for nll_loss
    wide = mlp((4096,))  # 250x the parameters, same activations per sample up to the hidden width
    assert bench.saved_activation_bytes(wide, x, y, "fp32") < x.numel() * 4 + 4 * 4096 * 4 * 2 + 1024
    bf16 = bench.saved_activation_bytes(model, x, y, "bf16")
    assert bf16 < fp32 * 0.6  # the input cast to bf16 is saved instead of the fp32 input


def test_errors_say_what_to_do():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="use --device cpu"):
            bench.resolve_device("cuda")
        run = subprocess.run([sys.executable, "-m", "ampteach", "bench", "--device", "cuda"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "torch.cuda.is_available() is False" in run.stdout
    with pytest.raises(ValueError, match="mlp:4096"):
        bench.build_model("resnet50")
    short = bench.run_bench("cpu", epochs=1, batch_size=1000, model="mlp:8", configs=("fp32",), impls=("torch",),
                            warmup_steps=50, progress=False)
    assert short["settings"]["warmup_steps"] == 3 and math.isfinite(short["rows"][0]["samples_per_s"])
    with pytest.raises(ValueError, match="unknown configs"):
        bench.run_bench("cpu", configs=("fp8",))


def test_width_sets_the_course_mlp_and_keeps_the_rows(tmp_path):
    out = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "ampteach", "bench", "--device", "cpu", "--width", "24", "--epochs", "1",
           "--batch-size", "1000", "--warmup-steps", "2", "--configs", "fp32,bf16", "--impls", "torch",
           "--no-progress", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert data["settings"]["model"] == "mlp:24,24" and "model mlp:24,24" in run.stdout
    assert [(r["impl"], r["config"]) for r in data["rows"]] == [("torch", "fp32"), ("torch", "bf16")]
    assert all(ROW_KEYS <= set(r) for r in data["rows"])
    widths = [m.out_features for m in bench.build_model(bench.width_model(24)) if isinstance(m, torch.nn.Linear)]
    assert widths == [24, 24, 10]  # 784-W-W-10
    both = subprocess.run([sys.executable, "-m", "ampteach", "bench", "--width", "8", "--model", "mlp:8"],
                          capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    with pytest.raises(ValueError, match="positive hidden width"):
        bench.width_model(0)
