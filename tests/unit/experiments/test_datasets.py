"""Datasets: the MNIST idx and CIFAR-10 python-batch readers on small files written here in those formats, and the
push / load round trip of the canonical layout with its failure modes (corruption, checksums, wrong dataset,
interrupted pushes). No downloads."""
from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import struct
import tarfile

import numpy as np
import pytest

from labelshift.experiments.datasets import sources
from labelshift.experiments.datasets import (DATASETS, build_splits, dataset_fingerprint, load_dataset, parse_idx,
                                             push_dataset, read_cifar10_folder, read_cifar_batch, read_idx,
                                             read_manifest, read_mnist_folder, read_mnist_pair, stratified_split)
from labelshift.errors import FormatError, InputError, ObjectNotFoundError
from labelshift.storage import open_store


# --------------------------------------------------------------------------------------- writers of the formats
def idx_bytes(arr: np.ndarray) -> bytes:
    """IDX encoding (magic 0x0000TTDD, big-endian uint32 dims, big-endian data)."""
    codes = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype("i2"): 0x0B, np.dtype("i4"): 0x0C,
             np.dtype("f4"): 0x0D, np.dtype("f8"): 0x0E}
    code = codes[arr.dtype.newbyteorder("=")]
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path, arr, gz=False):
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def fake_mnist(n, seed, size=28):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 10  # every class present
    rng.shuffle(y)
    x = rng.integers(0, 256, size=(n, size, size), dtype=np.uint8)
    return x, y.astype(np.uint8)


def write_mnist_folder(folder, n_train=80, n_test=30, gz=False):
    folder.mkdir(parents=True, exist_ok=True)
    (xtr, ytr), (xte, yte) = fake_mnist(n_train, 1), fake_mnist(n_test, 2)
    sfx = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{sfx}", xtr, gz)
    write_idx(folder / f"train-labels-idx1-ubyte{sfx}", ytr, gz)
    write_idx(folder / f"t10k-images-idx3-ubyte{sfx}", xte, gz)
    write_idx(folder / f"t10k-labels-idx1-ubyte{sfx}", yte, gz)
    return (xtr, ytr), (xte, yte)


class Py2StylePickler(pickle._Pickler):
    """Pickles bytes with the Python 2 ``str`` opcodes (SHORT_BINSTRING / BINSTRING) at protocol 2, as the
    CIFAR-10 files (written by Python 2's cPickle) do, instead of Python 3's ``_codecs.encode`` reduction."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def cifar_blob(obj, style="py2"):
    if style == "py2":
        buf = io.BytesIO()
        Py2StylePickler(buf, protocol=2).dump(obj)
        # numpy 1.x (and the real files) name the array reconstructor numpy.core.multiarray
        return buf.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    return pickle.dumps(obj, protocol=int(style))


def fake_cifar_batch(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    y = [int(v) for v in np.arange(n) % 10]
    return x, y, {b"batch_label": b"training batch", b"labels": y, b"data": x.reshape(n, 3072),
                  b"filenames": [f"img_{i}.png".encode() for i in range(n)]}


def write_cifar_folder(folder, per_batch=12, style="py2"):
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i in range(1, 6):
        x, y, batch = fake_cifar_batch(per_batch, i)
        (folder / f"data_batch_{i}").write_bytes(cifar_blob(batch, style))
        xs.append(x)
        ys += y
    xt, yt, batch = fake_cifar_batch(per_batch, 99)
    (folder / "test_batch").write_bytes(cifar_blob(batch, style))
    meta = {b"label_names": [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog",
                                                  "horse", "ship", "truck")],
            b"num_cases_per_batch": per_batch, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(cifar_blob(meta, style))
    return (np.concatenate(xs), np.array(ys)), (xt, np.array(yt))


@pytest.fixture
def store(tmp_path):
    return open_store(tmp_path / "store")


# ------------------------------------------------------------------------------------------------------- IDX
@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_round_trip_plain_and_gzip(tmp_path, gz):
    (xtr, ytr), (xte, yte) = write_mnist_folder(tmp_path / "m", gz=gz)
    data = read_mnist_folder(tmp_path / "m")
    np.testing.assert_array_equal(data["train"][0], xtr)
    np.testing.assert_array_equal(data["train"][1], ytr)
    np.testing.assert_array_equal(data["test"][0], xte)
    assert data["test"][1].dtype == np.int64 and np.array_equal(data["test"][1], yte)


def test_mnist_folder_in_torchvision_layout(tmp_path):
    (xtr, _), _ = write_mnist_folder(tmp_path / "root" / "MNIST" / "raw", gz=True)
    np.testing.assert_array_equal(read_mnist_folder(tmp_path / "root")["train"][0], xtr)


@pytest.mark.parametrize("dtype", ["u1", "i1", "i2", "i4", "f4", "f8"])
def test_idx_decodes_every_type_big_endian(dtype):
    arr = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype) if dtype != "u1" else np.arange(24, dtype="u1")
    out = parse_idx(idx_bytes(arr))
    assert out.dtype.isnative and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_idx_wrong_magic_names_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"\x12\x34\x08\x03" + bytes(100))
    with pytest.raises(FormatError, match="train-images-idx3-ubyte.*magic"):
        read_idx(path)


def test_idx_truncated_and_overlong(tmp_path):
    data = idx_bytes(np.zeros((5, 28, 28), np.uint8))
    cut = tmp_path / "cut"
    cut.write_bytes(data[:-10])
    with pytest.raises(FormatError, match="cut: truncated"):
        read_idx(cut)
    long = tmp_path / "long"
    long.write_bytes(data + b"xx")
    with pytest.raises(FormatError, match="long: 2 unexpected bytes"):
        read_idx(long)
    header_only = tmp_path / "hdr"
    header_only.write_bytes(data[:6])
    with pytest.raises(FormatError, match="hdr: truncated IDX header"):
        read_idx(header_only)


def test_idx_truncated_gzip(tmp_path):
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(500, dtype=np.uint8) % 10, gz=True)
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(FormatError, match="t10k-labels-idx1-ubyte.gz: corrupted or truncated gzip"):
        read_idx(path)


def test_mnist_pair_checks_magic_lengths_and_labels(tmp_path):
    x, y = fake_mnist(20, 0)
    images = write_idx(tmp_path / "images", x)
    labels = write_idx(tmp_path / "labels", y)
    short = write_idx(tmp_path / "short-labels", y[:19])
    with pytest.raises(FormatError, match="20 images but .*short-labels holds 19 labels"):
        read_mnist_pair(images, short)
    bad = write_idx(tmp_path / "bad-labels", np.where(y == 3, 12, y).astype(np.uint8))
    with pytest.raises(FormatError, match="bad-labels: labels must lie in 0..9"):
        read_mnist_pair(images, bad)
    with pytest.raises(FormatError, match="labels: magic number 0x00000801, expected 0x00000803"):
        read_mnist_pair(labels, labels)  # a label file where the images should be
    xs, ys = read_mnist_pair(images, labels)
    assert xs.shape == (20, 28, 28) and ys.tolist() == y.tolist()


# -------------------------------------------------------------------------------------------------- CIFAR-10
@pytest.mark.parametrize("style", ["py2", "2", "4", "5"])
def test_cifar_batch_round_trip(tmp_path, style):
    x, y, batch = fake_cifar_batch(7, 3)
    path = tmp_path / "data_batch_1"
    path.write_bytes(cifar_blob(batch, style))
    xs, ys = read_cifar_batch(path)
    assert xs.shape == (7, 3, 32, 32) and xs.dtype == np.uint8
    np.testing.assert_array_equal(xs, x)  # rows are the R, G, B planes one after another
    assert ys.dtype == np.int64 and ys.tolist() == y


@pytest.mark.parametrize("layout", ["flat", "subfolder", "archive"])
def test_cifar10_folder_layouts(tmp_path, layout):
    inner = tmp_path / "src" / ("cifar-10-batches-py" if layout != "flat" else "")
    (xtr, ytr), (xte, yte) = write_cifar_folder(inner)
    source = tmp_path / "src"
    if layout == "archive":
        archive = tmp_path / "arch" / "cifar-10-python.tar.gz"
        archive.parent.mkdir()
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(inner, arcname="cifar-10-batches-py")
        source = archive.parent
    data = read_cifar10_folder(source)
    np.testing.assert_array_equal(data["train"][0], xtr)
    np.testing.assert_array_equal(data["train"][1], ytr)
    np.testing.assert_array_equal(data["test"][0], xte)
    assert data["classes"][0] == "airplane" and len(data["classes"]) == 10


def test_cifar_refuses_foreign_globals_without_running_them(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}, protocol=2))
    with pytest.raises(FormatError, match=r"data_batch_1: .*global 'posix.mkdir' is not allowed"):
        read_cifar_batch(path)
    assert not marker.exists()


def test_cifar_truncated_and_inconsistent_batches(tmp_path):
    x, y, batch = fake_cifar_batch(10, 0)
    blob = cifar_blob(batch)
    cut = tmp_path / "test_batch"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(FormatError, match="test_batch: .*truncated"):
        read_cifar_batch(cut)
    mismatch = tmp_path / "data_batch_2"
    mismatch.write_bytes(cifar_blob({**batch, b"labels": y[:-1]}))
    with pytest.raises(FormatError, match="data_batch_2: 10 images but 9 labels"):
        read_cifar_batch(mismatch)
    out_of_range = tmp_path / "data_batch_3"
    out_of_range.write_bytes(cifar_blob({**batch, b"labels": [10] + y[1:]}))
    with pytest.raises(FormatError, match="data_batch_3: labels must lie in 0..9"):
        read_cifar_batch(out_of_range)
    no_data = tmp_path / "data_batch_4"
    no_data.write_bytes(cifar_blob({b"labels": y}))
    with pytest.raises(FormatError, match="data_batch_4: no 'data' entry"):
        read_cifar_batch(no_data)
    wrong_width = tmp_path / "data_batch_5"
    wrong_width.write_bytes(cifar_blob({**batch, b"data": x.reshape(10, -1)[:, :100]}))
    with pytest.raises(FormatError, match=r"data_batch_5: 'data' must be a uint8 array of shape \(N, 3072\)"):
        read_cifar_batch(wrong_width)


def test_cifar_folder_with_a_missing_batch(tmp_path):
    write_cifar_folder(tmp_path / "c")
    (tmp_path / "c" / "data_batch_4").unlink()
    with pytest.raises(FormatError, match="data_batch_4 is missing"):
        read_cifar10_folder(tmp_path / "c")


# ------------------------------------------------------------------------------------------- push and load
def test_digits_push_load_round_trip(store):
    arrays, _ = build_splits("digits", seed=3)
    manifest = push_dataset("digits", store, "data/digits", seed=3)
    ds = load_dataset(store, "data/digits", expected_name="digits")
    assert ds.name == "digits" and ds.n_classes == 10 and ds.image_shape == (1, 8, 8)
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(ds.split(split).x, arrays[split][0])
        np.testing.assert_array_equal(ds.split(split).y, arrays[split][1])
        assert ds.split(split).x.dtype == np.uint8 and ds.split(split).y.dtype == np.int64
    # 1,797 images: 20% stratified test, then 25% of the rest as valid
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (1079, 359, 359)
    assert len(ds.train) + len(ds.valid) + len(ds.test) == 1797
    assert ds.train.x.max() == 255  # 0..16 scaled to 0..255
    # stratified: every class's share of each split is within one example of the requested fraction
    total = np.bincount(np.concatenate([ds.train.y, ds.valid.y, ds.test.y]))
    assert np.all(np.abs(np.bincount(ds.test.y) - 0.2 * total) <= 0.5)
    assert manifest["class_counts"]["valid"] == np.bincount(ds.valid.y).tolist()
    assert manifest["split"] == {"method": "stratified", "seed": 3, "valid_fraction": 0.25, "test_fraction": 0.2,
                                 "test": "carved"}
    assert set(manifest["sha256"]) == {f"{s}/{p}.npy" for s in ("train", "valid", "test") for p in "xy"}
    assert sorted(store.list("data/digits/")) == sorted(
        [f"data/digits/{k}" for k in manifest["sha256"]] + ["data/digits/manifest.json"])
    # the same seed gives the same split (and content fingerprint), another seed another one
    again = push_dataset("digits", store, "elsewhere", seed=3)
    assert dataset_fingerprint(again) == dataset_fingerprint(manifest) == dataset_fingerprint(ds.manifest)
    assert dataset_fingerprint(push_dataset("digits", store, "elsewhere", seed=4)) != dataset_fingerprint(manifest)
    other = build_splits("digits", seed=4)[0]
    assert not np.array_equal(other["test"][1], arrays["test"][1])


def test_load_only_some_splits(store):
    push_dataset("digits", store, "d")
    ds = load_dataset(store, "d", splits=("valid",))
    assert ds.train is None and ds.test is None and len(ds.valid) == 359
    with pytest.raises(InputError, match="split 'train' was not loaded"):
        ds.split("train")


def test_small_mnist_push_from_idx_files(tmp_path, store):
    (xtr, ytr), (xte, yte) = write_mnist_folder(tmp_path / "raw", n_train=80, n_test=30, gz=True)
    manifest = push_dataset("mnist", store, "mnist", source_dir=tmp_path / "raw", valid_fraction=0.25, seed=0)
    ds = load_dataset(store, "mnist", expected_name="mnist")
    np.testing.assert_array_equal(ds.test.x, xte)  # the provided test set is kept as is
    np.testing.assert_array_equal(ds.test.y, yte)
    assert (len(ds.train), len(ds.valid)) == (60, 20)
    # train and valid partition the training file, each keeping the file's order
    merged = np.sort(np.concatenate([ds.train.x.reshape(60, -1), ds.valid.x.reshape(20, -1)]), axis=0)
    np.testing.assert_array_equal(merged, np.sort(xtr.reshape(80, -1), axis=0))
    assert manifest["split"]["test"] == "provided" and manifest["source"]["kind"] == "folder"
    assert [f["name"] for f in manifest["source"]["files"]][0] == "train-images-idx3-ubyte.gz"


def test_cifar10_push_from_python_batches(tmp_path, store):
    (xtr, _), (xte, _) = write_cifar_folder(tmp_path / "cifar-10-batches-py", per_batch=10)
    push_dataset("cifar10", store, "c10", source_dir=tmp_path, valid_fraction=0.2)
    ds = load_dataset(store, "c10", expected_name="cifar10")
    assert ds.train.x.shape == (40, 3, 32, 32) and ds.valid.x.shape == (10, 3, 32, 32)
    np.testing.assert_array_equal(ds.test.x, xte)
    assert ds.manifest["classes"][9] == "truck" and ds.in_channels == 3 and ds.image_size == 32


def test_corrupted_source_fails_before_anything_is_written(tmp_path, store):
    write_mnist_folder(tmp_path / "raw")
    path = tmp_path / "raw" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FormatError, match="t10k-images-idx3-ubyte: truncated"):
        push_dataset("mnist", store, "mnist", source_dir=tmp_path / "raw")
    assert store.list("") == []


def test_checksum_mismatch_behind_the_stores_back(store):
    push_dataset("digits", store, "d")
    path = store.root / "d" / "train" / "x.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip one pixel's bits on disk
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"checksum mismatch.*train/x\.npy.*push it again"):
        load_dataset(store, "d")


def test_checksum_mismatch_against_the_manifest(store):
    push_dataset("digits", store, "d")
    ds = load_dataset(store, "d")
    altered = ds.valid.x.copy()
    altered[0, 0, 0] ^= 1
    buf = io.BytesIO()
    np.save(buf, altered)
    store.put_bytes("d/valid/x.npy", buf.getvalue())  # the store's own record agrees; the manifest does not
    with pytest.raises(FormatError, match=r"d/valid/x\.npy: checksum mismatch.*labelshift data push digits"):
        load_dataset(store, "d")


def test_shape_mismatch_against_the_manifest(store):
    push_dataset("digits", store, "d")
    manifest = store.get_json("d/manifest.json")
    buf = io.BytesIO()
    np.save(buf, np.zeros((3, 8, 8), np.uint8))
    manifest["sha256"]["test/x.npy"] = store.put_bytes("d/test/x.npy", buf.getvalue())
    store.put_json("d/manifest.json", manifest)
    with pytest.raises(FormatError, match=r"d/test/x\.npy: uint8 array of shape \(3, 8, 8\), the manifest says"):
        load_dataset(store, "d")


def test_manifest_for_the_wrong_dataset(store):
    push_dataset("digits", store, "mnist-5k")
    with pytest.raises(FormatError, match="manifest is for dataset 'digits', not 'mnist-5k'"):
        load_dataset(store, "mnist-5k", expected_name="mnist-5k")
    store.put_json("other/manifest.json", {"hello": "world"})
    with pytest.raises(FormatError, match="not a labelshift dataset manifest"):
        load_dataset(store, "other")
    manifest = store.get_json("mnist-5k/manifest.json")
    store.put_json("old/manifest.json", {**manifest, "format_version": 99})
    with pytest.raises(FormatError, match="format version 99"):
        read_manifest(store, "old")


def test_missing_dataset(store):
    with pytest.raises(ObjectNotFoundError, match="no dataset at 'nowhere/manifest.json'"):
        load_dataset(store, "nowhere")


class FailingStore:
    """Delegates to a real store but raises on the n-th put_bytes, as a dropped connection would."""

    def __init__(self, inner, fail_at):
        self.inner, self.fail_at, self.puts = inner, fail_at, 0

    def put_bytes(self, key, data, **kw):
        self.puts += 1
        if self.puts == self.fail_at:
            raise ConnectionError("connection reset")
        return self.inner.put_bytes(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("fail_at", [1, 4])
def test_failed_push_leaves_nothing_readable(store, fail_at):
    push_dataset("digits", store, "d", seed=0)  # an older dataset at the same prefix
    with pytest.raises(ConnectionError):
        push_dataset("digits", FailingStore(store, fail_at), "d", seed=1)
    assert store.list("d/") == []  # the partial arrays were removed, the old manifest first of all
    with pytest.raises(ObjectNotFoundError):
        load_dataset(store, "d")


def test_mnist_5k_split_sizes():
    arrays, manifest = build_splits("mnist-5k")
    sizes = {s: arrays[s][0].shape for s in arrays}
    assert sizes == {"train": (3000, 28, 28), "valid": (1000, 28, 28), "test": (1000, 28, 28)}
    assert manifest["class_counts"] == {"train": [300] * 10, "valid": [100] * 10, "test": [100] * 10}
    assert arrays["train"][0].dtype == np.uint8 and arrays["train"][0].max() == 255


def test_registry_and_argument_errors(tmp_path, store):
    assert set(DATASETS) == {"mnist", "fashion-mnist", "cifar10", "mnist-5k", "digits"}
    with pytest.raises(InputError, match="unknown dataset 'svhn'"):
        push_dataset("svhn", store, "x")
    with pytest.raises(InputError, match="mnist is not bundled: pass source_dir"):
        push_dataset("mnist", store, "x")
    with pytest.raises(FormatError, match="no train-images-idx3-ubyte"):
        push_dataset("mnist", store, "x", source_dir=tmp_path)
    with pytest.raises(InputError, match="strictly between 0 and 1"):
        push_dataset("digits", store, "x", valid_fraction=1.0)
    assert store.list("") == []


def test_stratified_split_is_seeded_and_proportional():
    y = np.repeat(np.arange(4), [10, 20, 30, 40])
    keep, carved = stratified_split(y, 0.3, seed=5)
    assert np.bincount(y[carved]).tolist() == [3, 6, 9, 12]
    assert np.intersect1d(keep, carved).size == 0 and keep.size + carved.size == y.size
    np.testing.assert_array_equal(stratified_split(y, 0.3, seed=5)[1], carved)
    assert not np.array_equal(stratified_split(y, 0.3, seed=6)[1], carved)
    json.dumps(build_splits("digits")[1])  # the manifest is plain JSON


# ---------------------------------------------------------------------------------------------- fashion-mnist
def test_fashion_mnist_from_idx_files_in_a_folder(tmp_path, store):
    (xtr, ytr), (xte, yte) = write_mnist_folder(tmp_path / "raw", n_train=120, n_test=30, gz=True)
    manifest = push_dataset("fashion-mnist", store, "fm", source_dir=tmp_path / "raw")
    ds = load_dataset(store, "fm", expected_name="fashion-mnist")
    np.testing.assert_array_equal(ds.test.x, xte)       # the given test set, as is
    np.testing.assert_array_equal(ds.test.y, yte)
    assert (len(ds.train), len(ds.valid)) == (100, 20)  # the default valid share, 1/6, per class
    assert manifest["classes"] == ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                                   "Sneaker", "Bag", "Ankle boot"]
    assert (ds.mean, ds.std, ds.image_shape) == ((0.2860,), (0.3530,), (1, 28, 28))
    assert manifest["source"]["kind"] == "folder" and len(manifest["source"]["files"]) == 4
    assert DATASETS["fashion-mnist"].offline and DATASETS["fashion-mnist"].model == "lenet"


def test_fashion_mnist_reads_the_debian_package_folder_by_default(tmp_path, monkeypatch):
    (xtr, _), _ = write_mnist_folder(tmp_path / "pkg", n_train=60, n_test=20, gz=True)
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "pkg")
    arrays, manifest = build_splits("fashion-mnist")
    assert manifest["source"]["kind"] == "debian-package"
    assert manifest["source"]["package"] == "dataset-fashion-mnist"
    assert manifest["source"]["folder"] == str(tmp_path / "pkg")
    assert sum(len(arrays[s][1]) for s in ("train", "valid")) == len(xtr)


def test_fashion_mnist_without_the_package_says_how_to_get_it(tmp_path, monkeypatch, store):
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "not-installed")
    with pytest.raises(InputError) as err:
        push_dataset("fashion-mnist", store, "fm")
    msg = str(err.value)
    assert str(tmp_path / "not-installed") in msg and "does not exist" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "source_dir" in msg and "labelshift data push fashion-mnist --from DIR" in msg
    # a package folder with a file missing: reinstall, or source_dir
    write_mnist_folder(tmp_path / "partial", gz=True)
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "partial")
    with pytest.raises(InputError, match=r"incomplete: .*no t10k-labels-idx1-ubyte.*apt-get install --reinstall "
                                         r"dataset-fashion-mnist.*--from DIR"):
        push_dataset("fashion-mnist", store, "fm")
    assert store.list("") == []


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_truncated_file_is_a_format_error(tmp_path, monkeypatch, store, gz):
    write_mnist_folder(tmp_path / "pkg", gz=gz)
    path = tmp_path / "pkg" / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", tmp_path / "pkg")
    expected = "corrupted or truncated gzip file" if gz else "truncated: the header promises shape"
    for source_dir in (None, tmp_path / "pkg"):         # the package's folder and a folder given
        with pytest.raises(FormatError, match=expected) as err:
            push_dataset("fashion-mnist", store, "fm", source_dir=source_dir)
        assert str(path) in str(err.value)
    assert store.list("") == []


@pytest.mark.skipif(not sources.FASHION_MNIST_DIR.is_dir(),
                    reason=f"Debian's dataset-fashion-mnist is not installed ({sources.FASHION_MNIST_DIR} is missing; "
                           "`make setup` installs it where apt-get works)")
def test_fashion_mnist_package_split_and_normalisation():
    arrays, manifest = build_splits("fashion-mnist")
    assert {s: arrays[s][0].shape for s in arrays} == {
        "train": (50000, 28, 28), "valid": (10000, 28, 28), "test": (10000, 28, 28)}
    assert manifest["class_counts"] == {"train": [5000] * 10, "valid": [1000] * 10, "test": [1000] * 10}
    # the registry's normalisation: the training file's 60,000 images (train + valid pools), scaled to [0, 1]
    pixels = np.concatenate([arrays["train"][0], arrays["valid"][0]]).astype(np.float64) / 255.0
    spec = DATASETS["fashion-mnist"]
    assert abs(pixels.mean() - spec.mean[0]) < 5e-5 and abs(pixels.std() - spec.std[0]) < 5e-5
