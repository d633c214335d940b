"""E.6.1 as a command: fp32 vs fp16 + GradScaler vs bf16, each through torch.amp and through ampteach.

    $ ampteach bench --device auto --epochs 2 --batch-size 512 --out my_gpu.json
    $ ampteach bench --width 2048 --batch-size 256 --configs fp32,bf16    # the course MLP 784-W-W-10
    from ampteach.tools.bench import run_bench; rows = run_bench("cpu", epochs=1)["rows"]

Each run trains the same model from the same seed on the dataset preloaded on the device, leaves
the first warm-up steps out of the timing, and reports
    samples_per_s = timed samples / timed seconds       (evaluation excluded; CUDA synchronised)
    speedup_vs_fp32 = samples_per_s / samples_per_s of the same impl's fp32 run
    peak_mem_bytes: on CUDA, torch.cuda.max_memory_allocated during training minus what was
        allocated before (the dataset); on a CPU, which has no allocator peak to read, what one
        training batch keeps for the backward pass (the bytes autograd saved, the model's own
        weights not counted), split into activation_bytes (layer inputs and outputs) and
        weight_copy_bytes (the 16-bit copies of the weights autocast makes for its matmuls and keeps
        for backward; fp32 needs none). The copies are why that memory does not halve.
The table ends with the memory in those words and a one-line conclusion. A progress bar per
configuration shows while it trains, in a terminal only (none when the output goes to a file).
The default model is a wide MLP (4096 x 3 on CUDA: big matmuls keep tensor cores busy; smaller on
a CPU, where every fp16 op is emulated and slow).
"""

from __future__ import annotations

import json
import sys
import textwrap
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ampteach.tools.command import run_command
from ampteach.training.data import Preloaded, course_split, load_fashion_mnist, preload
from ampteach.training.machine import cuda_info, describe_device, resolve_device
from ampteach.training.models import cnn, mlp
from ampteach.training.seeding import seed_everything
from ampteach.training.train import TrainConfig, autocast_for, train

__all__ = ["CONFIGS", "IMPLS", "DEFAULT_MODEL", "build_model", "width_model", "supported_configs",
           "saved_activation_bytes", "saved_for_backward", "run_config", "run_bench", "format_table", "memory_lines",
           "conclusion", "load_results", "add_arguments", "run"]

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


def saved_for_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str,
                       impl: str = "torch") -> dict[str, int]:
    """What one forward + loss keeps for the backward pass, in bytes, the model's own weights not counted:
    {"activations": layer inputs and outputs, "weight_copies": half copies of the weights (autocast's)}.

    Each storage autograd saves counts once (as ampteach.lab.memory.measure_step counts); a saved tensor
    is a weight copy when it holds a parameter's values cast to its dtype (transposed views included)."""
    params = [p.detach() for p in model.parameters()]
    seen = {p.untyped_storage().data_ptr() for p in params}
    found = {"activations": 0, "weight_copies": 0}

    def is_copy(t: torch.Tensor) -> bool:
        return any(t.dtype != p.dtype and q.shape == p.shape and torch.equal(q, p.to(t.dtype))
                   for p in params if t.dim() == p.dim() for q in ((t, t.mT) if t.dim() >= 2 else (t,)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            found["weight_copies" if is_copy(t) else "activations"] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast_for(impl, x.device.type, precision):
        F.cross_entropy(model(x), y)
    return found


def saved_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str,
                           impl: str = "torch") -> int:
    """Bytes autograd keeps for backward during one forward + loss (the weights' own storage excluded,
    autocast's half copies of them included): the CPU's memory measure."""
    return sum(saved_for_backward(model, x, y, precision, impl).values())


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
    split = {}
    if device.type == "cuda":
        peak, measure = torch.cuda.max_memory_allocated() - before, CUDA_MEASURE
    else:
        xb, yb = data.train_x[:batch_size].clone(), data.train_y[:batch_size]  # own storage, not the dataset's
        saved = saved_for_backward(model, xb, yb, precision, impl)
        peak, measure = sum(saved.values()), CPU_MEASURE
        split = {"activation_bytes": saved["activations"], "weight_copy_bytes": saved["weight_copies"]}
    return {"impl": impl, "config": precision, "samples_per_s": history.samples_per_s, "peak_mem_bytes": int(peak),
            "mem_measure": measure, **split, "accuracy": history.final_accuracy,
            "train_seconds": history.train_seconds}


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
            for i in impls for c in configs]                       # one progress bar per configuration
    if repeat > 1 and progress:
        print(f"best of {repeat}: every configuration runs {repeat - 1} more time(s), without bars", file=sys.stderr)
    for _ in range(repeat - 1):
        for row in rows:
            again = run_config(data, row["config"], row["impl"], model, epochs, batch_size, warmup_steps, seed,
                               progress=False)
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
    for line in memory_lines(result) + [conclusion(result)]:
        indent = " " * (len(line) - len(line.lstrip()))
        lines += textwrap.wrap(line.lstrip(), 100, initial_indent=indent, subsequent_indent=indent + "  ",
                               break_on_hyphens=False)
    return "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MB" if n < 10 * 2**20 else f"{n / 2**20:.0f} MB"


def _reference_rows(result: dict) -> dict[str, dict]:
    """One row per config: torch.amp's where it ran, else ampteach's."""
    rows: dict[str, dict] = {}
    for r in result["rows"]:
        if r["config"] not in rows or r["impl"] == "torch":
            rows[r["config"]] = r
    return rows


def memory_lines(result: dict) -> list[str]:
    """The memory column in plain words: what was measured, and why a half-precision run's is not half of fp32's."""
    rows, batch = _reference_rows(result), result["settings"]["batch_size"]
    if result["device"]["type"] == "cuda":
        return ["memory: the most GPU memory allocated at once while training, beyond the dataset already on the "
                "GPU: weights, gradients, optimizer state and the activations of one batch."]
    lines = [f"memory: what one training batch of {batch} keeps for the backward pass (a CPU has no allocator peak "
             f"to read; the model's own weights are not counted)."]
    fp32 = rows.get("fp32")
    for config in ("fp16", "bf16"):
        r = rows.get(config)
        if r is None or fp32 is None:
            continue
        total = r["peak_mem_bytes"] / fp32["peak_mem_bytes"]
        if "activation_bytes" in r and "activation_bytes" in fp32:
            acts, copies, ref = r["activation_bytes"], r["weight_copy_bytes"], fp32["activation_bytes"]
            lines.append(f"  {config}: {_mb(r['peak_mem_bytes'])} = {_mb(acts)} of activations, kept in 16 bits "
                         f"({acts / ref:.2f}x fp32's {_mb(ref)}), + {_mb(copies)} of 16-bit copies of the weights: "
                         f"{total:.2f}x fp32's total.")
        else:   # a table saved before the two were counted apart
            lines.append(f"  {config}: {_mb(r['peak_mem_bytes'])}, {total:.2f}x fp32's {_mb(fp32['peak_mem_bytes'])}.")
    if len(lines) > 1:
        lines.append("  Why not half: autocast casts each weight to 16 bits for its matmul and keeps that copy for the "
                     "backward pass, where fp32 uses the weight itself; and a few ops (the loss's log-softmax) stay in "
                     "fp32. The copies weigh the same at any batch size, so the saving grows with the batch.")
    return lines


def conclusion(result: dict) -> str:
    """One line, as the doctor's: which precision to train in here, and the numbers that say so."""
    rows = _reference_rows(result)
    fp32 = rows.get("fp32")
    halves = [rows[c] for c in ("bf16", "fp16") if c in rows]
    if fp32 is None or not halves:
        return "conclusion: run fp32 and at least one of fp16, bf16 to compare them."
    speed = " and ".join(f"{r['config']} {r['samples_per_s'] / fp32['samples_per_s']:.2f}x" for r in halves)
    drift = max(abs(r["accuracy"] - fp32["accuracy"]) for r in halves)
    best = max(halves, key=lambda r: r["samples_per_s"])
    ratio = best["samples_per_s"] / fp32["samples_per_s"]
    if ratio >= 1.1 and abs(best["accuracy"] - fp32["accuracy"]) <= 1.0:
        verdict = f"train in {best['config']} here, it is faster at the same accuracy"
    elif ratio >= 0.9:
        verdict = "no speed to gain here, half precision buys memory, not time"
    else:
        verdict = "stay in fp32 here, half precision is slower on this hardware (`ampteach doctor` says why)"
    return (f"conclusion: {verdict}: {speed} fp32's samples/s, accuracy within {drift:.1f} points of "
            f"fp32's {fp32['accuracy']:.1f}%.")


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
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (there are none anyway when the output is not a terminal)")


def run(args) -> int:
    def measure() -> dict:
        model = width_model(args.width) if args.width is not None else args.model
        return run_bench(args.device, args.epochs, args.batch_size, model, tuple(args.configs.split(",")),
                         tuple(args.impls.split(",")), args.warmup_steps,
                         progress=not args.no_progress and sys.stderr.isatty(), repeat=args.repeat)

    return run_command("bench", measure, format_table, args.out)


