"""Autocast under torch.compile: what each backend makes of a region, for torch.autocast and ampteach.autocast.

    rows = compile_table()            # [backend, torch.autocast's result, ampteach.autocast's, graphs, same bits]
    out, graphs, breaks = compiled(fn, (a, b), backend="aot_eager")   # run fn compiled, count graphs and breaks

Under torch.compile, dynamo records a region's enter and exit in the graph and the backend replays
them: "eager" runs the graph's ops one by one inside the region, "aot_eager" and "inductor" have
AOTAutograd trace them through the Autocast key first, so the casts are explicit ops of the graph
(inductor then generates C++ for them, which needs a C compiler on a CPU). The torch side runs on
torch's own kernels (ampteach.lab.compare_torch.use_torch_kernels).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Callable

import torch
from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

from ampteach.amp import autocast_kernels
from ampteach.amp.autocast import autocast
from ampteach.lab.compare_torch import use_torch_kernels

__all__ = ["BACKENDS", "compile_table", "compiled", "has_c_compiler"]

BACKENDS = ("eager", "aot_eager", "inductor")


def has_c_compiler() -> bool:
    """Whether inductor can build CPU kernels here (it calls a C++ compiler: g++, clang++ or c++)."""
    return any(shutil.which(name) for name in ("g++", "clang++", "c++"))


def compiled(fn: Callable, args: tuple, backend: str = "eager", fullgraph: bool = False) -> tuple:
    """fn(*args) compiled afresh with `backend`: (its output, graphs compiled, graph breaks)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounterWithBackend(backend)
    out = torch.compile(fn, backend=counter, fullgraph=fullgraph)(*args)
    return out, counter.frame_count, sum(counters["graph_break"].values())


def _mm_in_a_region(region: Callable) -> Callable:
    def fn(a, b):
        with region("cpu", dtype=torch.bfloat16):
            return torch.mm(a, b)
    return fn


def compile_table(backends: tuple[str, ...] = BACKENDS) -> list[list[str]]:
    """torch.mm in a bf16 region, compiled with each backend: the output dtype under each implementation.

    A row: backend, torch.autocast's dtype (on torch's kernels), ampteach.autocast's (with ampteach's
    kernels registered), graphs (and breaks) of each, and whether the two outputs are equal bit for
    bit. Inductor without a C compiler: "no C compiler"; a backend that fails to compile here:
    "fails (<error>)". Inductor caches in a fresh folder (its usual cache may hold code built under
    other CPU settings, such as ATEN_CPU_CAPABILITY, which computes other bits).
    """
    with tempfile.TemporaryDirectory() as folder, temporary_cache_dir(folder):
        return _compile_rows(backends)


def _compile_rows(backends: tuple[str, ...]) -> list[list[str]]:
    torch.manual_seed(0)
    a, b = torch.rand(8, 8), torch.rand(8, 8)
    rows = []
    for backend in backends:
        if backend == "inductor" and not has_c_compiler():
            rows.append([backend, "no C compiler", "no C compiler", "-", "-"])
            continue
        results = []
        for region in (torch.autocast, autocast):
            if region is torch.autocast:
                use_torch_kernels()
            else:
                autocast_kernels.install()      # AOTAutograd then traces the casts through ampteach's kernels
            try:
                results.append(compiled(_mm_in_a_region(region), (a, b), backend))
            except Exception as exc:   # noqa: BLE001  (a backend that cannot compile here is a row too)
                results.append((f"fails ({type(exc.__cause__ or exc).__name__})", "-", "-"))
        (theirs, graphs_t, breaks_t), (ours, graphs_a, breaks_a) = results
        same = isinstance(theirs, torch.Tensor) and isinstance(ours, torch.Tensor) and theirs.dtype == ours.dtype \
            and torch.equal(theirs, ours)
        rows.append([backend, _dtype_or(theirs), _dtype_or(ours), f"{graphs_t} ({breaks_t}) / {graphs_a} ({breaks_a})",
                     "yes" if same else "no"])
    torch._dynamo.reset()
    return rows


def _dtype_or(result) -> str:
    return str(result.dtype).removeprefix("torch.") if isinstance(result, torch.Tensor) else result
