"""The refusals of the re-estimation on a Dask cluster (``tasks/reestimation/on_cluster.py``), said before anything
is written and naming the fix (run without dask): a model scored from its inputs, mixed batch formats, and a target
whose repeated rows would be collapsed (a pass that does not run over partitions yet). The partitions here are local
(``labelshift.partitions.local_rows``): the refusals do not depend on the engine."""
from __future__ import annotations

import types

import numpy as np
import pytest

from labelshift.errors import InputError
from labelshift.inference.holdout import Target
from labelshift.inference.report import assess_shift
from labelshift.inference.settings import AssessmentSettings
from labelshift.monitoring.layout import TargetBatch
from labelshift.partitions import local_rows
from tasks.reestimation.on_cluster import check_clusterable, not_partitioned_yet
from tests.fixtures.draws import calibrated_holdout, gaussian_logits

PRIOR = np.full(4, 0.25)


def test_collapsed_repeated_rows_are_refused_as_an_input_error_naming_the_fix():
    rng = np.random.default_rng(3)
    holdout, cal = calibrated_holdout(*gaussian_logits(rng, 1500, PRIOR))
    Xt = gaussian_logits(rng, 3000, np.array([0.4, 0.3, 0.2, 0.1]))[0].astype(np.float32)
    Xt[1::3] = Xt[::3][: Xt[1::3].shape[0]]                    # every row twice or more, across the cuts
    target = Target.from_partitioned_outputs(local_rows([Xt[:1000], Xt[1000:2500], Xt[2500:]]), cal)
    with pytest.raises(InputError, match="repeated target rows: this pass does not run on a Dask cluster yet.*"
                                         "run without dask") as refused, not_partitioned_yet():
        assess_shift(holdout, target)
    assert "pass the rows as one numpy array" not in str(refused.value)      # the domain's advice, not the user's
    with pytest.raises(InputError, match="repeated target rows: this pass does not run"), not_partitioned_yet():
        assess_shift(holdout, target, AssessmentSettings(interval="fisher"))
    with pytest.raises(TypeError, match="other"), not_partitioned_yet():     # any other TypeError as it is
        raise TypeError("other")


def test_models_scored_from_inputs_and_mixed_formats_are_refused_before_anything_is_written():
    torch_like = types.SimpleNamespace(uri="models:/net/1")
    batches = [TargetBatch("a.parquet", "0" * 64), TargetBatch("b.parquet", "1" * 64)]
    with pytest.raises(InputError, match="pytorch model scored from its inputs.*prediction logs only.*without --dask"):
        check_clusterable(torch_like, "s3://b/t/", batches)
    with pytest.raises(InputError, match="interval='bootstrap' resamples.*Fix: interval='source-aware'"):
        check_clusterable(torch_like, "s3://b/t/", batches, "bootstrap")
    with pytest.raises(InputError):
        check_clusterable(torch_like, "s3://b/t/", [*batches, TargetBatch("c.npy", "2" * 64)])


def test_a_batch_the_workers_cannot_find_but_this_process_reads_unchanged_fails_the_run(tmp_path):
    """The workers see another store than the flow (another endpoint or bucket, a folder not on their disk): their
    ObjectNotFoundError is not a batch gone since the listing, and says so; a batch gone here too is skipped."""
    from labelshift.errors import ObjectNotFoundError, PartitionError
    from labelshift.storage import LocalStore
    from tasks.reestimation.on_cluster import _check_gone_here_too

    store = LocalStore(tmp_path)
    store.put_bytes("day-0.npy", b"rows")
    listed = TargetBatch("day-0.npy", store.checksum("day-0.npy"))
    with pytest.raises(PartitionError, match="this process reads it unchanged: the workers do not see the store as "
                                             "the flow does.*run without dask"):
        _check_gone_here_too(store, listed, ObjectNotFoundError("no object"))
    store.delete("day-0.npy")
    _check_gone_here_too(store, listed, ObjectNotFoundError("no object"))        # gone here too: skipped
