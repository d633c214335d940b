"""ampteach.lab.memory against byte counts worked out by hand from shapes and dtype sizes."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import ampteach
from ampteach.lab.memory import (
    CATEGORIES,
    PeakMemory,
    measure_peak,
    measure_step,
    memory_breakdown,
    memory_table,
    plot_memory,
)
from ampteach.training.train import TrainConfig, prepare, train_step

FP32, FP16, INT64 = (torch.empty(0, dtype=d).element_size() for d in (torch.float32, torch.float16, torch.int64))
HIDDEN = 32
MLP_SHAPES = [(HIDDEN, 28 * 28), (HIDDEN,), (10, HIDDEN), (10,)]    # ampteach.mlp((32,)): weight, bias, weight, bias


def numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


N = sum(numel(s) for s in MLP_SHAPES)
ADAMW_STATE = 2 * FP32 * N + FP32 * len(MLP_SHAPES)    # exp_avg + exp_avg_sq per value, a float32 step per tensor


def batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 28, 28, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def after_one_step(config: TrainConfig, model: nn.Module | None = None):
    torch.manual_seed(0)
    model = model or ampteach.mlp((HIDDEN,))
    master, opt, scaler = prepare(model, config)
    x, y = batch()
    train_step(model, x, y, opt, scaler, config, master=master)
    return model, master, opt


@pytest.mark.parametrize("precision", ["fp32", "fp16"])   # fp16 here is O1: autocast, fp32 weights
def test_fp32_weights_with_adamw_hold_4_plus_4_plus_8_bytes_per_parameter(precision):
    model, master, opt = after_one_step(TrainConfig(precision=precision, optimizer="adamw"))
    b = memory_breakdown(model, opt, master)
    assert b.n_params == N
    assert b.totals == {"weights": FP32 * N, "grads": FP32 * N, "master": 0, "master_grads": 0,
                        "compensation": 0, "optimizer": ADAMW_STATE}
    assert b.buffers == 0 and b.total == sum(b.totals.values())
    assert b.per_param["weights"] == b.per_param["grads"] == 4.0


def test_o2_holds_half_weights_and_grads_plus_fp32_master_and_its_grads():
    model, master, opt = after_one_step(TrainConfig(precision="fp16", recipe="master", optimizer="adamw"))
    b = memory_breakdown(model, opt, master)
    assert b.totals == {"weights": FP16 * N, "grads": FP16 * N, "master": FP32 * N, "master_grads": FP32 * N,
                        "compensation": 0, "optimizer": ADAMW_STATE}
    assert {c: round(v, 2) for c, v in b.per_param.items() if c != "optimizer"} == \
        {"weights": 2.0, "grads": 2.0, "master": 4.0, "master_grads": 4.0, "compensation": 0.0}


def test_fp32_norm_parameters_are_their_own_master_and_count_once():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    model, master, opt = after_one_step(TrainConfig(precision="fp16", recipe="master", optimizer="sgd"), model)
    half_shapes = [(4, 1, 3, 3), (10, 4 * 26 * 26), (10,)]
    fp32_shapes = [(4,), (4,)]                                      # BatchNorm weight and bias, kept fp32
    n_half, n_fp32 = sum(map(numel, half_shapes)), sum(map(numel, fp32_shapes))
    b = memory_breakdown(model, opt, master)
    assert b.totals == {
        "weights": FP16 * n_half + FP32 * n_fp32,
        "grads": FP16 * n_half + FP32 * n_fp32,
        "master": FP32 * n_half,                                    # none for the fp32 BatchNorm parameters
        "master_grads": FP32 * n_half,
        "compensation": 0,
        "optimizer": FP32 * (n_half + n_fp32),                      # SGD momentum buffer
    }
    assert b.by_param["1.weight"] == {"weights": 16, "grads": 16, "master": 0, "master_grads": 0, "compensation": 0,
                                      "optimizer": 16}
    assert b.buffers == 2 * FP32 * 4 + INT64                        # running mean, var; num_batches_tracked


def test_only_tensors_that_exist_are_counted():
    model = ampteach.mlp((HIDDEN,))
    assert memory_breakdown(model).totals == {"weights": FP32 * N, "grads": 0, "master": 0, "master_grads": 0,
                                              "compensation": 0, "optimizer": 0}
    model, master, opt = after_one_step(TrainConfig(optimizer="sgd", momentum=0.0))
    assert memory_breakdown(model, opt).totals["optimizer"] == 0   # plain SGD keeps no state


def test_a_storage_shared_by_two_parameters_counts_once():
    flat = torch.zeros(30)
    model = nn.Module()
    model.a = nn.Parameter(flat[:10])
    model.b = nn.Parameter(flat[10:])
    b = memory_breakdown(model)
    assert b.totals["weights"] == FP32 * 30
    assert b.by_param["a"]["weights"] == FP32 * 30 and b.by_param["b"]["weights"] == 0


def test_measure_step_counts_the_activations_saved_for_backward_but_not_the_parameters():
    n, d_in, d_out = 8, 20, 5
    model = nn.Linear(d_in, d_out)
    x = torch.randn(n, d_in, requires_grad=True)                    # so addmm also saves the weight: excluded

    def step():
        (model(x) ** 2).sum().backward()                            # addmm saves x; pow saves its input

    used = measure_step(step, model)
    assert used.saved == FP32 * (n * d_in + n * d_out)
    assert used.cuda_peak is None and used.cuda_before is None
    assert used.tensors == [((n, d_in), torch.float32, FP32 * n * d_in), ((n, d_out), torch.float32, FP32 * n * d_out)]


def test_measure_step_lists_the_half_weight_copy_autocast_saves():
    """Under autocast a linear whose input needs a gradient saves its weight's half copy, which counts."""
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    x = torch.randn(5, 6)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()

    used = measure_step(step, model)
    weights = [(dtype, nbytes) for shape, dtype, nbytes in used.tensors if sorted(shape) in ([3, 4], [4, 6])]
    assert weights == [(torch.bfloat16, 3 * 4 * 2)]  # the second layer's cast weight (transposed), not the first's

    assert used.saved == sum(nbytes for *_, nbytes in used.tensors)


def test_half_activations_take_half_the_bytes():
    saved = {}
    for label, config in {"fp32": TrainConfig(), "O2": TrainConfig(precision="fp16", recipe="master")}.items():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, HIDDEN))
        master, opt, scaler = prepare(model, config)
        x, y = batch(n=4)
        step = functools.partial(train_step, model, x, y, opt, scaler, config, master=master)
        saved[label] = measure_step(step, model).saved
    # Saved: the input (fp32, or its half copy), then the fp32 log-softmax output, the int64 targets
    # and cross_entropy's 0-d fp32 total weight; O2's GradScaler adds its 0-d fp32 scale (loss * S).
    tail = FP32 * 4 * HIDDEN + INT64 * 4 + FP32
    assert saved["fp32"] == FP32 * 4 * 28 * 28 + tail
    assert saved["O2"] == FP16 * 4 * 28 * 28 + tail + FP32


def test_measure_step_reads_the_cuda_peak_around_the_step(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: calls.append("before") or 100)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: calls.append("peak") or 250)
    used = measure_step(lambda: calls.append("step"), nn.Linear(2, 2), device="cuda")
    assert calls == ["sync", "reset", "before", "step", "sync", "peak"]
    assert (used.cuda_before, used.cuda_peak) == (100, 250)


def test_memory_table_prints_bytes_per_parameter_and_the_optional_columns():
    runs = {"fp32": TrainConfig(), "O2": TrainConfig(precision="fp16", recipe="master")}
    breakdowns = {}
    for label, config in runs.items():
        model, master, opt = after_one_step(config)
        breakdowns[label] = memory_breakdown(model, opt, master)
    lines = memory_table(breakdowns).splitlines()
    assert lines[0].split() == [*CATEGORIES, "total"]
    per = breakdowns["O2"].per_param
    assert lines[2].split() == ["O2", *(f"{per[c]:.2f}" for c in CATEGORIES), f"{sum(per.values()):.2f}"]
    steps = {"fp32": ampteach.lab.memory.StepMemory(saved=800), "O2": ampteach.lab.memory.StepMemory(800, 0, 3 * 2**20)}
    lines = memory_table(breakdowns, steps, batch_size=8).splitlines()
    assert lines[0].split()[-4:] == ["saved/sample", "CUDA", "peak", "MiB"]
    assert lines[1].split()[-2:] == ["100", "-"] and lines[2].split()[-2:] == ["100", "3.0"]


def test_measure_peak_adds_what_the_step_allocates_and_subtracts_what_it_frees():
    model = nn.Linear(10, 10, bias=False)                          # steady: 400 bytes of weights

    def step():
        a = torch.empty(1000)                                      # + 4000
        b = torch.empty(500)                                       # + 2000
        del a                                                      # - 4000, as soon as it is freed
        c = torch.empty(3000)                                      # + 12000: the high point
        return b, c

    peak = measure_peak(step, model)
    assert peak.steady == FP32 * 100
    assert peak.timeline == [("forward", 400 + 4000), ("forward", 400 + 6000), ("forward", 400 + 2000 + 12000)]
    assert (peak.peak, peak.peak_phase) == (400 + 14000, "forward")


def test_measure_peak_counts_the_steady_tensors_a_step_frees():
    model = nn.Linear(10, 10, bias=False)
    model.weight.grad = torch.ones(10, 10)                         # steady: weights + last step's grad

    def step():
        model.weight.grad = None                                   # zero_grad(set_to_none=True)
        torch.empty(50)

    peak = measure_peak(step, model)
    assert peak.steady == 800 and peak.timeline == [("forward", 800 - 400 + 200)] and peak.peak == 800


def test_measure_peak_names_the_phase_of_every_op():
    model = nn.Linear(10, 10)
    x = torch.randn(4, 10)                                         # made before the step: not counted

    def step():
        model(x).sum().backward()
        with torch.no_grad():
            model.weight.sub_(model.weight.grad)

    phases = [phase for phase, _ in measure_peak(step, model).timeline]
    first_backward, first_optimizer = phases.index("backward"), phases.index("optimizer")
    assert set(phases[:first_backward]) == {"forward"}
    assert set(phases[first_backward:first_optimizer]) == {"backward"}
    assert set(phases[first_optimizer:]) == {"optimizer"}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_training_step_peaks_above_its_steady_state_by_what_only_lives_inside_the_step(precision):
    config = TrainConfig(precision=precision, optimizer="adamw")
    model, master, opt = after_one_step(config)
    scaler = prepare(model, config, optimizer=opt, master=master).scaler
    x, y = batch()
    step = lambda: train_step(model, x, y, opt, scaler, config, master=master)  # noqa: E731
    saved = measure_step(step, model).saved
    peak = measure_peak(step, model, opt, master)
    assert peak.steady == memory_breakdown(model, opt, master).total == (16 * N + FP32 * len(MLP_SHAPES))
    forward_high = max(b for phase, b in peak.timeline if phase == "forward")
    input_saved = FP32 * x.numel() if precision == "fp32" else 0   # fp32 saves x itself: made before the step
    assert forward_high >= peak.steady + saved - input_saved       # the activations kept for backward
    if precision == "fp16":                                        # O1: autocast's half copies of the weights
        weights = numel(MLP_SHAPES[0]) + numel(MLP_SHAPES[2])
        assert forward_high >= peak.steady + FP16 * weights
    assert peak.peak >= forward_high and peak.per_param[0] == peak.steady / N


def test_plot_memory_stacks_the_categories_and_marks_each_peak():
    model, master, opt = after_one_step(TrainConfig(optimizer="adamw"))
    breakdown = memory_breakdown(model, opt, master)
    peak = PeakMemory(steady=breakdown.total, peak=2 * breakdown.total, peak_phase="optimizer",
                      timeline=[("forward", 10), ("backward", 20), ("optimizer", 30)], n_params=N)
    fig = plot_memory({"fp32": breakdown}, {"fp32": peak})
    bars, line = fig.axes
    heights = [patch.get_height() for patch in bars.patches]
    assert heights == [v for v in breakdown.per_param.values() if v]          # one bar segment per held category
    assert list(bars.lines[0].get_ydata()) == [peak.per_param[1]]
    solid, dotted = line.lines
    assert list(solid.get_ydata()) == [10 / N, 20 / N] and list(dotted.get_ydata()) == [20 / N, 30 / N]
