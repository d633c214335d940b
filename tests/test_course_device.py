"""AMPTEACH_DEVICE, the one switch that moves the lessons onto a GPU: what each value gives, and the errors."""

from __future__ import annotations

import pytest
import torch

import ampteach
from ampteach.training.course_device import ENV, course_device, cpu_only, gpu_skips, on_gpu


@pytest.mark.parametrize("value", [None, "", "cpu", " CPU "])
def test_the_default_is_the_cpu_the_stored_outputs_ran_on(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    assert course_device() == torch.device("cpu") and not on_gpu()


def test_auto_takes_the_gpu_only_where_there_is_one(monkeypatch):
    monkeypatch.setenv(ENV, "auto")
    assert course_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert course_device() == torch.device("cuda")


def test_cuda_without_a_gpu_is_an_error_that_names_the_switch(monkeypatch):
    monkeypatch.setenv(ENV, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=f"{ENV}=cuda, but torch sees no GPU here.*unset {ENV}.*{ENV}=auto"):
        course_device()


def test_an_unknown_value_says_which_ones_exist(monkeypatch):
    monkeypatch.setenv(ENV, "gpu")
    with pytest.raises(ValueError, match="cpu .*cuda or auto"):
        course_device()


def test_cpu_claims_stay_on_the_cpu_and_say_so_on_a_gpu(monkeypatch, capsys):
    monkeypatch.setenv(ENV, "cpu")
    assert cpu_only("AVX512-BF16 is a CPU flag") == torch.device("cpu") and not gpu_skips("x")
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(ENV, "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_only("AVX512-BF16 is a CPU flag") == torch.device("cpu")
    assert gpu_skips("the CPU's fp16 matmul is slower than fp32")
    out = capsys.readouterr().out
    assert "runs on the CPU, also with AMPTEACH_DEVICE=cuda: AVX512-BF16 is a CPU flag" in out
    assert "Skipped on the GPU: the CPU's fp16 matmul is slower than fp32" in out


def test_it_is_public():
    assert ampteach.course_device is course_device
