"""The tiny GPT on left-padded batches: a padding mask that breaks half-precision training, and the fix.

    from ampteach.lab.padded_gpt import PAD_MASKS, padded_text, padded_gpt
    data = padded_text(preload_text(load_shakespeare(), block_size=64, steps_per_epoch=10))
    model = padded_gpt(data, mask="add finfo(float32).min")     # the mask as many models build it
    history = train(model, data, TrainConfig(precision="fp16", batch_size=32))   # NaN: every step skipped

Batched prompts of different lengths are padded; left padding (as batched generation pads) puts a PAD token
before each shorter window. Here every window of a batch loses its first L characters to PAD, L drawn from
0 to max_pad, and their targets are ignored by the loss (-100, cross_entropy's ignore_index). The model
masks each query's future and every PAD key, so a query at a PAD position may see nothing at all:
    "add finfo(float32).min"        scores + m, m built once in fp32 (0 where allowed, -3.4e38 where not) and
                                    cast to the scores' dtype: -inf in fp16 and bf16, so a PAD query's row is all
                                    -inf, its softmax NaN, and the next layer spreads the NaN over the sequence
    "masked_fill finfo(dtype).min"  scores.masked_fill(~keep, finfo(scores.dtype).min): finite in every dtype, so
                                    a PAD query's softmax is uniform (its output is ignored anyway)
    "sdpa boolean mask"             F.scaled_dot_product_attention(q, k, v, attn_mask=keep): in the PyTorch this
                                    course runs, zeros for a query that may attend to nothing
In fp32 all three train alike. The ways of masking are ampteach.lab.attention_masks' (apply_mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from ampteach.lab.attention_masks import apply_mask
from ampteach.training.gpt import GPT, CausalSelfAttention
from ampteach.training.seeding import seed_everything
from ampteach.training.text import PreloadedText

__all__ = ["IGNORE", "PAD_MASKS", "PaddedGPT", "PaddedText", "padded_gpt", "padded_text"]

PAD_MASKS = ("add finfo(float32).min", "masked_fill finfo(dtype).min", "sdpa boolean mask")
IGNORE = -100          # F.cross_entropy's ignore_index: a PAD position's target counts for nothing


@dataclass
class PaddedText:
    """A PreloadedText whose windows are left-padded: the first L ids of each window are pad_id (L from 0 to
    max_pad, drawn per window), their targets IGNORE. Serves train() exactly as the text it wraps does."""

    text: PreloadedText
    max_pad: int = 16

    @property
    def pad_id(self) -> int:
        """One past the text's largest id: a token of its own (the model gets one more embedding row)."""
        return int(max(self.text.train_ids.max(), self.text.val_ids.max())) + 1

    @property
    def device(self) -> torch.device:
        return self.text.device

    @property
    def steps_per_epoch(self) -> int:
        return self.text.steps_per_epoch

    def num_batches(self, batch_size: int) -> int:
        return self.text.num_batches(batch_size)

    def batches(self, batch_size: int, shuffle: bool = True, seed: int | None = 0, split: str = "train",
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The wrapped text's batches, each window left-padded (the held-out ones the same way every time)."""
        gen = torch.Generator().manual_seed((seed or 0) + (0 if split == "train" else 10_000))
        for x, y in self.text.batches(batch_size, shuffle=shuffle, seed=seed, split=split, drop_last=drop_last):
            pads = torch.randint(self.max_pad + 1, (x.size(0), 1), generator=gen).to(x.device)
            padding = torch.arange(x.size(1), device=x.device) < pads          # (B, T): True at PAD positions
            yield x.masked_fill(padding, self.pad_id), y.masked_fill(padding, IGNORE)


def padded_text(text: PreloadedText, max_pad: int = 16) -> PaddedText:
    """text's windows, left-padded with up to max_pad PAD tokens each (see PaddedText)."""
    if not 0 < max_pad < text.block_size:
        raise ValueError(f"max_pad must be between 1 and block_size - 1 = {text.block_size - 1}, got {max_pad}")
    return PaddedText(text, max_pad)


class PaddedGPT(GPT):
    """The course GPT with a key-padding mask: no query attends a PAD key or a later one; `mask` says how.

        model = padded_gpt(data, mask="masked_fill finfo(dtype).min")
    """

    def __init__(self, vocab_size: int, pad_id: int, mask: str = "add finfo(float32).min", **gpt_options):
        if mask not in PAD_MASKS:
            raise ValueError(f"mask must be one of {PAD_MASKS}, got {mask!r}")
        super().__init__(vocab_size, **gpt_options)
        self.pad_id, self.mask = pad_id, mask

    def attend(self, attn: CausalSelfAttention, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """One block's attention of h (B, T, C) where keep (B, 1, T, T) allows: q kᵀ / √d, masked, softmax, @ v."""
        B, T, C = h.shape
        q, k, v = attn.c_attn(h).split(C, dim=2)
        q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
        if self.mask == "sdpa boolean mask":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            y = F.softmax(apply_mask(scores, keep, self.mask), dim=-1) @ v
        return attn.resid_dropout(attn.c_proj(y.transpose(1, 2).reshape(B, T, C)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
        keep = causal & (idx != self.pad_id)[:, None, None, :]                 # (B, 1, T, T)
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.blocks:
            x = x + self.attend(block.attn, block.ln_1(x), keep)
            x = x + block.mlp(block.ln_2(x))
        return self.lm_head(self.ln_f(x))


def padded_gpt(data: PaddedText, mask: str = "add finfo(float32).min", seed: int = 0, **gpt_options) -> PaddedGPT:
    """The course GPT for data's vocabulary and one PAD token, seeded, masking PAD keys the `mask` way."""
    seed_everything(seed)
    return PaddedGPT(data.pad_id + 1, data.pad_id, mask, block_size=data.text.block_size, **gpt_options)
