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
from typing import Callable

import torch

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
    bit. Inductor without a C compiler: "no C compiler".
    """
    torch.manual_seed(0)
    a, b = torch.rand(8, 8), torch.rand(8, 8)
    rows = []
    for backend in backends:
        if backend == "inductor" and not has_c_compiler():
            rows.append([backend, "no C compiler", "no C compiler", "-", "-"])
            continue
        use_torch_kernels()
        theirs, graphs_t, breaks_t = compiled(_mm_in_a_region(torch.autocast), (a, b), backend)
        autocast_kernels.install()              # AOTAutograd then traces the casts through ampteach's kernels
        ours, graphs_a, breaks_a = compiled(_mm_in_a_region(autocast), (a, b), backend)
        rows.append([backend, str(theirs.dtype).removeprefix("torch."), str(ours.dtype).removeprefix("torch."),
                     f"{graphs_t} ({breaks_t}) / {graphs_a} ({breaks_a})",
                     "yes" if theirs.dtype == ours.dtype and torch.equal(theirs, ours) else "no"])
    torch._dynamo.reset()
    return rows
