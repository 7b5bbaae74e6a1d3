"""Object storage by URI: one interface over S3-compatible buckets and a local folder.

``open_store(uri)`` takes ``s3://bucket/prefix`` (any S3-compatible server, through boto3), ``file:///abs/path``
or a plain local path and returns a :class:`Store`. Keys are ``/``-separated paths relative to the store's root;
the same key means the same thing on both backends.

What every store guarantees
---------------------------
- **Atomic writes.** A reader sees the old object or the complete new one, never a part. Locally the bytes go to a
  temporary file in the destination folder, are fsync'ed and renamed over the target. On S3 a PutObject is atomic;
  objects above ``multipart_threshold`` go up through boto3's transfer manager as a multipart upload, which becomes
  visible only when completed and is aborted when anything fails before that.
- **Checksums recorded with the object.** Each write records the SHA-256 of the content: on S3 as object metadata
  (``x-amz-meta-sha256``, sent with the request that creates the object); locally in a sidecar ``<key>.sha256`` in
  ``sha256sum`` format. Reads verify against it and raise :class:`~labelshift.errors.FormatError` on a mismatch.
  Objects written by other tools carry none: they are read unverified and :meth:`Store.checksum` hashes them.
- **Cheap listing with fingerprints.** :meth:`Store.list_info` gives each key's size and a version token from the
  listing alone (S3: the ListObjectsV2 pages; locally one ``stat`` per file); see :class:`ObjectInfo`.
- **Safe keys.** Keys with ``..`` or ``.`` segments, a leading ``/``, backslashes, empty segments or NUL bytes are
  refused with :class:`~labelshift.errors.InputError`, as are the reserved ``.sha256`` suffix and the
  ``.labelshift-tmp-`` prefix of temporary files.
- **Clear errors** (:mod:`labelshift.errors`): a missing bucket or key raises ObjectNotFoundError, refused or absent
  credentials CredentialsError, an unreachable endpoint ServiceUnavailableError; each names the URI, the endpoint
  and what to set.

On S3 the endpoint and credentials come from boto3's own lookup (AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then
the AWS config file; the standard credential chain) unless ``endpoint_url=`` is given. Transient failures are
retried by botocore under a :class:`RetryPolicy`.

Locally the sidecar is renamed into place after the data: a crash in between leaves the new data with the previous
checksum, which the next read reports as a mismatch instead of returning unverified bytes. Writing again repairs it.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import numpy as np

from .errors import (
    CredentialsError,
    FormatError,
    InputError,
    LabelShiftError,
    ObjectNotFoundError,
    ServiceUnavailableError,
    StorageError,
)

__all__ = ["Store", "LocalStore", "S3Store", "ObjectInfo", "RetryPolicy", "open_store", "validate_key", "json_default"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CHECKSUM_SUFFIX = ".sha256"
TEMP_PREFIX = ".labelshift-tmp-"
METADATA_CHECKSUM = "sha256"  # boto3 metadata name; sent as the x-amz-meta-sha256 header
CHUNK = 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part (every part but the last)


# -- keys ------------------------------------------------------------------------------------------------------------
def validate_key(key: str, name: str = "key") -> str:
    """Return ``key`` if it is a safe relative object key, else raise :class:`InputError` saying why."""
    if not isinstance(key, str):
        raise InputError(f"{name} must be a string like 'results/table.json', got {type(key).__name__}.")
    problem = None
    if key == "":
        problem = "it is empty"
    elif "\\" in key:
        problem = "it contains a backslash; use '/' to separate folders"
    elif "\x00" in key:
        problem = "it contains a NUL byte"
    elif key.startswith("/"):
        problem = "it is absolute (starts with '/'); keys are relative to the store's root"
    else:
        segments = key.split("/")
        if any(s == "" for s in segments):
            problem = "it has an empty segment ('//' or a trailing '/')"
        elif any(s in (".", "..") for s in segments):
            problem = "it has a '.' or '..' segment (path traversal)"
        elif any(s.startswith(TEMP_PREFIX) for s in segments):
            problem = f"its segments may not start with the reserved prefix {TEMP_PREFIX!r}"
        elif key.endswith(CHECKSUM_SUFFIX):
            problem = f"the suffix {CHECKSUM_SUFFIX!r} is reserved for checksum files"
    if problem:
        raise InputError(f"invalid object {name} {key!r}: {problem}.")
    return key


def _is_valid_key(key: str) -> bool:
    try:
        validate_key(key)
    except InputError:
        return False
    return True


def _check_bytes(data: Any) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputError(
            f"data must be bytes, got {type(data).__name__}; use put_json, put_array or put_file for other content."
        )


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copy(source, target, digest) -> None:
    """Copy the binary stream ``source`` into ``target`` in chunks, feeding ``digest`` on the way."""
    for chunk in iter(lambda: source.read(CHUNK), b""):
        digest.update(chunk)
        target.write(chunk)


def json_default(value: Any) -> Any:
    """Let numpy scalars and arrays (common in results) go into JSON as plain numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serialisable")


def _mismatch(uri: str, recorded: str, actual: str) -> FormatError:
    return FormatError(
        f"checksum mismatch for {uri}: recorded sha256 {recorded}, content has {actual}. The object was changed "
        "or corrupted after it was written (or a write was interrupted); write it again from its source."
    )


def _verify(uri: str, recorded: str | None, actual: str) -> None:
    """Raise FormatError if a checksum was recorded and the content's differs."""
    if recorded is not None and actual != recorded.lower():
        raise _mismatch(uri, recorded, actual)


# -- the interface ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object without reading it: its size and a version token.

    ``version`` is an opaque string that changes whenever the object is written again, so an equal
    ``(size, version)`` pair seen at two times means the content did not change in between. On S3 it is the ETag
    (the same bytes uploaded again may keep it); locally the file's inode, mtime and ctime in nanoseconds (every
    write through :class:`LocalStore` renames a new file into place; a tool writing in place changes the times).

    ``version`` is None when the store cannot vouch for a token: on S3 when the server sends no ETag; locally when
    the file changed less than :attr:`LocalStore.racy_seconds` before the listing (file times tick coarsely, so a
    second same-size write in the same tick could leave every field alike). Such an object must be treated as
    possibly changed. Tokens are only comparable between listings of the same store.
    """

    size: int
    version: str | None


class Store:
    """Base class of the object stores: bytes and files by key (subclasses), JSON and numpy arrays on top."""

    uri: str

    # byte level (subclasses)
    def put_bytes(self, key: str, data: bytes, *, content_type: str | None = None) -> str:
        """Write ``data`` under ``key`` atomically and record its SHA-256 (returned as hex)."""
        raise NotImplementedError

    def get_bytes(self, key: str) -> bytes:
        """Read ``key``; raises FormatError if the content does not match its recorded checksum."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        """Keys (relative to the store's root) that start with the string ``prefix``, sorted."""
        raise NotImplementedError

    def list_info(self, prefix: str = "") -> dict[str, ObjectInfo]:
        """The keys of :meth:`list` (same order) with the :class:`ObjectInfo` of each, from the listing alone: no
        request or read per object."""
        raise NotImplementedError

    def delete(self, key: str, *, missing_ok: bool = False) -> None:
        """Remove ``key`` and its checksum; ObjectNotFoundError if absent unless ``missing_ok``."""
        raise NotImplementedError

    def checksum(self, key: str) -> str:
        """The SHA-256 recorded for ``key`` (computed from the content if none was recorded)."""
        raise NotImplementedError

    def url(self, key: str) -> str:
        """The full URI of ``key`` (``s3://bucket/prefix/key`` or ``file:///root/key``)."""
        raise NotImplementedError

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        """Upload the local file ``path`` under ``key`` atomically; returns its SHA-256."""
        raise NotImplementedError

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        """Download ``key`` to ``path`` atomically (temporary file in the same folder, then rename), verified."""
        raise NotImplementedError

    # typed helpers
    def put_json(self, key: str, obj: Any) -> str:
        """Write ``obj`` as indented UTF-8 JSON (numpy scalars and arrays become numbers and lists)."""
        try:
            text = json.dumps(obj, indent=2, default=json_default)
        except (TypeError, ValueError) as exc:
            raise InputError(f"cannot write {self.url(key)} as JSON: {exc}.") from None
        return self.put_bytes(key, text.encode("utf-8"), content_type="application/json")

    def get_json(self, key: str) -> Any:
        data = self.get_bytes(key)
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{self.url(key)} is not valid UTF-8 JSON: {exc}.") from None

    def put_array(self, key: str, arr: Any) -> str:
        """Write ``arr`` in numpy's ``.npy`` format (no pickled objects)."""
        buffer = io.BytesIO()
        try:
            np.save(buffer, np.asarray(arr), allow_pickle=False)
        except ValueError as exc:
            raise InputError(
                f"cannot write {self.url(key)} as .npy without pickling ({exc}); convert object arrays to a "
                "numeric or string dtype first."
            ) from None
        return self.put_bytes(key, buffer.getvalue(), content_type="application/octet-stream")

    def get_array(self, key: str) -> np.ndarray:
        data = self.get_bytes(key)
        try:
            arr = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise FormatError(f"{self.url(key)} is not a readable .npy array: {exc}.") from None
        if not isinstance(arr, np.ndarray):
            raise FormatError(f"{self.url(key)} holds an .npz archive, not a single .npy array.")
        return arr

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def _atomic_write(path: Path, write: Callable[[io.BufferedWriter], Any]) -> None:
    """Create ``path`` with what ``write(f)`` writes, all or nothing: temp file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (best effort: not every filesystem lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- local folder ----------------------------------------------------------------------------------------------------
class LocalStore(Store):
    """Objects as files under ``root``; the checksum of ``a/b.npy`` lives in ``a/b.npy.sha256``.

    The root folder is created on the first write. ``content_type`` is accepted and ignored.
    """

    #: :meth:`list_info` gives no version token (None) for a file whose ctime is less than this many seconds before
    #: the listing started: see :class:`ObjectInfo`. Two seconds cover the kernel's timestamp tick with a wide margin
    #: (and modest clock skew on a network filesystem).
    racy_seconds: float = 2.0

    def __init__(self, root: str | os.PathLike):
        self.root = Path(os.path.abspath(os.fspath(root)))
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*validate_key(key).split("/"))

    def url(self, key: str) -> str:
        return self._path(key).as_uri()

    def _os_error(self, key: str, exc: OSError) -> LabelShiftError:
        if isinstance(exc, (NotADirectoryError, IsADirectoryError, FileExistsError)):
            return InputError(
                f"cannot write {self.url(key)}: a folder and an object would share a name ({exc.strerror}); "
                "local stores cannot hold both 'a' and 'a/b'."
            )
        return StorageError(f"cannot write {self.url(key)}: {exc}.")

    def _write(self, key: str, path: Path, write: Callable[[Any], Any], digest: Callable[[], str]) -> str:
        """Write ``path`` atomically with ``write``, then its sidecar with ``digest()``; returns the digest."""
        try:
            _atomic_write(path, write)
            self._record(path, digest())
        except OSError as exc:
            raise self._os_error(key, exc) from exc
        return digest()

    def put_bytes(self, key: str, data: bytes, *, content_type: str | None = None) -> str:
        path = self._path(key)
        _check_bytes(data)
        digest = _sha256(data)
        return self._write(key, path, lambda f: f.write(data), lambda: digest)

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        target, source, digest = self._path(key), Path(path), hashlib.sha256()
        if not source.is_file():
            raise ObjectNotFoundError(f"cannot upload {source}: no such file.")

        def copy(f):
            with open(source, "rb") as src:
                _copy(src, f, digest)

        return self._write(key, target, copy, digest.hexdigest)

    @staticmethod
    def _record(path: Path, digest: str) -> None:
        line = f"{digest}  {path.name}\n".encode()
        _atomic_write(path.with_name(path.name + CHECKSUM_SUFFIX), lambda f: f.write(line))

    @staticmethod
    def _recorded(path: Path) -> str | None:
        try:
            text = path.with_name(path.name + CHECKSUM_SUFFIX).read_text()
        except FileNotFoundError:
            return None
        fields = text.split()
        return fields[0].lower() if fields else None

    def _read(self, key: str) -> tuple[bytes, str | None]:
        path = self._path(key)
        for _ in range(3):  # re-read if a concurrent writer replaced the object in between
            before = self._recorded(path)
            try:
                data = path.read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise ObjectNotFoundError(f"no object at {self.url(key)} (store {self.uri}).") from None
            after = self._recorded(path)
            if before == after:
                return data, after
        return data, after

    def get_bytes(self, key: str) -> bytes:
        data, recorded = self._read(key)
        if recorded is not None:
            _verify(self.url(key), recorded, _sha256(data))
        return data

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFoundError(f"no object at {self.url(key)} (store {self.uri}).")
        recorded = self._recorded(source)
        digest = hashlib.sha256()

        def copy(f):
            try:
                src = open(source, "rb")
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise ObjectNotFoundError(f"no object at {self.url(key)} (store {self.uri}).") from None
            with src:
                _copy(src, f, digest)
            _verify(self.url(key), recorded, digest.hexdigest())

        _atomic_write(Path(path), copy)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def checksum(self, key: str) -> str:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(f"no object at {self.url(key)} (store {self.uri}).")
        return self._recorded(path) or _file_sha256(path)

    def delete(self, key: str, *, missing_ok: bool = False) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if not missing_ok:
                raise ObjectNotFoundError(f"cannot delete {self.url(key)}: no such object.") from None
        path.with_name(path.name + CHECKSUM_SUFFIX).unlink(missing_ok=True)
        # drop folders the deletion left empty, up to (not including) the root
        folder = path.parent
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent

    def _walk(self, prefix: str) -> list[tuple[str, str]]:
        """(key, path) of every file whose key starts with ``prefix``, sorted by key."""
        if not isinstance(prefix, str):
            raise InputError(f"prefix must be a string, got {type(prefix).__name__}.")
        # start the walk at the deepest folder the prefix names, when it is a safe path
        start = self.root
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if head:
            if not _is_valid_key(head):
                return []
            start = self.root.joinpath(*head.split("/"))
        found = []
        for folder, _dirs, files in os.walk(start):
            relative = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                key = name if relative == "." else f"{relative}/{name}"
                if key.startswith(prefix) and _is_valid_key(key):
                    found.append((key, os.path.join(folder, name)))
        return sorted(found)

    def list(self, prefix: str = "") -> list[str]:
        return [key for key, _path in self._walk(prefix)]

    def list_info(self, prefix: str = "") -> dict[str, ObjectInfo]:
        started = time.time_ns()  # before the walk: a file changed during it counts as recent
        racy_ns = int(self.racy_seconds * 1e9)
        infos = {}
        for key, path in self._walk(prefix):
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):  # deleted since the walk saw it
                continue
            recent = started - st.st_ctime_ns < racy_ns
            version = None if recent else f"{st.st_ino}-{st.st_mtime_ns}-{st.st_ctime_ns}"
            infos[key] = ObjectInfo(size=st.st_size, version=version)
        return infos


# -- S3 ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    """How botocore retries transient S3 failures (connection errors, timeouts, HTTP 5xx, throttling).

    ``max_attempts`` counts the first try. ``mode`` is botocore's retry mode: ``"standard"`` (exponential backoff
    with jitter, at most 20 s a wait) or ``"adaptive"`` (standard plus client-side rate limiting after throttling).
    """

    max_attempts: int = 5
    mode: str = "standard"

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise InputError(f"RetryPolicy.max_attempts must be an integer >= 1, got {self.max_attempts!r}.")
        if self.mode not in ("standard", "adaptive"):
            raise InputError(f"RetryPolicy.mode must be 'standard' or 'adaptive', got {self.mode!r}.")

    def botocore_retries(self) -> dict:
        """The ``retries`` setting of botocore's ``Config``."""
        return {"mode": self.mode, "total_max_attempts": self.max_attempts}


_S3_URI = re.compile(r"^s3://(?P<bucket>[^/]*)/?(?P<prefix>.*)$", re.IGNORECASE)
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
    "InvalidSecurity", "AuthorizationHeaderMalformed", "InvalidClientTokenId", "403",
}
_CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials)"
_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # boto3's order; named in messages only

_shared_loader = None
_shared_loader_lock = threading.Lock()


def _botocore_session():
    """A fresh botocore session (it reads credentials and endpoint from the environment as it is now) sharing one
    data loader with the others, so the S3 service model is parsed once per process."""
    import botocore.session

    global _shared_loader
    session = botocore.session.Session()
    with _shared_loader_lock:
        if _shared_loader is None:
            _shared_loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _shared_loader)
    return session


def _client_error_code(exc) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", status)), int(status or 0)


class _VerifiedReader:
    """A read-only stream over an open file that raises StorageError at its end unless what was read hashes to
    ``digest`` (the file changed after the digest was taken)."""

    def __init__(self, f, digest: str, message: str):
        self._f, self._digest, self._message, self._hash = f, digest, message, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        chunk = self._f.read(size)
        self._hash.update(chunk)
        if not chunk and self._hash.hexdigest() != self._digest:
            raise StorageError(self._message)
        return chunk


class S3Store(Store):
    """Objects in an S3-compatible bucket under an optional key prefix, through boto3.

    Parameters
    ----------
    bucket, prefix:
        Where the objects live; ``prefix`` (no leading or trailing ``/``) is prepended to every key.
    endpoint_url:
        S3 endpoint. Default: what boto3 finds itself (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, config file, AWS).
    retry:
        :class:`RetryPolicy` given to botocore for transient errors.
    multipart_threshold, part_size:
        Objects larger than ``multipart_threshold`` bytes are uploaded by boto3's transfer manager in parts of
        ``part_size`` bytes (at least 5 MiB, S3's minimum).
    connect_timeout, read_timeout:
        Socket timeouts of each request, in seconds.
    client:
        A ready boto3 S3 client to use instead of building one (its own retry settings then apply).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        retry: RetryPolicy | None = None,
        multipart_threshold: int = 64 * 1024 * 1024,
        part_size: int = 16 * 1024 * 1024,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        client: Any = None,
    ):
        if not isinstance(bucket, str) or not _BUCKET_NAME.match(bucket) or ".." in bucket:
            raise InputError(
                f"invalid S3 bucket name {bucket!r}: use 3-63 lowercase letters, digits, '.' and '-', "
                "starting and ending with a letter or digit."
            )
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix, "prefix")
        if part_size < MIN_PART_SIZE:
            raise InputError(f"part_size must be at least {MIN_PART_SIZE} bytes (5 MiB, S3's minimum), got {part_size}.")
        if multipart_threshold < 0:
            raise InputError(f"multipart_threshold must be >= 0, got {multipart_threshold}.")
        self.bucket, self.prefix, self.endpoint_url = bucket, prefix, endpoint_url
        self.retry = retry or RetryPolicy()
        self.multipart_threshold, self.part_size = multipart_threshold, part_size
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._client, self._session, self._lock = client, None, threading.Lock()
        self._bucket_seen = False

    # pickling (Prefect may hash or ship task arguments): the boto3 client is rebuilt on first use
    def __getstate__(self):
        return {**self.__dict__, "_client": None, "_session": None, "_lock": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self):
        """The boto3 S3 client (built on first use; thread-safe)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3
                    from botocore.config import Config

                    config = Config(retries=self.retry.botocore_retries(), connect_timeout=self.connect_timeout,
                                    read_timeout=self.read_timeout)
                    self._session = boto3.session.Session(botocore_session=_botocore_session())
                    self._client = self._session.client("s3", endpoint_url=self.endpoint_url, config=config)
        return self._client

    # -- naming and errors ---------------------------------------------------------------------------------------------
    def _full_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full_key(key)}"

    def _endpoint(self) -> str:
        """The endpoint in use and where it came from, for error messages."""
        try:
            endpoint = self.client.meta.endpoint_url
        except Exception:  # the client itself could not be built
            endpoint = self.endpoint_url or next(filter(None, map(os.environ.get, _ENDPOINT_VARS)), None)
        if self.endpoint_url:
            source = "the endpoint_url argument"
        else:
            source = next((name for name in _ENDPOINT_VARS if os.environ.get(name) == endpoint),
                          "boto3's default; set AWS_ENDPOINT_URL_S3 to use another S3 server")
        return f"{endpoint} (from {source})"

    def _missing_bucket(self) -> ObjectNotFoundError:
        endpoint = self._endpoint()
        return ObjectNotFoundError(
            f"bucket {self.bucket!r} does not exist at {endpoint}; create it with `aws s3 mb s3://{self.bucket} "
            f"--endpoint-url {endpoint.split(' (from')[0]}` or boto3's create_bucket(Bucket={self.bucket!r}), or "
            "point the store at an existing bucket."
        )

    def _translate(self, exc: Exception, what: str, key: str | None) -> LabelShiftError | None:
        """Map a botocore exception (raised once botocore's retries are spent) to the labelshift error family, or
        None if it is not one we know."""
        from botocore.exceptions import (
            ClientError, ConnectionError, HTTPClientError, IncompleteReadError, NoCredentialsError,
            PartialCredentialsError,
        )

        target = self.url(key) if key is not None else self.uri
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return CredentialsError(
                f"cannot {what} {target}: no usable S3 credentials were found ({exc}). Set {_CREDENTIAL_VARS}."
            )
        code, status = _client_error_code(exc) if isinstance(exc, ClientError) else ("", 0)
        unavailable = status >= 500 or status == 429 or code in ("RequestTimeout", "SlowDown", "Throttling")
        if unavailable or isinstance(exc, (ConnectionError, HTTPClientError, IncompleteReadError)):
            return ServiceUnavailableError(
                f"cannot {what} {target}: the S3 endpoint {self._endpoint()} did not answer properly ({exc}; "
                f"botocore's {self.retry.mode} retries, at most {self.retry.max_attempts} attempts). Check that the "
                "server is running and that AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) points at it "
                "(for the local stack: `labelshift stack up` prints the value)."
            )
        if not isinstance(exc, ClientError):
            return None
        if code == "NoSuchBucket":
            return self._missing_bucket()
        if code == "NoSuchUpload":  # a multipart upload that was aborted or already completed
            return StorageError(f"cannot {what} {target}: the multipart upload no longer exists ({exc}).")
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            if key is None:
                return self._missing_bucket()
            return ObjectNotFoundError(f"no object at {target} (endpoint {self._endpoint()}).")
        if code in _CREDENTIAL_CODES or status == 403:
            try:
                access_key = self._session.get_credentials().access_key
            except Exception:  # no session (client passed in) or no credentials at all
                access_key = None
            who = f"access key id {access_key!r}" if access_key else "the credentials"
            return CredentialsError(
                f"cannot {what} {target}: the S3 endpoint {self._endpoint()} refused {who} ({code}: "
                f"{exc.response.get('Error', {}).get('Message', 'access denied')}). Check {_CREDENTIAL_VARS}, "
                "and that this identity may access the bucket."
            )
        return StorageError(f"cannot {what} {target}: S3 error {code} (HTTP {status}): {exc}.")

    def _call(self, what: str, operation: Callable[[], T], key: str | None = None) -> T:
        """Run ``operation`` (botocore retries transient errors inside it); translate its error to labelshift's."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return operation()
        except (BotoCoreError, ClientError) as exc:
            translated = self._translate(exc, what, key)
            if translated is None:
                raise
            raise translated from exc

    def _bucket_exists(self) -> bool:
        try:
            self._call("check the bucket", lambda: self.client.head_bucket(Bucket=self.bucket))
        except ObjectNotFoundError:
            return False
        return True

    def _head(self, key: str) -> dict | None:
        """HEAD ``key``: its response, or None if the key is absent (ObjectNotFoundError if the bucket is)."""
        full_key = self._full_key(key)
        try:
            response = self._call("read", lambda: self.client.head_object(Bucket=self.bucket, Key=full_key), key)
        except ObjectNotFoundError:
            # a HEAD 404 has no body to say whether the key or the bucket is missing: ask once per store
            if not self._bucket_seen and not self._bucket_exists():
                raise self._missing_bucket() from None
            self._bucket_seen = True
            return None
        self._bucket_seen = True
        return response

    def _recorded_checksum(self, key: str) -> str | None:
        response = self._head(key)
        if response is None:
            raise ObjectNotFoundError(f"no object at {self.url(key)} (endpoint {self._endpoint()}).")
        return response.get("Metadata", {}).get(METADATA_CHECKSUM)

    # -- writes --------------------------------------------------------------------------------------------------------
    def _put_object(self, key: str, body: bytes, digest: str, content_type: str | None) -> dict:
        """One PutObject of ``body`` with its checksum; returns the response (its ``ETag`` names the version)."""
        extra = {"ContentType": content_type} if content_type else {}
        return self._call("write", lambda: self.client.put_object(
            Bucket=self.bucket, Key=self._full_key(key), Body=body, Metadata={METADATA_CHECKSUM: digest}, **extra,
        ), key)

    def _upload(self, key: str, stream, digest: str, content_type: str | None) -> None:
        """Upload ``stream`` (larger than ``multipart_threshold``) through boto3's transfer manager, which aborts
        the multipart upload when any step fails."""
        from boto3.s3.transfer import TransferConfig

        extra = {"Metadata": {METADATA_CHECKSUM: digest}, **({"ContentType": content_type} if content_type else {})}
        # the threshold only bounds what the manager reads ahead to decide; anything sent here goes in parts
        config = TransferConfig(multipart_threshold=min(self.multipart_threshold + 1, self.part_size),
                                multipart_chunksize=self.part_size)
        try:
            self._call("write", lambda: self.client.upload_fileobj(
                stream, self.bucket, self._full_key(key), ExtraArgs=extra, Config=config), key)
        except StorageError as exc:
            # a Complete retried by botocore after its first answer was lost may hear NoSuchUpload although the
            # first one went through: fine when the key now holds this content
            code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
            if code != "NoSuchUpload" or self._recorded_checksum(key) != digest:
                raise
        self._bucket_seen = True

    def put_bytes(self, key: str, data: bytes, *, content_type: str | None = None) -> str:
        self._full_key(key)
        _check_bytes(data)
        view = memoryview(data).cast("B")
        digest = _sha256(view)
        if len(view) <= self.multipart_threshold:
            self._put_object(key, bytes(view), digest, content_type)
            self._bucket_seen = True
        else:
            self._upload(key, io.BytesIO(view), digest, content_type)
        return digest

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        source = Path(path)
        if not source.is_file():
            raise ObjectNotFoundError(f"cannot upload {source}: no such file.")
        if source.stat().st_size <= self.multipart_threshold:
            return self.put_bytes(key, source.read_bytes())
        self._full_key(key)  # validate before reading the file
        digest = _file_sha256(source)  # the metadata is sent when the upload starts
        message = f"{source} changed while it was being uploaded to {self.url(key)}; upload it again."
        with open(source, "rb") as f:
            self._upload(key, _VerifiedReader(f, digest, message), digest, None)
        return digest

    # -- reads ---------------------------------------------------------------------------------------------------------
    def _read_into(self, key: str, f) -> None:
        """GET ``key`` into the binary file ``f`` (rewound first), verified against its recorded checksum."""
        from botocore.exceptions import HTTPClientError, IncompleteReadError

        full_key = self._full_key(key)
        # botocore retries a GET until its response headers arrive; a body cut off after that is ours to retry
        for attempt in range(1, self.retry.max_attempts + 1):
            f.seek(0)
            f.truncate()
            response = self._call("read", lambda: self.client.get_object(Bucket=self.bucket, Key=full_key), key)
            digest, body = hashlib.sha256(), response["Body"]  # its read() checks the length at the end
            try:
                _copy(body, f, digest)
                break
            except (HTTPClientError, IncompleteReadError) as exc:
                if attempt == self.retry.max_attempts:
                    raise self._translate(exc, "read", key) from exc
                logger.info("reading %s broke off (%s); reading it again", self.url(key), exc)
            finally:
                body.close()  # not `with body`: that yields the raw stream, which skips the length check
        self._bucket_seen = True
        _verify(self.url(key), response.get("Metadata", {}).get(METADATA_CHECKSUM), digest.hexdigest())

    def get_bytes(self, key: str) -> bytes:
        buffer = io.BytesIO()
        self._read_into(key, buffer)
        return buffer.getvalue()

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self._full_key(key)
        _atomic_write(Path(path), lambda f: self._read_into(key, f))

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def checksum(self, key: str) -> str:
        recorded = self._recorded_checksum(key)
        return recorded.lower() if recorded else _sha256(self.get_bytes(key))

    def delete(self, key: str, *, missing_ok: bool = False) -> None:
        full_key = self._full_key(key)
        if not self.exists(key):  # S3's DELETE succeeds on absent keys; say so like the local store does
            if missing_ok:
                return
            raise ObjectNotFoundError(f"cannot delete {self.url(key)}: no such object.")
        self._call("delete", lambda: self.client.delete_object(Bucket=self.bucket, Key=full_key), key)

    def _list_items(self, prefix: str) -> list[tuple[str, dict]]:
        """(key, ListObjectsV2 entry) of every object whose key starts with ``prefix``, sorted by key."""
        if not isinstance(prefix, str):
            raise InputError(f"prefix must be a string, got {type(prefix).__name__}.")
        root = f"{self.prefix}/" if self.prefix else ""

        def fetch() -> list[dict]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            return [item for page in pages for item in page.get("Contents", [])]

        items = [(item["Key"][len(root):], item) for item in self._call("list", fetch)]
        self._bucket_seen = True
        # directory markers ('a/') and names that are not valid keys cannot be read through a store: leave them out
        return sorted((item for item in items if _is_valid_key(item[0])), key=lambda item: item[0])

    def list(self, prefix: str = "") -> list[str]:
        return [key for key, _item in self._list_items(prefix)]

    def list_info(self, prefix: str = "") -> dict[str, ObjectInfo]:
        return {key: ObjectInfo(size=int(item.get("Size", 0)), version=str(item.get("ETag") or "").strip('"') or None)
                for key, item in self._list_items(prefix)}

    def create_bucket(self) -> None:
        """Create the bucket if it does not exist yet (a convenience for local stacks and tests)."""
        if self._bucket_exists():
            return
        try:
            self._call("create the bucket", lambda: self.client.create_bucket(Bucket=self.bucket))
        except StorageError as exc:
            if "BucketAlreadyOwnedByYou" not in str(exc.__cause__):
                raise
        self._bucket_seen = True


# -- entry point -------------------------------------------------------------------------------------------------------
def open_store(uri: str | os.PathLike, **options: Any) -> Store:
    """Open the store named by ``uri``.

    - ``s3://bucket`` or ``s3://bucket/prefix``: an :class:`S3Store` (``options`` go to its constructor:
      ``endpoint_url``, ``retry``, ``multipart_threshold``...);
    - ``file:///absolute/path`` or a plain path (relative paths are taken from the current folder): a
      :class:`LocalStore`.
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise InputError(f"store URI must be a non-empty string like 's3://bucket/prefix' or a folder, got {uri!r}.")
    if uri[:5].lower() == "s3://":
        match = _S3_URI.match(uri)
        bucket, prefix = match["bucket"], match["prefix"]
        if not bucket:
            raise InputError(f"store URI {uri!r} names no bucket; write it as 's3://bucket/optional/prefix'.")
        return S3Store(bucket, prefix, **options)
    scheme = urlsplit(uri).scheme if "://" in uri else ""
    if scheme == "file":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise InputError(f"store URI {uri!r} names host {parts.netloc!r}; file URIs must be local (file:///path).")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise InputError(f"store URI {uri!r} must hold an absolute path (file:///abs/path).")
        return _local(path, options, uri)
    if scheme:
        raise InputError(
            f"store URI {uri!r} has unsupported scheme {scheme!r}; use s3://bucket/prefix, file:///path or a folder."
        )
    return _local(os.path.expanduser(uri), options, uri)


def _local(path: str, options: dict, uri: str) -> LocalStore:
    if options:
        raise InputError(f"options {sorted(options)} apply to S3 stores only, not to {uri!r}.")
    return LocalStore(path)
