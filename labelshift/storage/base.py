"""The store interface, its key rules and the checksum helpers both backends share."""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConflictError, FormatError, InputError, StorageError

CHECKSUM_SUFFIX = ".sha256"
TEMP_PREFIX = ".labelshift-tmp-"
CHUNK = 1024 * 1024


# -- keys --------------------------------------------------------------------------------------------------------------
def validate_key(key: str, name: str = "key") -> str:
    """Return ``key`` if it is a safe relative object key, else raise :class:`InputError` saying why."""
    if not isinstance(key, str):
        raise InputError(f"{name} must be a string like 'results/table.json', got {type(key).__name__}.")
    segments = key.split("/")
    problem = None
    if key == "":
        problem = "it is empty"
    elif "\\" in key:
        problem = "it contains a backslash; use '/' to separate folders"
    elif "\x00" in key:
        problem = "it contains a NUL byte"
    elif key.startswith("/"):
        problem = "it is absolute (starts with '/'); keys are relative to the store's root"
    elif "" in segments:
        problem = "it has an empty segment ('//' or a trailing '/')"
    elif "." in segments or ".." in segments:
        problem = "it has a '.' or '..' segment (path traversal)"
    elif any(s.startswith(TEMP_PREFIX) for s in segments):
        problem = f"its segments may not start with the reserved prefix {TEMP_PREFIX!r}"
    elif key.endswith(CHECKSUM_SUFFIX):
        problem = f"the suffix {CHECKSUM_SUFFIX!r} is reserved for checksum files"
    if problem:
        raise InputError(f"invalid object {name} {key!r}: {problem}.")
    return key


def is_valid_key(key: str) -> bool:
    try:
        validate_key(key)
    except InputError:
        return False
    return True


def check_prefix(prefix: Any) -> None:
    if not isinstance(prefix, str):
        raise InputError(f"prefix must be a string, got {type(prefix).__name__}.")


def check_bytes(data: Any) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InputError(
            f"data must be bytes, got {type(data).__name__}; use put_json, put_array or put_file for other content."
        )


# -- checksums ---------------------------------------------------------------------------------------------------------
def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def copy_stream(source, target, digest) -> None:
    """Copy the binary stream ``source`` into ``target`` in chunks, feeding ``digest`` on the way."""
    for chunk in iter(lambda: source.read(CHUNK), b""):
        digest.update(chunk)
        target.write(chunk)


def verify(uri: str, recorded: str | None, actual: str) -> None:
    """Raise FormatError if a checksum was recorded and the content's differs."""
    if recorded is not None and actual != recorded.lower():
        raise FormatError(
            f"checksum mismatch for {uri}: recorded sha256 {recorded}, content has {actual}. The object was changed "
            "or corrupted after it was written (or a write was interrupted); write it again from its source."
        )


class VerifiedReader:
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


def conflict(uri: str, expected: str | None, current: str | None) -> ConflictError:
    if expected is None:
        what = "it exists now, and this write expected to create it"
    elif current is None:
        what = "it was deleted meanwhile"
    else:
        what = f"it is at version {current[:16]}, this write expected {expected[:16]}"
    return ConflictError(f"conditional write of {uri} refused: {what}. Another writer changed it since it was read; "
                         "read it again and retry.")


def json_default(value: Any) -> Any:
    """Let numpy scalars and arrays (common in results) go into JSON as plain numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"object of type {type(value).__name__} is not JSON serialisable")


def encode_json(obj: Any, what: str) -> bytes:
    """``obj`` as indented UTF-8 JSON (numpy values as plain numbers and lists, :func:`json_default`); an
    :class:`InputError` naming ``what`` when it cannot be encoded."""
    try:
        return json.dumps(obj, indent=2, default=json_default).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} cannot be written as JSON ({exc}); pass numbers, strings, lists and dicts.") \
            from None


# -- the interface -----------------------------------------------------------------------------------------------------
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
        return list(self.list_info(prefix))

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

    def tried_once(self) -> "Store":
        """This store with each call tried once, without retries (for a check whose failure is itself an answer);
        the store itself when it does not retry."""
        return self

    # compare-and-swap (subclasses may make it atomic)
    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The content of ``key`` and its version token, read together (the token to pass to
        :meth:`compare_and_swap`); ObjectNotFoundError if absent. The base token is the content's SHA-256."""
        data = self.get_bytes(key)
        return data, sha256(data)

    def _current_token(self, key: str) -> str | None:
        try:
            return self.read_versioned(key)[1]
        except FileNotFoundError:
            return None

    def conditional_writes(self, key: str | None = None) -> bool:
        """True when :meth:`compare_and_swap` is atomic against concurrent calls on the same key; False when it is
        a read-compare-write that two writers within milliseconds can both pass."""
        return False

    def compare_and_swap(self, key: str, data: bytes, expected: str | None, *,
                         content_type: str | None = None) -> str:
        """Write ``data`` under ``key`` only if it is still the version ``expected`` (a token from
        :meth:`read_versioned`; None: only if ``key`` does not exist). Returns the new version token; raises
        :class:`~labelshift.errors.ConflictError` and writes nothing otherwise. The base version compares, then
        writes: not atomic (see :meth:`conditional_writes`)."""
        check_bytes(data)
        current = self._current_token(key)
        if current != expected:
            raise conflict(self.url(key), expected, current)
        self.put_bytes(key, data, content_type=content_type)
        return sha256(data)

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
