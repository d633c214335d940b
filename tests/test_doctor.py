"""`ampteach doctor`: the facts it gathers, the precision it recommends, and the command itself."""

from __future__ import annotations

import platform
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from ampteach.tools import bench, doctor
from ampteach.training import machine


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
    assert report.onednn_half == {"bf16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                                  "fp16": torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    assert f"oneDNN half  bf16 {'yes' if report.onednn_half['bf16'] else 'no'}" in text


def test_dataset_is_found_where_the_loader_looks(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTEACH_DATA", str(tmp_path))
    report = doctor.collect(probe=False)
    assert not report.dataset_found and str(tmp_path) in doctor.format_report(report)
    assert "AMPTEACH_DATA" in doctor.format_report(report)


def test_without_ampteach_data_the_doctor_names_the_bundled_split(monkeypatch, tmp_path):
    from ampteach.training import data

    monkeypatch.delenv("AMPTEACH_DATA", raising=False)
    monkeypatch.setattr(data, "cache_root", lambda: tmp_path / "empty-cache")
    report = doctor.collect(probe=False)
    assert report.dataset_found and report.dataset_source == "bundled" and report.dataset_counts == (7000, 1226)
    assert data.SOURCES["bundled"] in doctor.format_report(report)


def test_cpu_flags_are_read_from_proc_cpuinfo():
    name, flags = machine.cpu_info()
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


def fake_gpu(monkeypatch, name: str, major: int, minor: int) -> None:
    """torch.cuda as a machine with this GPU shows it. is_bf16_supported() keeps torch's default of counting
    emulation: True on every CUDA GPU since compute capability 5.3, unless including_emulation=False."""
    props = SimpleNamespace(name=name, major=major, minor=minor, total_memory=16 * 2**30)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: major >= 8 or including_emulation)
    monkeypatch.setattr(torch.version, "hip", None)


def fake_probe(cuda_speedup: dict[str, float]):
    """doctor.matmul_speedup without a GPU: the given CUDA ratios, and a slow-bf16 CPU."""
    def speedup(device, dtype, n=512, rounds=doctor.PROBE_ROUNDS, min_seconds=0.02):
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        return cuda_speedup[name] if device == "cuda" else 0.5
    return speedup


def test_a_cc_7_5_gpu_is_not_told_to_use_bf16(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 7, 5)
    assert torch.cuda.is_bf16_supported()  # torch's default counts the emulated bf16: the trap
    report = doctor.collect(probe=False)
    assert report.cuda["bf16"] is False and report.cuda["tensor_cores"] is True
    assert report.recommendation == "fp16 autocast + GradScaler"
    assert "compute capability 8.0" in report.reason and not report.fast_bf16("cuda")
    text = doctor.format_report(report)
    assert "Tesla T4, compute capability 7.5" in text and "bf16         no" in text
    # with the probe: bf16 is not even measured on the GPU, fp16's measured speed is in the reason
    monkeypatch.setattr(doctor, "matmul_speedup", fake_probe({"fp16": 5.0, "bf16": 0.8}))
    report = doctor.collect(probe=True)
    assert set(report.probe["cuda"]) == {"fp16"}
    assert report.recommendation == "fp16 autocast + GradScaler" and "5.0x" in report.reason
    assert bench.supported_configs(torch.device("cuda"), bench.CONFIGS) == ("fp32", "fp16")


def test_a_cc_8_0_gpu_is_told_to_use_bf16(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", 8, 0)
    report = doctor.collect(probe=False)
    assert report.cuda["bf16"] is True and report.recommendation == "bf16 autocast"
    assert report.fast_bf16("cuda")
    monkeypatch.setattr(doctor, "matmul_speedup", fake_probe({"fp16": 12.0, "bf16": 11.5}))
    report = doctor.collect(probe=True)
    assert report.probe["cuda"] == {"fp16": 12.0, "bf16": 11.5}
    assert report.recommendation == "bf16 autocast" and "11.5x" in report.reason and report.fast_bf16("cuda")
    assert bench.supported_configs(torch.device("cuda"), bench.CONFIGS) == bench.CONFIGS


def test_the_gpu_recommendation_follows_the_probe():
    ampere = dict(GPU, name="Test GPU", capability="8.6")
    precision, why = doctor.recommend(ampere, None, {"cuda": {"fp16": 3.0, "bf16": 0.9}})
    assert precision == "fp16 autocast + GradScaler" and "0.90x" in why  # bf16 measured slow: do not recommend it
    precision, why = doctor.recommend(ampere, None, {"cuda": {"fp16": 1.0, "bf16": 1.0}})
    assert precision == "fp32" and "no half-precision speed-up" in why


@pytest.mark.parametrize("flags, bf16, fast", [
    ({"amx_bf16": True}, 3.0, True), ({"amx_bf16": True}, 0.9, False), ({"avx512_bf16": True}, None, True),
    ({}, 0.07, False), ({}, None, False)])
def test_fast_bf16_needs_the_hardware_and_the_measurement(flags, bf16, fast):
    report = doctor.collect(probe=False)
    report.cpu_flags = {f: flags.get(f, False) for f in machine.CPU_HALF_FLAGS}
    report.probe = {"cpu": {"bf16": bf16}} if bf16 is not None else {}
    assert report.fast_bf16("cpu") is fast


def probes(*ratios):
    """A fake matmul_speedup returning these bf16 ratios in turn (fp16 always 0.5), counting its bf16 calls."""
    calls = []

    def speedup(device, dtype, n=512, rounds=doctor.PROBE_ROUNDS, min_seconds=0.02):
        if dtype == torch.float16:
            return 0.5
        calls.append(dtype)
        return ratios[min(len(calls), len(ratios)) - 1]
    return speedup, calls


def native_bf16_cpu(monkeypatch):
    monkeypatch.setattr(doctor, "cuda_info", lambda: None)
    flags = {f: f == "avx512_bf16" for f in machine.CPU_HALF_FLAGS}
    monkeypatch.setattr(doctor, "cpu_info", lambda: ("Test CPU", flags))
    monkeypatch.setattr(doctor, "onednn_half", lambda: {"bf16": True, "fp16": False})


def test_a_probe_that_contradicts_the_hardware_is_retried_then_called_busy(monkeypatch):
    native_bf16_cpu(monkeypatch)
    speedup, calls = probes(0.16, 0.2, 0.1)            # the generic loop's speed on a CPU with native bf16, thrice
    monkeypatch.setattr(doctor, "matmul_speedup", speedup)
    report = doctor.collect(probe=True)
    assert len(calls) == doctor.PROBE_TRIES and report.busy
    assert report.recommendation == doctor.BUSY and "Rerun" in report.reason and "0.20x" in report.reason
    assert report.fast_bf16("cpu")                     # the hardware decides what lessons condition on
    assert "looks busy" in doctor.format_report(report)


def test_a_retry_that_agrees_with_the_hardware_gives_a_verdict(monkeypatch):
    native_bf16_cpu(monkeypatch)
    speedup, calls = probes(0.16, 4.3)                 # busy once, then the cores were free
    monkeypatch.setattr(doctor, "matmul_speedup", speedup)
    report = doctor.collect(probe=True)
    assert len(calls) == 2 and not report.busy
    assert report.recommendation == "bf16 autocast" and "4.3x" in report.reason


def test_native_bf16_slower_than_fp32_is_a_finding_not_a_busy_machine(monkeypatch):
    native_bf16_cpu(monkeypatch)                       # AVX512-BF16 without AMX: about half fp32's speed
    speedup, calls = probes(0.5)
    monkeypatch.setattr(doctor, "matmul_speedup", speedup)
    report = doctor.collect(probe=True)
    assert len(calls) == 1 and not report.busy and not report.fast_bf16("cpu")
    assert report.recommendation == "fp32" and "0.50x" in report.reason and "AMX" in report.reason


def test_the_cpu_probe_runs_on_one_thread_and_gives_the_threads_back(monkeypatch):
    from ampteach.lab import roofline

    seen = []
    def timed(n, dtype, device, min_seconds, clock):
        seen.append((torch.get_num_threads(), clock))
        return 1.0

    monkeypatch.setattr(roofline, "matmul_seconds", timed)
    threads = torch.get_num_threads()
    doctor.matmul_speedup("cpu", torch.bfloat16, rounds=2)
    assert seen == [(1, "cpu")] * 4 and torch.get_num_threads() == threads


def test_no_native_bf16_is_never_called_busy(monkeypatch):
    monkeypatch.setattr(doctor, "cuda_info", lambda: None)
    monkeypatch.setattr(doctor, "cpu_info", lambda: ("Test CPU", {f: False for f in machine.CPU_HALF_FLAGS}))
    speedup, calls = probes(0.03)
    monkeypatch.setattr(doctor, "matmul_speedup", speedup)
    report = doctor.collect(probe=True)
    assert len(calls) == 1 and not report.busy and report.recommendation == "fp32"


def test_probe_keeps_each_formats_fastest_round(monkeypatch):
    times = {torch.float32: iter([0.9, 0.1, 0.5]), torch.bfloat16: iter([0.05, 0.4, 0.5])}
    from ampteach.lab import roofline

    monkeypatch.setattr(roofline, "matmul_seconds", lambda n, dtype, device, min_seconds, clock: next(times[dtype]))
    assert doctor.matmul_speedup("cpu", torch.bfloat16, rounds=3) == pytest.approx(0.1 / 0.05)


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
