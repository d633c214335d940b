"""E.6.1 as a command: fp32 vs fp16 + GradScaler vs bf16, each through torch.amp and through ampteach.

    $ ampteach bench --device auto --epochs 2 --batch-size 512 --out my_gpu.json
    $ ampteach bench --width 2048 --batch-size 256 --configs fp32,bf16    # the course MLP 784-W-W-10
    from ampteach.tools.bench import run_bench; rows = run_bench("cpu", epochs=1)["rows"]

Each run trains the same model from the same seed on the dataset preloaded on the device, leaves
the first warm-up steps out of the timing, and reports
    samples_per_s = timed samples / timed seconds       (evaluation excluded; CUDA synchronised)
    speedup_vs_fp32 = samples_per_s / samples_per_s of the same impl's fp32 run
    peak_mem_bytes: on CUDA, torch.cuda.max_memory_allocated during training minus what was
        allocated before (the dataset); on a CPU, the bytes autograd saved for backward in one
        training batch, parameters excluded (`mem_measure` names which), since a CPU process has no
        allocator peak to read. Both show what AMP halves: activations.
The default model is a wide MLP (4096 x 3 on CUDA: big matmuls keep tensor cores busy; smaller on
a CPU, where every fp16 op is emulated and slow).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.lab.memory import measure_step
from ampteach.tools.command import run_command
from ampteach.training.data import Preloaded, course_split, load_fashion_mnist, preload
from ampteach.training.machine import cuda_info, describe_device, resolve_device
from ampteach.training.models import cnn, mlp
from ampteach.training.seeding import seed_everything
from ampteach.training.train import TrainConfig, autocast_for, train

CONFIGS = ("fp32", "fp16", "bf16")
IMPLS = ("torch", "ampteach")
DEFAULT_MODEL = {"cuda": "mlp:4096,4096,4096", "cpu": "mlp:512,512"}
CPU_MEASURE = "saved_for_backward_bytes: tensors autograd saved in one training batch, parameters excluded (CPU)"
CUDA_MEASURE = "torch.cuda.max_memory_allocated during training, minus memory allocated before it (CUDA)"


def build_model(spec: str) -> nn.Module:
    """'mlp:4096,4096' -> mlp(hidden=(4096, 4096)); 'cnn:32,64' -> cnn(channels=(32, 64))."""
    kind, _, widths = spec.partition(":")
    try:
        sizes = tuple(int(w) for w in widths.split(",")) if widths else ()
    except ValueError:
        sizes = None
    if kind not in ("mlp", "cnn") or sizes is None or not sizes:
        raise ValueError(f"--model must look like 'mlp:4096,4096,4096' or 'cnn:32,64', got {spec!r}")
    return mlp(sizes) if kind == "mlp" else cnn(sizes)


def width_model(width: int) -> str:
    """The course MLP with two hidden layers of this width, 784-W-W-10, as a --model spec."""
    if width < 1:
        raise ValueError(f"--width must be a positive hidden width, got {width}")
    return f"mlp:{width},{width}"


def supported_configs(device: torch.device, configs: tuple[str, ...]) -> tuple[str, ...]:
    """configs without bf16 on a GPU that only emulates it (compute capability < 8.0): "bf16 where supported".
    Not torch.cuda.is_bf16_supported(), which by default counts emulation as support."""
    if device.type == "cuda" and not cuda_info()["bf16"]:
        return tuple(c for c in configs if c != "bf16")
    return configs


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str,
                           impl: str = "torch") -> int:
    """Bytes autograd keeps for backward during one forward + loss (parameters excluded): the CPU's
    memory measure, counted by ampteach.lab.memory.measure_step."""
    def forward_and_loss() -> torch.Tensor:
        with autocast_for(impl, x.device.type, precision):
            return F.cross_entropy(model(x), y)

    return measure_step(forward_and_loss, model, device=x.device).saved


def run_config(data: Preloaded, precision: str, impl: str, model_spec: str, epochs: int, batch_size: int,
               warmup_steps: int = 20, seed: int = 0, lr: float = 1e-3, progress: bool = True) -> dict:
    """Train one (impl, precision) configuration and return its row of the table."""
    device = data.device
    seed_everything(seed)
    model = build_model(model_spec).to(device)
    config = TrainConfig(precision=precision, impl=impl, epochs=epochs, batch_size=batch_size, lr=lr,
                         seed=seed, warmup_steps=warmup_steps, record_steps=False, progress=progress)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    history = train(model, data, config)
    if device.type == "cuda":
        peak, measure = torch.cuda.max_memory_allocated() - before, CUDA_MEASURE
    else:
        xb, yb = data.train_x[:batch_size].clone(), data.train_y[:batch_size]  # own storage, not the dataset's
        peak, measure = saved_activation_bytes(model, xb, yb, precision, impl), CPU_MEASURE
    return {"impl": impl, "config": precision, "samples_per_s": history.samples_per_s, "peak_mem_bytes": int(peak),
            "mem_measure": measure, "accuracy": history.final_accuracy, "train_seconds": history.train_seconds}


def run_bench(device: str = "auto", epochs: int = 2, batch_size: int = 512, model: str | None = None,
              configs: tuple[str, ...] = CONFIGS, impls: tuple[str, ...] = IMPLS, warmup_steps: int = 20,
              seed: int = 0, progress: bool = True, data: Preloaded | None = None, repeat: int = 1) -> dict:
    """Every (impl, config) run on one device; returns {"device", "settings", "rows"}.

    repeat > 1 runs the whole set that many times, interleaved, and keeps each row's best samples/s
    (as timeit does: noise from other processes only ever slows a run down).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    dev = resolve_device(device)
    bad = [c for c in configs if c not in CONFIGS] + [i for i in impls if i not in IMPLS]
    if bad:
        raise ValueError(f"unknown configs/impls {bad}: configs are {CONFIGS}, impls are {IMPLS}")
    configs = supported_configs(dev, configs)
    model = model or DEFAULT_MODEL[dev.type]
    build_model(model)  # a bad --model fails before any data is loaded
    data = data if data is not None else preload(course_split(load_fashion_mnist()), device=dev)
    steps = epochs * -(-len(data.train_x) // batch_size)
    if warmup_steps > steps // 2:  # otherwise too few (or no) steps are left to time
        print(f"note: {steps} steps per run; timing after {steps // 2} warm-up steps instead of {warmup_steps}")
        warmup_steps = steps // 2
    rows = [run_config(data, c, i, model, epochs, batch_size, warmup_steps, seed, progress=progress)
            for i in impls for c in configs]
    for _ in range(repeat - 1):
        for row in rows:
            again = run_config(data, row["config"], row["impl"], model, epochs, batch_size, warmup_steps, seed,
                               progress=progress)
            row["samples_per_s"] = max(row["samples_per_s"], again["samples_per_s"])
    for row in rows:
        base = next((r for r in rows if r["impl"] == row["impl"] and r["config"] == "fp32"), None)
        row["speedup_vs_fp32"] = row["samples_per_s"] / base["samples_per_s"] if base else None
    settings = {"model": model, "epochs": epochs, "batch_size": batch_size, "warmup_steps": warmup_steps,
                "optimizer": "adamw", "lr": 1e-3, "seed": seed, "repeat": repeat, "train_images": len(data.train_x),
                "test_images": len(data.test_x)}
    return {"device": describe_device(dev), "settings": settings, "rows": rows}


def format_table(result: dict) -> str:
    """The side-by-side table, plus ampteach's speed relative to torch's for each config."""
    dev, s = result["device"], result["settings"]
    lines = [f"{dev['name']} ({dev['type']}), torch {dev['torch']}, model {s['model']}, "
             f"{s['epochs']} epoch(s) of {s['train_images']} images, batch {s['batch_size']}"
             + (f", best of {s['repeat']} runs" if s.get("repeat", 1) > 1 else ""),
             f"{'impl':9s} {'config':6s} {'samples/s':>11s} {'vs fp32':>8s} {'memory MB':>10s} {'accuracy':>9s}"]
    for r in result["rows"]:
        speedup = f"{r['speedup_vs_fp32']:.2f}x" if r["speedup_vs_fp32"] else "-"
        lines.append(f"{r['impl']:9s} {r['config']:6s} {r['samples_per_s']:11,.0f} {speedup:>8s} "
                     f"{r['peak_mem_bytes'] / 2**20:10.1f} {r['accuracy']:8.1f}%")
    rows = {(r["impl"], r["config"]): r for r in result["rows"]}
    ratios = [f"{c} {rows[('torch', c)]['samples_per_s'] / rows[('ampteach', c)]['samples_per_s']:.2f}x"
              for c in CONFIGS if ("torch", c) in rows and ("ampteach", c) in rows]
    if ratios:
        lines.append("time per sample, ampteach / torch: " + ", ".join(ratios))
    lines.append(f"memory: {result['rows'][0]['mem_measure']}")
    return "\n".join(lines)


def load_results(folder: Path | str | None = None) -> list[dict]:
    """results = load_results()   # the tables shipped with ampteach (ampteach/results/*.json), GPU ones first

    Found with importlib.resources, so they load after any install, from any directory; pass `folder`
    to read tables of your own (files written by `ampteach bench --out`) instead.
    """
    files = Path(folder).glob("*.json") if folder is not None else (
        f for f in resources.files("ampteach").joinpath("results").iterdir() if f.name.endswith(".json"))
    results = [json.loads(f.read_text()) for f in sorted(files, key=lambda f: f.name)]
    return sorted(results, key=lambda r: r["device"]["type"] != "cuda")


def add_arguments(parser) -> None:
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", default=None, help=f"e.g. mlp:4096,4096,4096 or cnn:32,64 (default {DEFAULT_MODEL})")
    model.add_argument("--width", type=int, default=None, help="the course MLP 784-W-W-10 (same as --model mlp:W,W)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of fp32,fp16,bf16")
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of torch,ampteach")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1, help="run everything R times, keep each row's best speed")
    parser.add_argument("--out", type=Path, default=None, help="write the rows and the device description as JSON")
    parser.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    def measure() -> dict:
        model = width_model(args.width) if args.width is not None else args.model
        return run_bench(args.device, args.epochs, args.batch_size, model, tuple(args.configs.split(",")),
                         tuple(args.impls.split(",")), args.warmup_steps, progress=not args.no_progress,
                         repeat=args.repeat)

    return run_command("bench", measure, format_table, args.out)


