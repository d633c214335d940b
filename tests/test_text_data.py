"""Tiny Shakespeare: the bundled copy, its checksum, the character vocabulary, and the loop's batches of windows."""

from __future__ import annotations

import gzip
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ampteach.training.data import DataFileError, DatasetNotFoundError
from ampteach.training.text import (
    SHAKESPEARE_SHA256,
    CharText,
    bundled_text_path,
    load_shakespeare,
    preload_text,
)

ROOT = Path(__file__).parents[1]
BUNDLED = ROOT / "ampteach" / "datasets" / "tinyshakespeare"
SHARED = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


@pytest.fixture(scope="module")
def text() -> CharText:
    return load_shakespeare()


def test_the_readme_states_the_checksums_of_what_is_shipped():
    readme = (BUNDLED / "README.md").read_text()
    sums = dict((name, digest) for digest, name in re.findall(r"([0-9a-f]{64})  (\S+)", readme))
    assert sums["input.txt"] == SHAKESPEARE_SHA256
    assert sums["input.txt.gz"] == hashlib.sha256((BUNDLED / "input.txt.gz").read_bytes()).hexdigest()
    raw = gzip.decompress((BUNDLED / "input.txt.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == SHAKESPEARE_SHA256
    assert f"{len(raw):,} bytes" in readme


@pytest.mark.skipif(not SHARED.is_file(), reason="the course's shared data folder is not beside this checkout")
def test_the_bundled_text_is_the_shared_copy_byte_for_byte(text):
    assert text.text.encode() == SHARED.read_bytes()


def test_vocab_split_and_round_trip(text):
    assert text.vocab == sorted(set(text.text)) and len(set(text.vocab)) == len(text.vocab)
    assert len(text.train) == int(0.9 * len(text.text)) and len(text.train) + len(text.val) == len(text.text)
    assert text.train.dtype == text.val.dtype == torch.int64
    assert text.decode(text.train[:200]) == text.text[:200]
    assert text.decode(text.val[-100:].tolist()) == text.text[-100:]
    assert [text.vocab[i] for i in text.encode("ROMEO:").tolist()] == list("ROMEO:")
    with pytest.raises(ValueError, match="not in this text's vocabulary"):
        text.encode("é")


def test_any_text_becomes_a_char_text():
    t = CharText("abcabcab", train_fraction=0.5)
    assert t.vocab == ["a", "b", "c"] and t.train.tolist() == [0, 1, 2, 0] and t.val.tolist() == [1, 2, 0, 1]
    with pytest.raises(ValueError, match="empty"):
        CharText("")
    with pytest.raises(ValueError, match="between 0 and 1"):
        CharText("abc", train_fraction=1.0)


def test_loads_from_any_directory_in_a_fresh_process(tmp_path):
    code = "import ampteach; t = ampteach.load_shakespeare(); print(len(t.text), len(t.vocab))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    n = len(gzip.decompress((BUNDLED / "input.txt.gz").read_bytes()).decode())
    assert out.stdout.split() == [str(n), str(len(load_shakespeare().vocab))]


def test_a_plain_or_gzipped_copy_loads_the_same(tmp_path):
    raw = gzip.decompress(bundled_text_path().read_bytes())
    (tmp_path / "input.txt").write_bytes(raw)
    assert load_shakespeare(tmp_path / "input.txt").text == load_shakespeare().text


@pytest.mark.parametrize("damage", ["truncated gzip", "bit flip in gzip", "text cut short", "text edited"])
def test_a_damaged_copy_names_the_file_and_the_checksum(tmp_path, damage):
    packed = bundled_text_path().read_bytes()
    raw = gzip.decompress(packed)
    path = tmp_path / "copy.gz"
    if damage == "truncated gzip":
        path.write_bytes(packed[: len(packed) // 2])
    elif damage == "bit flip in gzip":
        path.write_bytes(packed[:1000] + bytes([packed[1000] ^ 0x10]) + packed[1001:])
    elif damage == "text cut short":
        path = tmp_path / "input.txt"
        path.write_bytes(raw[:-10])
    else:
        path = tmp_path / "input.txt"
        path.write_bytes(raw.replace(b"ROMEO", b"JULIET", 1))
    with pytest.raises(DataFileError) as err:
        load_shakespeare(path)
    assert str(path) in str(err.value) and SHAKESPEARE_SHA256 in str(err.value)


def test_a_missing_file_says_how_to_get_the_bundled_one(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="without a path"):
        load_shakespeare(tmp_path / "nothing.txt")


# --- batches of windows, as train() reads them ---------------------------------------------------------

def test_training_batches_are_windows_and_their_next_characters(text):
    data = preload_text(text, block_size=16, steps_per_epoch=3)
    batches = list(data.batches(5, seed=7))
    assert len(batches) == data.num_batches(5) == data.num_batches(500) == 3
    gen = torch.Generator().manual_seed(7)
    for x, y in batches:
        starts = torch.randint(len(text.train) - 16, (5,), generator=gen)     # the documented draw
        assert x.shape == y.shape == (5, 16) and x.dtype == torch.int64
        assert torch.equal(x, torch.stack([text.train[s:s + 16] for s in starts]))
        assert torch.equal(y, torch.stack([text.train[s + 1:s + 17] for s in starts]))
    again = list(data.batches(5, seed=7))
    other = list(data.batches(5, seed=8))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(batches, other))


def test_unshuffled_training_batches_walk_the_text_in_order(text):
    data = preload_text(text, block_size=8, steps_per_epoch=2)
    (x0, _), (x1, _) = data.batches(3, shuffle=False)
    assert text.decode(torch.cat([x0.flatten(), x1.flatten()])) == text.text[:48]


def test_held_out_windows_are_fixed_and_cover_the_validation_text(text):
    data = preload_text(text, block_size=32, eval_windows=10)
    first = torch.cat([x for x, _ in data.batches(4, split="val")])
    second = torch.cat([x for x, _ in data.batches(3, shuffle=True, seed=5, split="test")])
    assert first.shape == (10, 32) and torch.equal(first, second)
    assert torch.equal(first[0], text.val[:32]) and torch.equal(first[-1], text.val[-33:-1])
    x, y = next(data.batches(10, split="val"))
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_preload_text_refuses_impossible_settings(text):
    with pytest.raises(ValueError, match=">= 1"):
        preload_text(text, steps_per_epoch=0)
    with pytest.raises(ValueError, match="characters in each split"):
        preload_text(CharText("abcdefghij" * 5), block_size=8)
    with pytest.raises(ValueError, match="split must be"):
        next(preload_text(text).batches(2, split="dev"))
