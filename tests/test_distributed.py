"""ampteach.lab.distributed: the real 2-process DDP job on the CPU (gloo), and its pieces in-process.

The job is launched exactly as a learner launches it, `python -m torch.distributed.run
--nproc_per_node 2 -m ampteach.lab.distributed --device cpu ...`, on a free localhost port (no network).
"""

from __future__ import annotations

import pytest
import torch

import ampteach
from ampteach.lab.distributed import checksum, launch, parse_args, parse_output, plot_rank_checksums, shard_batches
from ampteach.training.data import Preloaded

STEPS, INJECT_AT, INJECT_RANK = 6, 3, 1


@pytest.mark.slow
def test_two_ranks_agree_and_both_skip_an_inf_injected_on_one_rank_before_the_all_reduce():
    job = launch("--steps", str(STEPS), "--inject-inf", str(INJECT_AT), "--inject-rank", str(INJECT_RANK),
                 "--log-steps")
    assert sorted(job.final) == [0, 1], "one final line per rank"
    assert job.final[0] == job.final[1], f"the ranks disagree: {job.final}"
    assert len(job.steps) == 2 * STEPS
    for s in range(STEPS):
        assert job.steps[0, s] == job.steps[1, s], \
            f"step {s}: the ranks disagree: {job.steps[0, s]} vs {job.steps[1, s]}"
    assert job.skipped(0) == [INJECT_AT], "rank 0 skips the step whose inf came from rank 1, and only that one"
    _, scale_before, weights_before = job.steps[0, INJECT_AT - 1]
    _, scale_after, weights_after = job.steps[0, INJECT_AT]
    assert scale_after == scale_before / 2 and weights_after == weights_before   # backed off, not updated
    assert job.final[0] == (job.steps[0, STEPS - 1][1], job.steps[0, STEPS - 1][2])
    assert job.final[0][0] == 2.0**15, "one backoff from the default 2**16"
    assert job.all_reduces == {0: STEPS, 1: STEPS}, "one gradient all-reduce per step"


@pytest.mark.slow
def test_control_an_inf_put_in_after_the_all_reduce_is_seen_by_one_rank_only():
    """The same fault behind DDP's back (after the reduction): only rank 1 skips, and the replicas part.

    In bf16, where no scaler runs and the finite check skips the step instead (scale stays 1.0).
    """
    job = launch("--precision", "bf16", "--steps", str(INJECT_AT + 2), "--inject-inf", str(INJECT_AT),
                 "--inject-rank", str(INJECT_RANK), "--inject-after-reduce", "--log-steps")
    steps = job.steps
    assert [steps[0, s][2] for s in range(INJECT_AT)] == [steps[1, s][2] for s in range(INJECT_AT)], "agree before"
    assert steps[INJECT_RANK, INJECT_AT][0] and not steps[1 - INJECT_RANK, INJECT_AT][0]
    assert steps[INJECT_RANK, INJECT_AT][2] == steps[INJECT_RANK, INJECT_AT - 1][2], "the skipped step changed nothing"
    assert job.final[0][0] == job.final[1][0] == 1.0
    assert job.final[0][1] != job.final[1][1], "from then on the replicas differ"


@pytest.mark.slow
def test_accumulation_with_no_sync_reduces_once_per_step_and_an_inf_in_a_quiet_micro_batch_reaches_every_rank():
    quiet = launch("--steps", "3", "--accumulate", "4", "--log-steps", "--inject-inf", "1", "--inject-rank", "1",
                   "--inject-micro-batch", "0")
    assert quiet.all_reduces == {0: 3, 1: 3}
    assert quiet.skipped(0) == quiet.skipped(1) == [1], "the inf waited in rank 1's local sum, then reached rank 0"
    assert quiet.final[0] == quiet.final[1]
    # the same job without the fault, with and without no_sync: the same steps, one all-reduce vs four per step
    runs = {sync: launch("--steps", "3", "--accumulate", "4", "--log-steps",
                         *(["--sync-each-micro-batch"] if sync else []))
            for sync in (False, True)}
    assert runs[False].all_reduces == {0: 3, 1: 3} and runs[True].all_reduces == {0: 12, 1: 12}
    for job in runs.values():
        assert job.final[0] == job.final[1] and not job.skipped(0)
    # summing locally first adds the same numbers in another order: equal to rounding, not bit for bit
    assert runs[False].final[0][1] == pytest.approx(runs[True].final[0][1], rel=1e-4)


@pytest.mark.slow
def test_fsdp2_shards_fp32_masters_and_both_ranks_skip_an_inf_in_one_shard():
    job = launch("--fsdp", "--impl", "torch", "--steps", "4", "--inject-inf", "2", "--inject-rank", "1", "--log-steps")
    assert ("rank 0: holds (32, 784) of 1.weight (64, 784), stored as torch.float32, computed in torch.float16"
            in job.text)
    assert 2 in job.skipped(0) and job.skipped(0) == job.skipped(1)
    assert job.final[0] == job.final[1]
    assert not job.all_reduces, "FSDP2 reduce-scatters; the DDP all-reduce counter is not used"
    ddp = launch("--impl", "torch", "--steps", "2", "--log-steps")
    assert [job.steps[0, s] for s in (0, 1)] == [ddp.steps[0, s] for s in (0, 1)], \
        "fp16 params at module boundaries = fp16 autocast on this MLP, step for step"


@pytest.mark.slow
def test_launch_reports_a_failed_job():
    with pytest.raises(RuntimeError, match="the job failed"):
        launch("--steps", "1", "--fsdp", "--impl", "ampteach")   # refused by the argument check


def test_parse_output_reads_every_kind_of_line_in_any_order():
    text = "\n".join(["rank 1: scale 2.0 checksum 3.5", "noise", "rank 0: step 0 skipped True scale 1.0 checksum 2.0",
                      "rank 0: gradient all-reduces 7 in 7 steps of 1 micro-batches", "rank 0: scale 2.0 checksum 3.5"])
    out = parse_output(text)
    assert out.final == {0: (2.0, 3.5), 1: (2.0, 3.5)} and out.steps == {(0, 0): (True, 1.0, 2.0)}
    assert out.all_reduces == {0: 7} and out.skipped(0) == [0] and out.skipped(1) == []
    assert "noise" not in out.text and out.text.splitlines()[0].startswith("rank 0")


def test_plot_rank_checksums_draws_a_panel_per_job_and_a_line_per_rank():
    agree = parse_output("\n".join(f"rank {r}: step {s} skipped {s == 1} scale 1.0 checksum {s}.0"
                                   for r in (0, 1) for s in range(3)))
    part = parse_output("\n".join(f"rank {r}: step {s} skipped False scale 1.0 checksum {s + r * (s > 1)}.0"
                                  for r in (0, 1) for s in range(3)))
    fig = plot_rank_checksums({"agree": agree, "part": part})
    left, right = fig.axes
    assert [a.get_title() for a in fig.axes] == ["agree", "part"]
    assert [line.get_label() for line in left.lines] == ["rank 0", "skipped step", "rank 1", "_nolegend_"]
    assert [list(line.get_ydata()) for line in right.lines] == [[0.0, 1.0, 2.0], [0.0, 1.0, 3.0]]


@pytest.fixture(scope="module")
def small() -> Preloaded:
    d = ampteach.preload(ampteach.course_split(ampteach.load_fashion_mnist(download=False)))
    return Preloaded(d.train_x[:700], d.train_y[:700], d.test_x[:10], d.test_y[:10], d.mean, d.std)


def test_shards_are_disjoint_equal_and_cover_each_epoch(small):
    # 700 images / 64 = 10 full batches; 3 ranks deal out 9 of them: 3 each per epoch
    per_rank = [list(zip(range(6), shard_batches(small, 64, rank, 3, seed=5))) for rank in range(3)]
    for epoch in range(2):
        order = torch.randperm(700, generator=torch.Generator().manual_seed(5 + epoch))
        batches = [order[i * 64:(i + 1) * 64] for i in range(9)]
        for rank in range(3):
            for k in range(3):
                x, y = per_rank[rank][3 * epoch + k][1]
                assert torch.equal(x, small.train_x[batches[rank + 3 * k]])
                assert torch.equal(y, small.train_y[batches[rank + 3 * k]])


def test_shard_batches_refuses_bad_ranks_and_too_few_batches(small):
    with pytest.raises(ValueError, match="rank must be"):
        next(shard_batches(small, 64, 2, 2))
    with pytest.raises(ValueError, match="fewer than the 2 ranks"):
        next(shard_batches(small, 512, 0, 2))


def test_checksum_sees_a_change_of_one_ulp_in_one_weight():
    torch.manual_seed(0)
    model = ampteach.mlp((8,))
    before = checksum(model)
    with torch.no_grad():
        w = model[1].weight
        w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1.0))
    assert checksum(model) != before


def test_the_module_says_how_to_launch_it_when_run_alone(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="torch.distributed.run --nproc_per_node 2 -m ampteach.lab.distributed"):
        ampteach.lab.distributed.main(["--steps", "1"])
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    assert "--steps, --batch-size and --accumulate must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--fsdp", "--impl", "ampteach"])
    assert "ampteach.GradScaler does not yet" in capsys.readouterr().err
    assert parse_args(["--fsdp", "--impl", "ampteach", "--precision", "bf16"]).fsdp
