"""What this machine can do with mixed precision, and which precision to use here.

    $ ampteach doctor            # or: python -m ampteach doctor
    from ampteach.tools.doctor import collect; collect().recommendation

The recommendation follows from two things: whether the hardware has native half-precision
arithmetic (tensor cores on a GPU, bf16 from compute capability 8.0; AVX512-BF16 / AMX on a CPU),
and the doctor's own matmul probe, which measures it:
    speed-up = best time(fp32 n x n matmul) / best time(half n x n matmul)   over interleaved rounds, > 1.1 to count.
On a CPU the probe runs on one thread timed by that thread's own CPU time, so another process on the machine
does not count; each format keeps its fastest call over several interleaved rounds. Native bf16 does not mean
fast bf16: an AVX512-BF16 CPU without AMX can run a bf16 matmul at half fp32's speed, one with AMX several times
faster. What native kernels never do is run like the generic loop (20 to 100 times slower than fp32): a probe
that says so on a CPU with native bf16 and oneDNN's bf16 kernels is probed again, and if it still says so the
doctor reports that the machine looks busy and gives no verdict instead of a wrong one.
`torch.cuda.is_bf16_supported()` is not used for the decision: by default it also counts bf16 that
a GPU only emulates (a T4 or V100, compute capability 7.x, runs it without tensor cores).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

import torch

from ampteach.training.machine import cpu_info, cuda_info, onednn_half

__all__ = [
    "BUSY", "FASTER", "GENERIC_LOOP", "PROBE_ROUNDS", "PROBE_TRIES", "Report", "add_arguments", "collect",
    "contradicts_hardware", "dataset_status", "format_report", "matmul_speedup", "recommend", "run",
]

FASTER = 1.1  # a probe ratio above this counts as a speed-up (below it: noise, or slower)
PROBE_ROUNDS = 5  # interleaved fp32/half rounds per probe; each format keeps its fastest call
PROBE_TRIES = 3   # probes before a contradiction between the flags and the measurement is called "busy"
GENERIC_LOOP = 0.25  # a bf16/fp32 ratio below this is the generic loop's speed, never a native kernel's
BUSY = "none yet: the machine looks busy"


@dataclass
class Report:
    python: str
    torch: str
    platform: str
    cpu_name: str
    cpu_capability: str
    cpu_flags: dict[str, bool]
    threads: int
    cpu_count: int
    cuda: dict | None
    dataset_root: str
    dataset_found: bool
    dataset_counts: tuple[int, int] | None
    probe: dict[str, dict[str, float]] = field(default_factory=dict)  # device -> {fp16, bf16}: speed-up vs fp32
    onednn_half: dict[str, bool] = field(default_factory=dict)  # {bf16, fp16}: PyTorch's oneDNN CPU kernels usable here
    recommendation: str = ""
    reason: str = ""
    dataset_source: str = ""          # data.SOURCES key: AMPTEACH_DATA, cache or bundled
    busy: bool = False                # the probe contradicted the hardware after PROBE_TRIES probes

    def fast_bf16(self, device: str = "cpu") -> bool:
        """The doctor's finding for device: native bf16 hardware AND, where the probe ran, a measured bf16 matmul
        faster than fp32's. Lessons make their speed claims conditional on this, not on a guess. On a machine the
        doctor found busy (the probe contradicting the hardware), the hardware decides."""
        measured = self.probe.get(device, {}).get("bf16")
        if device == "cuda":
            native = bool(self.cuda and self.cuda["tensor_cores"] and self.cuda["bf16"])
        else:
            native = any(self.cpu_flags.get(f) for f in ("avx512_bf16", "amx_bf16"))
        return native and (measured is None or measured > FASTER or self.busy)


def dataset_status() -> tuple[str, bool, tuple[int, int] | None, str]:
    """Where load_fashion_mnist() reads (data.find_data: $AMPTEACH_DATA, the cache, the bundled split), whether
    the four files are there, their image counts, and the source's name."""
    from ampteach.training.data import find_data, missing_files, read_idx_images

    source, root = find_data()
    if missing_files(root):
        return str(root), False, None, source
    try:
        counts = tuple(len(read_idx_images(root / f"{s}-images-idx3-ubyte.gz")) for s in ("train", "t10k"))
    except ValueError:
        return str(root), False, None, source
    return str(root), True, counts, source  # type: ignore[return-value]


def matmul_speedup(device: str, dtype: torch.dtype, n: int = 512, rounds: int = PROBE_ROUNDS,
                   min_seconds: float = 0.02) -> float:
    """best time(fp32 n x n matmul) / best time(dtype matmul) on device, over `rounds` interleaved rounds:
    > 1 means the half format is faster. On a CPU: one thread, timed by its own CPU time, so load from another
    process leaves the ratio alone (a GPU is timed by the wall clock, synchronised)."""
    from ampteach.lab.roofline import matmul_seconds

    threads = torch.get_num_threads()
    clock = "cpu" if device == "cpu" else "wall"
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        fp32 = half = float("inf")
        for _ in range(rounds):
            fp32 = min(fp32, matmul_seconds(n, torch.float32, device, min_seconds, clock))
            half = min(half, matmul_seconds(n, dtype, device, min_seconds, clock))
    finally:
        torch.set_num_threads(threads)
    return fp32 / half


def contradicts_hardware(cpu_flags: dict[str, bool] | None, kernels: dict[str, bool], bf16: float | None) -> bool:
    """Native bf16 flags and oneDNN's bf16 kernels, yet a bf16 matmul measured at the generic loop's speed
    (below GENERIC_LOOP x fp32): native kernels run from about half fp32's speed up, so the probe was disturbed."""
    native = bool(cpu_flags) and any(cpu_flags.get(f) for f in ("avx512_bf16", "amx_bf16"))
    return native and kernels.get("bf16", False) and bf16 is not None and bf16 < GENERIC_LOOP


def recommend(cuda: dict | None, cpu_flags: dict[str, bool] | None, probe: dict[str, dict[str, float]],
              busy: bool = False) -> tuple[str, str]:
    """(precision to use, why), from the hardware facts and the doctor's own measured probe."""
    if cuda is not None:
        return _recommend_cuda(cuda, probe.get("cuda", {}))
    if busy:
        bf16 = probe.get("cpu", {}).get("bf16", float("nan"))
        return BUSY, (f"this CPU has native bf16 and oneDNN's bf16 kernels, yet bf16 matmuls measured {bf16:.2f}x "
                      f"fp32's speed in {PROBE_TRIES} probes: another process is probably using the cores. Rerun "
                      f"`ampteach doctor` when the machine is quiet (on the hardware alone: bf16 autocast)")
    cpu = probe.get("cpu", {})
    bf16, fp16 = cpu.get("bf16"), cpu.get("fp16")
    native = [f.upper().replace("_", "-") for f in ("avx512_bf16", "amx_bf16") if cpu_flags and cpu_flags.get(f)]
    has = f"this CPU has native bf16 ({', '.join(native)})" if native else "this CPU has no native bf16 arithmetic"
    fp16_note = ""
    if fp16 and fp16 < 0.5:
        fp16_note = f"; fp16 autocast here runs {1 / fp16:.0f}x slower than fp32 (no native fp16)"
    if bf16 is None:  # not measured: go by the flags alone
        if native:
            return "bf16 autocast", f"{has} (flags only; run without --no-probe to measure it)"
        return "fp32", f"bf16 autocast on this CPU is slower than fp32: {has} (flags only, not measured)"
    if bf16 > FASTER:
        return "bf16 autocast", f"{has}: measured bf16 matmul {bf16:.1f}x fp32's speed{fp16_note}"
    kernel = (" (native bf16 instructions without AMX's matrix tiles need not beat fp32's AVX-512 kernels)"
              if native and "AMX-BF16" not in native else "")
    return "fp32", (f"bf16 autocast on this CPU is slower than fp32 (measured {bf16:.2f}x fp32's speed): {has}"
                    f"{kernel}. Run the lessons anyway (they teach numerics, not speed){fp16_note}")


def _recommend_cuda(cuda: dict, measured: dict[str, float]) -> tuple[str, str]:
    """The GPU's answer: tensor cores and native bf16 from the compute capability, speed from the probe."""
    name = f"{cuda['name']} (compute capability {cuda['capability']})"
    if not cuda["tensor_cores"]:
        return "fp32", f"{name} has no tensor cores: AMP saves activation memory but gives little speed"
    bf16, fp16 = measured.get("bf16"), measured.get("fp16")
    if cuda["bf16"] and (bf16 is None or bf16 > FASTER):
        speed = f": measured bf16 matmul {bf16:.1f}x fp32's speed" if bf16 else ""
        return "bf16 autocast", (f"{name} runs bf16 on tensor cores at fp16 speed with fp32's exponent range, so no "
                                 f"GradScaler is needed (fp16 + GradScaler works too){speed}")
    if fp16 is None or fp16 > FASTER:
        speed = f"; measured fp16 matmul {fp16:.1f}x fp32's speed" if fp16 else ""
        why = "has fp16 tensor cores but no native bf16 (that needs compute capability 8.0)" if not cuda["bf16"] \
            else f"measured bf16 matmul at only {bf16:.2f}x fp32's speed"
        return "fp16 autocast + GradScaler", f"{name} {why}: use fp16 and loss scaling{speed}"
    return "fp32", f"{name}: the probe measured no half-precision speed-up (fp16 {fp16:.2f}x fp32's speed)"


def collect(probe: bool = True) -> Report:
    cpu_name, flags = cpu_info()
    cuda = cuda_info()
    root, found, counts, source = dataset_status()
    speed: dict[str, dict[str, float]] = {}
    kernels = onednn_half()
    busy = False
    if probe:
        bf16 = matmul_speedup("cpu", torch.bfloat16)
        for _ in range(PROBE_TRIES - 1):  # a contradiction gets more probes before it counts
            if not contradicts_hardware(flags, kernels, bf16):
                break
            bf16 = max(bf16, matmul_speedup("cpu", torch.bfloat16))
        busy = contradicts_hardware(flags, kernels, bf16)
        speed["cpu"] = {"bf16": bf16, "fp16": matmul_speedup("cpu", torch.float16, n=256, rounds=3)}
        if cuda is not None:
            speed["cuda"] = {"fp16": matmul_speedup("cuda", torch.float16, n=4096)}
            if cuda["bf16"]:
                speed["cuda"]["bf16"] = matmul_speedup("cuda", torch.bfloat16, n=4096)
    rec, why = recommend(cuda, flags, speed, busy)
    return Report(
        python=platform.python_version(), torch=torch.__version__,
        platform=f"{platform.system()} {platform.machine()}", cpu_name=cpu_name,
        cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_flags=flags or {},
        threads=torch.get_num_threads(), cpu_count=os.cpu_count() or 1, cuda=cuda,
        dataset_root=root, dataset_found=found, dataset_counts=counts, dataset_source=source, probe=speed,
        onednn_half=kernels, recommendation=rec, reason=why, busy=busy,
    )


def format_report(r: Report, paths: bool = True) -> str:
    """The report as text; paths=False names where the data came from instead of the folder (for notebooks)."""
    yes = {True: "yes", False: "no"}
    lines = [
        f"Python         {r.python} ({r.platform})",
        f"torch          {r.torch}",
    ]
    if r.cuda:
        c = r.cuda
        lines += [
            f"GPU            {c['name']}, compute capability {c['capability']}, {c['memory_gib']} GiB, "
            f"CUDA {c['cuda']}",
            f"  tensor cores {yes[c['tensor_cores']]}",
            f"  bf16         {yes[c['bf16']]}",
        ]
    else:
        lines.append("GPU            none (torch.cuda.is_available() is False): everything runs on the CPU")
    flags = ", ".join(f"{f.upper().replace('_', '-')} {yes[v]}" for f, v in r.cpu_flags.items()) or "unknown on this OS"
    lines += [
        f"CPU            {r.cpu_name} (torch kernels: {r.cpu_capability})",
        f"  native half  {flags}",
        f"  threads      {r.threads} torch threads, {r.cpu_count} logical CPUs",
    ]
    if r.onednn_half:
        kernels = ", ".join(f"{k} {yes[v]}" for k, v in r.onednn_half.items())
        lines.append(f"  oneDNN half  {kernels} (PyTorch's fast CPU kernels for half-precision matmuls)")
    for device, speeds in r.probe.items():
        measured = ", ".join(f"{k} {v:.2f}x" for k, v in speeds.items())
        lines.append(f"  probe        {device} matmul speed vs fp32: {measured}")
    from ampteach.training.data import SOURCES

    named = SOURCES.get(r.dataset_source, "the folder")
    where = f"{named} ({r.dataset_root})" if paths and r.dataset_source != "bundled" else named
    if r.dataset_found:
        n_train, n_test = r.dataset_counts
        kind = ("the course subset" if (n_train, n_test) == (7000, 1226)
                else "the full dataset" if n_train == 60000 else "a copy")
        lines.append(f"Dataset        from {where}: {n_train} train / {n_test} test images ({kind})")
    else:
        lines.append(f"Dataset        not found in {where}: point AMPTEACH_DATA at a folder with the four "
                     f"FashionMNIST .gz files, or unset it to use the split bundled with ampteach")
    lines += [f"Recommended    {r.recommendation}", f"  why          {r.reason}"]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--no-probe", action="store_true", help="skip the ~1 s matmul speed probe")


def run(args) -> int:
    print(format_report(collect(probe=not args.no_probe)))
    return 0


