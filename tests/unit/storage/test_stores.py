"""Object storage: round trips, atomic writes, checksums, key safety and error messages,
on a local folder and on a real SeaweedFS S3 server started by the ``seaweed`` fixture."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import socket
import subprocess

import numpy as np
import pytest
import urllib3
import threading

from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

from labelshift import storage
from labelshift.errors import (
    CredentialsError,
    FormatError,
    InputError,
    ObjectNotFoundError,
    ServiceUnavailableError,
    StorageError,
)
from labelshift.storage import LocalStore, ObjectInfo, RetryPolicy, S3Store, open_store
from tests.fixtures.seaweed import SeaweedServer, SeaweedServerError

MIB = 1024 * 1024
FAST_RETRY = RetryPolicy(max_attempts=3)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def local_store(tmp_path) -> LocalStore:
    return open_store(str(tmp_path / "store"))


@pytest.fixture
def s3_store(s3_bucket) -> S3Store:
    return open_store(f"s3://{s3_bucket}/run-1", retry=FAST_RETRY)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def temp_leftovers(folder) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.startswith(storage.base.TEMP_PREFIX)]


class _Raw:
    """The raw stream of a canned HTTP answer, as botocore reads it."""

    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


def s3_error_answer(request, status: int, code: str) -> AWSResponse:
    """An S3 error answer to ``request``, made up on this side (returned from a ``before-send`` handler, it goes
    through botocore's parsing and retry decision like one from the server)."""
    body = f"<Error><Code>{code}</Code><Message>made up</Message></Error>".encode()
    return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Raw(body))


def on_send(store, operation: str, handler) -> list:
    """Call ``handler(request, call_number)`` before each HTTP request of ``operation`` the store's client sends
    (retries included); it may return an answer or raise to stand in for the network. Returns the call log."""
    calls = []

    def before_send(request, **_):
        calls.append(request)
        return handler(request, len(calls))

    store.client.meta.events.register(f"before-send.s3.{operation}", before_send)
    return calls


# -- round trips (both backends) ---------------------------------------------------------------------------------------
def test_bytes_round_trip_and_bookkeeping(store):
    digest = store.put_bytes("a/b/data.bin", b"\x00\x01hello", content_type="application/octet-stream")
    assert digest == sha(b"\x00\x01hello")
    assert store.get_bytes("a/b/data.bin") == b"\x00\x01hello"
    assert store.checksum("a/b/data.bin") == digest
    assert store.exists("a/b/data.bin") and not store.exists("a/b/other.bin")
    store.put_bytes("a/c.txt", b"c")
    store.put_bytes("z.txt", b"z")
    assert store.list() == ["a/b/data.bin", "a/c.txt", "z.txt"]  # sorted, relative, no checksum files
    assert store.list("a/") == ["a/b/data.bin", "a/c.txt"]
    assert store.list("a/b") == ["a/b/data.bin"]
    assert store.list("nothing/") == []
    assert store.url("a/c.txt") == store.uri + "/a/c.txt"
    # overwrite replaces content and checksum together
    assert store.put_bytes("z.txt", b"zz") == sha(b"zz")
    assert store.get_bytes("z.txt") == b"zz" and store.checksum("z.txt") == sha(b"zz")
    store.delete("a/c.txt")
    assert not store.exists("a/c.txt")
    assert store.list() == ["a/b/data.bin", "z.txt"]
    with pytest.raises(ObjectNotFoundError, match="a/c.txt"):
        store.delete("a/c.txt")
    store.delete("a/c.txt", missing_ok=True)


def test_json_and_array_round_trip(store):
    record = {"method": "MLLS", "mse": [0.1, 0.02], "seed": np.int64(3), "weights": np.array([0.5, 1.5])}
    store.put_json("results/summary.json", record)
    assert store.get_json("results/summary.json") == {"method": "MLLS", "mse": [0.1, 0.02], "seed": 3,
                                                      "weights": [0.5, 1.5]}
    rng = np.random.default_rng(0)
    for name, arr in {"f": rng.normal(size=(7, 3)), "i": np.arange(12, dtype=np.int32).reshape(3, 4),
                      "b": np.array([True, False]), "s": np.array(["cat", "dog"])}.items():
        store.put_array(f"arrays/{name}.npy", arr)
        back = store.get_array(f"arrays/{name}.npy")
        assert back.dtype == arr.dtype and np.array_equal(back, arr)
    with pytest.raises(InputError, match="pickling"):
        store.put_array("arrays/o.npy", np.array([{"a": 1}], dtype=object))
    assert not store.exists("arrays/o.npy")
    store.put_bytes("broken.json", b"{not json")
    with pytest.raises(FormatError, match="JSON"):
        store.get_json("broken.json")
    with pytest.raises(FormatError, match="npy"):
        store.get_array("broken.json")


def test_file_round_trip(store, tmp_path):
    source = tmp_path / "in.bin"
    payload = os.urandom(300_000)
    source.write_bytes(payload)
    assert store.put_file("files/in.bin", source) == sha(payload)
    target = tmp_path / "out" / "nested" / "copy.bin"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"old")
    store.get_file("files/in.bin", target)
    assert target.read_bytes() == payload
    assert temp_leftovers(tmp_path) == []
    with pytest.raises(ObjectNotFoundError):
        store.get_file("files/missing.bin", tmp_path / "never.bin")
    assert not (tmp_path / "never.bin").exists()
    with pytest.raises(ObjectNotFoundError, match="no such file"):
        store.put_file("files/x.bin", tmp_path / "absent.bin")


def test_unverified_objects_from_other_tools_are_readable(store, request):
    """Objects written without labelshift carry no checksum: they read fine and checksum() is computed."""
    if isinstance(store, LocalStore):
        (store.root / "ext").mkdir(parents=True)
        (store.root / "ext" / "raw.txt").write_bytes(b"raw")
    else:
        request.getfixturevalue("seaweed").client().put_object(Bucket=store.bucket, Key=f"{store.prefix}/ext/raw.txt", Body=b"raw")
    assert store.get_bytes("ext/raw.txt") == b"raw"
    assert store.checksum("ext/raw.txt") == sha(b"raw")


# -- listing with fingerprints -------------------------------------------------------------------------------------------
def test_list_info_gives_size_and_version_from_the_listing_alone(store, request, monkeypatch):
    monkeypatch.setattr(LocalStore, "racy_seconds", 0.0)  # files here are fresh; the local test below covers it
    store.put_bytes("a/x.bin", b"12345")
    store.put_bytes("a/empty.bin", b"")
    store.put_bytes("z.bin", b"zz")
    if isinstance(store, LocalStore):
        (store.root / "ext.bin").write_bytes(b"raw")
    else:
        request.getfixturevalue("seaweed").client().put_object(Bucket=store.bucket, Key=f"{store.prefix}/ext.bin",
                                                               Body=b"raw")

    def list_info(prefix=""):
        with monkeypatch.context() as m:
            if not isinstance(store, LocalStore):
                for method in ("head_object", "get_object"):  # nothing per object: the listing alone
                    m.setattr(store.client, method, lambda **kw: pytest.fail("a request per object"))
            return store.list_info(prefix)

    infos = list_info()
    assert list(infos) == store.list() == ["a/empty.bin", "a/x.bin", "ext.bin", "z.bin"]
    assert {k: info.size for k, info in infos.items()} == {"a/empty.bin": 0, "a/x.bin": 5, "ext.bin": 3, "z.bin": 2}
    assert all(isinstance(info.version, str) and info.version for info in infos.values())
    assert list(list_info("a/")) == store.list("a/") and list_info("none/") == {}
    if not isinstance(store, LocalStore):  # SeaweedFS, like AWS, gives the MD5 of a single-part upload as ETag
        assert infos["z.bin"].version == hashlib.md5(b"zz").hexdigest()
    assert list_info() == infos  # stable while nothing is written
    store.put_bytes("a/x.bin", b"54321")  # same size, other content
    after = list_info()
    assert after["a/x.bin"].size == 5 and after["a/x.bin"].version != infos["a/x.bin"].version
    assert {k: after[k] for k in ("a/empty.bin", "ext.bin", "z.bin")} == {k: infos[k] for k in
                                                                          ("a/empty.bin", "ext.bin", "z.bin")}
    store.delete("z.bin")
    assert list(store.list_info()) == ["a/empty.bin", "a/x.bin", "ext.bin"]


def test_local_list_info_does_not_vouch_for_a_file_changed_just_now(local_store, monkeypatch):
    """File times tick coarsely: two same-size writes in one tick leave inode, mtime and ctime alike, so a file
    changed within racy_seconds of the listing has no version yet (the caller must hash it)."""
    local_store.put_bytes("a.bin", b"a")
    monkeypatch.setattr(LocalStore, "racy_seconds", 60.0)
    assert local_store.list_info() == {"a.bin": ObjectInfo(size=1, version=None)}
    monkeypatch.setattr(LocalStore, "racy_seconds", 0.0)
    first = local_store.list_info()["a.bin"].version
    path = local_store.root / "a.bin"
    assert first == f"{path.stat().st_ino}-{path.stat().st_mtime_ns}-{path.stat().st_ctime_ns}"
    os.utime(path, ns=(0, 10**9))  # another tool sets the times (mtime, and with it ctime, change)
    assert local_store.list_info()["a.bin"].version != first
    local_store.put_bytes("a.bin", b"a")  # the same bytes again: a new file renamed into place, a new version
    assert local_store.list_info()["a.bin"] not in (ObjectInfo(1, first), ObjectInfo(1, None))


# -- checksums -----------------------------------------------------------------------------------------------------------
def test_local_checksum_sidecar_and_corruption(local_store, tmp_path):
    digest = local_store.put_array("m/weights.npy", np.ones(4))
    sidecar = local_store.root / "m" / "weights.npy.sha256"
    # sha256sum format: "<hex>  <name>", so `sha256sum -c weights.npy.sha256` works in that folder
    assert sidecar.read_text() == f"{digest}  weights.npy\n"
    data_file = local_store.root / "m" / "weights.npy"
    corrupted = bytearray(data_file.read_bytes())
    corrupted[-1] ^= 0xFF
    data_file.write_bytes(bytes(corrupted))
    with pytest.raises(FormatError, match="checksum mismatch.*weights.npy"):
        local_store.get_array("m/weights.npy")
    destination = tmp_path / "dl.npy"
    with pytest.raises(FormatError, match="checksum mismatch"):
        local_store.get_file("m/weights.npy", destination)
    assert not destination.exists() and temp_leftovers(tmp_path) == []


@pytest.mark.integration
def test_s3_checksum_metadata_and_corruption(s3_store, seaweed):
    digest = s3_store.put_json("m/meta.json", {"a": 1})
    raw = seaweed.client()
    head = raw.head_object(Bucket=s3_store.bucket, Key="run-1/m/meta.json")
    assert head["Metadata"]["sha256"] == digest  # x-amz-meta-sha256
    assert head["ContentType"] == "application/json"
    # replace the content behind the store's back, keeping the recorded checksum
    raw.put_object(Bucket=s3_store.bucket, Key="run-1/m/meta.json", Body=b'{"a": 2}', Metadata={"sha256": digest})
    with pytest.raises(FormatError, match="checksum mismatch.*meta.json"):
        s3_store.get_json("m/meta.json")


# -- atomicity ------------------------------------------------------------------------------------------------------------
def test_local_interrupted_write_leaves_old_version(local_store, monkeypatch):
    local_store.put_bytes("table.csv", b"version 1")

    def failing_replace(src, dst):
        raise OSError("disk vanished")

    monkeypatch.setattr(storage.local.os, "replace", failing_replace)
    with pytest.raises(StorageError, match="disk vanished"):
        local_store.put_bytes("table.csv", b"version 2")
    with pytest.raises(StorageError):
        local_store.put_bytes("new.csv", b"never")
    monkeypatch.undo()
    assert local_store.get_bytes("table.csv") == b"version 1"
    assert local_store.checksum("table.csv") == sha(b"version 1")
    assert local_store.list() == ["table.csv"]
    assert temp_leftovers(local_store.root) == []


def test_local_failing_data_source_leaves_nothing(local_store, tmp_path, monkeypatch):
    """A source that breaks after the first chunk: the temporary file is removed, no object appears."""
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(3 * storage.base.CHUNK))
    real_open = open
    calls = {"reads": 0}

    class BreakingReader:
        def __init__(self, f):
            self.f = f

        def read(self, n):
            calls["reads"] += 1
            if calls["reads"] > 1:
                raise OSError("source device failed")
            return self.f.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def patched_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return BreakingReader(f) if os.fspath(path) == os.fspath(source) else f

    monkeypatch.setattr("builtins.open", patched_open)
    with pytest.raises(StorageError, match="source device failed"):
        local_store.put_file("big.bin", source)
    monkeypatch.undo()
    assert calls["reads"] == 2
    assert not local_store.exists("big.bin")
    assert temp_leftovers(local_store.root) == []


@pytest.mark.integration
def test_s3_interrupted_multipart_upload_leaves_old_version(s3_bucket, seaweed, tmp_path, monkeypatch):
    store = open_store(f"s3://{s3_bucket}", retry=FAST_RETRY, multipart_threshold=5 * MIB, part_size=5 * MIB)
    old = os.urandom(1000)
    store.put_bytes("model.bin", old)
    new = tmp_path / "new.bin"
    new.write_bytes(os.urandom(11 * MIB))  # three parts: 5 + 5 + 1 MiB
    real_upload_part = store.client.upload_part
    uploaded, lock = [], threading.Lock()

    def upload_part_then_fail(**kwargs):  # parts go up concurrently: only the first to arrive succeeds
        with lock:
            if uploaded:
                raise EndpointConnectionError(endpoint_url="http://lost-during-upload")
            uploaded.append(kwargs["PartNumber"])
        return real_upload_part(**kwargs)

    monkeypatch.setattr(store.client, "upload_part", upload_part_then_fail)
    with pytest.raises(ServiceUnavailableError):
        store.put_file("model.bin", new)
    with pytest.raises(ServiceUnavailableError):
        store.put_file("fresh.bin", new)
    assert len(uploaded) == 1
    monkeypatch.undo()
    raw = seaweed.client()
    assert raw.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []  # aborted, not left dangling
    assert store.get_bytes("model.bin") == old
    assert store.list() == ["model.bin"]
    # the same upload without the fault completes, carries its checksum, and reads back verified
    digest = store.put_file("model.bin", new)
    assert raw.head_object(Bucket=s3_bucket, Key="model.bin")["Metadata"]["sha256"] == digest
    out = tmp_path / "back.bin"
    store.get_file("model.bin", out)
    assert sha(out.read_bytes()) == digest == sha(new.read_bytes())
    assert store.put_bytes("bytes.bin", new.read_bytes()) == digest  # put_bytes goes multipart above threshold too
    assert store.get_bytes("bytes.bin") == new.read_bytes()


@pytest.mark.integration
@pytest.mark.parametrize("second_answer", ["repeat", "NoSuchUpload"])
def test_s3_complete_retried_after_a_lost_answer(s3_bucket, monkeypatch, second_answer):
    """CompleteMultipartUpload succeeds on the server but its answer is lost; the retry must not fail the write.

    SeaweedFS answers a repeated Complete with 200; other servers say NoSuchUpload, simulated here.
    """
    store = open_store(f"s3://{s3_bucket}", retry=FAST_RETRY, multipart_threshold=5 * MIB, part_size=5 * MIB)
    payload = os.urandom(6 * MIB)

    def complete_then_lose_answer(request, call):
        if call == 1:  # the server completes the upload, then the connection drops before its answer
            store.client._endpoint.http_session.send(request)
            raise ConnectionClosedError(endpoint_url=request.url)
        if second_answer == "NoSuchUpload":
            return s3_error_answer(request, 404, "NoSuchUpload")
        return None  # botocore's retry goes to the server

    calls = on_send(store, "CompleteMultipartUpload", complete_then_lose_answer)
    digest = store.put_bytes("large.bin", payload)
    assert len(calls) == 2  # botocore retried the Complete
    assert store.get_bytes("large.bin") == payload and store.checksum("large.bin") == digest


@pytest.mark.integration
def test_s3_create_bucket_is_idempotent(seaweed, monkeypatch):
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    store = open_store("s3://made-by-the-store/x", retry=FAST_RETRY)
    store.create_bucket()
    store.create_bucket()
    store.put_bytes("k", b"v")
    assert store.get_bytes("k") == b"v"


# -- retries -------------------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_s3_transient_errors_are_retried(s3_store):
    def flaky(request, call):
        if call == 1:
            raise EndpointConnectionError(endpoint_url=request.url)
        if call == 2:
            return s3_error_answer(request, 503, "SlowDown")
        return None  # the third attempt reaches the server

    puts = on_send(s3_store, "PutObject", flaky)
    s3_store.put_bytes("retried.txt", b"ok")
    assert len(puts) == 3
    assert s3_store.get_bytes("retried.txt") == b"ok"
    # a definite answer (missing key) is not retried
    gets = on_send(s3_store, "GetObject", lambda request, call: None)
    with pytest.raises(ObjectNotFoundError):
        s3_store.get_bytes("absent.txt")
    assert len(gets) == 1
    # and attempts stop at the policy's maximum
    puts.clear()
    on_send(s3_store, "PutObject", lambda request, call: s3_error_answer(request, 500, "InternalError"))
    with pytest.raises(ServiceUnavailableError, match="at most 3 attempts"):
        s3_store.put_bytes("never.txt", b"no")
    assert len(puts) == 3 and not s3_store.exists("never.txt")


@pytest.mark.integration
def test_s3_read_cut_off_mid_body_is_read_again(s3_store, monkeypatch):
    """botocore retries a request until its answer's headers arrive; a body cut off after that is read again."""
    s3_store.put_bytes("body.bin", b"0123456789")
    real_get = s3_store.client.get_object
    gets = []

    def get_cut_off_once(**kwargs):
        response = real_get(**kwargs)
        gets.append(1)
        if len(gets) == 1:  # the connection breaks while the body streams in
            response["Body"]._raw_stream.read = lambda *a, **k: (_ for _ in ()).throw(
                urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead"))
        return response

    monkeypatch.setattr(s3_store.client, "get_object", get_cut_off_once)
    assert s3_store.get_bytes("body.bin") == b"0123456789" and len(gets) == 2


def test_retry_policy_goes_to_botocore():
    store = S3Store("some-bucket", endpoint_url="http://127.0.0.1:9", retry=RetryPolicy(max_attempts=4),
                    connect_timeout=1.5, read_timeout=7.0)
    config = store.client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (config.connect_timeout, config.read_timeout) == (1.5, 7.0)
    assert S3Store("some-bucket").retry == RetryPolicy(max_attempts=5, mode="standard")
    adaptive = S3Store("some-bucket", endpoint_url="http://127.0.0.1:9", retry=RetryPolicy(mode="adaptive"))
    assert adaptive.client.meta.config.retries == {"mode": "adaptive", "total_max_attempts": 5}
    for bad in (dict(max_attempts=0), dict(mode="legacy")):
        with pytest.raises(InputError):
            RetryPolicy(**bad)


@pytest.mark.parametrize("once", [False, True], ids=["policy", "tried-once"])
def test_s3_dropped_connections_are_retried_up_to_the_policy(monkeypatch, once):
    """A server that accepts each connection and closes it at once: botocore tries exactly max_attempts times, and
    once through :meth:`S3Store.tried_once` (the original store keeps its policy)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        store = open_store("s3://some-bucket", endpoint_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
                           retry=RetryPolicy(max_attempts=3))
        with pytest.raises(ServiceUnavailableError, match="did not answer properly"):
            (store.tried_once() if once else store).put_bytes("k", b"1")
    finally:
        listener.close()
    assert len(accepted) == (1 if once else 3)
    assert store.retry.max_attempts == 3 and store.tried_once().uri == store.uri


# -- errors --------------------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_s3_missing_bucket(s3_bucket, seaweed):
    store = open_store("s3://no-such-bucket-here/p", retry=FAST_RETRY)
    for operation in (lambda: store.get_bytes("k"), lambda: store.put_bytes("k", b"1"),
                      lambda: store.exists("k"), lambda: store.list()):
        with pytest.raises(ObjectNotFoundError) as info:
            operation()
        message = str(info.value)
        assert "bucket 'no-such-bucket-here' does not exist" in message
        assert seaweed.endpoint in message and "AWS_ENDPOINT_URL_S3" in message
        assert "create it with" in message


@pytest.mark.integration
def test_s3_missing_key(s3_store):
    with pytest.raises(ObjectNotFoundError, match=f"no object at {s3_store.uri}/missing/key.json"):
        s3_store.get_json("missing/key.json")
    with pytest.raises(ObjectNotFoundError, match="missing/key.json"):
        s3_store.checksum("missing/key.json")
    assert not s3_store.exists("missing/key.json")


@pytest.mark.integration
@pytest.mark.parametrize("variable, value", [("AWS_SECRET_ACCESS_KEY", "wrong-secret"),
                                             ("AWS_ACCESS_KEY_ID", "unknown-key")])
def test_s3_refused_credentials(s3_bucket, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    store = open_store(f"s3://{s3_bucket}", retry=FAST_RETRY)
    for operation in (lambda: store.put_bytes("k", b"1"), lambda: store.get_bytes("k"), lambda: store.exists("k")):
        with pytest.raises(CredentialsError) as info:
            operation()
        assert "AWS_ACCESS_KEY_ID" in str(info.value) and "AWS_SECRET_ACCESS_KEY" in str(info.value)
        assert "refused" in str(info.value)


@pytest.mark.integration
def test_s3_missing_credentials(s3_bucket, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = open_store(f"s3://{s3_bucket}", retry=FAST_RETRY)
    with pytest.raises(CredentialsError, match="no usable S3 credentials.*AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        store.get_bytes("k")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3_unreachable_endpoint_fails_fast(monkeypatch):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    store = open_store("s3://some-bucket/p", retry=RetryPolicy(max_attempts=2), connect_timeout=0.5)
    with pytest.raises(ServiceUnavailableError) as info:
        store.put_bytes("k", b"1")
    message = str(info.value)
    assert endpoint in message and "from AWS_ENDPOINT_URL_S3" in message and "at most 2 attempts" in message
    # an explicit endpoint_url wins over the environment and is named as the source
    store = open_store("s3://some-bucket", endpoint_url=endpoint, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(ServiceUnavailableError, match="endpoint_url argument"):
        store.list()


# -- keys and URIs -------------------------------------------------------------------------------------------------------
BAD_KEYS = ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "a\\..\\b", "a//b", "a/", "", ".", "a/./b",
            "x.sha256", "a/.labelshift-tmp-x", "nul\x00byte"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_path_traversal_and_bad_keys_refused(local_store, tmp_path, key):
    for operation in (lambda: local_store.put_bytes(key, b"x"), lambda: local_store.get_bytes(key),
                      lambda: local_store.exists(key), lambda: local_store.delete(key)):
        with pytest.raises(InputError, match="invalid object key"):
            operation()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written anywhere, not even the root


def test_s3_keys_follow_the_same_rules():
    store = S3Store("some-bucket", "p", endpoint_url="http://127.0.0.1:9")
    with pytest.raises(InputError, match="path traversal"):
        store.put_bytes("../x", b"1")


def test_local_key_folder_conflict(local_store):
    local_store.put_bytes("a", b"file")
    with pytest.raises(InputError, match="share a name"):
        local_store.put_bytes("a/b", b"nested")
    assert local_store.get_bytes("a") == b"file"


def test_open_store_uris(tmp_path, monkeypatch):
    s3 = open_store("s3://my-bucket/some/prefix/")
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("my-bucket", "some/prefix")
    assert s3.uri == "s3://my-bucket/some/prefix" and s3.url("k.json") == "s3://my-bucket/some/prefix/k.json"
    assert open_store("s3://my-bucket").url("k") == "s3://my-bucket/k"
    local = open_store(f"file://{tmp_path}/st")
    assert isinstance(local, LocalStore) and local.root == tmp_path / "st"
    assert local.uri == f"file://{tmp_path}/st"
    monkeypatch.chdir(tmp_path)
    assert open_store("relative/dir").root == tmp_path / "relative" / "dir"
    assert open_store(tmp_path / "p").root == tmp_path / "p"
    for bad, pattern in [("s3://", "names no bucket"), ("s3://Bad_Bucket/x", "invalid S3 bucket name"),
                         ("gs://b/k", "unsupported scheme"), ("file://otherhost/x", "must be local"),
                         ("s3://bucket/a/../b", "prefix"), ("", "non-empty")]:
        with pytest.raises(InputError, match=pattern):
            open_store(bad)
    with pytest.raises(InputError, match="S3 stores only"):
        open_store(str(tmp_path), endpoint_url="http://x")


def test_s3_store_pickles_without_its_client():
    store = S3Store("my-bucket", "p", endpoint_url="http://127.0.0.1:9", retry=FAST_RETRY)
    _ = store.client
    clone = pickle.loads(pickle.dumps(store))
    assert clone.uri == store.uri and clone.retry == FAST_RETRY and clone._client is None
    assert clone.client.meta.endpoint_url == "http://127.0.0.1:9"


@pytest.mark.integration
def test_s3_prefixes_isolate_stores(s3_bucket):
    first, second = open_store(f"s3://{s3_bucket}/one"), open_store(f"s3://{s3_bucket}/two")
    first.put_bytes("k.txt", b"1")
    second.put_bytes("k.txt", b"2")
    assert first.list() == ["k.txt"] and first.get_bytes("k.txt") == b"1"
    assert open_store(f"s3://{s3_bucket}").list() == ["one/k.txt", "two/k.txt"]


# -- the SeaweedFS fixture itself ----------------------------------------------------------------------------------------
@pytest.mark.integration
def test_seaweed_server_lifecycle(tmp_path):
    server = SeaweedServer(tmp_path / "sw")
    server.start()
    pid = server._process.pid
    assert set(server.env()) >= {"AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert len(set(server.ports.values())) == 8  # every port weed opens was chosen, none left to its default
    bucket = server.create_bucket()
    assert bucket in [b["Name"] for b in server.client().list_buckets()["Buckets"]]
    port = server.ports["s3.port"]
    server.stop()
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    with socket.socket() as s:  # the port is free again
        assert s.connect_ex(("127.0.0.1", port)) != 0


@contextlib.contextmanager
def _nearly_full_disk(tmp_path, size_gib: int, free_mib: int):
    """A mounted ext4 disk of ``size_gib`` (a sparse file of a few MB) with ``free_mib`` left free; needs root."""
    image, mount = tmp_path / "disk.img", tmp_path / "disk"
    mount.mkdir()
    steps = [["truncate", "-s", f"{size_gib}G", str(image)],
             ["mkfs.ext4", "-q", "-F", "-T", "largefile4", "-O", "^has_journal", "-m", "0", str(image)],
             ["mount", "-o", "loop", str(image), str(mount)]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a loop-mounted disk here ({' '.join(step[:1])}: {done.stderr.strip()[:200]})")
    try:
        filler = shutil.disk_usage(mount).free - free_mib * 2**20
        subprocess.run(["fallocate", "-l", str(filler), str(mount / "filler")], check=True)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.integration
def test_seaweed_writes_on_a_large_nearly_full_disk(tmp_path):
    """A 60 GiB disk with 450 MiB free: under 1 % of its size (614 MiB), where ``weed mini`` had no writable
    volume (a CI machine's failure), and over the 256 MiB that ``weed server`` is told to keep free."""
    with _nearly_full_disk(tmp_path, 60, 450) as disk:
        server = SeaweedServer(disk / "sw")
        try:
            server.start()
            client = server.client()
            buckets = [server.create_bucket() for _ in range(3)]
            for bucket in buckets:
                client.put_object(Bucket=bucket, Key="a/b.bin", Body=b"x" * 100_000)
            assert [client.get_object(Bucket=b, Key="a/b.bin")["Body"].read() for b in buckets] == [b"x" * 100_000] * 3
        finally:
            server.stop()


@pytest.mark.integration
def test_seaweed_refuses_to_start_on_a_full_disk_and_names_the_fix(tmp_path):
    from stack.supervisor import WEED_MIN_FREE_MIB, StackError

    with _nearly_full_disk(tmp_path, 1, WEED_MIN_FREE_MIB // 2) as disk:
        server = SeaweedServer(disk / "sw")
        with pytest.raises(StackError, match=r"MiB free; SeaweedFS needs at least 256 MiB.*LABELSHIFT_HOME"):
            server.start()
        assert not server.running


@pytest.mark.integration
def test_seaweed_server_reports_a_failed_start(tmp_path):
    server = SeaweedServer(tmp_path / "sw", startup_timeout=10, extra_args=("-no-such-flag",))
    with pytest.raises(SeaweedServerError, match="exited while starting") as info:
        server.start()
    assert "no-such-flag" in str(info.value)  # the log tail shows weed's complaint
    assert not server.running


def test_weed_binary_is_installed():
    from tests.fixtures.seaweed import find_weed

    out = subprocess.run([find_weed(), "version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "version" in out.stdout.lower()


def test_json_is_utf8_text(local_store):
    local_store.put_json("t.json", {"name": "Garg et al. é"})
    raw = (local_store.root / "t.json").read_bytes()
    assert json.loads(raw.decode("utf-8")) == {"name": "Garg et al. é"}
