"""Tiny Shakespeare as characters: the text, its 65-character vocabulary, and batches of windows for train().

    text = load_shakespeare()                       # bundled with ampteach: offline, from any directory
    text.vocab[:12], len(text.vocab)                # the 65 characters, sorted
    ids = text.encode("ROMEO:"); text.decode(ids)   # str <-> int64 ids (index into vocab)
    text.train, text.val                            # the first 90% / last 10% of the text, as int64 ids
    data = preload_text(text, block_size=64)        # what train() reads, as it reads preload()'s FashionMNIST
    for x, y in data.batches(32, seed=0): ...       # x: (32, 64) ids, y: x shifted by one character

A language model predicts each next character: for a window x = ids[i : i + T] the targets are
y = ids[i + 1 : i + T + 1], so one window of T characters is T predictions (cross-entropy in nats per
character; a model that knows nothing scores ln 65 = 4.17).

The text is the one nanoGPT's `shakespeare_char` example trains on (karpathy/char-rnn's
data/tinyshakespeare/input.txt, public domain), shipped gzipped in ampteach/datasets/tinyshakespeare/
with its provenance; its sha256 is checked at every load.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from ampteach.training.data import DataFileError, DatasetNotFoundError

__all__ = ["BUNDLED_TEXT", "SHAKESPEARE_SHA256", "CharText", "PreloadedText", "load_shakespeare", "preload_text"]

BUNDLED_TEXT = "datasets/tinyshakespeare/input.txt.gz"     # inside the ampteach package
# sha256 of the uncompressed input.txt (1,115,394 bytes), as its provenance README states it
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TRAIN_FRACTION = 0.9                                        # nanoGPT's split: first 90% train, last 10% val


class CharText:
    """A text as character ids: .text, .vocab (sorted characters), .encode, .decode, .train and .val."""

    def __init__(self, text: str, train_fraction: float = TRAIN_FRACTION):
        if not text:
            raise ValueError("the text is empty: a character model needs at least one character to learn from")
        if not 0 < train_fraction < 1:
            raise ValueError(f"train_fraction must be between 0 and 1 (the rest is validation), got {train_fraction}")
        self.text = text
        self.vocab: list[str] = sorted(set(text))
        self._index = {ch: i for i, ch in enumerate(self.vocab)}
        ids = self.encode(text)
        n = int(train_fraction * len(ids))
        self.train, self.val = ids[:n], ids[n:]

    def encode(self, s: str) -> torch.Tensor:
        """The int64 ids of s's characters (each the character's index in vocab)."""
        try:
            return torch.tensor([self._index[ch] for ch in s], dtype=torch.int64)
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} is not in this text's vocabulary of {len(self.vocab)} characters; "
                             f"encode only characters of the text (see .vocab)") from None

    def decode(self, ids) -> str:
        """The string of the ids (a tensor or a list of ints)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        return "".join(self.vocab[i] for i in ids)

    def __repr__(self) -> str:
        return (f"CharText({len(self.text):,} characters, vocab of {len(self.vocab)}, "
                f"train {len(self.train):,} / val {len(self.val):,})")


def bundled_text_path() -> Path:
    """The gzipped tiny Shakespeare shipped inside the package (found with importlib.resources)."""
    path = importlib.resources.files("ampteach").joinpath(BUNDLED_TEXT)
    if not isinstance(path, Path):   # a zipped install: open it as a resource instead
        raise DatasetNotFoundError(f"ampteach is installed as a zip archive, so {BUNDLED_TEXT} is not a file on disk; "
                                   f"install it unzipped (pip install ampteach) or pass path= to a copy of input.txt")
    return path


def load_shakespeare(path: str | os.PathLike | None = None) -> CharText:
    """Tiny Shakespeare (1,115,394 characters), checked against its sha256, as a CharText.

        text = load_shakespeare()                  # the copy bundled with ampteach (offline)
        text = load_shakespeare("input.txt")       # your own copy (plain or .gz); it must be the same text

    A truncated or corrupt copy raises DataFileError naming the file and the expected sha256.
    """
    path = Path(path).expanduser() if path is not None else bundled_text_path()
    if not path.is_file():
        raise DatasetNotFoundError(f"{path} does not exist; call load_shakespeare() without a path to read the copy "
                                   f"bundled with ampteach")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":                  # gzip's magic number
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataFileError(f"{path} is not a readable gzip file ({exc.__class__.__name__}: {exc}): it is truncated "
                            f"or corrupt. Expected tiny Shakespeare, sha256 {SHAKESPEARE_SHA256} uncompressed; "
                            f"reinstall ampteach (pip install --force-reinstall ampteach) or pass path= to a good "
                            f"copy") from exc
    got = hashlib.sha256(raw).hexdigest()
    if got != SHAKESPEARE_SHA256:
        raise DataFileError(f"{path} holds {len(raw):,} bytes with sha256 {got}, but tiny Shakespeare "
                            f"(1,115,394 bytes) has sha256 {SHAKESPEARE_SHA256}: the copy is truncated or corrupt. "
                            f"Reinstall ampteach (pip install --force-reinstall ampteach) or pass path= to a good "
                            f"copy of input.txt")
    return CharText(raw.decode("utf-8"))


@dataclass
class PreloadedText:
    """A text's ids on one device, served as the training loop's batches of windows (see preload_text)."""

    train_ids: torch.Tensor
    val_ids: torch.Tensor
    block_size: int = 64
    steps_per_epoch: int = 100
    eval_windows: int = 256

    @property
    def device(self) -> torch.device:
        return self.train_ids.device

    def num_batches(self, batch_size: int) -> int:
        """Training batches in one epoch: steps_per_epoch, whatever the batch size (windows are drawn, not split)."""
        return self.steps_per_epoch

    def _windows(self, ids: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts.to(ids.device)[:, None] + torch.arange(self.block_size, device=ids.device)
        return ids[idx], ids[idx + 1]

    def batches(self, batch_size: int, shuffle: bool = True, seed: int | None = 0, split: str = "train",
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (x, y) batches of windows, x (batch_size, block_size) ids and y = x shifted by one character.

        split "train": steps_per_epoch batches of windows starting at random places drawn on the CPU from
        `seed` (shuffle=True), or of consecutive windows from the start of the text (shuffle=False).
        split "val" (or "test", the loop's name for held-out data): the same eval_windows windows every time,
        evenly spaced over the validation text, in batches of batch_size. Every batch is full (drop_last has
        nothing to drop; it is accepted so code written for preload()'s batches runs unchanged).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if split == "train":
            span = len(self.train_ids) - self.block_size
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            for step in range(self.steps_per_epoch):
                if shuffle:
                    starts = torch.randint(span, (batch_size,), generator=gen)
                else:
                    starts = (torch.arange(batch_size) + step * batch_size) * self.block_size % span
                yield self._windows(self.train_ids, starts)
        elif split in ("val", "test"):
            starts = torch.linspace(0, len(self.val_ids) - self.block_size - 1, self.eval_windows).long()
            for i in range(0, self.eval_windows, batch_size):
                yield self._windows(self.val_ids, starts[i:i + batch_size])
        else:
            raise ValueError(f"split must be 'train' or 'val' ('test' is the same held-out windows), got {split!r}")


def preload_text(text: CharText, block_size: int = 64, steps_per_epoch: int = 100, eval_windows: int = 256,
                 device: str | torch.device = "cpu") -> PreloadedText:
    """text's ids on device, for train(): an epoch is steps_per_epoch random batches of windows of block_size.

        data = preload_text(load_shakespeare(), block_size=64, steps_per_epoch=50)
        history = train(gpt(65), data, TrainConfig(precision="bf16", epochs=6, batch_size=32))
        history.val_loss          # mean cross-entropy per character on eval_windows fixed validation windows

    A text has no natural epoch (nanoGPT counts iterations), so an "epoch" here is steps_per_epoch steps, after
    each of which train() measures the validation loss.
    """
    if block_size < 1 or steps_per_epoch < 1 or eval_windows < 1:
        raise ValueError(f"block_size, steps_per_epoch and eval_windows must be >= 1, got "
                         f"{block_size}, {steps_per_epoch}, {eval_windows}")
    if min(len(text.train), len(text.val)) <= block_size + 1:
        raise ValueError(f"block_size={block_size} needs more than {block_size + 1} characters in each split; "
                         f"the text has {len(text.train)} train and {len(text.val)} validation characters")
    return PreloadedText(text.train.to(device), text.val.to(device), block_size, steps_per_epoch, eval_windows)
