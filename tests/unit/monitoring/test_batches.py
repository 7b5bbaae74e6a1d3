"""Prediction-log and tabular batch formats (:mod:`labelshift.monitoring.batches`): reading in chunks, every check
naming the batch, the problem and the fix, and corrected outputs with class-named columns."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labelshift.monitoring.batches import (OutputSpec, check_one_format, check_reference,
                                                     iter_output_chunks, metric_names,
                                                     read_features, read_holdout, read_ids, read_outputs,
                                                     id_bytes)
from labelshift.monitoring.outputs import corrected_parquet
from labelshift.errors import FormatError, InputError

NAMES = ("cat", "dog", "bird")
URI = "s3://b/t/day-1.parquet"


def _parquet(table: dict) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf, row_group_size=7)
    return buf.getvalue()


def _probs(n=40, seed=0):
    x = np.random.default_rng(seed).random((n, 3)) + 0.1
    return (x / x.sum(1, keepdims=True)).astype(np.float32)


def test_column_and_list_layouts_read_the_same_outputs_in_chunks():
    p = _probs()
    spec = OutputSpec(NAMES, "probabilities", "id")
    by_col = _parquet({"id": np.arange(40), "cat": p[:, 0], "dog": p[:, 1], "bird": p[:, 2], "ts": np.arange(40)})
    by_list = _parquet({"id": np.arange(40), "probs": pa.array(list(p), type=pa.list_(pa.float32()))})
    chunks = list(iter_output_chunks(by_col, "parquet", spec, URI, chunk_rows=16))
    assert [len(c) for c in chunks] == [16, 16, 8]
    assert all(c.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), p)
    np.testing.assert_array_equal(read_outputs(by_list, "parquet", spec, URI), p)
    assert read_ids(by_col, URI, "id").to_pylist() == list(range(40))
    # the ids' size from the metadata (uncompressed: at least the 8 bytes a row they take once read), none without
    assert id_bytes(by_list, URI, "id") >= 8 * 40 and id_bytes(by_list, URI, "request") == 0
    damaged = bytearray(by_list)                     # the id column's first page header overwritten
    offset = pq.ParquetFile(io.BytesIO(by_list)).metadata.row_group(0).column(0).data_page_offset
    damaged[offset:offset + 8] = b"\xff" * 8
    with pytest.raises(FormatError, match="its id column 'id' cannot be read .*write the batch again"):
        read_ids(bytes(damaged), URI, "id")


def test_corrected_parquet_has_id_then_named_columns():
    p = _probs(5)
    table = pq.read_table(io.BytesIO(corrected_parquet(p, NAMES, pa.array(["a", "b", "c", "d", "e"]), "id")))
    assert table.column_names == ["id", "cat", "dog", "bird"]
    np.testing.assert_array_equal(table.column("dog").to_numpy(), p[:, 1])


PROBS = OutputSpec(NAMES, "probabilities")


def _err(data, spec=PROBS, fmt="parquet"):
    with pytest.raises(InputError) as info:
        read_outputs(data, fmt, spec, URI)
    msg = str(info.value)
    assert URI in msg
    return msg


def test_bad_prediction_logs_name_the_batch_problem_and_fix():
    p = _probs()
    msg = _err(_parquet({"cat": p[:, 0], "Dog": p[:, 1], "bird": p[:, 2]}))
    assert "no column for class(es) 'dog'" in msg and "'dog' is there as 'Dog'" in msg and "named" in msg
    msg = _err(_parquet({"probs": pa.array([list(r) + [0.0] for r in p], type=pa.list_(pa.float32()))}))
    assert "4 values" in msg and "3 classes" in msg
    four = OutputSpec(("0", "1", "2"), "logits")
    msg = _err(_parquet({"0": p[:, 0] * 5, "1": p[:, 1], "2": p[:, 2], "3": p[:, 0]}), four)
    assert "4 classes" in msg and "reference has 3" in msg
    msg = _err(_parquet({"cat": p[:, 0], "dog": p[:, 1], "bird": p[:, 2] + 0.3}))
    assert "do not sum to 1" in msg and "predict_proba" in msg
    logits = np.log(p) * 3
    msg = _err(_parquet({"cat": logits[:, 0], "dog": logits[:, 1], "bird": logits[:, 2]}))
    assert "look like logits" in msg and "--outputs logits" in msg
    msg = _err(_parquet({"cat": p[:, 0], "dog": p[:, 1], "bird": p[:, 2]}), OutputSpec(NAMES, "logits"))
    assert "probabilities" in msg and "--outputs probabilities" in msg
    bad = p.copy()
    bad[9, 1] = np.nan
    msg = _err(_parquet({"cat": bad[:, 0], "dog": bad[:, 1], "bird": bad[:, 2]}))
    assert "NaN or infinite" in msg and "first row 9" in msg
    buf = io.BytesIO()
    np.save(buf, p[:, :2])
    msg = _err(buf.getvalue(), fmt="npy")
    assert "shape (40, 2)" in msg and "3 classes" in msg
    with pytest.raises(Exception, match="not a readable Parquet"):
        read_outputs(b"garbage", "parquet", OutputSpec(NAMES, "logits"), URI)


def test_formats_may_not_mix_under_one_target():
    with pytest.raises(InputError, match=r"mix formats .*npy: t/a.npy.*parquet: t/b.parquet.*one format"):
        check_one_format(["t/a.npy", "t/b.parquet"], "s3://b/t/")
    assert check_one_format(["a.parquet", "b.parquet"], "x") == "parquet"


def test_tabular_columns_are_checked_against_the_signature():
    data = _parquet({"f0": np.ones(5), "F1": np.ones(5)})
    with pytest.raises(InputError, match=r"lacks the model's input column\(s\) 'f1'.*'f1' is there as 'F1'"):
        read_features(data, URI, ["f0", "f1"])
    assert read_features(_parquet({"b": np.ones(3), "a": np.zeros(3)}), URI, ["a", "b"]).tolist() == [[0, 1]] * 3


def test_reference_needs_class_names_and_an_example_of_every_class():
    x = np.log(_probs(30))
    with pytest.raises(InputError, match="no class names"):
        check_reference(x, np.arange(30) % 3, None, "logits")
    with pytest.raises(InputError, match=r"no example of class\(es\) 'bird'.*Add labelled examples"):
        check_reference(x, np.arange(30) % 2, NAMES, "logits")
    h = check_reference(x, np.array(NAMES * 10), NAMES, "logits")
    assert h.labels.tolist()[:3] == [0, 1, 2]


def test_holdout_file_names_classes_from_columns(tmp_path):
    p = _probs(30)
    path = tmp_path / "h.parquet"
    pq.write_table(pa.table({"cat": p[:, 0], "dog": p[:, 1], "bird": p[:, 2], "label": np.arange(30) % 3}), path)
    h = read_holdout(path, label_column="label", output_kind="probabilities")
    assert h.class_names == NAMES
    pq.write_table(pa.table({"out": pa.array(list(p), type=pa.list_(pa.float32())), "label": np.arange(30) % 3}),
                   path)
    with pytest.raises(InputError, match="--class-names"):
        read_holdout(path, label_column="label", output_kind="probabilities")
    with pytest.raises(InputError, match="no label column 'y'"):
        read_holdout(path, label_column="y", output_kind="probabilities")


def test_metric_names_are_safe_distinct_and_keep_indices():
    assert metric_names(["0", "1"]) == ["0", "1"]
    assert metric_names(["a/b", "a:b", "ok name"]) == ["0_a_b", "1_a_b", "ok name"]
