"""FashionMNIST, read from its own IDX files, validated, and preloaded on a device; offline by default.

    ds = load_fashion_mnist()               # $AMPTEACH_DATA, else a full download made earlier, else the bundled split
    ds = course_split(ds)                   # the course's 7,000 train / 1,226 held-out images
    data = preload(ds, device="cuda")       # normalised float tensors, already on the device
    for xb, yb in data.batches(256, shuffle=True, seed=0): ...
    load_fashion_mnist(full=True)           # the full 70,000 images (downloaded once, about 30 MB)

    $ ampteach data                         # where the data comes from on this machine
    $ ampteach data download                # fetch the full dataset into the user cache

The package carries the course's split (ampteach/datasets/fashion-mnist-course: 8,226 of the
official training images, 3.5 MB, MIT licence, (c) 2017 Zalando SE), so every lesson runs on a
machine without a network and prints the same numbers as with the full dataset.

An IDX file is a big-endian header (magic number, then one uint32 per dimension) followed by
the raw uint8 values: size == 8 + 4 * ndim_extra + prod(dims).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import os
import struct
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

BASE_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

# file name -> official MD5 of the full dataset's file (zalandoresearch/fashion-mnist)
FILES = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}

IMAGES_MAGIC = 2051  # 0x00000803: uint8 values, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: uint8 values, 1 dimension

# The course's split: the first 7,000 training images to train on, the next 1,226 held out.
# The bundled copy stores exactly these (its t10k files hold training images 7000..8225), so a
# lesson prints the same numbers whether it reads the bundled split or the full dataset.
COURSE_TRAIN = 7000
COURSE_HELD_OUT = 1226

BUNDLED = "datasets/fashion-mnist-course"   # inside the ampteach package

# Where load_fashion_mnist() found its files (FashionMNIST.source, `ampteach data`, the doctor).
SOURCES = {
    "root": "the folder passed as root=",
    "AMPTEACH_DATA": "the folder $AMPTEACH_DATA points at",
    "cache": "the full dataset in the user cache (downloaded earlier)",
    "bundled": "the course's split bundled with ampteach (offline, 7,000 + 1,226 images)",
}


class DatasetNotFoundError(FileNotFoundError):
    """The dataset files are not on disk and could not (or may not) be downloaded."""


class DataFileError(ValueError):
    """A dataset file is on disk but is not a valid FashionMNIST IDX file."""


@dataclass(frozen=True)
class FashionMNIST:
    """Images as uint8 (N, 28, 28), labels as int64 (N,), the ten class names, and where they came from."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    root: Path
    classes: tuple[str, ...] = CLASSES
    source: str = "root"          # a key of SOURCES: root, AMPTEACH_DATA, cache or bundled


def cache_root() -> Path:
    """The per-user cache for the full download: $XDG_CACHE_HOME/ampteach/fashion-mnist (~/.cache/...)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "ampteach" / "fashion-mnist"


def bundled_root() -> Path:
    """The course's split shipped inside the package (found with importlib.resources, from any directory)."""
    folder = importlib.resources.files("ampteach").joinpath(BUNDLED)
    if not isinstance(folder, Path):   # a zipped install: the loader needs real files
        raise DatasetNotFoundError(f"ampteach is installed as a zip archive, so its bundled data ({BUNDLED}) is "
                                   f"not a folder on disk; install it unzipped (pip install ampteach) or set "
                                   f"AMPTEACH_DATA")
    return folder


def default_root() -> Path:
    """Where a full copy of the data lives or goes: $AMPTEACH_DATA when set, else the user cache."""
    env = os.environ.get("AMPTEACH_DATA")
    if env:
        return Path(env).expanduser()
    return cache_root()


def find_data(full: bool = False) -> tuple[str, Path]:
    """(source, folder) load_fashion_mnist() reads when no root is given, in this order:

    1. $AMPTEACH_DATA, when set (used as it is: a missing file there is an error, not a fallback);
    2. the user cache, when it holds all four files (a full download made earlier);
    3. the course's split bundled with the package, unless full=True (then the cache, to download into).
    """
    env = os.environ.get("AMPTEACH_DATA")
    if env:
        return "AMPTEACH_DATA", Path(env).expanduser()
    cache = cache_root()
    if full or not missing_files(cache):
        return "cache", cache
    return "bundled", bundled_root()


def missing_files(root: str | os.PathLike | None = None) -> list[str]:
    """The standard file names not present under root (empty when the dataset is there)."""
    root = Path(root) if root is not None else default_root()
    return [name for name in FILES if not (root / name).is_file()]


def load_fashion_mnist(root: str | os.PathLike | None = None, download: bool = False,
                       full: bool = False) -> FashionMNIST:
    """Load FashionMNIST; with no arguments from $AMPTEACH_DATA, else the cache, else the bundled split.

        ds = load_fashion_mnist()              # offline: never touches the network
        ds = load_fashion_mnist(full=True)     # the full dataset, downloaded into the cache if missing
        ds = load_fashion_mnist("/data/fmnist", download=True)

    Downloads happen only when asked for: full=True (into $AMPTEACH_DATA or the cache) or
    download=True (into root, $AMPTEACH_DATA or the cache). Every file is validated: IDX magic
    number, 28 x 28 images, counts against the file size, labels in 0..9, as many labels as images.
    ds.source says where the files came from (see SOURCES).
    """
    if root is not None:
        source, root = "root", Path(root).expanduser()
    else:
        source, root = find_data(full=full or download)
    missing = missing_files(root)
    if missing:
        if not (download or full):
            why = "nothing was downloaded (download=False)"
            raise DatasetNotFoundError(_not_found_message(root, source, missing, why))
        try:
            for name in missing:
                download_file(BASE_URL + name, root / name, FILES[name])
        except OSError as exc:
            why = f"the download failed: {exc}"
            raise DatasetNotFoundError(_not_found_message(root, source, missing, why)) from exc

    train_images = read_idx_images(root / "train-images-idx3-ubyte.gz")
    train_labels = read_idx_labels(root / "train-labels-idx1-ubyte.gz")
    test_images = read_idx_images(root / "t10k-images-idx3-ubyte.gz")
    test_labels = read_idx_labels(root / "t10k-labels-idx1-ubyte.gz")
    _check_same_count(root, "train", train_images, train_labels)
    _check_same_count(root, "t10k", test_images, test_labels)
    return FashionMNIST(train_images, train_labels, test_images, test_labels, root, source=source)


def _not_found_message(root: Path, source: str, missing: list[str], why: str) -> str:
    names = "\n".join(f"  {n}" for n in FILES)
    where = {"AMPTEACH_DATA": f"{root} (from $AMPTEACH_DATA)", "cache": f"the cache {root}"}.get(source, str(root))
    return (
        f"FashionMNIST is not in {where} (missing: {', '.join(missing)}) and {why}.\n"
        f"What you can do:\n"
        f"  - the lessons need only the course's split, which comes with ampteach: call load_fashion_mnist()\n"
        f"    without root (and unset AMPTEACH_DATA if it points at a folder without the files);\n"
        f"  - for the full dataset: `ampteach data download` (or load_fashion_mnist(full=True)) on a machine\n"
        f"    with internet, which saves it in {cache_root()};\n"
        f"  - or put the four standard IDX files in a folder and pass root=... or set AMPTEACH_DATA to it:\n{names}"
    )


def _check_same_count(root: Path, split: str, images: torch.Tensor, labels: torch.Tensor) -> None:
    if len(images) != len(labels):
        raise DataFileError(
            f"{root / f'{split}-images-idx3-ubyte.gz'} holds {len(images)} images but "
            f"{root / f'{split}-labels-idx1-ubyte.gz'} holds {len(labels)} labels; the two files must "
            f"come from the same copy of the dataset (re-download them, or delete both)."
        )


def _read_gz(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:  # truncated or not gzip at all
        raise DataFileError(
            f"{path} is not a readable gzip file ({exc.__class__.__name__}: {exc}); it is truncated or "
            f"corrupt. Delete it and download it again."
        ) from exc


def _parse_idx(path: Path, magic: int, ndim: int) -> tuple[tuple[int, ...], bytes]:
    raw = _read_gz(path)
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFileError(f"{path} is {len(raw)} bytes, shorter than an IDX header ({header} bytes): truncated.")
    got_magic = struct.unpack(">I", raw[:4])[0]
    if got_magic != magic:
        raise DataFileError(
            f"{path} has IDX magic number {got_magic}, expected {magic}: this is not the right kind of "
            f"file ({'images' if magic == IMAGES_MAGIC else 'labels'}) or it is corrupt."
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = header + _prod(dims)
    if len(raw) != expected:
        raise DataFileError(
            f"{path} header promises dimensions {dims} ({expected} bytes) but the file holds "
            f"{len(raw)} bytes: it is truncated or corrupt. Delete it and download it again."
        )
    return dims, raw[header:]


def _prod(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def read_idx_images(path: str | os.PathLike) -> torch.Tensor:
    """Read an IDX3 image file into a uint8 tensor (N, 28, 28), raising DataFileError naming the file."""
    path = Path(path)
    (n, rows, cols), payload = _parse_idx(path, IMAGES_MAGIC, 3)
    if (rows, cols) != (28, 28):
        raise DataFileError(f"{path} holds {rows} x {cols} images; FashionMNIST images are 28 x 28.")
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).reshape(n, rows, cols)


def read_idx_labels(path: str | os.PathLike) -> torch.Tensor:
    """Read an IDX1 label file into an int64 tensor (N,), raising DataFileError naming the file."""
    path = Path(path)
    (n,), payload = _parse_idx(path, LABELS_MAGIC, 1)
    labels = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(torch.int64)
    if n and int(labels.max()) >= len(CLASSES):
        raise DataFileError(f"{path} holds label {int(labels.max())}; FashionMNIST labels are 0..9: corrupt file.")
    return labels


def md5sum(path: str | os.PathLike) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_file(url: str, dest: str | os.PathLike, md5: str, attempts: int = 2, progress: bool = True) -> Path:
    """Download url to dest atomically (temporary file, checked, then renamed), retrying once.

    The MD5 must equal `md5`; a failed or mismatching attempt leaves no file behind.
    """
    from tqdm.auto import tqdm

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for _ in range(attempts):
        fd, tmp_name = tempfile.mkstemp(prefix=dest.name + ".", suffix=".part", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=30) as resp:
                total = int(resp.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=not progress) as bar:
                    while chunk := resp.read(1 << 16):
                        out.write(chunk)
                        bar.update(len(chunk))
            got = md5sum(tmp)
            if got != md5:
                raise OSError(f"checksum mismatch for {url}: MD5 {got}, expected {md5}")
            os.replace(tmp, dest)
            return dest
        except (OSError, urllib.error.URLError) as exc:
            last_error = exc
        finally:
            tmp.unlink(missing_ok=True)
    raise OSError(f"could not download {url} after {attempts} attempts: {last_error}") from last_error


def course_split(ds: FashionMNIST) -> FashionMNIST:
    """The course's fixed split: 7,000 training images and 1,226 held-out ones, from either copy.

    With the full dataset these are training images 0..6999 and 7000..8225; the shared subset
    stores exactly those, so lessons print the same numbers on both. (Neither is the official test
    set: accuracies here are not comparable with published FashionMNIST test accuracies.)
    """
    n_train, n_test = len(ds.train_images), len(ds.test_images)
    if (n_train, n_test) == (COURSE_TRAIN, COURSE_HELD_OUT):
        return ds
    end = COURSE_TRAIN + COURSE_HELD_OUT
    if n_train < end:
        raise DataFileError(
            f"{ds.root} holds {n_train} training / {n_test} test images: neither the course subset "
            f"({COURSE_TRAIN} / {COURSE_HELD_OUT}) nor the full dataset (60000 / 10000)."
        )
    return FashionMNIST(
        ds.train_images[:COURSE_TRAIN], ds.train_labels[:COURSE_TRAIN],
        ds.train_images[COURSE_TRAIN:end], ds.train_labels[COURSE_TRAIN:end], ds.root,
    )


@dataclass
class Preloaded:
    """The whole dataset as normalised float tensors (N, 1, 28, 28) on one device; no DataLoader."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    mean: float
    std: float

    @property
    def device(self) -> torch.device:
        return self.train_x.device

    def num_batches(self, batch_size: int) -> int:
        """Training batches in one epoch: every image once, the last batch possibly smaller."""
        return -(-len(self.train_x) // batch_size)

    def batches(self, batch_size: int, shuffle: bool = True, seed: int | None = 0,
                split: str = "train", drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (x, y) mini-batches; the permutation is drawn on the CPU from `seed` (reproducible)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        x, y = (self.train_x, self.train_y) if split == "train" else (self.test_x, self.test_y)
        n = len(x)
        if shuffle:
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            order = torch.randperm(n, generator=gen).to(x.device)
        else:
            order = torch.arange(n, device=x.device)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]


def preload(ds: FashionMNIST, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Preloaded:
    """Normalise with the training split's own mean and std and move everything to device once.

    x = (pixel / 255 - mean) / std, shape (N, 1, 28, 28).
    """
    train = ds.train_images.to(torch.float32).div_(255)
    mean, std = train.mean().item(), train.std().item()

    def prep(images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32).div_(255).sub_(mean).div_(std).unsqueeze(1)
        return x.to(device=device, dtype=dtype)

    return Preloaded(prep(ds.train_images), ds.train_labels.to(device), prep(ds.test_images),
                     ds.test_labels.to(device), mean, std)



# -- `ampteach data`: where the data comes from, and the explicit full download ---------------------

def describe_source(full: bool = False) -> str:
    """One line for `ampteach data` and the doctor: which copy load_fashion_mnist() reads, and from where."""
    source, root = find_data(full=full)
    found = "" if not missing_files(root) else f" (missing: {', '.join(missing_files(root))})"
    shown = BUNDLED.replace("datasets/", "ampteach/datasets/") if source == "bundled" else str(root)
    return f"{SOURCES[source]}: {shown}{found}"


