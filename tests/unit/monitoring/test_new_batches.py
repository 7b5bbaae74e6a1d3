"""Finding, loading and answering new batches (:mod:`labelshift.monitoring.listing`, ``.inputs``, ``.outputs``): each
batch counted once across runs and crashes, bad or changed batches refused by name, outputs checked before anything is
written, and only new or changed data hashed; on a local folder and on a real SeaweedFS S3 server (the ``seaweed`` /
``s3_bucket`` fixtures). The watermark itself: test_watermark.py."""
from __future__ import annotations

import hashlib
import io
import json
import pickle

import numpy as np
import pytest

from labelshift.errors import FormatError, InputError, ObjectNotFoundError, StorageError
from labelshift.monitoring.inputs import load_batch
from labelshift.monitoring.layout import (CORRECTED_SUFFIX, STATE_PREFIX, SUMMARY_SUFFIX, WATERMARK_KEY,
                                          ChangedBatchError, TargetBatch)
from labelshift.monitoring.listing import NoBatchError, find_new_batches, list_batches
from labelshift.monitoring.outputs import write_batch_outputs
from labelshift.monitoring.watermark import Watermark, commit_watermark, read_watermark
from labelshift import storage
from labelshift.storage import LocalStore, ObjectInfo, RetryPolicy, open_store

FAST_RETRY = RetryPolicy(max_attempts=3)
INPUT_SHAPE = (3,)


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return open_store(str(tmp_path / "target"))


@pytest.fixture
def s3_store(s3_bucket):
    return open_store(f"s3://{s3_bucket}/target/", retry=FAST_RETRY)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


# -- helpers -----------------------------------------------------------------------------------------------------------
def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def npy_bytes(arr, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, arr, allow_pickle=allow_pickle)
    return buffer.getvalue()


def features(seed: int, n: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *INPUT_SHAPE)).astype(np.float32)


def softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def snapshot(store) -> dict[str, bytes]:
    """Every object of the store with its content: compared before and after an operation that must write nothing."""
    return {key: store.get_bytes(key) for key in store.list()}


def process(store, batches, *, attempt: int = 1) -> None:
    """What a run does per batch between find and commit: load, 'correct', write the outputs."""
    for batch in batches:
        x = load_batch(store, batch, input_shape=INPUT_SHAPE)
        write_batch_outputs(store, batch, softmax_rows(x.astype(np.float64)), {"attempt": attempt},
                            n_rows=x.shape[0])


def commit(store, previous, batches, **record):
    return commit_watermark(store, previous, batches, {"p_value": 0.5, **record})


# -- the normal cycle --------------------------------------------------------------------------------------------------
def test_first_run_sees_all_then_nothing_then_only_the_new_batch(store):
    store.put_array("2026/11/24/part-0.npy", features(0))
    store.put_array("2026/11/25/part-0.npy", features(1, n=7))
    assert read_watermark(store) == Watermark()

    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["2026/11/24/part-0.npy", "2026/11/25/part-0.npy"]
    assert watermark.sequence == 0 and watermark.processed == {}
    for batch in new:
        assert batch.checksum == sha(store.get_bytes(batch.key))
    x = load_batch(store, new[1], input_shape=INPUT_SHAPE)
    assert x.dtype == np.float32 and x.shape == (7, 3) and np.array_equal(x, features(1, n=7))
    process(store, new)

    first = commit(store, watermark, new, target_prior=np.array([0.25, 0.75]), p_value=np.float64(0.01))
    assert first.sequence == 1 and first.updated_at is not None
    assert first.processed == {b.key: b.checksum for b in new}
    assert len(first.history) == 1
    entry = first.history[0]
    assert entry["sequence"] == 1 and entry["batches"] == [b.key for b in new]
    assert entry["target_prior"] == [0.25, 0.75] and entry["p_value"] == 0.01  # numpy values stored as JSON numbers
    assert read_watermark(store) == first

    assert find_new_batches(store) == ([], first)

    store.put_array("2026/11/26/part-0.npy", features(2))
    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["2026/11/26/part-0.npy"] and watermark == first
    process(store, new)
    second = commit(store, watermark, new)
    assert second.sequence == 2 and len(second.processed) == 3 and len(second.history) == 2
    assert second.history[1]["batches"] == ["2026/11/26/part-0.npy"]
    assert find_new_batches(store)[0] == []


def test_outputs_are_written_next_to_each_batch(store):
    store.put_array("day/a.npy", features(0))
    [batch], _ = find_new_batches(store)
    corrected = softmax_rows(np.random.default_rng(3).normal(size=(5, 4)))
    written = write_batch_outputs(store, batch, corrected, {"target_prior": np.array([0.1, 0.2, 0.3, 0.4])},
                                  n_rows=5)
    assert store.list() == ["day/a.corrected.npy", "day/a.npy", "day/a.summary.json"]
    stored = store.get_array("day/a.corrected.npy")
    assert stored.dtype == np.float32 and np.allclose(stored, corrected, atol=1e-7)
    summary = store.get_json("day/a.summary.json")
    assert summary == written
    assert summary["target_prior"] == [0.1, 0.2, 0.3, 0.4]
    assert summary["input"] == {"key": "day/a.npy", "uri": store.url("day/a.npy"), "sha256": batch.checksum, "rows": 5}
    assert summary["output"]["sha256"] == store.checksum("day/a.corrected.npy")
    assert summary["output"]["key"] == "day/a.corrected.npy" and summary["output"]["classes"] == 4
    assert not store.exists(WATERMARK_KEY)  # outputs alone never move the watermark


def test_outputs_and_state_are_never_batches(store):
    for key in ["a.npy", "sub/b.npy", "sub/deeper/c.npy", "_labelshift/cache/x.npy", "sub/_labelshift/d.npy"]:
        store.put_array(key, features(0))
    store.put_array("sub/orphan.corrected.npy", np.full((2, 2), 0.5))  # an output whose input was removed
    store.put_bytes("notes.txt", b"not a batch")
    store.put_bytes("upper.NPY", npy_bytes(features(0)))  # suffixes are case-sensitive
    new, watermark = find_new_batches(store)
    process(store, new)
    commit(store, watermark, new)
    # a nested '_labelshift' folder is ordinary data; only the top-level one belongs to the system
    expected = ["a.npy", "sub/_labelshift/d.npy", "sub/b.npy", "sub/deeper/c.npy"]
    assert [b.key for b in new] == expected
    assert [b.key for b in list_batches(store)] == expected  # after outputs and the watermark were written
    assert store.exists("sub/b" + CORRECTED_SUFFIX) and store.exists("sub/b" + SUMMARY_SUFFIX)
    assert store.exists(WATERMARK_KEY) and WATERMARK_KEY.startswith(STATE_PREFIX)

    batch = new[2]
    assert (batch.name, batch.corrected_key, batch.summary_key) == ("sub/b", "sub/b.corrected.npy",
                                                                     "sub/b.summary.json")
    for key in ["sub/b.corrected.npy", "_labelshift/x.npy", "b.json", ".npy"]:
        with pytest.raises(InputError, match="not a batch key"):
            TargetBatch(key, batch.checksum)
    with pytest.raises(InputError, match="64 lowercase hex"):
        TargetBatch("a.npy", "abc")


# -- crash between outputs and commit ----------------------------------------------------------------------------------
def test_crash_between_outputs_and_commit_loses_nothing_and_counts_nothing_twice(store):
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))

    # run 1 crashes after writing all outputs, before the commit
    new, watermark = find_new_batches(store)
    with pytest.raises(RuntimeError, match="worker killed"):
        process(store, new, attempt=1)
        raise RuntimeError("worker killed")
    assert store.exists("a.corrected.npy") and store.exists("b.summary.json")
    assert not store.exists(WATERMARK_KEY) and read_watermark(store) == Watermark()

    # run 2 finds the same batches, overwrites their outputs and commits once
    retry, watermark = find_new_batches(store)
    assert retry == new
    process(store, retry, attempt=2)
    after = commit(store, watermark, retry)
    assert after.sequence == 1 and after.processed == {b.key: b.checksum for b in new}
    assert len(after.history) == 1 and after.history[0]["batches"] == ["a.npy", "b.npy"]
    assert store.get_json("a.summary.json")["attempt"] == 2
    assert find_new_batches(store)[0] == []

    # a later run crashes the same way: the committed watermark stays byte for byte as it was
    store.put_array("c.npy", features(2))
    committed = store.get_bytes(WATERMARK_KEY)
    new, watermark = find_new_batches(store)
    with pytest.raises(RuntimeError):
        process(store, new)
        raise RuntimeError("worker killed")
    assert store.get_bytes(WATERMARK_KEY) == committed
    assert [b.key for b in find_new_batches(store)[0]] == ["c.npy"]


def test_crash_between_corrected_and_summary(store, monkeypatch):
    store.put_array("a.npy", features(0))
    new, watermark = find_new_batches(store)
    real_put = store.put_bytes

    def dying_put(key, data, **kwargs):
        if key.endswith(SUMMARY_SUFFIX):
            raise StorageError("connection lost")
        return real_put(key, data, **kwargs)

    monkeypatch.setattr(store, "put_bytes", dying_put)
    with pytest.raises(StorageError, match="connection lost"):
        process(store, new)
    monkeypatch.undo()
    assert store.exists("a.corrected.npy") and not store.exists("a.summary.json")
    assert find_new_batches(store) == (new, Watermark())
    process(store, new, attempt=2)
    assert commit(store, watermark, new).processed == {"a.npy": new[0].checksum}
    assert store.get_json("a.summary.json")["attempt"] == 2


# -- empty or missing target -------------------------------------------------------------------------------------------
def test_empty_target_is_refused_with_a_clear_message(store):
    with pytest.raises(InputError) as error:
        find_new_batches(store)
    message = str(error.value)
    assert store.uri in message and "NAME.npy" in message and "(n, *model input shape)" in message
    if isinstance(store, LocalStore):
        assert "folder does not exist" in message
        assert not store.root.exists()  # nothing was created
    else:
        assert "holds no objects" in message
    assert store.list() == []

    store.put_bytes("readme.txt", b"data comes tomorrow")
    store.put_array("x.corrected.npy", np.full((1, 2), 0.5))
    before = snapshot(store)
    with pytest.raises(InputError, match=r"holds 2 object\(s\) but none is an input batch \('readme.txt'"):
        find_new_batches(store)
    assert snapshot(store) == before


def test_missing_local_folder(tmp_path):
    target = open_store(f"file://{tmp_path}/never/made")
    with pytest.raises(InputError, match=f"no target batch under file://{tmp_path}/never/made: the folder does not"):
        find_new_batches(target)
    assert not (tmp_path / "never").exists()


@pytest.mark.integration
def test_missing_s3_prefix_and_bucket(s3_bucket, seaweed):
    target = open_store(f"s3://{s3_bucket}/never/written/", retry=FAST_RETRY)
    with pytest.raises(InputError, match=f"no target batch under s3://{s3_bucket}/never/written: it holds no objects"):
        find_new_batches(target)
    assert seaweed.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    missing = open_store("s3://no-such-bucket-labelshift/target", retry=FAST_RETRY)
    with pytest.raises(ObjectNotFoundError, match="no-such-bucket-labelshift"):
        find_new_batches(missing)


def test_no_batch_names_every_kind_of_batch_and_a_caller_that_knows_the_model_names_its_own(tmp_path):
    target = open_store(f"file://{tmp_path}/target")
    with pytest.raises(NoBatchError) as info:
        find_new_batches(target)
    assert isinstance(info.value, InputError)
    said = str(info.value)
    assert "`labelshift reference register`" in said and "NAME.npy" in said and "scikit-learn or pyfunc" in said
    own = info.value.for_model("NAME.parquet with columns 'a', 'b'")
    assert str(own).startswith(f"no target batch under file://{tmp_path}/target: the folder does not exist. Write "
                               "each batch of new data there as NAME.parquet with columns 'a', 'b'; ")
    assert "NAME.npy" not in str(own) and isinstance(own, NoBatchError)
    import pickle

    again = pickle.loads(pickle.dumps(own))        # across a process boundary, or in Prefect's results
    assert str(again) == str(own) and again.uri == own.uri and again.why == own.why


def test_all_batches_deleted_after_a_run_is_no_new_data(store):
    """Retention removed every counted batch and nothing came: no new data, not an empty target."""
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))
    new, watermark = find_new_batches(store)
    process(store, new)
    first = commit(store, watermark, new)
    store.delete("a.npy")
    store.delete("b.npy")
    before = snapshot(store)  # outputs and the watermark are left, no input
    found, seen = find_new_batches(store)
    assert found == [] and seen == first and seen.fingerprints == {}
    assert snapshot(store) == before
    for key in list(store.list()):  # the outputs go too: only the watermark is left
        if key != WATERMARK_KEY:
            store.delete(key)
    assert find_new_batches(store) == ([], first)
    store.put_array("c.npy", features(2))
    assert [b.key for b in find_new_batches(store)[0]] == ["c.npy"]


# -- bad batches -------------------------------------------------------------------------------------------------------
UNPICKLED: list[str] = []


def _record_unpickling() -> str:
    UNPICKLED.append("unpickled")
    return "boom"


class Booby:
    """Records its own unpickling, which must never happen when a batch is loaded."""

    def __reduce__(self):
        return (_record_unpickling, ())


def _valid() -> bytes:
    return npy_bytes(features(0))


def _with_nan() -> np.ndarray:
    x = features(0)
    x[1, 2] = np.nan
    return x


def _with_inf() -> np.ndarray:
    x = features(0)
    x[3, 0] = -np.inf
    return x


BAD_BATCHES = {
    # name: (content, error type, pattern the message must hold besides the batch's URI)
    "int64": (np.arange(6).reshape(2, 3), InputError, r"dtype int64 \(expected float32.*astype\(numpy.float32\)"),
    "uint8-pixels": (np.zeros((2, 3), np.uint8), InputError, r"dtype uint8.*scaled to \[0, 1\]"),
    "bool": (np.ones((2, 3), bool), InputError, r"dtype bool \(expected float32"),
    "complex": (np.ones((2, 3), np.complex128), InputError, r"dtype complex128.*real-valued"),
    "object": (np.array([[Booby()] * 3], dtype=object), InputError, r"dtype object.*never loaded"),
    "strings": (np.array([["a", "b", "c"]]), InputError, r"dtype <U1.*plain float array"),
    "structured": (np.zeros((2,), [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]), InputError, r"dtype.*plain float"),
    "float128": (np.ones((2, 3), np.longdouble), InputError, r"dtype float128.*astype\(numpy.float32\)"),
    "trailing-dims": (np.zeros((2, 4), np.float32), InputError, r"shape \(2, 4\), but the model takes \(n, 3\)"),
    "flattened": (np.zeros((2, 1, 3), np.float32), InputError, r"sizes agree: save arr.reshape\(-1, 3\)"),
    "1-D": (np.zeros(6, np.float32), InputError, r"shape \(6,\).*1-D array is a flattened"),
    "scalar": (np.float32(1.0), InputError, r"shape \(\), but the model takes"),
    "zero-rows": (np.zeros((0, 3), np.float32), InputError, r"zero rows"),
    "nan": (_with_nan(), InputError, r"1 NaN or infinite value\(s\).*first row 1"),
    "inf": (_with_inf(), InputError, r"1 NaN or infinite value\(s\).*first row 3"),
    "float32-overflow": (np.full((2, 3), 1e39), InputError, r"NaN or infinite.*overflow"),
    "truncated": (_valid()[:-5], FormatError, r"truncated: its header promises 188 bytes"),
    "extra-bytes": (_valid() + b"\0", FormatError, r"followed by extra bytes"),
    "garbage": (b"this is not numpy at all", FormatError, r"not a \.npy file"),
    "empty-file": (b"", FormatError, r"not a \.npy file"),
    "npz": ("npz", FormatError, r"not a \.npy file"),
    "pickle": (pickle.dumps(features(0)), FormatError, r"not a \.npy file"),
    "corrupt-header": (b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4 }\n", FormatError, r"corrupt \.npy header"),
}


def _bad_content(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):  # an .npz archive under a .npy name
        buffer = io.BytesIO()
        np.savez(buffer, x=features(0))
        return buffer.getvalue()
    return npy_bytes(np.asarray(value), allow_pickle=True)


@pytest.mark.parametrize("case", BAD_BATCHES)
def test_bad_batch_is_refused_naming_it_and_nothing_is_written(store, case):
    content, error_type, pattern = BAD_BATCHES[case]
    store.put_array("good.npy", features(1))
    store.put_bytes("2026/bad.npy", _bad_content(content))
    before = snapshot(store)
    UNPICKLED.clear()

    new, watermark = find_new_batches(store)  # listing reads no content: the bad batch is a batch like the others
    assert [b.key for b in new] == ["2026/bad.npy", "good.npy"]
    with pytest.raises(error_type, match=pattern) as error:
        process(store, new)  # the bad batch comes first, as in a run that checks every batch before writing
    assert f"batch {store.url('2026/bad.npy')}" in str(error.value) or store.url("2026/bad.npy") in str(error.value)
    assert UNPICKLED == []
    assert snapshot(store) == before  # no output, no watermark
    assert find_new_batches(store)[0] == new


def test_object_arrays_are_not_unpickled():
    """The sentinel really fires when such a file is unpickled, so the check above can fail."""
    UNPICKLED.clear()
    np.load(io.BytesIO(_bad_content(BAD_BATCHES["object"][0])), allow_pickle=True)
    assert UNPICKLED == ["unpickled"]  # one object, three references (pickle's memo)
    UNPICKLED.clear()


def test_too_many_rows(local_store):
    local_store.put_array("big.npy", features(0, n=11))
    [batch], _ = find_new_batches(local_store)
    with pytest.raises(InputError, match=r"big.npy has 11 rows, more than max_rows=10; split it"):
        load_batch(local_store, batch, input_shape=INPUT_SHAPE, max_rows=10)
    assert load_batch(local_store, batch, input_shape=INPUT_SHAPE, max_rows=11).shape == (11, 3)
    with pytest.raises(InputError, match="input_shape must hold positive sizes"):
        load_batch(local_store, batch, input_shape=(0,))
    with pytest.raises(InputError, match="max_rows must be a positive integer"):
        load_batch(local_store, batch, input_shape=INPUT_SHAPE, max_rows=0)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f8", ">f4"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_float_batches_are_read_as_float32(local_store, dtype, order):
    x = np.asarray(np.random.default_rng(0).normal(size=(4, 2, 3)), dtype=dtype, order=order)
    local_store.put_bytes("x.npy", npy_bytes(x))
    [batch] = list_batches(local_store)
    out = load_batch(local_store, batch, input_shape=(2, 3))
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.flags.writeable
    assert np.array_equal(out, x.astype(np.float32))
    assert load_batch(local_store, batch, input_shape=None).shape == (4, 2, 3)


def test_batch_without_a_recorded_checksum(local_store):
    """A batch copied in by another tool (no .sha256 sidecar) is listed with the checksum of its content."""
    local_store.root.mkdir(parents=True)
    data = npy_bytes(features(0))
    (local_store.root / "copied.npy").write_bytes(data)
    [batch] = list_batches(local_store)
    assert batch.checksum == sha(data)
    assert np.array_equal(load_batch(local_store, batch, input_shape=INPUT_SHAPE), features(0))


def test_batch_replaced_while_a_run_is_going(store):
    store.put_array("a.npy", features(0))
    [listed], watermark = find_new_batches(store)
    store.put_array("a.npy", features(9))
    with pytest.raises(ChangedBatchError, match=r"a.npy changed after this run listed it") as error:
        load_batch(store, listed, input_shape=INPUT_SHAPE)
    assert error.value.changed == {"a.npy": (listed.checksum, store.checksum("a.npy"))}
    assert not store.exists(WATERMARK_KEY)


# -- a counted batch that changed --------------------------------------------------------------------------------------
def test_changed_batch_is_refused_unless_reprocessing_is_asked_for(store):
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))
    new, watermark = find_new_batches(store)
    process(store, new)
    first = commit(store, watermark, new)

    store.put_array("a.npy", features(5))  # same key, new content
    store.put_array("c.npy", features(2))
    before = snapshot(store)
    with pytest.raises(ChangedBatchError, match=r"1 batch\(es\) already counted have changed content") as error:
        find_new_batches(store)
    message = str(error.value)
    assert store.url("a.npy") in message and "under a new key" in message and "on_changed='reprocess'" in message
    assert "(e.g. NAME-v2.npy)" in message and "`labelshift estimate --reprocess-changed`" in message
    assert error.value.changed == {"a.npy": (first.processed["a.npy"], store.checksum("a.npy"))}
    assert isinstance(error.value, InputError)
    assert snapshot(store) == before

    new, watermark = find_new_batches(store, on_changed="reprocess")
    assert [b.key for b in new] == ["a.npy", "c.npy"] and watermark == first
    process(store, new)
    second = commit(store, watermark, new)
    assert second.processed == {"a.npy": store.checksum("a.npy"), "b.npy": first.processed["b.npy"],
                                "c.npy": store.checksum("c.npy")}
    assert second.history[-1]["batches"] == ["a.npy", "c.npy"] and second.history[-1]["replaced"] == ["a.npy"]
    assert "replaced" not in second.history[0]
    assert find_new_batches(store)[0] == []
    with pytest.raises(InputError, match="on_changed must be"):
        find_new_batches(store, on_changed="ignore")


def test_deleted_counted_batch_is_not_an_error(store):
    for key in ["a.npy", "b.npy"]:
        store.put_array(key, features(0))
    new, watermark = find_new_batches(store)
    first = commit(store, watermark, new)
    store.delete("a.npy")
    assert find_new_batches(store) == ([], first)
    assert "a.npy" in read_watermark(store).processed


def test_bad_outputs_are_refused_before_anything_is_written(store):
    store.put_array("a.npy", features(0))
    [batch], _ = find_new_batches(store)
    before = snapshot(store)
    probs = softmax_rows(np.random.default_rng(0).normal(size=(5, 3)))
    nan_probs = probs.copy()
    nan_probs[0, 0] = np.nan
    cases = [
        (dict(corrected=np.log(probs), summary={}), r"negative entries .* looks like logits"),
        (dict(corrected=probs * 2, summary={}), r"must sum to 1"),
        (dict(corrected=nan_probs, summary={}), r"NaN"),
        (dict(corrected=probs[0], summary={}), r"must be 2-D"),
        (dict(corrected=probs, summary={}, n_rows=6), r"have 5 rows but the batch has 6"),
        (dict(corrected=probs, summary={"model": object()}), r"cannot be written as JSON"),
        (dict(corrected=probs, summary={"input": "x"}), r"summary fields \['input'\] are set by"),
        (dict(corrected=probs, summary=[1]), r"summary must be a dict"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(InputError, match=pattern):
            write_batch_outputs(store, batch, **kwargs)
    assert snapshot(store) == before


# -- cost: only new or changed data is hashed ----------------------------------------------------------------------
class HashSpy:
    """Counts, per key, what a run hashes (``store.checksum``) and which batches it reads whole to do so (S3:
    ``get_bytes`` of an object without recorded sha256; local: the file read of one without a sidecar)."""

    def __init__(self, store, monkeypatch):
        self.hashed: list[str] = []
        self.read_whole: list[str] = []
        real_checksum, real_get = store.checksum, store.get_bytes
        real_file_sha = storage.local.file_sha256

        def checksum(key):
            self.hashed.append(key)
            return real_checksum(key)

        def get_bytes(key):
            if not key.startswith(STATE_PREFIX):  # the watermark is read by every run
                self.read_whole.append(key)
            return real_get(key)

        def file_sha(path):
            self.read_whole.append(path.relative_to(store.root).as_posix())
            return real_file_sha(path)

        monkeypatch.setattr(store, "checksum", checksum)
        if isinstance(store, LocalStore):
            monkeypatch.setattr(storage.local, "file_sha256", file_sha)
        else:
            monkeypatch.setattr(store, "get_bytes", get_bytes)

    def reset(self) -> None:
        self.hashed.clear()
        self.read_whole.clear()


def put_foreign(store, request, key: str, data: bytes, *, in_place: bool = True) -> None:
    """Write ``data`` as another tool would: locally a plain file without sidecar (written in place, or through a
    temporary file renamed over it), on S3 a bare put_object without labelshift's sha256 metadata."""
    if isinstance(store, LocalStore):
        path = store.root.joinpath(*key.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if in_place:
            path.write_bytes(data)
        else:
            temp = path.with_name("upload.tmp")
            temp.write_bytes(data)
            temp.replace(path)
    else:
        request.getfixturevalue("seaweed").client().put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}",
                                                               Body=data)


@pytest.fixture
def settled(monkeypatch):
    """Local files here are milliseconds old; trust their times anyway (test_fresh_local_file_... covers the
    default, under which a file changed within LocalStore.racy_seconds has no fingerprint yet)."""
    monkeypatch.setattr(LocalStore, "racy_seconds", 0.0)


def stored_fingerprints(store) -> dict:
    return json.loads(store.get_bytes(WATERMARK_KEY))["fingerprints"]


def test_foreign_batch_is_hashed_once_then_known_by_its_fingerprint(store, request, monkeypatch, settled):
    foreign = npy_bytes(features(0, n=6))
    put_foreign(store, request, "day1/foreign.npy", foreign)
    store.put_array("day1/ours.npy", features(1))
    spy = HashSpy(store, monkeypatch)

    new, watermark = find_new_batches(store)  # run 1: both are new, each hashed once
    assert [b.key for b in new] == ["day1/foreign.npy", "day1/ours.npy"]
    assert sorted(spy.hashed) == ["day1/foreign.npy", "day1/ours.npy"]
    assert spy.read_whole == ["day1/foreign.npy"]  # ours has its sha256 recorded: no read of its content
    assert new[0].checksum == sha(foreign) and new[0].fingerprint.size == len(foreign)
    process(store, new)
    first = commit(store, watermark, new)
    recorded = stored_fingerprints(store)
    assert sorted(recorded) == ["day1/foreign.npy", "day1/ours.npy"]
    assert recorded["day1/foreign.npy"]["size"] == len(foreign)
    assert recorded["day1/ours.npy"] == {"size": store.list_info()["day1/ours.npy"].size,
                                         "version": store.list_info()["day1/ours.npy"].version}
    assert read_watermark(store).fingerprints == first.fingerprints == {b.key: b.fingerprint for b in new}

    spy.reset()
    assert find_new_batches(store) == ([], first)  # run 2: nothing new, nothing hashed or read
    assert spy.hashed == [] and spy.read_whole == []

    for day in (2, 3):  # runs 3 and 4: only the day's new batch is hashed, the counted ones never again
        spy.reset()
        key = f"day{day}/foreign.npy"
        put_foreign(store, request, key, npy_bytes(features(day)))
        new, watermark = find_new_batches(store)
        assert [b.key for b in new] == [key]
        assert spy.hashed == [key] and spy.read_whole == [key]
        process(store, new)
        commit(store, watermark, new)
    spy.reset()
    assert find_new_batches(store)[0] == [] and spy.hashed == [] and spy.read_whole == []
    assert len(stored_fingerprints(store)) == 4


WRITERS = ["labelshift", "foreign-replace"]


@pytest.mark.parametrize("writer", WRITERS)
def test_rewritten_counted_batch_is_detected_through_its_fingerprint(store, request, monkeypatch, settled, writer):
    def write(key, arr):
        if writer == "labelshift":
            store.put_array(key, arr)
        else:  # a tool that writes a temporary file and renames it (rsync, aws s3 sync...)
            put_foreign(store, request, key, npy_bytes(arr), in_place=False)

    write("a.npy", features(0))
    write("b.npy", features(1))
    new, watermark = find_new_batches(store)
    process(store, new)
    first = commit(store, watermark, new)

    write("a.npy", features(5))  # same key, same size, other content
    spy = HashSpy(store, monkeypatch)
    with pytest.raises(ChangedBatchError) as error:
        find_new_batches(store)
    assert spy.hashed == ["a.npy"]  # b's fingerprint matched: not hashed
    assert error.value.changed == {"a.npy": (first.processed["a.npy"], sha(npy_bytes(features(5))))}

    new, watermark = find_new_batches(store, on_changed="reprocess")
    process(store, new)
    second = commit(store, watermark, new)
    assert stored_fingerprints(store)["a.npy"]["version"] == store.list_info()["a.npy"].version
    assert second.fingerprints["a.npy"] != first.fingerprints["a.npy"]
    spy.reset()
    assert find_new_batches(store)[0] == [] and spy.hashed == []


def test_in_place_rewrite_right_after_a_listing_is_still_detected(local_store, request, monkeypatch):
    """The racy case: a file written in place twice within one tick of the file clock keeps its size, inode, mtime
    and ctime. A file changed within the racy window (default 2 s; 60 s here so that a slow machine cannot step out
    of it) gets no fingerprint, so it is hashed again."""
    monkeypatch.setattr(LocalStore, "racy_seconds", 60.0)
    put_foreign(local_store, request, "a.npy", npy_bytes(features(0)))
    new, watermark = find_new_batches(local_store)
    assert new[0].fingerprint.version is None
    process(local_store, new)
    committed = commit(local_store, watermark, new)
    assert committed.fingerprints == {} and stored_fingerprints(local_store) == {}
    put_foreign(local_store, request, "a.npy", npy_bytes(features(5)))  # same size, same inode, at once
    with pytest.raises(ChangedBatchError, match="a.npy"):
        find_new_batches(local_store)


def test_same_content_under_a_new_fingerprint_is_not_a_change(store, monkeypatch, settled):
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))
    new, watermark = find_new_batches(store)
    process(store, new)
    commit(store, watermark, new)
    listed = store.list_info()

    # a stale token (as after a copy of the folder, or another tool's upload of the same bytes)
    data = json.loads(store.get_bytes(WATERMARK_KEY))
    data["fingerprints"]["a.npy"]["version"] = "stale"
    store.put_bytes(WATERMARK_KEY, json.dumps(data).encode())
    spy = HashSpy(store, monkeypatch)
    found, seen = find_new_batches(store)
    assert found == [] and spy.hashed == ["a.npy"]
    assert seen.fingerprints == {"a.npy": listed["a.npy"], "b.npy": listed["b.npy"]}  # refreshed, not yet written
    assert stored_fingerprints(store)["a.npy"]["version"] == "stale"

    # refreshed tokens are written by the next commit; until then each run hashes the batch again
    store.put_array("c.npy", features(2))
    spy.reset()
    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["c.npy"] and sorted(spy.hashed) == ["a.npy", "c.npy"]
    process(store, new)
    commit(store, watermark, new)
    assert stored_fingerprints(store)["a.npy"]["version"] == listed["a.npy"].version
    spy.reset()
    assert find_new_batches(store)[0] == [] and spy.hashed == []

    # the same bytes written again: the S3 ETag (the MD5 of the content) stays; a local file gets a new inode and is
    # hashed once, found unchanged
    store.put_array("b.npy", features(1))
    spy.reset()
    assert find_new_batches(store)[0] == []
    assert spy.hashed == (["b.npy"] if isinstance(store, LocalStore) else [])


def test_watermark_without_fingerprints_still_reads(store, monkeypatch, settled):
    """A watermark written before fingerprints existed: every counted batch is hashed once more (never counted
    again), and the next commit records the fingerprints."""
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))
    new, watermark = find_new_batches(store)
    process(store, new)
    committed = commit(store, watermark, new)
    old = {  # the shape the previous version wrote: no 'fingerprints' field
        "format": "labelshift-watermark", "version": 1, "sequence": 1, "updated_at": committed.updated_at,
        "run_id": committed.run_id, "processed": committed.processed, "history": committed.history,
    }
    store.put_bytes(WATERMARK_KEY, json.dumps(old).encode())
    assert read_watermark(store) == committed and read_watermark(store).fingerprints == {}

    spy = HashSpy(store, monkeypatch)
    found, seen = find_new_batches(store)
    assert found == [] and sorted(spy.hashed) == ["a.npy", "b.npy"]
    assert sorted(seen.fingerprints) == ["a.npy", "b.npy"]
    store.put_array("c.npy", features(2))
    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["c.npy"]
    process(store, new)
    commit(store, watermark, new)
    written = json.loads(store.get_bytes(WATERMARK_KEY))
    assert sorted(written["fingerprints"]) == ["a.npy", "b.npy", "c.npy"]
    # what an older reader relies on is unchanged: same major version, processed still maps key -> sha256
    assert written["version"] == 1
    assert written["processed"] == {k: sha(store.get_bytes(k)) for k in written["processed"]}
    spy.reset()
    assert find_new_batches(store)[0] == [] and spy.hashed == []


def test_list_batches_with_a_watermark_hashes_only_what_it_cannot_vouch_for(local_store, monkeypatch, settled):
    local_store.put_array("a.npy", features(0))
    new, watermark = find_new_batches(local_store)
    committed = commit(local_store, watermark, new)
    local_store.put_array("b.npy", features(1))
    spy = HashSpy(local_store, monkeypatch)
    assert [b.key for b in list_batches(local_store, committed)] == ["a.npy", "b.npy"] and spy.hashed == ["b.npy"]
    spy.reset()
    assert list_batches(local_store) == list_batches(local_store, committed)
    assert sorted(spy.hashed) == ["a.npy", "b.npy", "b.npy"]  # without a watermark every batch is hashed
    with pytest.raises(InputError, match="fingerprint of batch 'a.npy' must be an ObjectInfo"):
        TargetBatch("a.npy", new[0].checksum, {"size": 1})
    assert TargetBatch("a.npy", new[0].checksum, ObjectInfo(1, "x")) == TargetBatch("a.npy", new[0].checksum)
