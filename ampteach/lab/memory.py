"""Where training memory goes, per parameter: counted from the real tensors, between steps and during one.

    step = lambda: train_step(model, x, y, opt, scaler, config, master=master)
    used = measure_step(step, model)          # activations autograd saved; CUDA peak on a GPU
    b = memory_breakdown(model, opt, master)  # after a step, so grads and optimizer state exist
    b.per_param        # fp32 + AdamW: {'weights': 4.0, 'grads': 4.0, 'master': 0.0, ..., 'optimizer': 8.0}
    print(memory_table({"fp32": b32, "O2": b_o2}))
    peak = measure_peak(step, model, opt, master)   # bytes alive at the step's high point, any device

bytes(category) = sum of nbytes over the distinct storages its tensors live in (numel * element_size
for an ordinary tensor). Each storage counts once, in the first category that holds it: an fp32
parameter that is its own master adds nothing under "master". memory_breakdown is the steady state,
what a run holds between steps; measure_peak follows every tensor the step allocates and frees, so
it also sees what lives only inside the step (activations, autocast's half weight copies, the
optimizer's temporaries).
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = [
    "CATEGORIES", "PHASES", "MemoryBreakdown", "PeakMemory", "StepMemory", "measure_peak", "measure_step",
    "memory_breakdown", "memory_table", "plot_memory",
]

# In counting order: a storage already counted in an earlier category is not counted again.
CATEGORIES = ("weights", "grads", "master", "master_grads", "compensation", "optimizer")


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


class _StorageCounter:
    """Adds up storage bytes, each storage once (zero-byte storages are ignored)."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self.seen = {_storage_key(t) for t in exclude}

    def add(self, t: torch.Tensor | None) -> int:
        if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
            return 0
        key = _storage_key(t)
        if key in self.seen:
            return 0
        self.seen.add(key)
        return t.untyped_storage().nbytes()


@dataclass
class MemoryBreakdown:
    """Bytes held for a model's parameters, by category and by parameter name; buffers apart."""

    n_params: int                                           # parameter values (elements) in the model
    by_param: dict[str, dict[str, int]]                     # parameter name -> category -> bytes
    buffers: int = 0                                        # e.g. BatchNorm running statistics
    totals: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.totals = {c: sum(row[c] for row in self.by_param.values()) for c in CATEGORIES}

    @property
    def total(self) -> int:
        """All bytes counted: every category plus buffers."""
        return sum(self.totals.values()) + self.buffers

    @property
    def per_param(self) -> dict[str, float]:
        """Bytes per parameter value in each category (fp32 + AdamW: 4 + 4 + 8)."""
        return {c: b / self.n_params for c, b in self.totals.items()}


def memory_breakdown(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                     master=None) -> MemoryBreakdown:
    """Count the bytes of model's weights, grads, master copies, compensation buffers and optimizer state.

    master: a MasterWeights (fp32 copies) or a HalfWeights (working copies that exist only during a
    step, and Kahan compensation buffers). Measure after a training step: gradients and optimizer
    state (AdamW: exp_avg, exp_avg_sq, and a step counter per parameter) only exist once a step has
    made them.
    """
    counter = _StorageCounter()
    by_param: dict[str, dict[str, int]] = {}
    for name, category, t in _held_tensors(model, optimizer, master):
        row = by_param.setdefault(name, dict.fromkeys(CATEGORIES, 0))
        row[category] += counter.add(t)
    buffers = sum(counter.add(b) for b in model.buffers())
    return MemoryBreakdown(sum(p.numel() for p in model.parameters()), by_param, buffers)


def _held_tensors(model: nn.Module, optimizer, master) -> Iterator[tuple[str, str, torch.Tensor | None]]:
    """(parameter name, category, tensor or None) for everything held for each parameter, in CATEGORIES order."""
    for name, p in model.named_parameters():
        m = master.master_of(p) if master is not None and p.requires_grad else p
        compensation = getattr(master, "compensation_of", lambda _: None)(p) if p.requires_grad else None
        yield name, "weights", p
        yield name, "grads", p.grad
        yield name, "master", m
        yield name, "master_grads", m.grad
        yield name, "compensation", compensation
        for v in (optimizer.state.get(m, {}) if optimizer is not None else {}).values():
            yield name, "optimizer", v


@dataclass
class StepMemory:
    """What one training step used beyond the tensors memory_breakdown counts."""

    saved: int                     # bytes autograd saved for backward (activations), parameters excluded
    cuda_before: int | None = None  # torch.cuda.memory_allocated before the step (None off CUDA)
    cuda_peak: int | None = None    # torch.cuda.max_memory_allocated during the step (None off CUDA)
    tensors: list[tuple[tuple[int, ...], torch.dtype, int]] = field(default_factory=list)
    # what `saved` adds up, one entry per storage counted, in the order saved: (shape, dtype, bytes)


def measure_step(step: Callable[[], object], model: nn.Module,
                 device: torch.device | str | None = None) -> StepMemory:
    """Run step() once and measure it: activations saved for backward on any device; peak memory on CUDA.

        used = measure_step(lambda: train_step(model, x, y, opt, scaler, config), model)

    saved = sum of nbytes over the distinct storages autograd packed for backward, less the model's
    own parameters and buffers (counted by memory_breakdown): the layer inputs and outputs the
    backward pass needs, and under autocast the half copies of the weights. On a CUDA device (by
    default the model's), cuda_peak is torch.cuda.max_memory_allocated over the step, after
    resetting the peak; the step is synchronized before and after so the count covers all its work.
    tensors lists what saved adds up: (shape, dtype, bytes) per storage counted.
    """
    counter = _StorageCounter(exclude=[*model.parameters(), *model.buffers()])
    saved = 0

    tensors = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        added = counter.add(t)
        if added:
            saved += added
            tensors.append((tuple(t.shape), t.dtype, added))
        return t

    device = torch.device(device) if device is not None else next(model.parameters()).device
    on_cuda = device.type == "cuda" and torch.cuda.is_available()
    before = peak = None
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    if on_cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    return StepMemory(saved, before, peak, tensors)


PHASES = ("forward", "backward", "optimizer")


@dataclass
class PeakMemory:
    """Bytes of tensors alive during one training step, measured op by op (measure_peak)."""

    steady: int                         # held when the step began: memory_breakdown(...).total
    peak: int                           # the most bytes alive at once during the step
    peak_phase: str                     # where the peak came: "forward", "backward" or "optimizer"
    timeline: list[tuple[str, int]]     # (phase, bytes alive) after every op of the step
    n_params: int = 1

    @property
    def per_param(self) -> tuple[float, float]:
        """(steady, peak) in bytes per parameter value."""
        return self.steady / self.n_params, self.peak / self.n_params


def measure_peak(step: Callable[[], object], model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 master=None) -> PeakMemory:
    """Run step() once and follow every tensor it allocates and frees: the peak of a training step, on any device.

        peak = measure_peak(lambda: train_step(model, x, y, opt, scaler, config, master=master), model, opt, master)

    bytes alive = steady + what the step allocated and still holds - what it freed of the steady
    tensors (e.g. last step's gradients, freed by zero_grad). Allocations are seen as op outputs
    (a TorchDispatchMode), frees when a storage dies. Not counted: memory an op uses only inside its
    kernel, and tensors made before the step (its inputs x, y). The phase is "backward" while
    autograd's engine runs, "optimizer" after it.
    """
    steady = memory_breakdown(model, optimizer, master).total
    held = itertools.chain((t for _, _, t in _held_tensors(model, optimizer, master)), model.buffers())
    live = _LiveBytes(held, steady)      # a generator: no reference here may keep a tensor the step frees
    with live:
        step()
    return PeakMemory(steady, live.peak, live.peak_phase, live.timeline, sum(p.numel() for p in model.parameters()))


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of live storages: new op outputs are added, and any tracked storage that dies is taken off."""

    def __init__(self, held: Iterable[torch.Tensor | None], steady: int):
        super().__init__()
        self.live = self.peak = steady
        self.phase, self.peak_phase = "forward", "forward"
        self.timeline: list[tuple[str, int]] = []
        self._tracked: dict[tuple[str, int], weakref.finalize] = {}
        for t in held:
            self._track(t, count=False)            # already in steady: only their frees change the count

    def _track(self, t, count: bool = True) -> None:
        if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
            return
        storage = t.untyped_storage()
        key = _storage_key(t)
        if key in self._tracked:
            return
        self._tracked[key] = weakref.finalize(storage, self._free, key, storage.nbytes())
        if count:
            self.live += storage.nbytes()

    def _free(self, key: tuple[str, int], nbytes: int) -> None:
        self._tracked.pop(key, None)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs)):
            self._track(t, count=False)            # made before the step (its inputs): not the step's memory
        out = func(*args, **(kwargs or {}))
        in_backward = torch._C._current_graph_task_id() != -1
        if in_backward:
            self.phase = "backward"
        elif self.phase == "backward":
            self.phase = "optimizer"
        for t in tree_leaves(out):
            self._track(t)
        if self.live > self.peak:
            self.peak, self.peak_phase = self.live, self.phase
        self.timeline.append((self.phase, self.live))
        return out

    def __exit__(self, *exc):
        for finalizer in self._tracked.values():
            finalizer.detach()                     # storages that outlive the step no longer report here
        return super().__exit__(*exc)


def memory_table(breakdowns: dict[str, MemoryBreakdown], steps: dict[str, StepMemory] | None = None,
                 batch_size: int = 1) -> str:
    """A text table, one row per run: bytes per parameter value in each category and in all.

    With steps (measure_step results per run), two more columns: activations saved for backward in
    bytes per sample (saved / batch_size) and, where measured, the CUDA peak of the step in MiB.
    """
    header = ["", *CATEGORIES, "total"]
    if steps:
        header.append("saved/sample")
        if any(s.cuda_peak is not None for s in steps.values()):
            header.append("CUDA peak MiB")
    rows = [header]
    for label, b in breakdowns.items():
        per = b.per_param
        row = [label, *(f"{per[c]:.2f}" for c in CATEGORIES), f"{sum(per.values()):.2f}"]
        if steps:
            row.append(f"{steps[label].saved / batch_size:,.0f}")
            if len(header) > len(row):
                peak = steps[label].cuda_peak
                row.append("-" if peak is None else f"{peak / 2**20:,.1f}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
                     for r in rows)


def plot_memory(breakdowns: dict[str, MemoryBreakdown], peaks: dict[str, PeakMemory] | None = None):
    """Left: bytes per parameter held between steps, stacked by category (a dash at each run's peak);
    right: bytes per parameter alive after every op of one step, one line per run, forward and
    backward solid, optimizer dotted. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    from ampteach.lab.plots import course_style

    with course_style():
        fig, axes = plt.subplots(1, 2 if peaks else 1, figsize=(12 if peaks else 6, 3.6), squeeze=False)
        bars, labels = axes[0][0], list(breakdowns)
        bottom = [0.0] * len(labels)
        for category in CATEGORIES:
            values = [b.per_param[category] for b in breakdowns.values()]
            if any(values):
                bars.bar(labels, values, bottom=bottom, label=category)
                bottom = [b + v for b, v in zip(bottom, values)]
        if peaks:
            bars.plot(labels, [peaks[k].per_param[1] for k in labels], "_", color="black", ms=30, mew=2,
                      label="peak during a step")
        bars.set(ylabel="bytes per parameter", title="Held between steps")
        bars.tick_params(axis="x", labelsize=7)
        bars.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if peaks:
            line = axes[0][1]
            for i, (label, peak) in enumerate(peaks.items()):
                values = [b / peak.n_params for _, b in peak.timeline]
                last_pass = max(k for k, (phase, _) in enumerate(peak.timeline) if phase != "optimizer") + 1
                line.plot(range(last_pass), values[:last_pass], color=f"C{i}", label=label)
                line.plot(range(last_pass - 1, len(values)), values[last_pass - 1:], color=f"C{i}", ls=":")
            line.set(xlabel="op of one training step (solid: forward and backward, dotted: optimizer)",
                     ylabel="bytes per parameter alive", title="During one step")
            line.legend(fontsize=7)
        fig.tight_layout()
    return fig
