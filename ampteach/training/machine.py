"""The machine the course runs on: what it is, and how to time work on it.

    from ampteach.training.machine import machine_line, best_seconds
    print(machine_line())                       # e.g. "Intel Xeon ... | native bf16: AVX512-BF16 | 2 threads"
    seconds = best_seconds(lambda: a @ b)       # the fastest of repeated calls

One home for device probing (CPU model and native half-precision flags, the GPU's compute capability,
oneDNN's half kernels) and for timing, which the doctor, the benchmarks, the roofline and the step-time
measurements share. Timing keeps the fastest call:
    best = min over calls of (end - start)      noise from other processes only ever slows a call down
"""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path
from typing import Callable

import torch

__all__ = ["CPU_HALF_FLAGS", "best_seconds", "cpu_info", "cuda_info", "describe_device", "machine_line",
           "machine_tag", "native_cuda_bf16", "onednn_half", "resolve_clock", "resolve_device", "sync"]

CPU_HALF_FLAGS = ("avx512_bf16", "amx_bf16", "amx_fp16", "avx512_fp16")
FLAG_NAMES = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16", "amx_fp16": "AMX-FP16",
              "avx512_fp16": "AVX512-FP16"}


def cpu_info() -> tuple[str, dict[str, bool] | None]:
    """CPU model name and its native half-precision flags (None where the OS does not tell)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        name, flags = platform.processor() or "unknown", set()
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
        return name, {f: f in flags for f in CPU_HALF_FLAGS}
    return platform.processor() or platform.machine(), None


def native_cuda_bf16(capability: tuple[int, int]) -> bool:
    """bf16 on tensor cores: NVIDIA compute capability 8.0 (Ampere) or newer, or any ROCm GPU; the same
    answer as torch.cuda.is_bf16_supported(including_emulation=False), for any torch version."""
    return bool(torch.version.hip) or capability >= (8, 0)


def cuda_info() -> dict | None:
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    cc = (props.major, props.minor)
    return {
        "name": props.name,
        "capability": f"{cc[0]}.{cc[1]}",
        "tensor_cores": cc >= (7, 0),
        "bf16": native_cuda_bf16(cc),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
    }


def onednn_half() -> dict[str, bool]:
    """Whether PyTorch's CPU matmuls can use oneDNN's bf16 / fp16 kernels here (bf16 needs AVX512 or AVX-NE-CONVERT,
    fp16 AVX512-FP16 or AVX-NE-CONVERT); without them a half matmul runs in a generic fallback loop."""
    try:
        return {"bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                "fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())}
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return {}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda if torch sees a GPU, else cpu; 'cuda' without one is an error, not a silent fallback."""
    if name not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {name!r}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for a GPU, but torch.cuda.is_available() is False here "
                           f"(torch {torch.__version__}); use --device cpu, or --device auto to take what there is")
    return torch.device(name)


def describe_device(device: torch.device) -> dict:
    """What ran the benchmark, for the JSON and the table's title."""
    cpu_name, flags = cpu_info()
    info = {"type": device.type, "torch": torch.__version__, "python": platform.python_version(),
            "cpu": cpu_name, "cpu_native_half": flags, "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info.update(cuda_info())
    info["name"] = info.get("name") if device.type == "cuda" else cpu_name
    return info


def sync(device: str) -> None:
    """Wait for the device's queued work (a GPU runs asynchronously; a CPU call has finished when it returns)."""
    if device == "cuda":
        torch.cuda.synchronize()


def resolve_clock(clock: str, device: str = "cpu") -> str:
    """"auto" -> "cpu" where torch runs on one CPU thread (its CPU time is then the work's own time, whatever
    else the machine is doing), else "wall"; "cpu" needs exactly that situation."""
    if clock not in ("auto", "wall", "cpu"):
        raise ValueError(f"clock must be 'auto', 'wall' or 'cpu', got {clock!r}")
    one_thread = device == "cpu" and torch.get_num_threads() == 1
    if clock == "cpu" and not one_thread:
        raise ValueError(f"clock='cpu' counts the calling thread only, but torch uses {torch.get_num_threads()} "
                         f"threads on {device!r}: call torch.set_num_threads(1) (or set OMP_NUM_THREADS=1) and use "
                         f"the CPU, or time with clock='wall'")
    return clock if clock != "auto" else ("cpu" if one_thread else "wall")


def best_seconds(fn: Callable[[], object], device: str = "cpu", min_seconds: float = 0.2, clock: str = "auto") -> float:
    """The fastest of repeated calls of fn, in seconds (one warm-up call first, then calls until min_seconds
    have passed, at least 3): noise from other processes only ever slows a call down. A call that takes
    longer than min_seconds is timed once, warm-up included: its one-time costs are small beside it.

    clock: "wall", or "cpu" for the calling thread's CPU time (one torch thread on the CPU only), which leaves
    out the time other processes take the core away; "auto" picks "cpu" wherever it can (resolve_clock)."""
    clock = resolve_clock(clock, device)

    def timed() -> float:
        now = time.perf_counter if clock == "wall" else time.thread_time
        sync(device)
        start = now()
        fn()
        sync(device)
        return now() - start

    first = timed()
    if first >= min_seconds:
        return first
    best, spent, calls = float("inf"), 0.0, 0
    while spent < min_seconds or calls < 3:
        seconds = timed()
        best, spent, calls = min(best, seconds), spent + seconds, calls + 1
    return best


def machine_line(device: str = "cpu") -> str:
    """One line naming what a timing ran on: the CPU model (or GPU), its native half-precision support, threads.

    Every lesson cell that prints a time prints this beside it, so a stored number always names its machine."""
    if device == "cuda" and torch.cuda.is_available():
        c = cuda_info()
        return (f"{c['name']} (compute capability {c['capability']}, "
                f"{'bf16 and fp16' if c['bf16'] else 'fp16 only'} on tensor cores) | torch {torch.__version__}")
    name, flags = cpu_info()
    native = [FLAG_NAMES[f] for f, on in (flags or {}).items() if on]
    half = "native half: " + (", ".join(native) if native else "none (AVX2 or older)")
    if flags is None:
        half = "native half: unknown"
    threads = torch.get_num_threads()
    return f"{name} | {half} | {threads} thread{'s' if threads != 1 else ''} | torch {torch.__version__}"


def machine_tag(device: str = "cpu") -> str:
    """A file name for this machine's measurements: "cuda-nvidia-h100-80gb-hbm3", "cpu-intel-xeon-avx512-bf16".

    The GPU's name on CUDA; on a CPU its vendor and family and its best native half-precision instruction set."""
    if device == "cuda":
        name = cuda_info()["name"] if torch.cuda.is_available() else "unknown-gpu"
    else:
        cpu, flags = cpu_info()
        words = [w for w in re.split(r"[^a-z0-9]+", cpu.lower()) if w and w not in _MARKETING]
        best = next((FLAG_NAMES[f] for f in ("amx_bf16", "avx512_bf16", "avx512_fp16") if (flags or {}).get(f)),
                    "no native half")
        name = " ".join(words[:3] + [best.lower()])
    return f"{device}-" + "-".join(w for w in re.split(r"[^a-z0-9]+", name.lower()) if w)


_MARKETING = {"r", "tm", "processor", "cpu", "with", "radeon", "graphics", "core", "ghz"}
