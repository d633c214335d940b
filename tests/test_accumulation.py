"""ampteach.lab.grad_accumulation: one optimizer step from N micro-batches, checked against PyTorch's own recipe.

The reference is the loop of PyTorch's AMP examples ("Gradient accumulation") written out with
torch.autocast and torch.amp.GradScaler; accumulation_step must reproduce it bit for bit, with either
implementation's scaler, and skip exactly the steps the recipe skips.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import ampteach
from ampteach.lab.distributed import AllReduceCount, count_all_reduces
from ampteach.lab.grad_accumulation import accumulation_step, plot_accumulation_windows, windows_from_events

N = 4
GEN = torch.Generator().manual_seed(0)
MICRO = [(torch.randn(16, 1, 28, 28, generator=GEN), torch.randint(0, 10, (16,), generator=GEN)) for _ in range(3 * N)]


def fresh(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return ampteach.mlp((16,))


def fp16():
    return torch.autocast("cpu", dtype=torch.float16)


def reference_step(model, micro_batches, opt, scaler, max_norm) -> None:
    """PyTorch's documented accumulation loop, spelled out."""
    for x, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y) / len(micro_batches)
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("GradScaler", [torch.amp.GradScaler, ampteach.GradScaler], ids=["torch", "ampteach"])
def test_matches_pytorchs_accumulation_loop_bit_for_bit(GradScaler):
    ref, ours = fresh(), fresh()
    ref_opt, opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, ours))
    ref_scaler, scaler = torch.amp.GradScaler("cpu", growth_interval=1), GradScaler("cpu", growth_interval=1)
    for k in range(3):
        window = MICRO[k * N:(k + 1) * N]
        reference_step(ref, window, ref_opt, ref_scaler, 0.5)
        result = accumulation_step(ours, window, opt, scaler, autocast=fp16, max_norm=0.5)
        assert not result.skipped
        assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), ours.parameters())), f"step {k}"
        assert scaler.get_scale() == ref_scaler.get_scale() == 2.0**16 * 2 ** (k + 1)
    assert all(p.grad is None for p in ours.parameters()), "the gradients are cleared for the next window"


def test_the_loss_is_the_mean_over_the_micro_batches():
    model = fresh()
    result = accumulation_step(model, MICRO[:N], torch.optim.SGD(model.parameters(), lr=0.0))
    model.eval()
    with torch.no_grad():
        expected = sum(F.cross_entropy(model(x), y) / N for x, y in MICRO[:N])
    assert torch.allclose(result.loss, expected, rtol=1e-6)


@pytest.mark.parametrize("GradScaler", [torch.amp.GradScaler, ampteach.GradScaler], ids=["torch", "ampteach"])
def test_an_inf_in_any_micro_batch_skips_the_step_and_backs_off(GradScaler):
    model = fresh()
    before = [p.detach().clone() for p in model.parameters()]
    scaler = GradScaler("cpu")

    def break_first(i, m):
        if i == 0:
            m[1].weight.grad.view(-1)[0] = math.inf

    result = accumulation_step(model, MICRO[:N], torch.optim.AdamW(model.parameters()), scaler, autocast=fp16,
                               after_backward=break_first)
    assert result.skipped and scaler.get_scale() == 2.0**15
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


@pytest.mark.parametrize("scaler", [None, torch.amp.GradScaler("cpu", enabled=False)], ids=["none", "disabled"])
def test_without_a_scaler_a_non_finite_gradient_skips_the_step(scaler):
    model = fresh()
    before = [p.detach().clone() for p in model.parameters()]
    bad = [(x.clone(), y) for x, y in MICRO[:N]]
    bad[2][0][0, 0, 0, 0] = math.nan                                  # one NaN pixel in micro-batch 2
    opt = torch.optim.AdamW(model.parameters())
    result = accumulation_step(model, bad, opt, scaler, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert result.skipped and not opt.state, "the optimizer never stepped"
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert not accumulation_step(model, MICRO[:N], opt, scaler).skipped   # and the next clean window steps


def test_a_bf16_scaler_changes_nothing_but_the_work_done():
    runs = []
    for scaler in (torch.amp.GradScaler("cpu"), None):
        model = fresh()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for k in range(3):
            accumulation_step(model, MICRO[k * N:(k + 1) * N], opt, scaler,
                              autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        runs.append(model)
    assert all(torch.equal(p, q) for p, q in zip(*(m.parameters() for m in runs)))


def test_needs_a_micro_batch():
    model = fresh()
    with pytest.raises(ValueError, match="at least one micro-batch"):
        accumulation_step(model, [], torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_no_sync_all_reduces_once_per_step_and_gives_the_same_gradients(single_process_group):
    models, counts = [], []
    for no_sync in (True, False):
        model = fresh()
        ddp = DistributedDataParallel(model)
        count = AllReduceCount()
        ddp.register_comm_hook(count, count_all_reduces)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for k in range(2):
            accumulation_step(ddp, MICRO[k * N:(k + 1) * N], opt, torch.amp.GradScaler("cpu"), autocast=fp16,
                              no_sync=no_sync)
        models.append(model)
        counts.append(count.calls)
    assert counts == [2, 2 * N]
    # one process: the all-reduce averages over one rank, so both ways add the same numbers in the same order
    assert all(torch.equal(p, q) for p, q in zip(*(m.parameters() for m in models)))


def test_windows_from_events_groups_micro_batches_by_the_step_that_applied_them():
    events = [(0, "backward"), (1, "backward"), (1, "step"), (2, "backward"), (3, "backward"), (3, "zero"),
              (5, "backward"), (6, "backward"), (7, "backward"), (7, "step"), (8, "backward")]
    windows, dropped = windows_from_events(events)
    assert windows == [[0, 1], [5, 6, 7]]
    assert dropped == [2, 3, 8], "cleared without a step, or never stepped"
    with pytest.raises(ValueError, match="unknown event"):
        windows_from_events([(0, "forward")])


def test_the_windows_figure_draws_one_box_per_micro_batch_and_row():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = [(i, "backward") for i in range(4)] + [(3, "step")]
    ax = plot_accumulation_windows({"a": events, "b": events[:2]}, n_micro=4, every=2, bad=[1])
    assert len(ax.patches) == 2 * 4 and [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    plt.close(ax.figure)
