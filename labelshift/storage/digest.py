"""The digest of a set of named files: what a trusted model version is checked against (``docs/serving.md``).

A :class:`FileDigest` holds the SHA-256 of each file's content under its name and one overall digest over all of
them: ``sha256:`` and the SHA-256 of the lines ``<name> NUL <content sha256> LF``, the names in sorted order, so
the digest changes when a file is added, removed, renamed or changed, and not with the order files were found in.
:func:`changes` names which files differ between two digests. No MLflow here: :mod:`labelshift_mlflow.trusted` gathers
the files of a model version and records and checks its digest.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from labelshift.storage.base import file_sha256

__all__ = ["DIGEST_PREFIX", "FileDigest", "digest_files", "digest_folder", "changes"]

DIGEST_PREFIX = "sha256:"


@dataclass(frozen=True)
class FileDigest:
    """SHA-256 of each named file (``files``: name -> hex) and the overall digest (``value``: ``sha256:<hex>``)."""

    value: str
    files: Mapping[str, str]

    def manifest(self, max_chars: int = 4000) -> str | None:
        """The per-file digests as compact JSON (name -> the first 16 hex digits), for naming the file that changed;
        None when it would be longer than ``max_chars`` (the overall digest alone is still checked)."""
        text = json.dumps({n: h[:16] for n, h in sorted(self.files.items())}, separators=(",", ":"))
        return text if len(text) <= max_chars else None


def _overall(files: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode("utf-8") + b"\0" + files[name].encode("ascii") + b"\n")
    return DIGEST_PREFIX + h.hexdigest()


def digest_files(files: Mapping[str, Path | str]) -> FileDigest:
    """The digest of ``files`` (name -> local path). A name must not hold NUL or a line break; at least one file."""
    if not files:
        raise ValueError("nothing to digest: no files")
    hashes = {}
    for name, path in files.items():
        if "\0" in name or "\n" in name:
            raise ValueError(f"file name {name!r} holds a NUL or line break")
        hashes[name] = file_sha256(Path(path))
    return FileDigest(_overall(hashes), hashes)


def digest_folder(folder: Path | str, prefix: str = "") -> dict[str, Path]:
    """Every regular file under ``folder`` as name -> path, the name its ``/``-separated path below ``folder``
    after ``prefix`` (``prefix + "data/model.pt2"``); an absent folder gives nothing."""
    root = Path(folder)
    if not root.is_dir():
        return {}
    return {prefix + p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def changes(expected: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """What differs between a recorded manifest and the files found, one phrase each: ``"X changed"``, ``"X
    added"``, ``"X removed"``. The manifest's digests may be shortened: a found digest matches one it starts with."""
    out = []
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            out.append(f"{name} removed")
        elif name not in expected:
            out.append(f"{name} added")
        elif not found[name].startswith(expected[name]):
            out.append(f"{name} changed")
    return out
