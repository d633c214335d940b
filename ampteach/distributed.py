"""Data-parallel mixed precision: DDP with autocast and one loss scaler per process.

    python -m torch.distributed.run --nproc_per_node 2 -m ampteach.distributed --device cpu --steps 20
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

With FSDP2 (torch.distributed.fsdp.fully_shard) the picture changes: each rank holds a shard of
the fp32 parameters (they are the master weights), MixedPrecisionPolicy(param_dtype=...) casts them
when they are gathered for compute, and ShardedGradScaler all-reduces found_inf itself, because each
rank sees only its shard of the gradients.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .data import Preloaded, course_split, load_fashion_mnist, preload
from .models import mlp
from .seeding import seed_everything
from .train import TrainConfig, prepare, train_step

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
    """
    return math.fsum(p.detach().double().sum().item() for p in model.parameters())


def _inf_into_grad(grad: torch.Tensor) -> torch.Tensor:
    """A tensor hook: this rank's gradient with one element set to inf, before DDP reduces it."""
    grad = grad.clone()
    grad.view(-1)[0] = float("inf")
    return grad


def _inf_after_reduce(step: int, model: nn.Module) -> None:
    """after_backward hook: an inf written into this rank's already all-reduced gradient."""
    model.module[1].weight.grad.view(-1)[0] = float("inf")


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
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    config = TrainConfig(precision=args.precision, impl=args.impl, batch_size=args.batch_size, lr=args.lr,
                         seed=args.seed, skip_nonfinite=True, progress=False)
    _, opt, scaler = prepare(ddp, config)   # this rank's own scaler (fp16; bf16 needs none)

    for step, (x, y) in zip(range(args.steps), shard_batches(data, args.batch_size, rank, world_size, args.seed)):
        injecting = step == args.inject_inf and rank == args.inject_rank
        before_reduce = injecting and not args.inject_after_reduce
        handle = model[1].weight.register_hook(_inf_into_grad) if before_reduce else None
        after_backward = _inf_after_reduce if injecting and args.inject_after_reduce else None
        result = train_step(ddp, x, y, opt, scaler, config, step=step, after_backward=after_backward)
        if handle is not None:
            handle.remove()
        if args.log_steps:
            _say(f"rank {rank}: step {step} skipped {result.skipped} scale {scaler.get_scale()!r} "
                 f"checksum {checksum(model)!r}")
    return f"rank {rank}: scale {scaler.get_scale()!r} checksum {checksum(model)!r}"


def _say(line: str) -> None:
    """Print one whole line in one write: the ranks share stdout, and print() writes the newline apart."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m torch.distributed.run --nproc_per_node 2 -m ampteach.distributed",
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
    parser.add_argument("--log-steps", action="store_true",
                        help="also print `rank R: step s skipped B scale S checksum C` after every step")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA GPU here; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise SystemExit("ampteach.distributed runs one process per rank: start it with\n"
                         "  python -m torch.distributed.run --nproc_per_node 2 -m ampteach.distributed --device cpu")
    dist.init_process_group(BACKENDS[args.device])
    try:
        if not 0 <= args.inject_rank < dist.get_world_size():
            raise SystemExit(f"--inject-rank {args.inject_rank} is not a rank of this job (0..{dist.get_world_size() - 1})")
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
