"""The dtype of every step through one GPT block under autocast: CPU bf16, and CUDA fp16 on fake tensors.

    from ampteach.lab.block_dtypes import POINTS, block_dtypes, plot_block_dtypes
    table = {config: block_dtypes(*CONFIGS[config]) for config in CONFIGS}   # config -> point -> dtype
    fig = plot_block_dtypes(table)                                        # a grid coloured by dtype

walk(model, idx, y) runs the GPT's forward (ampteach.training.gpt, explicit attention) one op at a
time and notes the dtype at every point: the same ops in the same order as model(idx), so it gives
the same logits (tests/test_gpt.py checks it bit for bit). Under autocast each op follows its cast
list: linear and matmul run in the half dtype on both devices; softmax, layer_norm and the loss are on
CUDA's fp32 list, while on the CPU softmax and layer_norm keep their input's dtype and only the loss
(cross_entropy) is on the fp32 list. CUDA without a GPU runs on fake tensors (dtypes are real, values
are not), as ampteach.lab.compare_torch does.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn

from ampteach.lab.compare_torch import fake_cuda, has_cuda, torch_autocast
from ampteach.lab.plots import FORMAT_COLORS, course_style
from ampteach.training.gpt import GPT, gpt

__all__ = ["CONFIGS", "POINTS", "block_dtypes", "dtype_table", "plot_block_dtypes", "sdpa_dtype", "walk"]

CONFIGS = {   # config -> (device, autocast dtype)
    "CPU, bf16 autocast": ("cpu", torch.bfloat16),
    "CPU, fp16 autocast": ("cpu", torch.float16),
    "CUDA, fp16 autocast": ("cuda", torch.float16),
}
POINTS = ("embeddings", "ln_1", "q, k, v = c_attn(...)", "q @ kᵀ", "× 1/√d", "masked_fill(-inf)", "softmax",
          "softmax @ v", "c_proj", "x + attention", "ln_2", "mlp Linear 1", "GELU", "mlp Linear 2", "x + mlp",
          "ln_f", "logits = lm_head(...)", "loss = cross_entropy(...)")
SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def walk(model: GPT, idx: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, torch.dtype], torch.Tensor, torch.Tensor]:
    """(dtype at each of POINTS in the first block, logits, loss): model's forward with explicit attention, op by op.

        seen, logits, loss = walk(model, idx, y)            # inside an autocast region, or not
    """
    seen: dict[str, torch.dtype] = {}

    def note(point: str, t: torch.Tensor) -> torch.Tensor:
        seen.setdefault(point, t.dtype)      # the first block's; later blocks repeat it
        return t

    T = idx.size(1)
    x = note("embeddings", model.drop(model.wte(idx) + model.wpe(torch.arange(T, device=idx.device))))
    for block in model.blocks:
        attn = block.attn
        h = note("ln_1", block.ln_1(x))
        B, _, C = h.shape
        qkv = note("q, k, v = c_attn(...)", attn.c_attn(h))
        q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in qkv.split(C, dim=2))
        scores = note("q @ kᵀ", q @ k.transpose(-2, -1))
        scores = note("× 1/√d", scores * (1.0 / math.sqrt(k.size(-1))))
        future = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
        scores = note("masked_fill(-inf)", scores.masked_fill(future, float("-inf")))
        p = note("softmax", F.softmax(scores, dim=-1))
        a = note("softmax @ v", p @ v).transpose(1, 2).reshape(B, T, C)
        x = note("x + attention", x + attn.resid_dropout(note("c_proj", attn.c_proj(a))))
        h = note("ln_2", block.ln_2(x))
        fc, act, proj, drop = block.mlp
        m = note("mlp Linear 2", proj(note("GELU", act(note("mlp Linear 1", fc(h))))))
        x = note("x + mlp", x + drop(m))
    logits = note("logits = lm_head(...)", model.lm_head(note("ln_f", model.ln_f(x))))
    loss = note("loss = cross_entropy(...)", F.cross_entropy(logits.flatten(0, -2), y.flatten()))
    return seen, logits, loss


class _Walk(nn.Module):
    """walk() as a module's forward, so torch.func.functional_call can run it on fake CUDA weights."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, y: torch.Tensor):
        return walk(self.model, idx, y)[0]


def _region(impl: str, device: str, dtype: torch.dtype, fake: bool):
    if impl == "torch":
        return torch_autocast(device, dtype)
    if impl == "ampteach":
        from ampteach.amp.autocast import autocast

        return autocast(device, dtype=dtype, fake_cuda=fake)
    raise ValueError(f"impl must be 'torch' or 'ampteach', got {impl!r}")


def block_dtypes(device: str = "cpu", dtype: torch.dtype = torch.bfloat16, vocab_size: int = 65,
                 block_size: int = 8, n_embd: int = 32, n_head: int = 2, impl: str = "torch") -> dict[str, torch.dtype]:
    """point -> dtype through a one-block GPT under autocast(device, dtype); fake CUDA tensors without a GPU.

    impl "torch" runs torch.autocast, "ampteach" ampteach.autocast (the same table, if the rebuild is right)."""
    fake = device == "cuda" and not has_cuda()
    torch.manual_seed(0)
    model = gpt(vocab_size, block_size, n_layer=1, n_head=n_head, n_embd=n_embd, attention="explicit")
    if fake:
        shapes = {f"model.{k}": v.shape for k, v in model.named_parameters()}   # tied weights listed once
        with fake_cuda():
            state = {k: torch.empty(s, device="cuda") for k, s in shapes.items()}
            idx = torch.zeros(2, block_size, dtype=torch.int64, device="cuda")
            with _region(impl, device, dtype, fake):
                return torch.func.functional_call(_Walk(model), state, (idx, idx))
    model = model.to(device)
    idx = torch.randint(vocab_size, (2, block_size), device=device)
    with _region(impl, device, dtype, fake):
        return walk(model, idx, idx)[0]


def sdpa_dtype(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The dtype F.scaled_dot_product_attention returns under autocast(device, dtype) for fp32 q, k, v."""
    region = fake_cuda() if device == "cuda" and not has_cuda() else torch.no_grad()
    with region:
        q = torch.randn(1, 2, 4, 8, device=device)
        with torch_autocast(device, dtype):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True).dtype


def dtype_table(table: dict[str, dict[str, torch.dtype]]) -> str:
    """The table as text: one row per point, one column per config."""
    configs = list(table)
    lines = [f"{'':26s}" + "".join(f"{c:>22s}" for c in configs)]
    for point in POINTS:
        lines.append(f"{point:26s}" + "".join(f"{SHORT.get(table[c][point], str(table[c][point])):>22s}"
                                              for c in configs))
    return "\n".join(lines)


def plot_block_dtypes(table: dict[str, dict[str, torch.dtype]]) -> Figure:
    """A grid: rows are the points of one block in order, columns the configs, each cell coloured by its dtype."""
    configs = list(table)
    with course_style():
        fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(configs), 0.32 * len(POINTS) + 0.9))
        for col, config in enumerate(configs):
            for row, point in enumerate(POINTS):
                name = SHORT.get(table[config][point], "?")
                ax.add_patch(plt.Rectangle((col, row), 0.94, 0.9, color=FORMAT_COLORS.get(name, "0.6"), alpha=0.8))
                ax.text(col + 0.47, row + 0.45, name, ha="center", va="center", fontsize=8,
                        color="white" if name == "fp32" else "black")
        ax.set_xlim(0, len(configs))
        ax.set_ylim(len(POINTS), 0)
        ax.set_xticks([c + 0.47 for c in range(len(configs))], configs)
        ax.xaxis.tick_top()
        ax.set_yticks([r + 0.45 for r in range(len(POINTS))], POINTS)
        ax.tick_params(length=0)
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
        ax.set_title("dtype of each step's output through one block, logits and loss", loc="left", pad=24)
        fig.tight_layout()
    return fig
