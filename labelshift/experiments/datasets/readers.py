"""Readers for the standard distribution formats of MNIST and CIFAR-10, written from the format descriptions.

* **IDX** (MNIST, LeCun et al. 1998): a 4-byte magic number -- two zero bytes, a type code (0x08 = unsigned byte,
  0x09 = signed byte, 0x0B = int16, 0x0C = int32, 0x0D = float32, 0x0E = float64) and the number of dimensions --
  followed by one big-endian uint32 per dimension and then the data, big-endian, row-major. MNIST's image files
  have magic 2051 (0x00000803: uint8, 3 dims N x 28 x 28), its label files 2049 (0x00000801: uint8, 1 dim).
  Files may be gzip-compressed (``.gz``), as they are distributed.
* **CIFAR-10 python batches** (Krizhevsky 2009): each of ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` is
  a *pickled* dict (written by Python 2) with ``b'data'``, a uint8 array of shape (N, 3072) whose rows hold the
  red, green and blue 32 x 32 planes one after another, and ``b'labels'``, a list of N ints in 0..9;
  ``batches.meta`` holds ``b'label_names'``. Pickle *is* the format here, so these files are read with
  :class:`RestrictedUnpickler`, which only resolves the few globals a pickled numpy array needs
  (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``, ``numpy`` ``_frombuffer`` and
  ``_codecs.encode`` with the latin-1 codec, which Python 3 emits for bytes at protocol 2) and refuses every other
  global, so a crafted file cannot run code. Only read files you meant to read all the same.

Every problem (wrong magic number, truncated or over-long file, images and labels of different lengths, labels out
of range, a pickle that is not a CIFAR batch) raises :class:`~labelshift.errors.FormatError` naming the file.
"""
from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from ...errors import FormatError

IDX_TYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
MNIST_IMAGES_MAGIC = 0x00000803
MNIST_LABELS_MAGIC = 0x00000801

#: the four MNIST files, by role, without the optional ``.gz``
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_META = "batches.meta"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"


# ------------------------------------------------------------------------------------------------------------- IDX
def _read_maybe_gzip(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file.") from None
    except OSError as exc:
        raise FormatError(f"{path}: could not be read ({exc}).") from None
    if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise FormatError(
                f"{path}: corrupted or truncated gzip file ({exc}); download the file again.") from None
    if path.suffix == ".gz":
        raise FormatError(f"{path}: named .gz but is not gzip-compressed; download the file again.")
    return raw


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode the bytes of one IDX file into a native-endian array; ``name`` is used in error messages."""
    if len(data) < 4:
        raise FormatError(f"{name}: only {len(data)} bytes; an IDX file starts with a 4-byte magic number.")
    if data[0] != 0 or data[1] != 0 or data[2] not in IDX_TYPES or not 1 <= data[3] <= 8:
        magic = int.from_bytes(data[:4], "big")
        raise FormatError(
            f"{name}: bad IDX magic number 0x{magic:08X} (expected 0x0000TTDD with a known type TT and 1-8 "
            "dimensions DD, e.g. 0x00000803 for MNIST images); this is not an IDX file or it is corrupted.")
    dtype, ndim = IDX_TYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise FormatError(f"{name}: truncated IDX header ({len(data)} bytes, need {header}).")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found < expected:
        raise FormatError(
            f"{name}: truncated: the header promises shape {dims} ({expected} data bytes) but only {found} "
            "follow; download the file again.")
    if found > expected:
        raise FormatError(
            f"{name}: {found - expected} unexpected bytes after the data of shape {dims}; the file is corrupted.")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file, plain or gzip-compressed."""
    path = Path(path)
    return parse_idx(_read_maybe_gzip(path), str(path))


def _find_mnist_file(folder: Path, stem: str) -> Path:
    # accept the files directly in `folder`, or torchvision's layout `folder/MNIST/raw/`
    for base in (folder, folder / "MNIST" / "raw", folder / "raw"):
        for candidate in (base / stem, base / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    raise FormatError(
        f"{folder}: no {stem} (nor {stem}.gz) found; an MNIST folder holds train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (optionally .gz), directly "
        "or under MNIST/raw/.")


def read_mnist_pair(images_path: str | os.PathLike, labels_path: str | os.PathLike,
                    n_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Read one MNIST images/labels pair: (N, H, W) uint8 images and (N,) int64 labels, checked against each other."""
    images_path, labels_path = Path(images_path), Path(labels_path)
    images_raw = _read_maybe_gzip(images_path)
    labels_raw = _read_maybe_gzip(labels_path)
    for raw, path, magic, what in ((images_raw, images_path, MNIST_IMAGES_MAGIC, "images (N x H x W, uint8)"),
                                   (labels_raw, labels_path, MNIST_LABELS_MAGIC, "labels (N, uint8)")):
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        if found != magic:
            shown = "none (file shorter than 4 bytes)" if found is None else f"0x{found:08X}"
            raise FormatError(
                f"{path}: magic number {shown}, expected 0x{magic:08X} for MNIST {what}; wrong or corrupted file.")
    images = parse_idx(images_raw, str(images_path))
    labels = parse_idx(labels_raw, str(labels_path)).astype(np.int64)
    if images.shape[0] != labels.shape[0]:
        raise FormatError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels; the "
            "two files must come from the same release.")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise FormatError(
            f"{labels_path}: labels must lie in 0..{n_classes - 1}, found values from {labels.min()} to "
            f"{labels.max()}; the file is corrupted or not an MNIST label file.")
    return images, labels


def read_mnist_folder(folder: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read the four MNIST idx files from ``folder`` (plain or .gz; torchvision's ``MNIST/raw/`` layout also works).

    Returns ``{"train": (images, labels), "test": (images, labels)}`` plus ``"files"``: the paths read.
    """
    folder = Path(folder)
    paths = {role: _find_mnist_file(folder, stem) for role, stem in MNIST_FILES.items()}
    out: dict = {
        "train": read_mnist_pair(paths["train_images"], paths["train_labels"]),
        "test": read_mnist_pair(paths["test_images"], paths["test_labels"]),
    }
    out["files"] = [paths[r] for r in MNIST_FILES]
    return out


# ------------------------------------------------------------------------------------------------------ CIFAR-10
def _codecs_encode_latin1(text, encoding="latin1", errors="strict"):
    # Python 3 pickles bytes at protocol 2 as _codecs.encode(str, 'latin1'); allow exactly that and nothing else.
    if encoding.replace("-", "").replace("_", "").lower() not in ("latin1", "iso88591") or errors != "strict":
        raise pickle.UnpicklingError(f"_codecs.encode with encoding {encoding!r} is not allowed")
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], object]:
    from numpy._core import multiarray, numeric  # numpy >= 2 (pyproject requires it)

    reconstruct, frombuffer = multiarray._reconstruct, numeric._frombuffer
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _codecs_encode_latin1,
    }
    for module in ("numpy.core", "numpy._core"):  # files written by numpy 1.x name numpy.core
        allowed[(f"{module}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{module}.numeric", "_frombuffer")] = frombuffer
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a pickled dict of numpy arrays, lists and bytes needs.

    Anything else (``os.system``, ``builtins.eval``, arbitrary classes) raises :class:`pickle.UnpicklingError`,
    so loading a crafted file fails instead of running its code. Reads with ``encoding="bytes"`` as CIFAR-10's
    Python 2 pickles require.
    """

    def __init__(self, file):
        super().__init__(file, encoding="bytes")
        self._allowed = _numpy_globals()

    def find_class(self, module, name):
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global '{module}.{name}' is not allowed in a CIFAR-10 batch file") from None


def restricted_load(data: bytes, name: str = "<bytes>"):
    """Unpickle ``data`` with :class:`RestrictedUnpickler`; any failure is a FormatError naming ``name``."""
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise FormatError(f"{name}: not a valid CIFAR-10 python batch ({exc}).") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError) as exc:
        raise FormatError(
            f"{name}: corrupted or truncated pickle ({type(exc).__name__}: {exc}); download the file again.") \
            from None


def _str_keys(obj, name: str) -> dict:
    if not isinstance(obj, dict):
        raise FormatError(f"{name}: expected a pickled dict, found {type(obj).__name__}; not a CIFAR-10 batch.")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def parse_cifar_batch(data: bytes, name: str = "<bytes>", n_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Decode one CIFAR python batch into (N, 3, 32, 32) uint8 images and (N,) int64 labels."""
    batch = _str_keys(restricted_load(data, name), name)
    missing = [k for k in ("data", "labels") if k not in batch]
    if missing:
        raise FormatError(f"{name}: no {', '.join(repr(k) for k in missing)} entry; not a CIFAR-10 data batch.")
    images, labels = batch["data"], batch["labels"]
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 2 or \
            images.shape[1] != 3 * 32 * 32:
        shown = f"{images.dtype} array of shape {images.shape}" if isinstance(images, np.ndarray) \
            else type(images).__name__
        raise FormatError(f"{name}: 'data' must be a uint8 array of shape (N, 3072), found {shown}.")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise FormatError(f"{name}: 'labels' must be a list of integers.") from None
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise FormatError(
            f"{name}: {images.shape[0]} images but {labels.size} labels; the batch is corrupted.")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise FormatError(
            f"{name}: labels must lie in 0..{n_classes - 1}, found values from {labels.min()} to {labels.max()}.")
    return images.reshape(-1, 3, 32, 32).copy(), labels


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch file (``data_batch_i`` or ``test_batch``)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: could not be read ({exc}).") from None
    return parse_cifar_batch(data, str(path))


def parse_cifar_meta(data: bytes, name: str = "<bytes>") -> list[str]:
    """Class names from ``batches.meta``."""
    meta = _str_keys(restricted_load(data, name), name)
    names = meta.get("label_names")
    if not isinstance(names, list) or len(names) != 10:
        raise FormatError(f"{name}: expected 'label_names', a list of 10 class names; not CIFAR-10's batches.meta.")
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def read_cifar10_folder(folder: str | os.PathLike) -> dict:
    """Read CIFAR-10's python version from ``folder``.

    ``folder`` may hold the batch files themselves, a ``cifar-10-batches-py/`` folder (torchvision's layout) or the
    unextracted ``cifar-10-python.tar.gz``. Returns ``{"train": (x, y), "test": (x, y), "classes": [...],
    "files": [...]}`` with x of shape (N, 3, 32, 32) uint8 and y int64.
    """
    folder = Path(folder)
    blobs: dict[str, tuple[bytes, str]] = {}
    wanted = (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH, CIFAR10_META)
    base = next((b for b in (folder, folder / CIFAR10_FOLDER) if (b / CIFAR10_TEST_BATCH).is_file()), None)
    files: list[Path] = []
    if base is not None:
        for stem in wanted:
            path = base / stem
            if not path.is_file():
                raise FormatError(f"{folder}: {stem} is missing next to {base / CIFAR10_TEST_BATCH}; "
                                  f"CIFAR-10's python version has {', '.join(wanted)}.")
            try:
                blobs[stem] = (path.read_bytes(), str(path))
            except OSError as exc:
                raise FormatError(f"{path}: could not be read ({exc}).") from None
            files.append(path)
    elif (folder / CIFAR10_ARCHIVE).is_file():
        archive = folder / CIFAR10_ARCHIVE
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar.getmembers():
                    stem = Path(member.name).name
                    if stem in wanted and member.isfile():
                        blobs[stem] = (tar.extractfile(member).read(), f"{archive}:{member.name}")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise FormatError(f"{archive}: corrupted or truncated archive ({exc}); download it again.") from None
        missing = [s for s in wanted if s not in blobs]
        if missing:
            raise FormatError(f"{archive}: lacks {', '.join(missing)}; not CIFAR-10's python version.")
        files.append(archive)
    else:
        raise FormatError(
            f"{folder}: no CIFAR-10 python batches found; expected data_batch_1..5, test_batch and batches.meta "
            f"in it or in {CIFAR10_FOLDER}/ below it, or {CIFAR10_ARCHIVE}.")
    classes = parse_cifar_meta(*blobs[CIFAR10_META])
    train = [parse_cifar_batch(*blobs[s]) for s in CIFAR10_TRAIN_BATCHES]
    test = parse_cifar_batch(*blobs[CIFAR10_TEST_BATCH])
    return {
        "train": (np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])),
        "test": test,
        "classes": classes,
        "files": files,
    }
