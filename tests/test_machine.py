"""ampteach.training.machine: the line that names a timing's machine, and the file name of its tables."""

from __future__ import annotations

import re

import torch

from ampteach.training import machine


def fake_cpu(monkeypatch, name, flags):
    monkeypatch.setattr(machine, "cpu_info", lambda: (name, {f: f in flags for f in machine.CPU_HALF_FLAGS}))


def test_the_machine_line_names_the_cpu_its_native_half_and_threads(monkeypatch):
    fake_cpu(monkeypatch, "AMD EPYC 9R14 96-Core Processor", {"avx512_bf16"})
    line = machine.machine_line()
    assert line.startswith("AMD EPYC 9R14 96-Core Processor | native half: AVX512-BF16 | ")
    assert f"{torch.get_num_threads()} thread" in line and torch.__version__ in line
    fake_cpu(monkeypatch, "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", set())
    assert "native half: none (AVX2 or older)" in machine.machine_line()


def test_the_machine_tag_is_a_file_name_from_the_cpu_and_its_best_half_support(monkeypatch):
    fake_cpu(monkeypatch, "AMD EPYC 9R14 96-Core Processor", {"avx512_bf16"})
    assert machine.machine_tag("cpu") == "cpu-amd-epyc-9r14-avx512-bf16"
    fake_cpu(monkeypatch, "Intel(R) Xeon(R) Platinum 8488C", {"avx512_bf16", "amx_bf16", "avx512_fp16"})
    assert machine.machine_tag("cpu") == "cpu-intel-xeon-platinum-amx-bf16"
    fake_cpu(monkeypatch, "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz", set())
    assert machine.machine_tag("cpu") == "cpu-intel-i7-8650u-no-native-half"


def test_the_machine_tag_of_a_gpu_is_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(machine, "cuda_info", lambda: {"name": "NVIDIA H100 80GB HBM3"})
    assert machine.machine_tag("cuda") == "cuda-nvidia-h100-80gb-hbm3"


def test_this_machines_tag_is_a_plain_file_name():
    assert re.fullmatch(r"cpu-[a-z0-9]+(-[a-z0-9]+)*", machine.machine_tag("cpu"))
