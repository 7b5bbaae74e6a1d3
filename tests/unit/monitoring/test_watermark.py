"""The watermark (:mod:`labelshift.monitoring.watermark`): the store's compare-and-swap (conditional writes on S3, a
lock on a local folder), concurrent commits, rejected (quarantined) batches, corrupt or tampered watermarks named with
their recovery, commits refused before they could count a batch twice, and writes failing half way or on a full disk;
on a local folder and on a real SeaweedFS S3 server."""
from __future__ import annotations

import errno
import json
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from labelshift import storage
from labelshift.errors import ConflictError, FormatError, InputError, StorageError
from labelshift.monitoring.layout import WATERMARK_KEY, RejectedBatch
from labelshift.monitoring.listing import find_new_batches, list_batches
from labelshift.monitoring.watermark import ConcurrentRunError, Watermark, commit_watermark, read_watermark
from labelshift.storage import LocalStore, RetryPolicy, S3Store, open_store
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


def features(seed: int, n: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)


def snapshot(store) -> dict[str, bytes]:
    """Every object of the store with its content: compared before and after an operation that must write nothing."""
    return {key: store.get_bytes(key) for key in store.list()}


def commit(store, previous, batches, **record):
    return commit_watermark(store, previous, batches, {"p_value": 0.5, **record})


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


# -- the watermark -----------------------------------------------------------------------------------------------------
def _valid_watermark() -> dict:
    return Watermark(sequence=1, processed={"a.npy": "0" * 64}, updated_at="2026-11-25T06:00:00.000+00:00",
                     history=[{"sequence": 1, "time": "2026-11-25T06:00:00.000+00:00", "batches": ["a.npy"]}],
                     run_id="r1").to_dict()


def _edited(**changes) -> bytes:
    data = _valid_watermark()
    data.update(changes)
    return json.dumps(data).encode()


CORRUPT_WATERMARKS = {
    "not-json": (b'{"sequence": 1, "processed": {', r"not valid UTF-8 JSON"),
    "not-utf8": (b"\xff\xfe\x00", r"not valid UTF-8 JSON"),
    "a-list": (b"[1, 2]", r"expected a JSON object, found list"),
    "no-format": (b'{"sequence": 1}', r"field 'format' must be 'labelshift-watermark'"),
    "sequence-text": (_edited(sequence="3"), r"field 'sequence' must be a non-negative integer, found '3'"),
    "sequence-negative": (_edited(sequence=-1), r"field 'sequence' must be a non-negative integer"),
    "processed-list": (_edited(processed=["a.npy"]), r"field 'processed' must be an object"),
    "processed-bad-checksum": (_edited(processed={"a.npy": "xyz"}), r"gives 'a.npy' the checksum 'xyz'"),
    "processed-output-key": (_edited(processed={"a.corrected.npy": "0" * 64}), r"not a batch key"),
    "history-not-list": (_edited(history={}), r"field 'history' must be a list"),
    "history-sequence": (_edited(history=[{"sequence": 7}]), r"history' entry has sequence 7, outside 1..1"),
    "updated-at": (_edited(updated_at="yesterday"), r"field 'updated_at' must be an ISO 8601 time"),
    "counted-without-run": (_edited(sequence=0, history=[]), r"'sequence' is 0 .* records processed batches"),
    "fingerprints-list": (_edited(fingerprints=[]), r"field 'fingerprints' must be an object.*deleting the field"),
    "fingerprint-uncounted": (_edited(fingerprints={"b.npy": {"size": 1, "version": "v"}}),
                              r"'fingerprints' holds 'b.npy', which is not in 'processed'"),
    "fingerprint-size": (_edited(fingerprints={"a.npy": {"size": -1, "version": "v"}}),
                         r"gives 'a.npy' .*non-negative integer 'size'"),
    "fingerprint-version": (_edited(fingerprints={"a.npy": {"size": 1, "version": None}}),
                            r"non-empty string 'version'"),
}


@pytest.mark.parametrize("case", CORRUPT_WATERMARKS)
def test_corrupt_watermark_names_the_key_and_the_recovery(store, case):
    content, pattern = CORRUPT_WATERMARKS[case]
    store.put_array("a.npy", features(0))
    store.put_bytes(WATERMARK_KEY, content)
    before = snapshot(store)
    for attempt in (lambda: read_watermark(store), lambda: find_new_batches(store),
                    lambda: commit(store, Watermark(), list_batches(store))):
        with pytest.raises(FormatError, match=pattern) as error:
            attempt()
        message = str(error.value)
        assert store.url(WATERMARK_KEY) in message and "restore the file from a backup" in message
        assert "delete it" in message
    assert snapshot(store) == before


def test_watermark_from_a_newer_version(local_store):
    local_store.put_bytes(WATERMARK_KEY, _edited(version=99))
    with pytest.raises(FormatError, match=r"watermark version 99, newer than .* upgrade labelshift"):
        read_watermark(local_store)


def test_watermark_whose_content_no_longer_matches_its_checksum(store, request):
    store.put_array("a.npy", features(0))
    new, watermark = find_new_batches(store)
    commit(store, watermark, new)
    tampered = store.get_bytes(WATERMARK_KEY).replace(b'"sequence": 1', b'"sequence": 5', 1)
    if isinstance(store, LocalStore):  # the data file changes, its sha256 sidecar does not
        (store.root / "_labelshift" / "watermark.json").write_bytes(tampered)
    else:  # replaced behind the store's back, keeping the recorded checksum
        head = request.getfixturevalue("seaweed").client()
        full_key = f"{store.prefix}/{WATERMARK_KEY}"
        recorded = head.head_object(Bucket=store.bucket, Key=full_key)["Metadata"]["sha256"]
        head.put_object(Bucket=store.bucket, Key=full_key, Body=tampered, Metadata={"sha256": recorded})
    with pytest.raises(FormatError, match=r"watermark .*watermark.json is corrupt: checksum mismatch") as error:
        find_new_batches(store)
    assert "write the same content again" in str(error.value)


def test_watermark_round_trip_and_history_limit(local_store):
    data = _valid_watermark()
    assert Watermark.from_dict(json.loads(json.dumps(data))).to_dict() == data
    assert Watermark.from_dict(Watermark().to_dict()) == Watermark()

    for i in range(4):
        local_store.put_array(f"b{i}.npy", features(i))
        new, watermark = find_new_batches(local_store)
        latest = commit_watermark(local_store, watermark, new, {"run": i}, history_limit=2)
    assert latest.sequence == 4 and len(latest.processed) == 4
    assert [entry["run"] for entry in latest.history] == [2, 3]
    assert read_watermark(local_store) == latest


# -- committing --------------------------------------------------------------------------------------------------------
def test_concurrent_commit_is_refused(store):
    store.put_array("a.npy", features(0))
    batches_a, seen_by_a = find_new_batches(store)
    batches_b, seen_by_b = find_new_batches(store)  # a second run started before the first committed
    won = commit(store, seen_by_a, batches_a, run="A")
    with pytest.raises(ConcurrentRunError, match=r"moved to sequence 1 .* since this run read sequence 0") as error:
        commit(store, seen_by_b, batches_b, run="B")
    assert isinstance(error.value, StorageError)
    assert read_watermark(store) == won and won.history[0]["run"] == "A"
    # a stale watermark of the same sequence number is refused too (the run id differs)
    store.put_array("b.npy", features(1))
    new, current = find_new_batches(store)
    commit(store, current, new)
    with pytest.raises(ConcurrentRunError):
        commit(store, current, new)


def test_commit_overwritten_by_a_rival_right_after_its_write_is_reported(store, monkeypatch):
    """On a store without conditional writes the commit is compare, write, read back: a rival's write landing just
    after it is reported (with conditional writes the rival's own commit would be refused instead)."""
    monkeypatch.setattr(store, "conditional_writes", lambda key=None: False)
    monkeypatch.setattr(store, "compare_and_swap", storage.Store.compare_and_swap.__get__(store))
    store.put_array("a.npy", features(0))
    new, watermark = find_new_batches(store)
    rival = Watermark(sequence=1, processed={"a.npy": new[0].checksum}, updated_at="2026-01-01T00:00:00+00:00",
                      history=[{"sequence": 1, "batches": ["a.npy"]}], run_id="rival")
    real_put = store.put_bytes

    def put_then_rival_writes(key, data, **kwargs):
        digest = real_put(key, data, **kwargs)
        if key == WATERMARK_KEY:
            real_put(key, json.dumps(rival.to_dict()).encode())
        return digest

    monkeypatch.setattr(store, "put_bytes", put_then_rival_writes)
    with pytest.raises(ConcurrentRunError, match="overwritten by another run"):
        commit(store, watermark, new)
    monkeypatch.undo()
    assert read_watermark(store) == rival
    assert find_new_batches(store)[0] == []  # the rival counted the batch: it is not counted again


def test_commit_refuses_what_would_double_count(store):
    store.put_array("a.npy", features(0))
    store.put_array("b.npy", features(1))
    new, watermark = find_new_batches(store)
    with pytest.raises(InputError, match=r"\['a.npy'\] are listed more than once"):
        commit(store, watermark, [new[0], new[0]])
    with pytest.raises(InputError, match=r"record fields \['sequence', 'batches'\] are set by commit_watermark"):
        commit_watermark(store, watermark, new, {"sequence": 9, "batches": []})
    with pytest.raises(InputError, match="cannot be written as JSON"):
        commit(store, watermark, new, model=object())
    assert not store.exists(WATERMARK_KEY)
    first = commit(store, watermark, new[:1])
    committed = store.get_bytes(WATERMARK_KEY)
    with pytest.raises(InputError, match=r"\['a.npy'\] are already counted .* count them twice"):
        commit(store, first, new)
    assert store.get_bytes(WATERMARK_KEY) == committed
    assert [b.key for b in find_new_batches(store)[0]] == ["b.npy"]


@pytest.fixture
def target(tmp_path):
    store = open_store(str(tmp_path / "target"))
    put_batch(store, "a.npy", 0)
    new, watermark = find_new_batches(store)
    commit_watermark(store, watermark, new, {})
    put_batch(store, "b.npy", 1)
    return store


# -- faults while committing on a local folder -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("failing", [1, 2], ids=["data-file", "checksum-file"])
def test_a_write_failing_half_way_leaves_a_readable_watermark(target, monkeypatch, failing):
    """The commit's rename of the data file (1) or of its checksum file (2) fails: the watermark is the old or the
    new one, never one reported corrupt; the rerun counts what is left, once."""
    new, watermark = find_new_batches(target)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == failing:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StorageError, match=r"cannot write .*watermark.json"):
        commit_watermark(target, watermark, new, {})
    monkeypatch.undo()
    now = read_watermark(target)  # readable: no checksum mismatch
    assert now.sequence == (1 if failing == 1 else 2)
    again, watermark = find_new_batches(target)
    if again:
        commit_watermark(target, watermark, again, {})
    assert counted_per_key(target) == {"a.npy": 1, "b.npy": 1}
    assert not [p for p in target.root.rglob(".labelshift-tmp-*") if "lock" not in p.name]


def test_a_full_disk_fails_the_write_with_what_to_do_and_keeps_the_watermark(target, monkeypatch):
    new, watermark = find_new_batches(target)
    before = target.get_bytes(WATERMARK_KEY)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match=r"disk holding .* is full .* free some space and run again"):
        commit_watermark(target, watermark, new, {})
    with pytest.raises(StorageError, match="is full"):
        target.put_bytes("b.corrected.npy", b"x" * 100)
    monkeypatch.undo()
    assert target.get_bytes(WATERMARK_KEY) == before and not target.exists("b.corrected.npy")
    assert not [p for p in target.root.rglob(".labelshift-tmp-*") if "lock" not in p.name]
    again, watermark = find_new_batches(target)
    commit_watermark(target, watermark, again, {})
    assert counted_per_key(target) == {"a.npy": 1, "b.npy": 1}


@pytest.mark.parametrize("how", ["truncated", "truncated-without-checksum", "garbage"])
def test_a_corrupt_or_truncated_watermark_is_never_reset_silently(target, how):
    path = target.root / "_labelshift" / "watermark.json"
    content = path.read_bytes()
    path.write_bytes(b"\x00\xff garbage" if how == "garbage" else content[: len(content) // 2])
    if how == "truncated-without-checksum":
        path.with_name("watermark.json.sha256").unlink()
    before = {k: target.get_bytes(k) for k in target.list() if k != WATERMARK_KEY}
    for attempt in (lambda: find_new_batches(target), lambda: read_watermark(target)):
        with pytest.raises(FormatError) as error:
            attempt()
        message = str(error.value)
        assert target.url(WATERMARK_KEY) in message and "restore the file from a backup" in message
        assert "delete it" in message
    assert {k: target.get_bytes(k) for k in target.list() if k != WATERMARK_KEY} == before
    path.unlink()  # the documented way to start over: every batch is processed again, once
    path.with_name("watermark.json.sha256").unlink(missing_ok=True)
    again, watermark = find_new_batches(target)
    commit_watermark(target, watermark, again, {})
    assert counted_per_key(target) == {"a.npy": 1, "b.npy": 1}
