"""ampteach.training.data against the shared subset, against corrupted copies, and against local "downloads"."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from ampteach.training import data as D

# The course split: where the test run points AMPTEACH_DATA (CI: ../shared's subset), else the bundled copy.
SUBSET = Path(os.environ.get("AMPTEACH_DATA") or D.bundled_root())
SHARED_README = Path(__file__).parents[2] / "shared/data/fashion-mnist-subset/README.md"
needs_subset = pytest.mark.skipif(not (SUBSET / "train-images-idx3-ubyte.gz").is_file(),
                                  reason="the course's FashionMNIST subset is not available (set AMPTEACH_DATA)")


def numpy_idx(path: Path, header: int) -> np.ndarray:
    """An independent reading of an IDX file: skip the header, take the bytes as uint8."""
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header)


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def subset() -> D.FashionMNIST:
    if not (SUBSET / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("the course's FashionMNIST subset is not available (set AMPTEACH_DATA)")
    return D.load_fashion_mnist(SUBSET, download=False)


@pytest.fixture
def copy_of_subset(tmp_path) -> Path:
    if not (SUBSET / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("the course's FashionMNIST subset is not available (set AMPTEACH_DATA)")
    for name in D.FILES:
        shutil.copyfile(SUBSET / name, tmp_path / name)
    return tmp_path


# --- reading the real files ------------------------------------------------------------------

def test_subset_shapes_dtypes_and_classes(subset):
    assert subset.train_images.shape == (7000, 28, 28) and subset.train_images.dtype == torch.uint8
    assert subset.test_images.shape == (1226, 28, 28) and subset.test_images.dtype == torch.uint8
    assert subset.train_labels.shape == (7000,) and subset.train_labels.dtype == torch.int64
    assert subset.test_labels.shape == (1226,) and subset.test_labels.dtype == torch.int64
    assert len(subset.classes) == 10 and subset.classes[0] == "T-shirt/top" and subset.classes[9] == "Ankle boot"
    assert set(subset.train_labels.tolist()) == set(range(10))


def test_subset_values_equal_an_independent_parse(subset):
    images = numpy_idx(SUBSET / "train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    labels = numpy_idx(SUBSET / "t10k-labels-idx1-ubyte.gz", 8)
    assert np.array_equal(subset.train_images.numpy(), images)
    assert np.array_equal(subset.test_labels.numpy(), labels.astype(np.int64))


def test_root_resolution_argument_then_env_then_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPTEACH_DATA", str(tmp_path / "from-env"))
    assert D.default_root() == tmp_path / "from-env"
    monkeypatch.delenv("AMPTEACH_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert D.default_root() == tmp_path / "cache" / "ampteach" / "fashion-mnist"
    # an explicit root wins over the environment
    monkeypatch.setenv("AMPTEACH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(D.DatasetNotFoundError, match="explicit"):
        D.load_fashion_mnist(tmp_path / "explicit", download=False)


@needs_subset
def test_env_variable_is_used_when_no_root_given(monkeypatch):
    monkeypatch.setenv("AMPTEACH_DATA", str(SUBSET))
    assert len(D.load_fashion_mnist(download=False).train_images) == 7000


# --- missing and corrupt files -----------------------------------------------------------------

def test_missing_files_without_download_name_folder_files_and_env(tmp_path):
    with pytest.raises(D.DatasetNotFoundError) as info:
        D.load_fashion_mnist(tmp_path, download=False)
    message = str(info.value)
    assert str(tmp_path) in message and "AMPTEACH_DATA" in message and "download=False" in message
    for name in D.FILES:
        assert name in message


def test_no_network_gives_the_same_clear_error_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "BASE_URL", (tmp_path / "no-such-server").as_uri() + "/")
    root = tmp_path / "data"
    with pytest.raises(D.DatasetNotFoundError, match="AMPTEACH_DATA") as info:
        D.load_fashion_mnist(root, download=True)
    assert "download failed" in str(info.value)
    assert not any(root.iterdir())  # no half-written file left behind


@pytest.mark.parametrize("name", ["train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"])
def test_truncated_gzip_names_the_file(copy_of_subset, name):
    path = copy_of_subset / name
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(D.DataFileError, match=name) as info:
        D.load_fashion_mnist(copy_of_subset, download=False)
    assert "truncated or corrupt" in str(info.value)


def test_truncated_payload_inside_valid_gzip_is_caught_by_the_size_check(copy_of_subset):
    path = copy_of_subset / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "rb") as f:
        raw = f.read()
    with gzip.open(path, "wb") as f:
        f.write(raw[:-100])  # a valid gzip stream that holds fewer bytes than the header promises
    with pytest.raises(D.DataFileError, match="train-images-idx3-ubyte.gz.*header promises"):
        D.load_fashion_mnist(copy_of_subset, download=False)


def test_not_gzip_at_all(copy_of_subset):
    (copy_of_subset / "t10k-images-idx3-ubyte.gz").write_bytes(b"<html>404 not found</html>")
    with pytest.raises(D.DataFileError, match="t10k-images-idx3-ubyte.gz"):
        D.load_fashion_mnist(copy_of_subset, download=False)


def test_swapped_files_fail_the_magic_number_check(copy_of_subset):
    images, labels = copy_of_subset / "train-images-idx3-ubyte.gz", copy_of_subset / "train-labels-idx1-ubyte.gz"
    shutil.copyfile(labels, images)
    with pytest.raises(D.DataFileError, match="magic number 2049, expected 2051"):
        D.load_fashion_mnist(copy_of_subset, download=False)


def test_image_and_label_counts_must_match(copy_of_subset):
    write_idx(copy_of_subset / "t10k-labels-idx1-ubyte.gz", np.zeros(1000, np.uint8), D.LABELS_MAGIC)
    with pytest.raises(D.DataFileError, match="1226 images but .*1000 labels"):
        D.load_fashion_mnist(copy_of_subset, download=False)


def test_wrong_image_size_and_bad_labels(tmp_path):
    write_idx(tmp_path / "img.gz", np.zeros((3, 27, 28), np.uint8), D.IMAGES_MAGIC)
    with pytest.raises(D.DataFileError, match="27 x 28"):
        D.read_idx_images(tmp_path / "img.gz")
    write_idx(tmp_path / "lab.gz", np.array([0, 3, 12], np.uint8), D.LABELS_MAGIC)
    with pytest.raises(D.DataFileError, match="label 12"):
        D.read_idx_labels(tmp_path / "lab.gz")
    (tmp_path / "tiny.gz").write_bytes(gzip.compress(b"\x00\x00"))
    with pytest.raises(D.DataFileError, match="shorter than an IDX header"):
        D.read_idx_labels(tmp_path / "tiny.gz")


# --- downloading (from local file:// URLs: tests never touch the network) -----------------------

@needs_subset
def test_download_checks_md5_and_loads(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "BASE_URL", SUBSET.as_uri() + "/")
    monkeypatch.setattr(D, "FILES", {name: D.md5sum(SUBSET / name) for name in D.FILES})
    ds = D.load_fashion_mnist(tmp_path / "cache", download=True)
    assert len(ds.train_images) == 7000
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(D.FILES)


@needs_subset
def test_checksum_mismatch_retries_then_fails_leaving_no_file(monkeypatch, tmp_path):
    calls = []
    real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: calls.append(a[0]) or real_urlopen(*a, **k))
    url = (SUBSET / "train-labels-idx1-ubyte.gz").as_uri()
    dest = tmp_path / "train-labels-idx1-ubyte.gz"
    with pytest.raises(OSError, match="checksum mismatch"):
        D.download_file(url, dest, md5="0" * 32, progress=False)
    assert len(calls) == 2  # the first attempt and one retry
    assert list(tmp_path.iterdir()) == []  # neither the file nor a .part file


@needs_subset
def test_one_failed_attempt_is_retried(monkeypatch, tmp_path):
    real_urlopen = urllib.request.urlopen
    attempts = []

    def flaky(*args, **kwargs):
        attempts.append(1)
        if len(attempts) == 1:
            raise urllib.error.URLError("connection reset")
        return real_urlopen(*args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", flaky)
    src = SUBSET / "t10k-labels-idx1-ubyte.gz"
    out = D.download_file(src.as_uri(), tmp_path / src.name, D.md5sum(src), progress=False)
    assert out.read_bytes() == src.read_bytes() and len(attempts) == 2


# --- the course split and preloading ------------------------------------------------------------

def test_course_split_is_identical_on_the_full_dataset_and_the_subset(subset, tmp_path):
    # A stand-in for the full dataset: training images 0..8225 are the subset's train + t10k (as
    # the subset's README says), followed by others; its t10k is a different set of images.
    rng = np.random.default_rng(0)
    extra = rng.integers(0, 256, size=(500, 28, 28), dtype=np.uint8)
    train = np.concatenate([subset.train_images.numpy(), subset.test_images.numpy(), extra])
    labels = np.concatenate([subset.train_labels.numpy(), subset.test_labels.numpy(), rng.integers(0, 10, 500)])
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train, D.IMAGES_MAGIC)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels, D.LABELS_MAGIC)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", extra[:300], D.IMAGES_MAGIC)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels[-300:], D.LABELS_MAGIC)
    full = D.course_split(D.load_fashion_mnist(tmp_path, download=False))
    same = D.course_split(subset)
    assert same is subset
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(full, field), getattr(subset, field)), field


def test_course_split_rejects_a_dataset_too_small(subset):
    small = D.FashionMNIST(subset.train_images[:100], subset.train_labels[:100],
                           subset.test_images[:10], subset.test_labels[:10], subset.root)
    with pytest.raises(D.DataFileError, match="neither the course subset"):
        D.course_split(small)


def test_preload_normalises_with_training_statistics(subset):
    data = D.preload(subset)
    assert data.train_x.shape == (7000, 1, 28, 28) and data.train_x.dtype == torch.float32
    assert data.test_x.shape == (1226, 1, 28, 28) and data.device.type == "cpu"
    pixels = subset.train_images.double() / 255
    assert data.mean == pytest.approx(pixels.mean().item(), rel=1e-5)
    assert data.std == pytest.approx(pixels.std().item(), rel=1e-5)
    assert data.train_x.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert data.train_x.std().item() == pytest.approx(1.0, abs=1e-4)
    expected = (subset.test_images[5].float() / 255 - data.mean) / data.std
    assert torch.equal(data.test_x[5, 0], expected)
    assert torch.equal(data.train_y, subset.train_labels)


def test_batches_cover_each_example_once_and_reproducibly(subset):
    data = D.preload(subset)
    first = [y for _, y in data.batches(1000, shuffle=True, seed=3)]
    again = [y for _, y in data.batches(1000, shuffle=True, seed=3)]
    other = [y for _, y in data.batches(1000, shuffle=True, seed=4)]
    assert [len(y) for y in first] == [1000] * 7
    assert torch.equal(torch.cat(first).sort().values, data.train_y.sort().values)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(torch.cat(first), torch.cat(other))
    sizes = [len(y) for _, y in data.batches(500, shuffle=False, split="test")]
    assert sizes == [500, 500, 226]
    assert [len(y) for _, y in data.batches(500, split="test", drop_last=True)] == [500, 500]
    with pytest.raises(ValueError, match="batch_size"):
        next(data.batches(0))
    with pytest.raises(ValueError, match="split"):
        next(data.batches(10, split="valid"))


# --- offline by default: the bundled split and the lookup order -----------------------------------

SHA256 = __import__("re").compile(r"^\s*([0-9a-f]{64})\s+(\S+\.gz)\s*$", __import__("re").M)


def sha256sum(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No AMPTEACH_DATA, an empty user cache, and every download attempt fails loudly."""
    monkeypatch.delenv("AMPTEACH_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))

    def no_network(*args, **kwargs):
        raise urllib.error.URLError(f"tried to download {args[0]!r}: the course must run offline by default")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    return tmp_path / "empty-cache" / "ampteach" / "fashion-mnist"


def test_bundled_files_match_the_checksums_in_their_readme():
    folder = D.bundled_root()
    listed = dict((name, digest) for digest, name in SHA256.findall((folder / "README.md").read_text()))
    assert sorted(listed) == sorted(D.FILES)
    assert {name: sha256sum(folder / name) for name in D.FILES} == listed
    assert "MIT" in (folder / "README.md").read_text() and "Zalando SE" in (folder / "LICENSE").read_text()


@pytest.mark.skipif(not SHARED_README.is_file(), reason="the project's shared data folder is not beside this checkout")
def test_bundled_files_are_the_published_subset():
    published = dict((name, digest) for digest, name in SHA256.findall(SHARED_README.read_text()))
    assert {name: sha256sum(D.bundled_root() / name) for name in D.FILES} == published


def test_lesson_data_path_works_offline_with_nothing_set(offline):
    """What lesson 0 does, on a machine with no network, no AMPTEACH_DATA and no earlier download."""
    ds = D.load_fashion_mnist()
    assert ds.source == "bundled" and ds.root == D.bundled_root()
    data = D.preload(D.course_split(ds))
    assert data.train_x.shape == (7000, 1, 28, 28) and data.test_x.shape == (1226, 1, 28, 28)
    # the same images as any other copy of the course split
    reference = D.load_fashion_mnist(SUBSET)
    assert torch.equal(ds.train_images, reference.train_images) and torch.equal(ds.test_labels, reference.test_labels)
    assert not offline.exists()   # nothing was written to the cache


def test_lookup_order_env_then_cache_then_bundled(offline, monkeypatch, tmp_path):
    assert D.find_data() == ("bundled", D.bundled_root())
    offline.mkdir(parents=True)
    for name in list(D.FILES)[:2]:                         # an incomplete cache is not used
        shutil.copyfile(SUBSET / name, offline / name)
    assert D.find_data()[0] == "bundled"
    for name in D.FILES:
        shutil.copyfile(SUBSET / name, offline / name)
    assert D.find_data() == ("cache", offline) and D.load_fashion_mnist().source == "cache"
    monkeypatch.setenv("AMPTEACH_DATA", str(tmp_path / "elsewhere"))
    assert D.find_data() == ("AMPTEACH_DATA", tmp_path / "elsewhere")
    # set, but empty: an error, not a fallback
    with pytest.raises(D.DatasetNotFoundError, match="from \\$AMPTEACH_DATA"):
        D.load_fashion_mnist()


def test_full_dataset_is_downloaded_only_when_asked(offline, monkeypatch):
    monkeypatch.setattr(D, "BASE_URL", "http://example.invalid/")
    with pytest.raises(D.DatasetNotFoundError) as info:
        D.load_fashion_mnist(full=True)
    assert "tried to download 'http://example.invalid/" in str(info.value)
    message = str(info.value)
    assert "shared" not in message and "ampteach data download" in message


def test_full_download_goes_to_the_cache_and_is_used_next(offline, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", urllib.request.build_opener().open)   # the network again
    monkeypatch.setattr(D, "BASE_URL", SUBSET.as_uri() + "/")
    monkeypatch.setattr(D, "FILES", {name: D.md5sum(SUBSET / name) for name in D.FILES})
    ds = D.load_fashion_mnist(full=True)
    assert ds.source == "cache" and ds.root == offline and not D.missing_files(offline)
    assert D.load_fashion_mnist().source == "cache"


def test_ampteach_data_command_says_where(offline, capsys):
    from ampteach.tools.cli import main
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert "bundled with ampteach" in out and "AMPTEACH_DATA" in out
