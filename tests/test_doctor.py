"""`ampteach doctor`: the facts it gathers, the precision it recommends, and the command itself."""

from __future__ import annotations

import platform
import subprocess
import sys

import torch

from ampteach import doctor


def test_report_holds_the_machine_facts():
    report = doctor.collect(probe=False)
    text = doctor.format_report(report)
    assert report.torch == torch.__version__ and torch.__version__ in text
    assert platform.python_version() in text
    assert f"{torch.get_num_threads()} torch threads" in text
    assert "AVX512-BF16" in text or "unknown on this OS" in text
    assert "Recommended" in text and report.recommendation in text
    if not torch.cuda.is_available():
        assert report.cuda is None and "GPU            none" in text


def test_dataset_is_found_where_the_loader_looks(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTEACH_DATA", str(tmp_path))
    report = doctor.collect(probe=False)
    assert not report.dataset_found and str(tmp_path) in doctor.format_report(report)
    assert "AMPTEACH_DATA" in doctor.format_report(report)


def test_cpu_flags_are_read_from_proc_cpuinfo():
    name, flags = doctor.cpu_info()
    if flags is None:  # not Linux
        return
    text = open("/proc/cpuinfo").read().split()
    for flag, present in flags.items():
        assert present == (flag in text)


GPU = dict(name="Test GPU", capability="8.0", tensor_cores=True, bf16=True)


def test_recommendation_on_gpus():
    assert doctor.recommend(GPU, None, {})[0] == "bf16 autocast"
    volta = dict(GPU, capability="7.0", bf16=False)
    assert doctor.recommend(volta, None, {})[0] == "fp16 autocast + GradScaler"
    pascal = dict(GPU, capability="6.1", tensor_cores=False, bf16=False)
    precision, why = doctor.recommend(pascal, None, {})
    assert precision == "fp32" and "no tensor cores" in why


def test_recommendation_on_cpus_follows_the_measurement_then_the_flags():
    avx2 = {"avx512_bf16": False, "amx_bf16": False}
    precision, why = doctor.recommend(None, avx2, {"cpu": {"bf16": 0.4, "fp16": 0.05}})
    assert precision == "fp32"
    assert "bf16 autocast on this CPU is slower than fp32" in why and "no native bf16" in why
    assert "20x slower" in why  # 1 / 0.05, the fp16 note
    amx = {"avx512_bf16": True, "amx_bf16": True}
    precision, why = doctor.recommend(None, amx, {"cpu": {"bf16": 3.0, "fp16": 1.0}})
    assert precision == "bf16 autocast" and "AMX-BF16" in why and "3.0x" in why
    assert doctor.recommend(None, amx, {})[0] == "bf16 autocast"  # no probe: the flags decide
    assert doctor.recommend(None, avx2, {})[0] == "fp32"


def test_probe_measures_a_positive_ratio():
    ratio = doctor.matmul_speedup("cpu", torch.bfloat16, n=64, min_seconds=0.01)
    assert ratio > 0


def test_command_line_entry_points():
    for cmd in (["ampteach", "doctor", "--no-probe"], [sys.executable, "-m", "ampteach", "doctor", "--no-probe"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "torch          " + torch.__version__ in out.stdout and "Recommended" in out.stdout
    usage = subprocess.run([sys.executable, "-m", "ampteach"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "doctor" in usage.stdout
