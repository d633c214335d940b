"""ampteach.distributed: the real 2-process DDP job on the CPU (gloo), and its pieces in-process.

The job is launched exactly as a learner launches it, `python -m torch.distributed.run
--nproc_per_node 2 -m ampteach.distributed --device cpu ...`, on a free localhost port (no network).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import torch

import ampteach
from ampteach.data import Preloaded
from ampteach.distributed import checksum, parse_args, shard_batches

FINAL = re.compile(r"^rank (\d+): scale (\S+) checksum (\S+)$")
STEP = re.compile(r"^rank (\d+): step (\d+) skipped (True|False) scale (\S+) checksum (\S+)$")
STEPS, INJECT_AT, INJECT_RANK = 6, 3, 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args: str) -> tuple[dict[int, tuple[float, float]], dict[tuple[int, int], tuple[bool, float, float]]]:
    """Run the 2-process job; return {rank: (scale, checksum)} and {(rank, step): (skipped, scale, checksum)}."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "ampteach.distributed", "--device", "cpu", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    final, steps = {}, {}
    for line in done.stdout.splitlines():
        if m := FINAL.match(line):
            final[int(m[1])] = (float(m[2]), float(m[3]))
        elif m := STEP.match(line):
            steps[int(m[1]), int(m[2])] = (m[3] == "True", float(m[4]), float(m[5]))
    return final, steps


@pytest.mark.slow
def test_two_ranks_agree_and_both_skip_an_inf_injected_on_one_rank_before_the_all_reduce():
    final, steps = launch("--steps", str(STEPS), "--inject-inf", str(INJECT_AT), "--inject-rank", str(INJECT_RANK),
                          "--log-steps")
    assert sorted(final) == [0, 1], "one final line per rank"
    assert final[0] == final[1], f"the ranks disagree: {final}"
    assert len(steps) == 2 * STEPS
    for s in range(STEPS):
        assert steps[0, s] == steps[1, s], f"step {s}: the ranks disagree: {steps[0, s]} vs {steps[1, s]}"
    skipped = [s for s in range(STEPS) if steps[0, s][0]]
    assert skipped == [INJECT_AT], "rank 0 skips the step whose inf came from rank 1, and only that one"
    _, scale_before, weights_before = steps[0, INJECT_AT - 1]
    _, scale_after, weights_after = steps[0, INJECT_AT]
    assert scale_after == scale_before / 2 and weights_after == weights_before   # backed off, not updated
    assert final[0] == (steps[0, STEPS - 1][1], steps[0, STEPS - 1][2])
    assert final[0][0] == 2.0**15, "one backoff from the default 2**16"


@pytest.mark.slow
def test_control_an_inf_put_in_after_the_all_reduce_is_seen_by_one_rank_only():
    """The same fault behind DDP's back (after the reduction): only rank 1 skips, and the replicas part.

    In bf16, where no scaler runs and the isfinite check skips the step instead (scale stays 1.0).
    """
    final, steps = launch("--precision", "bf16", "--steps", str(INJECT_AT + 2), "--inject-inf", str(INJECT_AT),
                          "--inject-rank", str(INJECT_RANK), "--inject-after-reduce", "--log-steps")
    assert [steps[0, s][2] for s in range(INJECT_AT)] == [steps[1, s][2] for s in range(INJECT_AT)], "agree before"
    assert steps[INJECT_RANK, INJECT_AT][0] and not steps[1 - INJECT_RANK, INJECT_AT][0]
    assert steps[INJECT_RANK, INJECT_AT][2] == steps[INJECT_RANK, INJECT_AT - 1][2], "the skipped step changed nothing"
    assert final[0][0] == final[1][0] == 1.0
    assert final[0][1] != final[1][1], "from then on the replicas differ"


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
    with pytest.raises(SystemExit, match="torch.distributed.run --nproc_per_node 2 -m ampteach.distributed"):
        ampteach.distributed.main(["--steps", "1"])
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    assert "--steps and --batch-size must be >= 1" in capsys.readouterr().err
