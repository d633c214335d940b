"""A tiny GPT: a decoder-only, pre-LayerNorm transformer over characters, in the shape of nanoGPT.

    text = load_shakespeare()
    model = gpt(len(text.vocab))                          # 4 layers, 4 heads, 128 wide, context 64: 0.8M parameters
    logits = model(ids)                                   # (B, T) int64 -> (B, T, vocab_size)
    print(text.decode(model.generate(text.encode("ROMEO:"), 200, generator=torch.Generator().manual_seed(0))))

One block, pre-norm (each sublayer reads a LayerNorm of the residual stream and adds back to it):
    x = x + attention(ln_1(x))          attention = softmax(q kᵀ / √d + causal mask) v, per head
    x = x + mlp(ln_2(x))                mlp = Linear(4C) -> GELU -> Linear(C)
then a final LayerNorm and a linear head that shares the token embedding's weight (weight tying).

Attention has two paths. attention="sdpa" calls F.scaled_dot_product_attention (what real models use;
it scales q and k before their product). attention="explicit" writes the steps out as nanoGPT's
fallback does, in the order that overflows fp16 (lesson 9):
    scores = (q @ kᵀ) * (1 / √d);  scores.masked_fill(future, -inf);  softmax;  @ v
The shape follows karpathy/nanoGPT's model.py (GPT-2's, small); the code here is the course's own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_PATHS", "GPT", "Block", "CausalSelfAttention", "explicit_attention", "gpt"]

ATTENTION_PATHS = ("sdpa", "explicit")


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out, scaled AFTER the matmul (nanoGPT's order), for q, k, v of shape (B, H, T, d).

        y = explicit_attention(q, k, v)          # = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    softmax(q kᵀ / √d, masked to the past) v. q kᵀ is formed before the 1/√d scale, so in fp16 it is the
    unscaled product that must fit under 65504.
    """
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one Linear makes q, k and v, another mixes the heads' outputs."""

    def __init__(self, n_embd: int, n_head: int, attention: str = "sdpa", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be a multiple of n_head={n_head} (each head gets n_embd / n_head)")
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        self.n_head, self.attention, self.dropout = n_head, attention, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)                     # each (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d)
        if self.attention == "sdpa":
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            y = explicit_attention(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)                        # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    """x + attention(ln_1(x)), then + mlp(ln_2(x)): one pre-LayerNorm transformer block."""

    def __init__(self, n_embd: int, n_head: int, attention: str = "sdpa", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, attention, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=bias), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token + position embeddings -> n_layer Blocks -> LayerNorm -> linear head (tied to the token embedding)."""

    def __init__(self, vocab_size: int, block_size: int = 64, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
                 attention: str = "sdpa", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if min(vocab_size, block_size, n_layer, n_head, n_embd) < 1:
            raise ValueError(f"vocab_size, block_size, n_layer, n_head and n_embd must all be >= 1, got "
                             f"{(vocab_size, block_size, n_layer, n_head, n_embd)}")
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)                  # token embedding
        self.wpe = nn.Embedding(block_size, n_embd)                  # position embedding
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, attention, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight                        # weight tying, as GPT-2 and nanoGPT
        self.apply(self._init_weights)
        for block in self.blocks:                                    # GPT-2: residual projections scaled by depth
            for proj in (block.attn.c_proj, block.mlp[2]):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def attention(self) -> str:
        """"sdpa" or "explicit": which attention path every block takes (settable)."""
        return self.blocks[0].attn.attention

    @attention.setter
    def attention(self, path: str) -> None:
        if path not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {path!r}")
        for block in self.blocks:
            block.attn.attention = path

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2 or idx.dtype != torch.int64:
            raise ValueError(f"GPT takes (batch, time) int64 token ids, got {tuple(idx.shape)} {idx.dtype}; "
                             f"encode text with load_shakespeare().encode(...) and add a batch dimension")
        T = idx.size(1)
        if T > self.block_size:
            raise ValueError(f"a sequence of {T} tokens is longer than the model's context of {self.block_size} "
                             f"(block_size): crop it to the last {self.block_size} tokens")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue idx ((T,) or (B, T) ids) by max_new_tokens sampled tokens; returns the ids, prompt included.

            out = model.generate(text.encode("ROMEO:"), 200, generator=torch.Generator().manual_seed(0))

        Each new token is drawn from softmax(logits / temperature) of the last position (top_k: only the k
        most likely), with the model reading at most its last block_size tokens.
        """
        squeeze = idx.dim() == 1
        idx = idx[None] if squeeze else idx
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.block_size:])[:, -1, :].float() / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        self.train(was_training)
        return idx[0] if squeeze else idx


def gpt(vocab_size: int, block_size: int = 64, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
        attention: str = "sdpa", dropout: float = 0.0, bias: bool = True) -> GPT:
    """The course's tiny GPT: (B, T) int64 ids -> (B, T, vocab_size) logits. See the module docstring.

        model = gpt(65)                                   # Shakespeare's 65 characters, 0.8M parameters
        model = gpt(65, attention="explicit")             # q @ kᵀ, scale, mask, softmax, @ v written out
    """
    return GPT(vocab_size, block_size, n_layer, n_head, n_embd, attention, dropout, bias)
