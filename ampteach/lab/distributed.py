"""Data-parallel mixed precision: DDP with autocast and one loss scaler per process; FSDP2 with fp32 shards.

    python -m torch.distributed.run --nproc_per_node 2 -m ampteach.lab.distributed --device cpu --steps 20
    rank 0: scale 65536.0 checksum -12.345678901234567
    rank 1: scale 65536.0 checksum -12.345678901234567

Each process (rank) trains a replica of the FashionMNIST model on its own shard of every epoch's
batches, with its own autocast region and its own GradScaler (gloo on the CPU, NCCL on GPUs). Nothing
is shared but the gradients: DDP all-reduces (averages) them during backward, before scaler.unscale_
and scaler.step read them, so every rank checks the same averaged gradients for inf/NaN, skips the
same steps and moves its scale the same way. The ranks stay bit-identical without the scalers ever
talking to each other; the checksum (the float64 sum of every parameter value) shows it.
An inf on one rank is averaged into every rank's gradients ((inf + g) / 2 = inf), so all ranks skip
together: `--inject-inf STEP --inject-rank R` puts an inf into one gradient on rank R in the middle
of backward, before the all-reduce. With `--inject-after-reduce` the inf lands after it, on rank R
only, as a bug in your own code could do it: then only rank R skips and the replicas part ways.

`--accumulate N` makes every optimizer step from N micro-batches (ampteach.lab.grad_accumulation): the first
N-1 run inside DDP's no_sync(), so each step does one gradient all-reduce instead of N (each rank
prints how many it did); `--sync-each-micro-batch` all-reduces after every micro-batch instead.

`--fsdp` shards the model with FSDP2 instead (torch.distributed.fsdp.fully_shard): each rank keeps
a shard of the fp32 parameters (they are the master weights), MixedPrecisionPolicy(param_dtype=...)
casts them when they are gathered for compute (no autocast), gradients are reduce-scattered in fp32,
and each rank holds only its shard of them. torch.amp.GradScaler still agrees across ranks: on
FSDP2's DTensor gradients its inf check is reduced over the ranks (pytorch/pytorch#132816). Then
`--inject-inf` writes the inf into rank R's own gradient shard, after the reduce-scatter.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import os
import re
import socket
import subprocess
import sys
from typing import Iterator, Mapping, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ampteach.lab.grad_accumulation import accumulation_step
from ampteach.training.data import Preloaded, course_split, load_fashion_mnist, preload
from ampteach.training.models import mlp
from ampteach.training.seeding import seed_everything
from ampteach.training.train import TrainConfig, autocast_for, make_optimizer, prepare, scaler_for

__all__ = [
    "ALL_REDUCES", "BACKENDS", "FINAL", "STEP", "AllReduceCount", "JobOutput", "checksum", "count_all_reduces",
    "launch", "main", "parse_args", "parse_output", "plot_rank_checksums", "run", "shard", "shard_batches",
]

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def shard_batches(data: Preloaded, batch_size: int, rank: int, world_size: int,
                  seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless stream of (x, y) for one rank: each epoch's shuffled batches dealt out in turn.

    Epoch e is drawn from seed + e (as in train()); rank r gets batches r, r + W, r + 2W, ... of it,
    and the last few batches that would leave some ranks one short are dropped, so every rank takes
    the same number of steps per epoch and step s of every rank comes from the same epoch.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..world_size-1, got rank={rank} with world_size={world_size}")
    n_batches = len(data.train_x) // batch_size
    usable = n_batches - n_batches % world_size
    if usable == 0:
        raise ValueError(f"{len(data.train_x)} training images make {n_batches} full batches of {batch_size}, "
                         f"fewer than the {world_size} ranks: use a smaller batch size")
    for epoch in itertools.count():
        batches = data.batches(batch_size, shuffle=True, seed=seed + epoch, drop_last=True)
        for i, batch in enumerate(itertools.islice(batches, usable)):
            if i % world_size == rank:
                yield batch


def checksum(model: nn.Module) -> float:
    """The sum of every parameter value in float64 (math.fsum of per-tensor sums): a fingerprint of the weights.

    Replicas with the same weights give the same number; any difference in a weight changes it
    (barring a coincidence), so equal checksums printed with all 17 digits say the ranks agree.
    Sharded (FSDP2) parameters are gathered first (a collective: every rank must call it).
    """
    return math.fsum(_full(p).double().sum().item() for p in model.parameters())


def _full(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value: FSDP2's DTensor shards gathered from every rank, a plain tensor as it is."""
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of a DTensor, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _inf_at_call(call: int):
    """A tensor hook that sets one element of the gradient to inf in the call-th backward it sees (before DDP
    reduces)."""
    calls = itertools.count()

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if next(calls) != call:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad
    return hook


def _inf_after_reduce(last_micro_batch: int):
    """after_backward hook: an inf written into this rank's gradient once it is reduced (its own shard under FSDP2)."""
    def hook(micro_batch: int, model: nn.Module) -> None:
        if micro_batch == last_micro_batch:
            _local(_inner(model)[1].weight.grad).view(-1)[0] = float("inf")
    return hook


def _inner(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


class AllReduceCount:
    """How many gradient all-reduces DDP ran: the state of the communication hook count_all_reduces."""

    def __init__(self) -> None:
        self.calls = 0


def count_all_reduces(state: AllReduceCount, bucket):
    """A DDP communication hook (ddp.register_comm_hook(state, count_all_reduces)): count, then DDP's own average."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    state.calls += 1
    return allreduce_hook(None, bucket)


def shard(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """FSDP2: shard every Linear, then the whole model; compute in dtype, reduce gradients and return logits in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                                      output_dtype=torch.float32))   # the loss in fp32
    return model


def run(args: argparse.Namespace) -> str:
    """Train on this process's rank and return its line `rank R: scale S checksum C`."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if rank != 0:
        dist.barrier()          # rank 0 loads (and, if allowed, downloads) the data first
    data = preload(course_split(load_fashion_mnist()), device=device)
    if rank == 0:
        dist.barrier()

    seed_everything(args.seed)  # the same init everywhere (DDP also broadcasts rank 0's weights)
    model = mlp(tuple(args.hidden)).to(device)
    config = TrainConfig(precision=args.precision, impl=args.impl, batch_size=args.batch_size, lr=args.lr,
                         seed=args.seed, skip_nonfinite=True, progress=False)
    counter = None
    if args.fsdp:
        wrapped = shard(model, config.dtype)
        opt = make_optimizer(model.parameters(), config)
        scaler = scaler_for(config, device.type)                      # this rank's own (fp16; bf16 needs none)
        autocast = contextlib.nullcontext                             # FSDP casts the gathered parameters itself
        w = model[1].weight
        _say(f"rank {rank}: holds {tuple(_local(w).shape)} of 1.weight {tuple(w.shape)}, stored as {w.dtype}, "
             f"computed in {config.dtype}")
    else:
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        counter = AllReduceCount()
        wrapped.register_comm_hook(counter, count_all_reduces)
        _, opt, scaler = prepare(wrapped, config)                     # this rank's own scaler (fp16; bf16 needs none)
        autocast = functools.partial(autocast_for, config.impl, device.type, config.precision)

    stream = shard_batches(data, args.batch_size, rank, world_size, args.seed)
    last = args.accumulate - 1
    for step in range(args.steps):
        micro_batches = [next(stream) for _ in range(args.accumulate)]
        injecting = step == args.inject_inf and rank == args.inject_rank
        after_reduce = injecting and (args.inject_after_reduce or args.fsdp)
        handle = None
        if injecting and not after_reduce:
            handle = model[1].weight.register_hook(_inf_at_call(min(args.inject_micro_batch, last)))
        result = accumulation_step(wrapped, micro_batches, opt, scaler, autocast=autocast,
                                   no_sync=not args.sync_each_micro_batch,
                                   after_backward=_inf_after_reduce(last) if after_reduce else None)
        if handle is not None:
            handle.remove()
        if args.log_steps:
            line = (f"rank {rank}: step {step} skipped {result.skipped} scale {scaler.get_scale()!r} "
                    f"checksum {checksum(model)!r}")
            _say(line)
    if counter is not None:
        _say(f"rank {rank}: gradient all-reduces {counter.calls} in {args.steps} steps of {args.accumulate} "
             f"micro-batches")
    return f"rank {rank}: scale {scaler.get_scale()!r} checksum {checksum(model)!r}"


def _say(line: str) -> None:
    """Print one whole line in one write: the ranks share stdout, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- launching the job from Python (a lesson, a test) and reading what the ranks printed -------------

FINAL = re.compile(r"^rank (\d+): scale (\S+) checksum (\S+)$")
STEP = re.compile(r"^rank (\d+): step (\d+) skipped (True|False) scale (\S+) checksum (\S+)$")
ALL_REDUCES = re.compile(r"^rank (\d+): gradient all-reduces (\d+) ")


class JobOutput(NamedTuple):
    """What the ranks of one job printed, parsed (line order between ranks does not matter)."""

    returncode: int
    final: dict[int, tuple[float, float]]                      # rank -> (scale, checksum) at the end
    steps: dict[tuple[int, int], tuple[bool, float, float]]    # (rank, step) -> (skipped, scale, checksum)
    all_reduces: dict[int, int]                                # rank -> gradient all-reduces (DDP only)
    text: str                                                  # every "rank ..." line, sorted

    def skipped(self, rank: int) -> list[int]:
        return sorted(s for (r, s), (k, _, _) in self.steps.items() if r == rank and k)


def parse_output(stdout: str, returncode: int = 0) -> JobOutput:
    final, steps, reduces, lines = {}, {}, {}, []
    for line in stdout.splitlines():
        if m := FINAL.match(line):
            final[int(m[1])] = (float(m[2]), float(m[3]))
        elif m := STEP.match(line):
            steps[int(m[1]), int(m[2])] = (m[3] == "True", float(m[4]), float(m[5]))
        elif m := ALL_REDUCES.match(line):
            reduces[int(m[1])] = int(m[2])
        if line.startswith("rank "):
            lines.append(line)
    return JobOutput(returncode, final, steps, reduces, "\n".join(sorted(lines)))


def launch(*args: str, nproc: int = 2, timeout: float = 600) -> JobOutput:
    """Run `python -m torch.distributed.run --nproc_per_node 2 -m ampteach.lab.distributed ARGS` on this machine.

    The rendezvous uses a free localhost port (no network); each rank runs one intra-op thread.
    Raises RuntimeError with the job's output if it fails.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "ampteach.lab.distributed", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"the job failed (exit code {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}")
    return parse_output(done.stdout, done.returncode)


def plot_rank_checksums(jobs: Mapping[str, JobOutput]):
    """One panel per job: each rank's weight checksum after every step, its skipped steps marked x.

        fig = plot_rank_checksums({"inf before the all-reduce": job, "inf after it": other})

    Replicas that agree draw one line (rank 1's dashed line on rank 0's wide one); replicas that part draw two.
    """
    import matplotlib.pyplot as plt

    from ampteach.lab.plots import course_style

    styles = (dict(lw=5, alpha=0.35, color="tab:blue"), dict(ls="--", lw=1.5, color="tab:orange"))
    with course_style():
        fig, axes = plt.subplots(1, len(jobs), figsize=(4.6 * len(jobs), 3.0), squeeze=False)
        for ax, (title, job) in zip(axes[0], jobs.items()):
            skip_label = "skipped step"
            for rank, style in zip(sorted({r for r, _ in job.steps}), itertools.cycle(styles)):
                steps = sorted(s for r, s in job.steps if r == rank)
                ax.plot(steps, [job.steps[rank, s][2] for s in steps], label=f"rank {rank}", **style)
                skipped = [s for s in steps if job.steps[rank, s][0]]
                if skipped:
                    ax.plot(skipped, [job.steps[rank, s][2] for s in skipped], "x", color="tab:red", label=skip_label)
                    skip_label = "_nolegend_"
            ax.set(title=title, xlabel="step")
        axes[0][0].set_ylabel("checksum of the weights")
        axes[0][-1].legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch.distributed.run --nproc_per_node 2 -m ampteach.lab.distributed",
        description="DDP + autocast + a GradScaler per process on FashionMNIST; each rank prints its loss "
                    "scale and a checksum of its parameters, which must agree across ranks.")
    parser.add_argument("--device", choices=sorted(BACKENDS), default="cpu",
                        help="cpu (gloo backend) or cuda (nccl, one GPU per process)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per rank")
    parser.add_argument("--precision", choices=["fp16", "bf16"], default="fp16",
                        help="autocast dtype; fp16 uses a dynamic GradScaler, bf16 skips non-finite steps instead")
    parser.add_argument("--impl", choices=["ampteach", "torch"], default="ampteach",
                        help="ampteach.GradScaler/autocast or torch.amp's")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64], help="MLP hidden widths")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inject-inf", type=int, default=None, metavar="STEP",
                        help="at this step (0-based) put an inf into one gradient on --inject-rank")
    parser.add_argument("--inject-rank", type=int, default=0)
    parser.add_argument("--inject-after-reduce", action="store_true",
                        help="inject after DDP's all-reduce (only that rank sees it) instead of before")
    parser.add_argument("--inject-micro-batch", type=int, default=0, metavar="M",
                        help="with --accumulate: the micro-batch (0-based) whose backward gets the inf")
    parser.add_argument("--accumulate", type=int, default=1, metavar="N",
                        help="micro-batches per optimizer step; the first N-1 run under DDP's no_sync()")
    parser.add_argument("--sync-each-micro-batch", action="store_true",
                        help="with --accumulate: all-reduce after every micro-batch (no no_sync)")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard with FSDP2 (fully_shard + MixedPrecisionPolicy) instead of DDP")
    parser.add_argument("--log-steps", action="store_true",
                        help="also print `rank R: step s skipped B scale S checksum C` after every step")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.accumulate < 1:
        parser.error("--steps, --batch-size and --accumulate must be >= 1")
    if args.fsdp and args.impl == "ampteach" and args.precision == "fp16":
        parser.error("--fsdp with fp16 needs a scaler that takes FSDP2's DTensor gradients; ampteach.GradScaler "
                     "does not yet: use --impl torch (torch.amp.GradScaler), or --precision bf16")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA GPU here; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit("ampteach.lab.distributed runs one process per rank: start it with\n"
                         "  python -m torch.distributed.run --nproc_per_node 2 -m ampteach.lab.distributed "
                         "--device cpu")
    dist.init_process_group(BACKENDS[args.device])
    try:
        if not 0 <= args.inject_rank < dist.get_world_size():
            raise SystemExit(f"--inject-rank {args.inject_rank} is not a rank of this job "
                             f"(0..{dist.get_world_size() - 1})")
        _say(run(args))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Done, and every line is written. Leave without the interpreter's teardown, where a finished
    # rank occasionally aborts as gloo's threads are destroyed ("terminate called without an active
    # exception", after destroy_process_group; seen in about 1 run in 20 on a busy 2-core CPU).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
