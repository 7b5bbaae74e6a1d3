"""A store in an S3-compatible bucket through boto3: botocore retries, boto3's transfer manager for large objects,
and botocore's errors translated into labelshift's."""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (CredentialsError, InputError, LabelShiftError, ObjectNotFoundError, ServiceUnavailableError,
                      StorageError)
from .base import (TEMP_PREFIX, ObjectInfo, Store, VerifiedReader, check_bytes, check_prefix, conflict, copy_stream,
                   file_sha256, is_valid_key, sha256, validate_key, verify)
from .local import atomic_write

logger = logging.getLogger(__name__)

METADATA_CHECKSUM = "sha256"  # boto3 metadata name; sent as the x-amz-meta-sha256 header
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest part (every part but the last)

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
    "InvalidSecurity", "AuthorizationHeaderMalformed", "InvalidClientTokenId", "403",
}
_CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE with ~/.aws/credentials)"
_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # boto3's order; named in messages only
#: name of the small object, beside the key of a first compare-and-swap, that tells whether the server honours
#: conditional writes (not a valid key: listings never show it)
PROBE_NAME = f"{TEMP_PREFIX}conditional-write-probe"
_NEVER_AN_ETAG = '"00000000000000000000000000000000-labelshift"'
_conditional: dict[tuple[str, str], bool] = {}  # (endpoint, bucket) -> honours If-Match and If-None-Match
_conditional_lock = threading.Lock()


def _refused(exc: Exception) -> bool:
    """True for a conditional write's refusal: 412 PreconditionFailed, or AWS's 409 ConditionalRequestConflict (a
    concurrent conditional write on the key is in progress)."""
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


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


#: connections the client keeps per host: the transfer manager's 10 threads for each of the few transfers a run
#: makes at once (tasks.reestimation.scoring/outputs: 4 downloads, 2 uploads)
MAX_POOL_CONNECTIONS = 50


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
        Socket timeouts of each request, in seconds (default :attr:`CONNECT_TIMEOUT_S`, :attr:`READ_TIMEOUT_S`).
    client:
        A ready boto3 S3 client to use instead of building one (its own retry settings then apply).
    """

    #: socket timeouts of each request, in seconds (runtime/timeouts.py lists them with every other limit). The read
    #: limit is the wait for the next bytes of an answer, not for a whole transfer: a healthy server (SeaweedFS on
    #: a loaded 2-core machine, AWS) sends them within a second or two; a frozen one (SIGSTOP) never does, and with
    #: botocore's 5 attempts a call then fails within 5 x 15 s + its back-off (under a second), where 60 s made it
    #: over 5 minutes (tests/integration/test_faults_stack.py)
    CONNECT_TIMEOUT_S = 5.0
    READ_TIMEOUT_S = 15.0

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        retry: RetryPolicy | None = None,
        multipart_threshold: int = 64 * 1024 * 1024,
        part_size: int = 16 * 1024 * 1024,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
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
        self.connect_timeout = self.CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout
        self.read_timeout = self.READ_TIMEOUT_S if read_timeout is None else read_timeout
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._client, self._session, self._lock = client, None, threading.Lock()
        self._bucket_seen = False

    def tried_once(self) -> "S3Store":
        """A copy of this store (same bucket, prefix, endpoint and timeouts; its own client) whose calls botocore tries
        once: a frozen server then costs one read timeout, not :attr:`RetryPolicy.max_attempts` of them."""
        if self._client is not None and self._session is None:   # a client passed in keeps its own retry settings
            return self
        once = object.__new__(S3Store)
        once.__setstate__({**self.__getstate__(), "retry": RetryPolicy(max_attempts=1, mode=self.retry.mode)})
        return once

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

                    # room for boto3's 10 transfer threads in each of a few uploads or downloads at once
                    config = Config(retries=self.retry.botocore_retries(), connect_timeout=self.connect_timeout,
                                    read_timeout=self.read_timeout, max_pool_connections=MAX_POOL_CONNECTIONS)
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

    def _missing(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"no object at {self.url(key)} (endpoint {self._endpoint()}).")

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
        code, status = "", 0
        if isinstance(exc, ClientError):
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            code = str(exc.response.get("Error", {}).get("Code", status))
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
            return self._missing_bucket() if key is None else self._missing(key)
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

    def _call(self, what: str, operation: Callable[[], Any], key: str | None = None) -> Any:
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
            raise self._missing(key)
        return response.get("Metadata", {}).get(METADATA_CHECKSUM)

    # -- writes --------------------------------------------------------------------------------------------------------
    @staticmethod
    def _extra_args(digest: str, content_type: str | None) -> dict:
        """The checksum metadata (sent with the request that creates the object) and the content type."""
        return {"Metadata": {METADATA_CHECKSUM: digest}, **({"ContentType": content_type} if content_type else {})}

    def _upload(self, key: str, stream, digest: str, content_type: str | None) -> None:
        """Upload ``stream`` (larger than ``multipart_threshold``) through boto3's transfer manager, which aborts
        the multipart upload when any step fails."""
        from boto3.s3.transfer import TransferConfig

        # the threshold only bounds what the manager reads ahead to decide; anything sent here goes in parts
        config = TransferConfig(multipart_threshold=min(self.multipart_threshold + 1, self.part_size),
                                multipart_chunksize=self.part_size)
        extra = self._extra_args(digest, content_type)
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
        full_key = self._full_key(key)
        check_bytes(data)
        view = memoryview(data).cast("B")
        digest = sha256(view)
        if len(view) <= self.multipart_threshold:
            extra = self._extra_args(digest, content_type)
            self._call("write", lambda: self.client.put_object(
                Bucket=self.bucket, Key=full_key, Body=bytes(view), **extra), key)
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
        digest = file_sha256(source)  # the metadata is sent when the upload starts
        message = f"{source} changed while it was being uploaded to {self.url(key)}; upload it again."
        with open(source, "rb") as f:
            self._upload(key, VerifiedReader(f, digest, message), digest, None)
        return digest

    # -- reads ---------------------------------------------------------------------------------------------------------
    def _read_into(self, key: str, f) -> dict:
        """GET ``key`` into the binary file ``f`` (rewound first), verified against its recorded checksum; returns the
        response (its headers)."""
        from botocore.exceptions import HTTPClientError, IncompleteReadError

        full_key = self._full_key(key)
        # botocore retries a GET until its response headers arrive; a body cut off after that is ours to retry
        for attempt in range(1, self.retry.max_attempts + 1):
            f.seek(0)
            f.truncate()
            response = self._call("read", lambda: self.client.get_object(Bucket=self.bucket, Key=full_key), key)
            digest, body = hashlib.sha256(), response["Body"]  # its read() checks the length at the end
            try:
                copy_stream(body, f, digest)
                break
            except (HTTPClientError, IncompleteReadError) as exc:
                if attempt == self.retry.max_attempts:
                    raise self._translate(exc, "read", key) from exc
                logger.info("reading %s broke off (%s); reading it again", self.url(key), exc)
            finally:
                body.close()  # not `with body`: that yields the raw stream, which skips the length check
        self._bucket_seen = True
        verify(self.url(key), response.get("Metadata", {}).get(METADATA_CHECKSUM), digest.hexdigest())
        return response

    def get_bytes(self, key: str) -> bytes:
        buffer = io.BytesIO()
        self._read_into(key, buffer)
        return buffer.getvalue()

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        self._full_key(key)
        atomic_write(Path(path), lambda f: self._read_into(key, f))

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    # -- compare-and-swap ----------------------------------------------------------------------------------------------
    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The content and the ETag of the very response that carried it."""
        buffer = io.BytesIO()
        response = self._read_into(key, buffer)
        data = buffer.getvalue()
        return data, response.get("ETag") or f"sha256:{sha256(data)}"

    def _current_token(self, key: str) -> str | None:
        response = self._head(key)
        return None if response is None else response.get("ETag")

    def _conditional_put(self, full_key: str, body: bytes, key: str, **condition) -> dict | None:
        """PUT with an ``IfMatch`` or ``IfNoneMatch`` condition: the response, or None when the server refused it."""
        from botocore.exceptions import ClientError

        def put():
            try:
                return self.client.put_object(Bucket=self.bucket, Key=full_key, Body=body, **condition)
            except ClientError as exc:
                if _refused(exc):
                    return None
                raise

        return self._call("write", put, key)

    def conditional_writes(self, key: str | None = None) -> bool:
        """Whether the server honours ``If-None-Match: *`` and ``If-Match`` on PUT (AWS S3 does since 2024, SeaweedFS
        answers PreconditionFailed too). Found once per endpoint and bucket and process, by up to three PUTs of a
        small probe object beside ``key``: a server that ignores the headers accepts what must be refused."""
        cache = (str(self.client.meta.endpoint_url), self.bucket)
        with _conditional_lock:
            known = _conditional.get(cache)
        if known is not None:
            return known
        folder = self._full_key(key).rpartition("/")[0] if key else self.prefix
        probe = f"{folder}/{PROBE_NAME}" if folder else PROBE_NAME
        honoured = False
        for _ in range(2):  # accepted the first time: the probe may just not have existed yet
            if self._conditional_put(probe, b"probe", key, IfNoneMatch="*") is None:
                honoured = self._conditional_put(probe, b"probe", key, IfMatch=_NEVER_AN_ETAG) is None
                break
        if not honoured:
            logger.warning(
                "the S3 endpoint %s ignores conditional writes (If-Match / If-None-Match): compare-and-swap on %s "
                "falls back to read, compare, write, which two writers within milliseconds can both pass. Give "
                "each target one writer at a time (a concurrency limit of one), or use a server that supports "
                "them.", self._endpoint(), self.uri)
        with _conditional_lock:
            _conditional[cache] = honoured
        return honoured

    def compare_and_swap(self, key: str, data: bytes, expected: str | None, *,
                         content_type: str | None = None) -> str:
        """One PUT with ``If-Match: <expected ETag>`` (``If-None-Match: *`` when ``expected`` is None); the server
        refuses it with PreconditionFailed when another write came first. On a server that ignores these headers
        (:meth:`conditional_writes` is False) a HEAD, a comparison and a plain PUT instead. The token is the ETag."""
        full_key = self._full_key(key)
        check_bytes(data)
        if not self.conditional_writes(key):
            return Store.compare_and_swap(self, key, data, expected, content_type=content_type)
        body = bytes(memoryview(data).cast("B"))
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        response = self._conditional_put(full_key, body, key, **condition,
                                         **self._extra_args(sha256(body), content_type))
        if response is None:
            raise conflict(self.url(key), expected, self._current_token(key))
        self._bucket_seen = True
        return response.get("ETag") or self._current_token(key)

    def checksum(self, key: str) -> str:
        recorded = self._recorded_checksum(key)
        return recorded.lower() if recorded else sha256(self.get_bytes(key))

    def delete(self, key: str, *, missing_ok: bool = False) -> None:
        full_key = self._full_key(key)
        if not self.exists(key):  # S3's DELETE succeeds on absent keys; say so like the local store does
            if missing_ok:
                return
            raise ObjectNotFoundError(f"cannot delete {self.url(key)}: no such object.")
        self._call("delete", lambda: self.client.delete_object(Bucket=self.bucket, Key=full_key), key)

    # -- listing -------------------------------------------------------------------------------------------------------
    def list_info(self, prefix: str = "") -> dict[str, ObjectInfo]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""

        def fetch() -> list[dict]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            return [item for page in pages for item in page.get("Contents", [])]

        items = sorted(((item["Key"][len(root):], item) for item in self._call("list", fetch)), key=lambda kv: kv[0])
        self._bucket_seen = True
        # directory markers ('a/') and names that are not valid keys cannot be read through a store: leave them out
        return {key: ObjectInfo(size=int(item.get("Size", 0)), version=str(item.get("ETag") or "").strip('"') or None)
                for key, item in items if is_valid_key(key)}

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
