"""The canonical layout of a dataset in an object store, and the push / load that write and verify it.

Under a prefix (``s3://bucket/data/mnist-5k`` or a local folder) a dataset is::

    train/x.npy  train/y.npy  valid/x.npy  valid/y.npy  test/x.npy  test/y.npy  manifest.json

Images are uint8, (N, H, W) for one channel or (N, C, H, W); labels int64 in 0..n_classes-1; arrays are ``.npy``
files loaded with ``allow_pickle=False``. ``manifest.json`` records the dataset name, the format version, each
array's shape, dtype and SHA-256, the class counts per split, the source and the split's seed and fractions.

Writes are ordered so that only complete datasets are readable: :func:`push_dataset` first removes any manifest at
the prefix, then writes the arrays, and writes the manifest *last*; if anything fails it removes what it wrote.
A half-pushed dataset therefore has no manifest, and :func:`load_dataset` refuses it. Every read re-computes
the checksum of every array and compares shapes, dtypes, label range and class counts against the manifest.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import FormatError, InputError, ObjectNotFoundError
from .sources import get_spec, stratified_split

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_KIND = "labelshift-dataset"
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Split:
    """One pool of a dataset: uint8 images ``x`` and int64 labels ``y``."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def class_counts(self, n_classes: int) -> np.ndarray:
        return np.bincount(self.y, minlength=n_classes)


@dataclass(frozen=True)
class Dataset:
    """A dataset read from the store: the train, valid and test pools (a pool not asked for is None)."""

    name: str
    n_classes: int
    train: Split | None
    valid: Split | None
    test: Split | None
    manifest: dict = field(repr=False, default_factory=dict)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        return tuple(self.manifest["image_shape"])

    @property
    def in_channels(self) -> int:
        return self.image_shape[0]

    @property
    def image_size(self) -> int:
        return self.image_shape[1]

    @property
    def mean(self) -> tuple[float, ...]:
        return tuple(self.manifest["normalization"]["mean"])

    @property
    def std(self) -> tuple[float, ...]:
        return tuple(self.manifest["normalization"]["std"])

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise InputError(f"split must be one of {SPLITS}, got {name!r}.")
        pool = getattr(self, name)
        if pool is None:
            raise InputError(f"split {name!r} was not loaded; pass it in load_dataset(..., splits=...).")
        return pool


def _key(prefix: str, name: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/{name}" if prefix else name


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def _check_raw_images(name: str, x: np.ndarray, y: np.ndarray, image_shape, n_classes: int, what: str) -> None:
    shape = tuple(image_shape)
    per_image = x.shape[1:] if x.ndim == 4 else (1, *x.shape[1:])
    if x.dtype != np.uint8 or per_image != shape:
        raise FormatError(f"{name} {what}: expected uint8 images of shape {shape}, got {x.dtype} {x.shape[1:]}.")
    if y.shape != (x.shape[0],):
        raise FormatError(f"{name} {what}: {x.shape[0]} images but labels of shape {y.shape}.")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise FormatError(f"{name} {what}: labels outside 0..{n_classes - 1}.")


def build_splits(name: str, *, source_dir=None, download: bool = False, valid_fraction: float | None = None,
                 test_fraction: float | None = None, seed: int = 0, cache_dir=None) -> tuple[dict, dict]:
    """Read the source of ``name`` and split it; returns ({split: (x, y)}, manifest-without-checksums).

    Nothing is written anywhere (downloads aside). :func:`push_dataset` is this plus the writes.
    """
    spec = get_spec(name)
    valid_fraction = spec.valid_fraction if valid_fraction is None else float(valid_fraction)
    source_dir = None if source_dir is None else Path(source_dir)
    cache_dir = None if cache_dir is None else Path(cache_dir)
    raw = spec.builder(source_dir, download, cache_dir)
    x_all, y_all = raw["train"]
    _check_raw_images(name, x_all, y_all, spec.image_shape, spec.n_classes, "training set")
    if raw["test"] is None:
        test_fraction = spec.test_fraction if test_fraction is None else float(test_fraction)
        keep, test_idx = stratified_split(y_all, test_fraction, seed)
        test = (x_all[test_idx], y_all[test_idx])
        x_all, y_all = x_all[keep], y_all[keep]
        test_how = "carved"
    else:
        if test_fraction is not None:
            raise InputError(f"{name} comes with its own test set; leave test_fraction unset.")
        test = raw["test"]
        _check_raw_images(name, *test, spec.image_shape, spec.n_classes, "test set")
        test_how = "provided"
    # seed + 1 so the valid carve is not the same draw as the test carve
    train_idx, valid_idx = stratified_split(y_all, valid_fraction, seed + 1)
    arrays = {"train": (x_all[train_idx], y_all[train_idx]), "valid": (x_all[valid_idx], y_all[valid_idx]),
              "test": test}
    manifest = {
        "kind": MANIFEST_KIND,
        "format_version": FORMAT_VERSION,
        "dataset": name,
        "n_classes": spec.n_classes,
        "image_shape": list(spec.image_shape),
        "classes": raw.get("classes", [str(c) for c in range(spec.n_classes)]),
        "normalization": {"mean": list(spec.mean), "std": list(spec.std)},
        "source": raw["source"],
        "split": {"method": "stratified", "seed": int(seed), "valid_fraction": valid_fraction,
                  "test_fraction": test_fraction if test_how == "carved" else None, "test": test_how},
        "class_counts": {s: np.bincount(arrays[s][1], minlength=spec.n_classes).tolist() for s in SPLITS},
    }
    return arrays, manifest


def push_dataset(name: str, store, prefix: str, *, source_dir=None, download: bool = False,
                 valid_fraction: float | None = None, test_fraction: float | None = None, seed: int = 0,
                 cache_dir=None) -> dict:
    """Build dataset ``name`` (see :data:`DATASETS`) and write it in the canonical layout under ``prefix``.

    Args:
        name: a key of :data:`DATASETS` (``mnist``, ``fashion-mnist``, ``cifar10``, ``mnist-5k``, ``digits``).
        store: a :class:`labelshift.storage.Store` (``open_store(uri)``).
        prefix: folder inside the store, e.g. ``"datasets/mnist-5k"``; ``""`` for the store's root.
        source_dir: folder holding the standard files (MNIST or Fashion-MNIST idx files, CIFAR-10 python batches).
        download: fetch the standard files with torchvision's downloader (needs internet).
        valid_fraction: share of the training pool put in ``valid``; the dataset's default when None.
        test_fraction: share carved out as ``test`` for datasets without one (mnist-5k, digits).
        seed: seed of the stratified splits.
        cache_dir: where downloads go (default ``~/.cache/labelshift``, :func:`.sources.default_cache_dir`).

    Returns the manifest that was written. A dataset already at ``prefix`` is replaced. Sources are read and
    checked before the first write, so a bad source changes nothing; a failure while writing removes the manifest
    and the arrays at ``prefix`` (best effort), so no partial dataset is ever readable.
    """
    arrays, manifest = build_splits(name, source_dir=source_dir, download=download, valid_fraction=valid_fraction,
                                    test_fraction=test_fraction, seed=seed, cache_dir=cache_dir)
    blobs: dict[str, bytes] = {}
    manifest.update(shapes={}, dtypes={}, sha256={})
    for split in SPLITS:
        for part, arr in zip(("x", "y"), arrays[split]):
            fname = f"{split}/{part}.npy"
            blobs[fname] = _npy_bytes(arr)
            manifest["shapes"][fname] = list(arr.shape)
            manifest["dtypes"][fname] = str(arr.dtype)
            manifest["sha256"][fname] = hashlib.sha256(blobs[fname]).hexdigest()

    manifest_key = _key(prefix, MANIFEST)
    store.delete(manifest_key, missing_ok=True)  # an old dataset here stops being readable before it is overwritten
    try:
        for fname, data in blobs.items():
            store.put_bytes(_key(prefix, fname), data)
        store.put_json(manifest_key, manifest)
    except BaseException:
        # remove every array key of the layout, also ones left by an older dataset at this prefix: without a
        # manifest they are unreadable anyway
        for key in [*(_key(prefix, f) for f in blobs), manifest_key]:
            try:
                store.delete(key, missing_ok=True)
            except Exception:  # best effort: the manifest is what makes a dataset readable
                pass
        raise
    return manifest


def dataset_fingerprint(manifest: dict) -> str:
    """A SHA-256 that identifies a pushed dataset's content: the name, the format version and the checksums of its
    arrays (so the same data pushed twice, anywhere, has the same fingerprint). A cache key for training."""
    ident = {"dataset": manifest["dataset"], "format_version": manifest["format_version"],
             "sha256": dict(sorted(manifest["sha256"].items()))}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _fix(manifest: dict | None, prefix: str) -> str:
    name = (manifest or {}).get("dataset", "NAME")
    return f"push it again (`labelshift data push {name} --to <store>/{prefix.strip('/')}`)"


def read_manifest(store, prefix: str, expected_name: str | None = None) -> dict:
    """Read and check the manifest at ``prefix`` (kind, version, name, fields); no arrays are read."""
    key = _key(prefix, MANIFEST)
    try:
        manifest = store.get_json(key)
    except ObjectNotFoundError:
        raise ObjectNotFoundError(
            f"no dataset at {key!r}: the manifest is missing, so nothing was pushed there or a push did not finish; "
            f"{_fix(None, prefix)}.") from None
    except FormatError as exc:  # not JSON, or altered behind the store's back
        raise FormatError(f"{exc} The dataset manifest cannot be trusted; {_fix(None, prefix)}.") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise FormatError(f"{key}: not a labelshift dataset manifest; {_fix(None, prefix)}.")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatError(
            f"{key}: dataset format version {manifest.get('format_version')!r}, but this labelshift reads version "
            f"{FORMAT_VERSION}; {_fix(manifest, prefix)}.")
    if expected_name is not None and manifest.get("dataset") != expected_name:
        raise FormatError(
            f"{key}: the manifest is for dataset {manifest.get('dataset')!r}, not {expected_name!r}; point to the "
            f"prefix that holds {expected_name} or push it there (`labelshift data push {expected_name} --to ...`).")
    needed = ("dataset", "n_classes", "image_shape", "shapes", "dtypes", "sha256", "class_counts", "normalization")
    missing = [f for f in needed if f not in manifest]
    if missing:
        raise FormatError(f"{key}: manifest lacks {', '.join(missing)}; {_fix(manifest, prefix)}.")
    return manifest


def _read_array(store, prefix: str, fname: str, manifest: dict) -> np.ndarray:
    key = _key(prefix, fname)
    fix = _fix(manifest, prefix)
    if fname not in manifest["sha256"]:
        raise FormatError(f"{_key(prefix, MANIFEST)}: no entry for {fname}; {fix}.")
    try:
        data = store.get_bytes(key)
    except ObjectNotFoundError:
        raise FormatError(f"{key} is missing although the manifest lists it; the dataset is damaged, {fix}.") \
            from None
    except FormatError as exc:  # the store's own checksum record disagrees with the content
        raise FormatError(f"{exc} ({key} of dataset {manifest.get('dataset')!r}: {fix}.)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != manifest["sha256"][fname]:
        raise FormatError(
            f"{key}: checksum mismatch (SHA-256 {digest[:12]}..., manifest says "
            f"{manifest['sha256'][fname][:12]}...): the file was changed or corrupted after the push; {fix}.")
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(f"{key}: not a readable .npy array ({exc}); {fix}.") from None
    want_shape, want_dtype = tuple(manifest["shapes"][fname]), manifest["dtypes"][fname]
    if arr.shape != want_shape or str(arr.dtype) != want_dtype:
        raise FormatError(
            f"{key}: {arr.dtype} array of shape {arr.shape}, the manifest says {want_dtype} {want_shape}; {fix}.")
    return arr


def load_dataset(store, prefix: str, expected_name: str | None = None,
                 splits: tuple[str, ...] | list[str] = SPLITS) -> Dataset:
    """Read a dataset written by :func:`push_dataset`, verifying every array against the manifest.

    Args:
        store: a :class:`labelshift.storage.Store`.
        prefix: where the dataset was pushed.
        expected_name: when given, a manifest for another dataset is a FormatError.
        splits: the pools to read (the others are None in the result).

    Raises:
        ObjectNotFoundError: no manifest at ``prefix`` (never pushed, or a push did not finish).
        FormatError: wrong dataset or version, a missing or altered array (checksum), shapes, dtypes, labels or
            class counts that disagree with the manifest; the message names the file and how to fix it.
    """
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise InputError(f"splits must be among {SPLITS}, got {unknown}.")
    manifest = read_manifest(store, prefix, expected_name)
    n_classes = int(manifest["n_classes"])
    pools: dict[str, Split | None] = {s: None for s in SPLITS}
    for split in splits:
        x = _read_array(store, prefix, f"{split}/x.npy", manifest)
        y = _read_array(store, prefix, f"{split}/y.npy", manifest)
        if x.shape[0] != y.shape[0]:
            raise FormatError(f"{_key(prefix, split)}: {x.shape[0]} images but {y.shape[0]} labels; "
                              f"{_fix(manifest, prefix)}.")
        if y.size and (y.min() < 0 or y.max() >= n_classes):
            raise FormatError(f"{_key(prefix, split + '/y.npy')}: labels outside 0..{n_classes - 1}; "
                              f"{_fix(manifest, prefix)}.")
        counts = np.bincount(y, minlength=n_classes).tolist()
        if counts != manifest["class_counts"].get(split):
            raise FormatError(f"{_key(prefix, split + '/y.npy')}: class counts {counts} differ from the manifest's "
                              f"{manifest['class_counts'].get(split)}; {_fix(manifest, prefix)}.")
        pools[split] = Split(x, y)
    return Dataset(name=manifest["dataset"], n_classes=n_classes, manifest=manifest, **pools)


__all__ = ["Dataset", "FORMAT_VERSION", "Split", "build_splits", "dataset_fingerprint", "load_dataset",
           "push_dataset", "read_manifest"]
