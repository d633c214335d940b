"""The padded GPT: left padding, a PAD key mask built three ways, and what each does in half precision."""

from __future__ import annotations

import math

import pytest
import torch

from ampteach.lab.padded_gpt import IGNORE, PAD_MASKS, padded_gpt, padded_text
from ampteach.training.config import TrainConfig
from ampteach.training.text import CharText, preload_text
from ampteach.training.train import cross_entropy, train

TEXT = CharText("to be or not to be, that is the question. " * 40)


def tiny(mask: str, data):
    return padded_gpt(data, mask, n_layer=2, n_head=2, n_embd=16)


@pytest.fixture
def data():
    return padded_text(preload_text(TEXT, block_size=16, steps_per_epoch=3, eval_windows=8), max_pad=6)


def test_windows_are_left_padded_and_their_targets_ignored(data):
    x, y = next(iter(data.batches(8, seed=0)))
    pad = x == data.pad_id
    assert data.pad_id == len(TEXT.vocab) and pad.any() and not pad[:, 6:].any()
    assert torch.equal(pad, y == IGNORE)
    for row in pad:                                       # the PAD tokens come first, then the text
        assert not row[int(row.sum()):].any()
    again = next(iter(data.batches(8, split="val")))[0]
    assert torch.equal(again, next(iter(data.batches(8, split="val")))[0])   # held-out padding is fixed


def test_in_fp32_every_mask_gives_the_same_loss(data):
    x, y = next(iter(data.batches(8, seed=1)))
    losses = [cross_entropy(tiny(mask, data)(x), y).item() for mask in PAD_MASKS]
    assert all(math.isfinite(v) for v in losses)
    assert max(losses) - min(losses) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finfo_float32_min_turns_a_half_forward_nan_and_the_fixes_do_not(data, dtype):
    x, _ = next(iter(data.batches(8, seed=1)))
    with torch.autocast("cpu", dtype=dtype):
        logits = {mask: tiny(mask, data)(x) for mask in PAD_MASKS}
    padded = (x == data.pad_id).any(1)                    # a window with no padding never meets the NaN
    assert padded.any() and not padded.all()
    broken = torch.isnan(logits["add finfo(float32).min"]).flatten(1)
    assert broken[padded].all() and not broken[~padded].any()   # every position of a padded window
    assert torch.isfinite(logits["masked_fill finfo(dtype).min"]).all()
    assert torch.isfinite(logits["sdpa boolean mask"]).all()


def test_fp16_training_with_the_float32_mask_skips_every_step_and_with_the_fix_learns(data):
    config = TrainConfig(precision="fp16", epochs=2, batch_size=8, progress=False)
    broken = train(tiny("add finfo(float32).min", data), data, config)
    fixed = train(tiny("masked_fill finfo(dtype).min", data), data, config)
    assert broken.skipped_steps == 6 and all(math.isnan(v) for v in broken.val_loss)
    assert fixed.skipped_steps < 6 and fixed.val_loss[-1] < math.log(len(TEXT.vocab))


def test_bad_arguments_say_what_to_do(data):
    with pytest.raises(ValueError, match="mask must be one of"):
        tiny("add -inf", data)
    with pytest.raises(ValueError, match="max_pad"):
        padded_text(preload_text(TEXT, block_size=16), max_pad=16)
