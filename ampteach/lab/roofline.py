"""The roofline: how fast this machine multiplies matrices in fp32, bf16 and fp16, and what limits it.

    $ ampteach roofline --device cpu --sizes 256,512,1024,2048 --out roofline.json
    from ampteach.lab.roofline import roofline_table, plot_roofline
    table = roofline_table("cpu", sizes=(128, 256, 512, 1024)); plot_roofline(table)

An (n x n) @ (n x n) matmul does 2n^3 flops and, at the least, reads two n x n inputs and writes one:
    intensity = 2n^3 / (3n^2 * bytes per element)                  flops per byte moved
    attainable GFLOP/s = min(compute roof, intensity * bandwidth)      the roofline (Williams et al. 2009)
Both roofs are measured here: the compute roof is the fastest matmul measured in each format, the
memory roof the bandwidth of a large copy (read + write). An elementwise x + y (op "add") does n^2
flops for 3n^2 elements moved: far left on the plot, under the memory roof.
"""

from __future__ import annotations

import torch

from ampteach.training.machine import best_seconds, describe_device, resolve_clock, resolve_device

__all__ = [
    "A100_QUOTED", "COLORS", "COPY_MIB", "DEFAULT_SIZES", "DTYPES", "add_seconds", "copy_bandwidth", "format_table",
    "intensity", "matmul_seconds", "measure", "plot_roofline", "ridge_point", "roofline_table", "speedups",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SIZES = {"cpu": (256, 512, 1024, 2048), "cuda": (1024, 2048, 4096, 8192)}
COPY_MIB = {"cpu": 256, "cuda": 1024}  # well past the last-level cache, so the copy measures memory
COLORS = {"fp32": "tab:blue", "tf32": "tab:purple", "bf16": "tab:orange", "fp16": "tab:green"}

# Vendor figures, quoted (not measured by this course): NVIDIA A100 datasheet, dense (no sparsity),
# https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
A100_QUOTED = {
    "name": "NVIDIA A100 80GB SXM, vendor figures (quoted, not measured)",
    "source": "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)",
    "bandwidth_gbs": 2039.0,
    "compute_gflops": {"fp32": 19_500.0, "tf32": 156_000.0, "bf16": 312_000.0, "fp16": 312_000.0},
}


def _op_seconds(op, n: int, dtype: torch.dtype, device: str, min_seconds: float, clock: str) -> float:
    """Best time of op(a, b, out=out) on two n x n tensors in dtype on device."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.zeros(n, n, device=device, dtype=dtype)  # touched: no page faults in the timing
    return best_seconds(lambda: op(a, b, out=out), device, min_seconds, clock)


def matmul_seconds(n: int, dtype: torch.dtype, device: str = "cpu", min_seconds: float = 0.2,
                   clock: str = "auto") -> float:
    """Best time of one (n x n) @ (n x n) matmul in dtype on device."""
    return _op_seconds(torch.mm, n, dtype, device, min_seconds, clock)


def add_seconds(n: int, dtype: torch.dtype, device: str = "cpu", min_seconds: float = 0.2,
                clock: str = "auto") -> float:
    """Best time of one elementwise add of two n x n tensors in dtype on device."""
    return _op_seconds(torch.add, n, dtype, device, min_seconds, clock)


def intensity(op: str, n: int, dtype: torch.dtype) -> float:
    """Flops per byte moved, with the least traffic there can be (each input read once, the output written once)."""
    nbytes = 3 * n * n * dtype.itemsize
    return (2 * n**3 if op == "matmul" else n * n) / nbytes


def measure(op: str, n: int, dtype_name: str, device: str = "cpu", min_seconds: float = 0.2,
            clock: str = "auto") -> dict:
    """One row of the table: {op, dtype, size, gflops, intensity, seconds}."""
    dtype = DTYPES[dtype_name]
    timer = matmul_seconds if op == "matmul" else add_seconds
    seconds = timer(n, dtype, device, min_seconds, clock)
    flops = 2 * n**3 if op == "matmul" else n * n
    return {"op": op, "dtype": dtype_name, "size": n, "gflops": flops / seconds / 1e9,
            "intensity": intensity(op, n, dtype), "seconds": seconds}


def copy_bandwidth(device: str = "cpu", mib: int | None = None, min_seconds: float = 0.2, clock: str = "auto") -> float:
    """GB/s of dst.copy_(src) on a buffer far larger than the caches, counting the bytes read and written."""
    n = (mib or COPY_MIB[device]) * 2**20 // 4
    src = torch.ones(n, device=device)
    dst = torch.zeros_like(src)  # touched now, so the first timed copy does not pay for page faults
    return 2 * src.nbytes / best_seconds(lambda: dst.copy_(src), device, min_seconds, clock) / 1e9


def roofline_table(device: str = "cpu", sizes: tuple[int, ...] | None = None, dtypes: tuple[str, ...] = tuple(DTYPES),
                   ops: tuple[str, ...] = ("matmul",), min_seconds: float = 0.2, max_seconds: float | None = None,
                   copy_mib: int | None = None, clock: str = "auto") -> dict:
    """Every (op, dtype, size) measured on device, plus the measured roofs; returns
    {"device", "settings", "peaks": {"bandwidth_gbs", "compute_gflops": {dtype: best matmul GFLOP/s}}, "rows",
    "skipped"}.

    max_seconds: once one call of a dtype takes longer than this, its larger sizes are skipped (and listed
    under "skipped"): a format this machine can only emulate can take minutes per matmul.
    clock: "auto", "wall" or "cpu" (see best_seconds); the table records the one used.
    """
    dev = resolve_device(device).type
    clock = resolve_clock(clock, dev)
    bad = [d for d in dtypes if d not in DTYPES] + [o for o in ops if o not in ("matmul", "add")]
    if bad:
        raise ValueError(f"unknown dtypes/ops {bad}: dtypes are {tuple(DTYPES)}, ops are ('matmul', 'add')")
    sizes = tuple(sorted(sizes or DEFAULT_SIZES[dev]))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive matrix sizes, got {sizes!r}")
    rows, skipped = [], []
    for op in ops:
        for name in dtypes:
            too_slow = False
            for n in sizes:
                if too_slow:
                    skipped.append({"op": op, "dtype": name, "size": n,
                                    "why": f"a smaller size took over {max_seconds} s"})
                    continue
                rows.append(measure(op, n, name, dev, min_seconds, clock))
                too_slow = max_seconds is not None and rows[-1]["seconds"] > max_seconds
    matmuls = [r for r in rows if r["op"] == "matmul"]
    peaks = {"bandwidth_gbs": copy_bandwidth(dev, copy_mib, min_seconds, clock),
             "compute_gflops": {d: max(r["gflops"] for r in matmuls if r["dtype"] == d)
                                for d in dtypes if any(r["dtype"] == d for r in matmuls)}}
    info = describe_device(torch.device(dev))
    if dev == "cuda":
        info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32  # fp32 rows are TF32 when True
    settings = {"sizes": list(sizes), "dtypes": list(dtypes), "ops": list(ops), "min_seconds": min_seconds,
                "max_seconds": max_seconds, "copy_mib": copy_mib or COPY_MIB[dev], "clock": clock}
    return {"device": info, "settings": settings, "peaks": peaks, "rows": rows, "skipped": skipped}


def speedups(table: dict, op: str = "matmul") -> dict[str, dict[int, float]]:
    """{dtype: {size: GFLOP/s / fp32's GFLOP/s at the same size}} for the half formats."""
    fp32 = {r["size"]: r["gflops"] for r in table["rows"] if r["op"] == op and r["dtype"] == "fp32"}
    out: dict[str, dict[int, float]] = {}
    for r in table["rows"]:
        if r["op"] == op and r["dtype"] != "fp32" and r["size"] in fp32:
            out.setdefault(r["dtype"], {})[r["size"]] = r["gflops"] / fp32[r["size"]]
    return out


def format_table(table: dict) -> str:
    """GFLOP/s per size and dtype (and vs fp32), then the measured roofs."""
    dev, peaks = table["device"], table["peaks"]
    dtypes = table["settings"]["dtypes"]
    clock = "" if table["settings"].get("clock", "wall") == "wall" else ", timed by CPU time"
    lines = [f"{dev['name']} ({dev['type']}), torch {dev['torch']}, {dev.get('threads', '?')} threads{clock}"]
    for op in table["settings"]["ops"]:
        lines.append(f"{op:7s} {'n':>5s} " + " ".join(f"{d + ' GFLOP/s':>13s}" for d in dtypes)
                     + "".join(f" {d + '/fp32':>10s}" for d in dtypes if d != "fp32"))
        cells = {(r["dtype"], r["size"]): r["gflops"] for r in table["rows"] if r["op"] == op}
        for n in table["settings"]["sizes"]:
            values = (f"{cells[d, n]:13.1f}" if (d, n) in cells else f"{'-':>13s}" for d in dtypes)
            line = f"{'':7s} {n:5d} " + " ".join(values)
            for d in dtypes:
                if d != "fp32":
                    ok = (d, n) in cells and ("fp32", n) in cells
                    line += f" {cells[d, n] / cells['fp32', n]:9.2f}x" if ok else f" {'-':>10s}"
            lines.append(line)
    roofs = ", ".join(f"{d} {g:,.1f}" for d, g in peaks["compute_gflops"].items())
    lines.append(f"measured roofs: memory {peaks['bandwidth_gbs']:.1f} GB/s "
                 f"(copy of {table['settings']['copy_mib']} MiB); "
                 f"compute (best matmul) GFLOP/s: {roofs}")
    for s in table.get("skipped", []):
        lines.append(f"skipped {s['op']} {s['dtype']} n={s['size']}: {s['why']}")
    return "\n".join(lines)


def ridge_point(peaks: dict, dtype: str) -> float:
    """The intensity (flops per byte) where the memory roof meets dtype's compute roof: below it, memory bounds."""
    return peaks["compute_gflops"][dtype] / peaks["bandwidth_gbs"]


def plot_roofline(table: dict | None = None, quoted: dict | None = None, ax=None, title: str | None = None):
    """Measured rows (circles: matmul, labelled with n; crosses: add) against the roofs, log-log: the memory
    roof in black, each format's compute roof in its colour from its ridge point on. quoted: vendor peaks
    (like A100_QUOTED), dotted and labelled as quoted. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.5))
    rows = table["rows"] if table else []
    lo, hi = 0.02, 3000.0
    for peaks, style, tag in ((table["peaks"] if table else None, "-", "measured"), (quoted, ":", "quoted")):
        if not peaks:
            continue
        bw, roofs = peaks["bandwidth_gbs"], peaks["compute_gflops"]
        top = max(roofs.values()) / bw  # the highest ridge point
        ax.plot([lo, top], [bw * lo, bw * top], style, color="black", lw=1.2,
                label=f"memory roof ({tag}): {bw:,.0f} GB/s")
        for d, roof in roofs.items():
            ax.plot([roof / bw, hi], [roof, roof], style, color=COLORS.get(d, "grey"), lw=1.2,
                    label=f"{d} roof ({tag}): {roof:,.0f} GFLOP/s")
    for r in rows:
        ax.plot(r["intensity"], r["gflops"], "o" if r["op"] == "matmul" else "x", color=COLORS[r["dtype"]], ms=6)
        if r["op"] == "matmul":
            ax.annotate(str(r["size"]), (r["intensity"], r["gflops"]), fontsize=7, xytext=(4, -3),
                        textcoords="offset points", color=COLORS[r["dtype"]])
    if rows:
        ax.plot([], [], "o", color="grey", label="matmul n x n (n beside it)")
        ax.plot([], [], "x", color="grey", label="add n x n")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (flops per byte moved)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title or (table["device"]["name"] if table else quoted["name"]), fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.2)
    return ax


