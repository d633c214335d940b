"""ampteach.autocast and ampteach.GradScaler as drop-ins on a transformer: torch.amp's numbers, bit for bit.

On the CPU, with the same inputs through torch.autocast and ampteach.autocast, the GPT's loss and every
gradient are identical, for bf16 and fp16 and both attention paths; train() through either impl gives the
same step losses, loss scales and weights. On CUDA (fake tensors without a GPU), every step through one
block has the same dtype under both.
"""

from __future__ import annotations

import pytest
import torch

import ampteach
from ampteach.lab.block_dtypes import CONFIGS, block_dtypes
from ampteach.training.config import TrainConfig
from ampteach.training.gpt import gpt
from ampteach.training.text import CharText, preload_text
from ampteach.training.train import cross_entropy, train

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def small(attention: str = "sdpa"):
    torch.manual_seed(0)
    return gpt(32, block_size=16, n_layer=2, n_head=2, n_embd=32, attention=attention)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_loss_and_every_gradient_match_torch_autocast_bit_for_bit(precision, attention):
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randint(32, (4, 16), generator=gen), torch.randint(32, (4, 16), generator=gen)
    ours, theirs = small(attention), small(attention)
    with torch.autocast("cpu", dtype=DTYPES[precision]):
        loss_torch = cross_entropy(theirs(x), y)
    loss_torch.backward()
    with ampteach.autocast("cpu", dtype=DTYPES[precision]):
        loss_ours = cross_entropy(ours(x), y)
    loss_ours.backward()
    assert loss_ours.dtype == loss_torch.dtype == torch.float32
    assert torch.equal(loss_ours, loss_torch)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_a_broken_cast_would_be_caught():
    """The comparison above can fail: fp32 instead of bf16 for one region changes the loss bits."""
    x = torch.randint(32, (4, 16), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = cross_entropy(small()(x), x)
    with ampteach.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        unmixed = cross_entropy(small()(x), x)
    assert not torch.equal(reference, unmixed)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_train_through_either_impl_gives_the_same_run(precision):
    data = preload_text(CharText("".join(chr(97 + (i * 7) % 26) for i in range(4000))), block_size=16,
                        steps_per_epoch=3, eval_windows=8)
    runs = {}
    for impl in ("torch", "ampteach"):
        model = small()
        config = TrainConfig(precision=precision, impl=impl, epochs=2, batch_size=4, progress=False, init_scale=2.0**14)
        runs[impl] = (train(model, data, config), model)
    (h_torch, m_torch), (h_ours, m_ours) = runs["torch"], runs["ampteach"]
    assert h_ours.step_loss == h_torch.step_loss and h_ours.val_loss == h_torch.val_loss
    assert h_ours.scales == h_torch.scales and h_ours.skipped == h_torch.skipped
    for a, b in zip(m_ours.parameters(), m_torch.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_step_of_a_block_has_torch_autocasts_dtype(config):
    device, dtype = CONFIGS[config]
    assert block_dtypes(device, dtype, impl="ampteach") == block_dtypes(device, dtype, impl="torch")


def test_the_dtype_table_differs_where_the_lists_differ():
    """softmax is on CUDA's fp32 list and on no CPU list (PyTorch's AMP op reference): the two tables, measured
    separately, must show it."""
    cpu, cuda = block_dtypes("cpu", torch.float16), block_dtypes("cuda", torch.float16)
    assert cpu["softmax"] == torch.float16 and cuda["softmax"] == torch.float32
    assert [p for p in cpu if cpu[p] != cuda[p]] == ["softmax"]
