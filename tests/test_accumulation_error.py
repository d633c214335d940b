"""ampteach.lab.accumulation_error: lesson 10's measurements, checked against direct computations.

running_sums must be the emulated sum of each prefix, computed on its own; error_vs_k the largest
relative error of each prefix product, computed on its own; closest_accumulator must find torch's
autocast matmul reproduced by fp32 accumulation and not by a bf16 one (torch's own kernel, so this
checks the measurement, with the margins the lesson's assert uses).
"""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure

from ampteach.amp.accumulator import emulated_matmul
from ampteach.lab.accumulation_error import (
    autocast_matmul,
    closest_accumulator,
    error_vs_k,
    max_relative_error,
    plot_error_vs_k,
    plot_running_sums,
    running_sums,
)

matplotlib.use("Agg")
E4M3 = torch.float8_e4m3fn


def test_running_sums_are_the_emulated_sums_of_each_prefix():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(300, generator=gen).half(), torch.rand(300, generator=gen).half()
    ks = [1, 2, 17, 128, 299, 300]
    for bits, rounding in ((11, "nearest"), (6, "truncate"), (53, "nearest")):
        got = running_sums(x, y, ks, acc_bits=bits, rounding=rounding)
        want = torch.cat([emulated_matmul(x[None, :k], y[:k, None], acc_bits=bits, rounding=rounding)[0] for k in ks])
        assert torch.equal(got, want)


def test_an_fp16_sum_of_ones_stops_at_2048():
    ones = torch.ones(4096, dtype=torch.float16)
    sums = running_sums(ones, ones, [1000, 2048, 2049, 4096], acc_bits=11)
    assert sums.tolist() == [1000.0, 2048.0, 2048.0, 2048.0]
    assert running_sums(ones, ones, [4096], acc_bits=24).item() == 4096.0


def test_running_sums_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="from 1 to len"):
        running_sums(torch.ones(4), torch.ones(4), [5], acc_bits=11)
    with pytest.raises(ValueError, match="vectors of one length"):
        running_sums(torch.ones(4), torch.ones(5), [1], acc_bits=11)


def test_error_vs_k_is_the_largest_relative_error_of_each_prefix_product():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.rand(8, 512, generator=gen).to(E4M3), torch.rand(512, 6, generator=gen).to(E4M3)
    ks = [16, 100, 512]
    settings = {"t": dict(acc_bits=9, rounding="truncate"), "p": dict(acc_bits=9, promote_every=32)}
    errors = error_vs_k(a, b, ks, settings)
    for label, kwargs in settings.items():
        for k, err in zip(ks, errors[label]):
            exact = a[:, :k].double() @ b[:k].double()             # exact: e4m3 products and sums fit float64
            c = emulated_matmul(a[:, :k], b[:k], **kwargs)
            assert err == ((c - exact).abs() / exact).max().item()
    assert errors["t"][-1] > errors["p"][-1] > 0


def test_max_relative_error_needs_nonzero_outputs():
    assert max_relative_error(torch.tensor([1.5, 2.0]), torch.tensor([1.0, 2.0])) == 0.5
    with pytest.raises(ValueError, match="undefined"):
        max_relative_error(torch.tensor([1.0]), torch.tensor([0.0]))


def test_torchs_autocast_bf16_matmul_is_reproduced_by_fp32_accumulation_not_bf16():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.rand(16, 1024, generator=gen), torch.rand(1024, 16, generator=gen)   # as in the lesson
    assert autocast_matmul(a, b).dtype == torch.bfloat16
    match = closest_accumulator(a, b, candidates=(8, 11, 24, 53))
    assert match[24] >= 0.95 and match[53] >= 0.95
    assert match[8] <= 0.05 and match[11] <= 0.5
    with pytest.raises(ValueError, match="autocast's half dtypes"):
        closest_accumulator(a, b, dtype=torch.float32)


def test_autocast_matmul_takes_a_device_and_answers_on_the_cpu():
    a, b = torch.rand(4, 8), torch.rand(8, 4)
    out = autocast_matmul(a, b, device=torch.device("cpu"))
    assert out.device.type == "cpu" and torch.equal(out, autocast_matmul(a, b))


def test_plots_return_their_figures():
    ks = [16, 64, 256]
    fig = plot_error_vs_k({"a": [1e-3, 2e-3, 4e-3], "b": [1e-4, 1.5e-4, 2e-4]}, ks, slopes={"a": 1, "b": 0.5},
                          claims={"claim": (256, 3e-3)}, styles={"b": {"ls": "--"}}, title="t")
    assert isinstance(fig, Figure) and len(fig.axes[0].lines) == 5
    fig = plot_running_sums(ks, {"fp16": torch.tensor([1.0, 2.0, 3.0])})
    assert isinstance(fig, Figure) and fig.axes[0].lines[0].get_ydata().tolist() == [1.0, 2.0, 3.0]
