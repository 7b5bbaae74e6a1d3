"""The watermark's compare-and-swap (conditional writes on S3, a lock on a local folder), concurrent commits, and
rejected (quarantined) batches; on a local folder and on a real SeaweedFS S3 server."""
from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from labelshift.errors import ConflictError, InputError
from labelshift.monitoring.layout import WATERMARK_KEY, RejectedBatch
from labelshift.monitoring.listing import find_new_batches
from labelshift.monitoring.watermark import ConcurrentRunError, commit_watermark, read_watermark
from labelshift.storage import RetryPolicy, S3Store, open_store
from labelshift.storage import s3 as s3_module
from tests.reestimation_support import npy_bytes

N_RACERS = 8


@pytest.fixture
def local_store(tmp_path):
    return open_store(str(tmp_path / "target"))


@pytest.fixture
def s3_store(s3_bucket):
    return open_store(f"s3://{s3_bucket}/target/", retry=RetryPolicy(max_attempts=3))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def put_batch(store, key: str, seed: int) -> None:
    store.put_bytes(key, npy_bytes(np.random.default_rng(seed).normal(size=(4, 3)).astype(np.float32)))


def counted_per_key(store) -> dict[str, int]:
    """How many history entries counted each batch (1 each when nothing was counted twice)."""
    counts: dict[str, int] = {}
    for entry in read_watermark(store).history:
        for key in entry["batches"]:
            counts[key] = counts.get(key, 0) + 1
    return counts


# -- the store's compare-and-swap --------------------------------------------------------------------------------------
def test_compare_and_swap_creates_replaces_and_refuses_stale_versions(store):
    assert store.conditional_writes("state/x.json")
    first = store.compare_and_swap("state/x.json", b"one", None)
    data, token = store.read_versioned("state/x.json")
    assert data == b"one" and token == first
    with pytest.raises(ConflictError, match=r"x.json refused: it exists now, and this write expected to create it"):
        store.compare_and_swap("state/x.json", b"other", None)
    second = store.compare_and_swap("state/x.json", b"two", first)
    assert second != first and store.read_versioned("state/x.json") == (b"two", second)
    with pytest.raises(ConflictError, match="Another writer changed it since it was read"):
        store.compare_and_swap("state/x.json", b"three", first)
    assert store.get_bytes("state/x.json") == b"two"
    store.delete("state/x.json")
    with pytest.raises(ConflictError, match="deleted meanwhile"):
        store.compare_and_swap("state/x.json", b"four", second)
    assert not store.exists("state/x.json")
    assert store.list() == []  # neither the lock file nor the probe object is listed


def test_seaweedfs_refuses_a_stale_if_match_with_precondition_failed(s3_store, seaweed):
    """The server itself, without the store's wrapper: a stale If-Match and If-None-Match: * on an existing key."""
    raw = seaweed.client()
    key = f"{s3_store.prefix}/raw.json"
    etag = raw.put_object(Bucket=s3_store.bucket, Key=key, Body=b"a")["ETag"]
    raw.put_object(Bucket=s3_store.bucket, Key=key, Body=b"b", IfMatch=etag)
    for condition in ({"IfMatch": etag}, {"IfNoneMatch": "*"}):
        with pytest.raises(raw.exceptions.ClientError) as error:
            raw.put_object(Bucket=s3_store.bucket, Key=key, Body=b"c", **condition)
        assert error.value.response["Error"]["Code"] == "PreconditionFailed"
        assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


@pytest.mark.integration
def test_server_ignoring_conditional_writes_is_detected_and_commits_fall_back(s3_bucket, seaweed, caplog,
                                                                              monkeypatch):
    """A server that drops If-Match / If-None-Match (simulated by removing the headers before they are sent) is
    found by the probe; compare-and-swap then compares and writes (not atomic) and says so in a warning."""
    monkeypatch.setattr(s3_module, "_conditional", {})
    store = S3Store(s3_bucket, "plain", retry=RetryPolicy(max_attempts=2))

    def strip(request, **_):
        for header in ("If-Match", "If-None-Match"):
            if header in request.headers:
                del request.headers[header]

    store.client.meta.events.register("before-sign.s3.PutObject", strip)
    with caplog.at_level(logging.WARNING, logger="labelshift.storage.s3"):
        assert store.conditional_writes(WATERMARK_KEY) is False
    assert "ignores conditional writes" in caplog.text and "concurrency limit of one" in caplog.text
    put_batch(store, "a.npy", 0)
    new, watermark = find_new_batches(store)
    committed = commit_watermark(store, watermark, new, {})
    assert read_watermark(store) == committed
    with pytest.raises(ConcurrentRunError, match="moved to sequence 1"):  # the comparison still refuses the stale
        commit_watermark(store, watermark, new, {})


# -- concurrent commits ------------------------------------------------------------------------------------------------
def _race(store, n: int) -> list:
    """n runs that read the same watermark, each counting its own batch, committing at the same moment."""
    for i in range(n):
        put_batch(store, f"b{i}.npy", i)
    new, watermark = find_new_batches(store)
    assert len(new) == n
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        try:
            return commit_watermark(store, watermark, [new[i]], {"racer": i})
        except ConcurrentRunError as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _check_one_winner_then_a_later_run_takes_the_rest(store, outcomes: list) -> None:
    winners = [o for o in outcomes if not isinstance(o, Exception)]
    losers = [o for o in outcomes if isinstance(o, ConcurrentRunError)]
    assert len(winners) == 1 and len(losers) == len(outcomes) - 1
    assert all("another run committed meanwhile" in str(o) for o in losers)
    won = read_watermark(store)
    assert won == winners[0] and won.sequence == 1 and len(won.processed) == 1
    later, watermark = find_new_batches(store)
    assert len(later) == len(outcomes) - 1 and not set(b.key for b in later) & set(won.processed)
    commit_watermark(store, watermark, later, {"racer": "later"})
    assert find_new_batches(store)[0] == []
    counts = counted_per_key(store)
    assert sorted(counts) == sorted(f"b{i}.npy" for i in range(len(outcomes)))
    assert set(counts.values()) == {1}


def test_concurrent_commits_from_threads_exactly_one_wins(store):
    _check_one_winner_then_a_later_run_takes_the_rest(store, _race(store, N_RACERS))


def _commit_in_a_process(root: str, i: int, barrier, results) -> None:
    store = open_store(root)
    new, watermark = find_new_batches(store)
    barrier.wait()
    try:
        commit_watermark(store, watermark, [b for b in new if b.key == f"b{i}.npy"], {"racer": i})
        results.put((i, "won"))
    except ConcurrentRunError as exc:
        results.put((i, f"refused: {exc}"))


def test_concurrent_commits_from_processes_on_a_local_folder_exactly_one_wins(local_store):
    for i in range(N_RACERS):
        put_batch(local_store, f"b{i}.npy", i)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(N_RACERS), ctx.Queue()
    procs = [ctx.Process(target=_commit_in_a_process, args=(str(local_store.root), i, barrier, results))
             for i in range(N_RACERS)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    won = [i for i, o in outcomes.items() if o == "won"]
    assert len(won) == 1, outcomes
    assert all("another run committed meanwhile" in o for i, o in outcomes.items() if i not in won)
    later, watermark = find_new_batches(local_store)
    assert sorted(b.key for b in later) == sorted(f"b{i}.npy" for i in range(N_RACERS) if i not in won)
    commit_watermark(local_store, watermark, later, {})
    assert set(counted_per_key(local_store).values()) == {1} and len(counted_per_key(local_store)) == N_RACERS


def test_a_commit_whose_answer_was_lost_is_recognised_as_its_own(store, monkeypatch):
    """The write landed but its answer was lost, and the retry was refused (the object moved: by this very write)."""
    put_batch(store, "a.npy", 0)
    new, watermark = find_new_batches(store)
    real = store.compare_and_swap

    def landed_then_refused(key, data, expected, **kw):
        real(key, data, expected, **kw)
        return real(key, data, expected, **kw)

    monkeypatch.setattr(store, "compare_and_swap", landed_then_refused)
    committed = commit_watermark(store, watermark, new, {})
    monkeypatch.undo()
    assert read_watermark(store) == committed and committed.token == read_watermark(store).token
    assert find_new_batches(store)[0] == []


# -- rejected batches --------------------------------------------------------------------------------------------------
def test_rejected_batch_is_recorded_not_counted_and_not_retried_until_it_changes(store):
    put_batch(store, "good.npy", 0)
    store.put_bytes("bad.npy", b"not an array")
    new, watermark = find_new_batches(store)
    bad = next(b for b in new if b.key == "bad.npy")
    good = [b for b in new if b.key != "bad.npy"]
    committed = commit_watermark(store, watermark, good, {"p_value": 0.5},
                                 rejected=[RejectedBatch(bad, "not a .npy file")])
    assert committed.processed.keys() == {"good.npy"}
    assert committed.rejected["bad.npy"]["reason"] == "not a .npy file"
    assert committed.rejected["bad.npy"]["sha256"] == bad.checksum
    assert committed.history[-1]["batches"] == ["good.npy"] and committed.history[-1]["rejected"] == ["bad.npy"]
    assert read_watermark(store) == committed
    assert find_new_batches(store)[0] == []  # not offered again while unchanged

    put_batch(store, "bad.npy", 1)  # fixed: new content, new again
    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["bad.npy"]
    fixed = commit_watermark(store, watermark, new, {})
    assert fixed.rejected == {} and set(fixed.processed) == {"good.npy", "bad.npy"}
    assert set(counted_per_key(store).values()) == {1}


def test_a_commit_of_rejections_only_and_a_deleted_rejected_batch(store):
    store.put_bytes("bad.npy", b"garbage")
    new, watermark = find_new_batches(store)
    only = commit_watermark(store, watermark, [], {}, rejected=[RejectedBatch(new[0], "garbage")])
    assert only.sequence == 1 and only.processed == {} and set(only.rejected) == {"bad.npy"}
    with pytest.raises(InputError, match="nothing to commit"):
        commit_watermark(store, only, [], {})
    put_batch(store, "good.npy", 0)
    store.delete("bad.npy")
    new, watermark = find_new_batches(store)
    assert [b.key for b in new] == ["good.npy"] and watermark.rejected == {}
    assert commit_watermark(store, watermark, new, {}).rejected == {}
