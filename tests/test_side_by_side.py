"""ampteach.lab.side_by_side: the pairs the lessons run, one starting model, and bit-for-bit comparison."""

from __future__ import annotations

import math

import pytest
import torch

import ampteach
from ampteach.amp import autocast_kernels
from ampteach.lab.compare_torch import TorchAutocast
from ampteach.lab.side_by_side import (
    CUSTOM_FUNCTIONS,
    IMPLEMENTATIONS,
    first_difference,
    fresh_mlp,
    same_state,
    same_weights,
)


def test_the_pairs_are_torchs_and_ampteachs():
    assert IMPLEMENTATIONS["torch.amp"] == (TorchAutocast, torch.amp.GradScaler)
    assert IMPLEMENTATIONS["ampteach"] == (ampteach.autocast, ampteach.GradScaler)
    assert CUSTOM_FUNCTIONS["torch.amp"][1:] == (torch.amp.custom_fwd, torch.amp.custom_bwd)
    assert CUSTOM_FUNCTIONS["ampteach"][1:] == (ampteach.custom_fwd, ampteach.custom_bwd)
    assert CUSTOM_FUNCTIONS["torch.amp"][0] is TorchAutocast and TorchAutocast.__mro__[1] is torch.autocast


def test_torchs_side_runs_torchs_own_kernels_and_ampteachs_side_its_own():
    """After an ampteach region the kernels stay; the torch side of a comparison must not run them."""
    x = torch.rand(4, 4)
    served = []
    for impl, (autocast, _) in [*IMPLEMENTATIONS.items(), *IMPLEMENTATIONS.items()]:
        with autocast("cpu", dtype=torch.bfloat16):
            served.append((impl, autocast_kernels.installed(), (x @ x).dtype))
    assert served == [("torch.amp", False, torch.bfloat16), ("ampteach", True, torch.bfloat16)] * 2


def test_fresh_mlp_is_built_on_the_device_asked_for_with_the_cpus_weights():
    meta = fresh_mlp(seed=3, device="meta")                  # a device other than the CPU, without a GPU
    assert {p.device.type for p in meta.parameters()} == {"meta"}
    assert [p.shape for p in meta.parameters()] == [p.shape for p in fresh_mlp(seed=3).parameters()]
    assert same_weights(fresh_mlp(seed=3, device=torch.device("cpu")), fresh_mlp(seed=3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fresh_mlp_on_a_gpu_holds_the_cpus_weights():
    assert same_weights(fresh_mlp(seed=3, device="cuda").cpu(), fresh_mlp(seed=3))


def test_fresh_mlp_repeats_its_weights_per_seed():
    assert same_weights(fresh_mlp(seed=3), fresh_mlp(seed=3))
    assert not same_weights(fresh_mlp(seed=3), fresh_mlp(seed=4))
    assert not same_weights(fresh_mlp((8,)), fresh_mlp((16,)))


def test_same_weights_sees_one_ulp_and_a_dtype():
    a, b = fresh_mlp(), fresh_mlp()
    with torch.no_grad():
        w = b[1].weight.view(-1)
        w[0] = torch.nextafter(w[0], torch.tensor(math.inf))
    assert not same_weights(a, b)
    assert not same_weights(fresh_mlp(), fresh_mlp().double())


def test_first_difference_names_where():
    base = {"model": {"w": torch.ones(2)}, "scaler": {"scale": 2.0}, "history": [1.0, math.nan], "step": 3}
    same = {"model": {"w": torch.ones(2)}, "scaler": {"scale": 2.0}, "history": [1.0, math.nan], "step": 3}
    assert first_difference(base, same) is None and same_state(base, same)
    cases = {
        "state['model']['w']: tensors differ": {**same, "model": {"w": torch.tensor([1.0, 2.0])}},
        "state['scaler']['scale']: 2.0 != 4.0": {**same, "scaler": {"scale": 4.0}},
        "state['history'][1]: nan != 0.0": {**same, "history": [1.0, 0.0]},
        "state['history']: lengths 2 != 1": {**same, "history": [1.0]},
        "state: keys": {k: v for k, v in same.items() if k != "step"},
        "state['step']: int != float": {**same, "step": 3.0},
    }
    for expected, other in cases.items():
        assert first_difference(base, other).startswith(expected), expected
    assert first_difference(torch.ones(2), torch.ones(2, dtype=torch.float16)) == "state: tensors differ"
