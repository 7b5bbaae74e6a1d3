"""Prediction logs scored for re-estimation (tasks.reestimation.scoring._score_logs): batches downloaded several at
once and calibrated a batch per thread into one pooled array, whose rows are each batch's own, in the batches'
order, also when a batch between good ones is rejected (the rows after it move up); and each good batch's ids, read
with its outputs for the corrected outputs."""
from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from labelshift import rows
from labelshift.calibration import BCTS
from labelshift.monitoring.batches import OutputSpec
from labelshift.monitoring.listing import list_batches
from labelshift.storage import open_store
from tasks.reestimation import scoring
from tasks.reestimation.scoring import ScoredBatches

NAMES = ("a", "b", "c")


def _parquet(z: np.ndarray, ids: list[str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"request": ids, **{c: z[:, j] for j, c in enumerate(NAMES)}}), buf, row_group_size=64)
    return buf.getvalue()


def test_rows_of_each_good_batch_are_its_own_and_a_rejected_batch_leaves_no_hole(tmp_path, monkeypatch):
    monkeypatch.setattr(scoring, "CALIBRATE_THREADS", 2)
    chunks = scoring.iter_output_chunks             # chunks of 32 rows: the bad row is met after two good chunks
    monkeypatch.setattr(scoring, "iter_output_chunks", lambda *a, **kw: chunks(*a, **kw, chunk_rows=32))
    rng = np.random.default_rng(0)
    holdout, labels = rng.standard_normal((300, 3)), rng.integers(0, 3, 300)
    calibrator = BCTS().fit(holdout, labels)
    bundle = SimpleNamespace(n_classes=3, spec=OutputSpec(NAMES, "logits"), calibrator=calibrator,
                             id_column="request")
    store = open_store(f"file://{tmp_path}/target")
    batches = {f"day-{i}.parquet": rng.standard_normal((n, 3)).astype(np.float32)
               for i, n in enumerate([150, 90, 200, 40])}
    bad = batches["day-1.parquet"].copy()
    bad[70, 1] = np.nan                                      # found part-way through the batch
    for key, z in batches.items():
        store.put_bytes(key, _parquet(bad if key == "day-1.parquet" else z, [f"{key}:{i}" for i in range(len(z))]))
    out = ScoredBatches([], [])
    scoring._score_logs(bundle, store, list_batches(store), out, logging.getLogger("t"), None)
    assert [b.key for b in out.batches] == ["day-0.parquet", "day-2.parquet", "day-3.parquet"]
    assert [r.batch.key for r in out.rejected] == ["day-1.parquet"] and "NaN" in out.rejected[0].reason
    for b, probs, raw, ids in zip(out.batches, out.probs, out.outputs, out.ids, strict=True):
        z = batches[b.key]
        assert ids.to_pylist() == [f"{b.key}:{i}" for i in range(len(z))]
        np.testing.assert_array_equal(raw, z)                # the kept raw outputs are the batch's, exactly
        expected = calibrator.predict_proba(z.astype(np.float64)).astype(np.float32)
        np.testing.assert_allclose(probs, expected, rtol=0, atol=4 * np.finfo(np.float32).eps)
    pooled = rows.joined(out.probs)                       # consecutive views of one array: pooled without a copy
    assert pooled.shape == (390, 3) and np.shares_memory(pooled, out.probs[0])
    assert np.shares_memory(rows.joined(out.outputs), out.outputs[2])


def test_ids_above_the_budget_are_left_for_the_outputs_to_read(tmp_path, monkeypatch):
    """Id columns larger than KEPT_ID_BYTES (from the files' metadata) are not kept: the corrected outputs read them
    from a second download instead (``ids`` empty), and the rows are scored the same."""
    rng = np.random.default_rng(1)
    calibrator = BCTS().fit(rng.standard_normal((300, 3)), rng.integers(0, 3, 300))
    bundle = SimpleNamespace(n_classes=3, spec=OutputSpec(NAMES, "logits"), calibrator=calibrator,
                             id_column="request")
    store = open_store(f"file://{tmp_path}/target")
    z = rng.standard_normal((100, 3)).astype(np.float32)
    store.put_bytes("day-0.parquet", _parquet(z, [f"r{i}" for i in range(100)]))
    for budget, kept in ((2**20, True), (100, False)):   # 100 string ids take more than 100 bytes
        monkeypatch.setattr(scoring, "KEPT_ID_BYTES", budget)
        out = ScoredBatches([], [])
        scoring._score_logs(bundle, store, list_batches(store), out, logging.getLogger("t"), None)
        assert len(out.batches) == 1 and bool(out.ids) == kept
        np.testing.assert_array_equal(out.outputs[0], z)
