"""A store in a local folder: atomic file writes and ``sha256sum``-style sidecar checksums."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError, ObjectNotFoundError, StorageError
from .base import (CHECKSUM_SUFFIX, TEMP_PREFIX, ObjectInfo, Store, check_bytes, check_prefix, conflict, copy_stream,
                   file_sha256, is_valid_key, sha256, validate_key, verify)

_NOT_THERE = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path: Path, write: Callable[[io.BufferedWriter], Any]) -> None:
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (best effort: not every filesystem lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


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

    def _missing(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"no object at {self.url(key)} (store {self.uri}).")

    # -- writes --------------------------------------------------------------------------------------------------------
    def _write(self, key: str, path: Path, write: Callable[[Any], Any], digest: Callable[[], str]) -> str:
        """Write ``path`` atomically with ``write``, then its sidecar with ``digest()``; returns the digest.

        The old sidecar is removed first, so a write that fails at any step leaves either the old or the new content,
        readable: a file without a sidecar is read unverified, never reported as corrupt."""
        try:
            _sidecar(path).unlink(missing_ok=True)
            atomic_write(path, write)
            line = f"{digest()}  {path.name}\n".encode()
            atomic_write(_sidecar(path), lambda f: f.write(line))
        except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
            raise InputError(
                f"cannot write {self.url(key)}: a folder and an object would share a name ({exc.strerror}); "
                "local stores cannot hold both 'a' and 'a/b'."
            ) from exc
        except OSError as exc:
            if exc.errno in _DISK_FULL:
                raise StorageError(
                    f"cannot write {self.url(key)}: the disk holding {self.root} is full ({exc.strerror}). Nothing "
                    "was half-written (the object keeps its previous content); free some space and run again."
                ) from exc
            raise StorageError(f"cannot write {self.url(key)}: {exc}.") from exc
        return digest()

    # -- compare-and-swap ----------------------------------------------------------------------------------------------
    def conditional_writes(self, key: str | None = None) -> bool:
        """True: :meth:`compare_and_swap` holds an exclusive ``flock`` on a lock file beside the object (atomic
        between processes and threads on this machine, and on network filesystems whose locks work across hosts)."""
        return True

    @contextlib.contextmanager
    def _locked(self, key: str, path: Path):
        lock = path.with_name(f"{TEMP_PREFIX}lock-{path.name}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot lock {self.url(key)} for a conditional write ({lock}: {exc}).") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.get_bytes(key)
        return data, sha256(data)

    def compare_and_swap(self, key: str, data: bytes, expected: str | None, *,
                         content_type: str | None = None) -> str:
        """Under an exclusive lock: compare the SHA-256 of the file's content with ``expected``, then write it like
        :meth:`put_bytes`. The token is the content's SHA-256."""
        path = self._path(key)
        check_bytes(data)
        digest = sha256(data)
        with self._locked(key, path):
            try:
                current = file_sha256(path)
            except _NOT_THERE:
                current = None
            if current != expected:
                raise conflict(self.url(key), expected, current)
            self._write(key, path, lambda f: f.write(data), lambda: digest)
        return digest

    def put_bytes(self, key: str, data: bytes, *, content_type: str | None = None) -> str:
        path = self._path(key)
        check_bytes(data)
        digest = sha256(data)
        return self._write(key, path, lambda f: f.write(data), lambda: digest)

    def put_file(self, key: str, path: str | os.PathLike) -> str:
        target, source, digest = self._path(key), Path(path), hashlib.sha256()
        if not source.is_file():
            raise ObjectNotFoundError(f"cannot upload {source}: no such file.")

        def copy(f):
            with open(source, "rb") as src:
                copy_stream(src, f, digest)

        return self._write(key, target, copy, digest.hexdigest)

    # -- reads ---------------------------------------------------------------------------------------------------------
    @staticmethod
    def _recorded(path: Path) -> str | None:
        try:
            fields = _sidecar(path).read_text().split()
        except FileNotFoundError:
            return None
        return fields[0].lower() if fields else None

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        for _ in range(3):  # re-read if a concurrent writer replaced the object in between
            before = self._recorded(path)
            try:
                data = path.read_bytes()
            except _NOT_THERE:
                raise self._missing(key) from None
            recorded = self._recorded(path)
            if before == recorded:
                break
        if recorded is not None:
            verify(self.url(key), recorded, sha256(data))
        return data

    def get_file(self, key: str, path: str | os.PathLike) -> None:
        source = self._path(key)
        if not source.is_file():
            raise self._missing(key)
        recorded = self._recorded(source)
        digest = hashlib.sha256()

        def copy(f):
            try:
                src = open(source, "rb")
            except _NOT_THERE:
                raise self._missing(key) from None
            with src:
                copy_stream(src, f, digest)
            verify(self.url(key), recorded, digest.hexdigest())

        atomic_write(Path(path), copy)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def checksum(self, key: str) -> str:
        path = self._path(key)
        if not path.is_file():
            raise self._missing(key)
        return self._recorded(path) or file_sha256(path)

    def delete(self, key: str, *, missing_ok: bool = False) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except _NOT_THERE:
            if not missing_ok:
                raise ObjectNotFoundError(f"cannot delete {self.url(key)}: no such object.") from None
        _sidecar(path).unlink(missing_ok=True)
        # drop folders the deletion left empty, up to (not including) the root
        folder = path.parent
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent

    # -- listing -------------------------------------------------------------------------------------------------------
    def _walk(self, prefix: str) -> list[tuple[str, str]]:
        """(key, path) of every file whose key starts with ``prefix``, sorted by key."""
        check_prefix(prefix)
        # start the walk at the deepest folder the prefix names, when it is a safe path
        start = self.root
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if head:
            if not is_valid_key(head):
                return []
            start = self.root.joinpath(*head.split("/"))
        found = []
        for folder, _dirs, files in os.walk(start):
            relative = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                key = name if relative == "." else f"{relative}/{name}"
                if key.startswith(prefix) and is_valid_key(key):
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
