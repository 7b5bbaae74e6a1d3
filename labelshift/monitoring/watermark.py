"""The store side of scheduled re-estimation: target batches, their outputs, and the watermark.

A target (a :class:`~labelshift.storage.Store`: an S3 prefix or a local folder) receives unlabelled batches, keys
ending in ``.npy`` outside ``_labelshift/``. Beside each batch ``NAME.npy`` a run writes ``NAME.corrected.npy`` and
then ``NAME.summary.json``; ``_labelshift/watermark.json`` lists every batch counted, by key and SHA-256, and one
history entry per run. This module keeps those books and knows nothing about models or estimators.

A run calls :func:`find_new_batches` (reads only), :func:`load_batch` per batch (reads and checks the content it
was listed with), :func:`write_batch_outputs` per batch, and last :func:`commit_watermark` (an atomic
compare-and-swap of the watermark on the version that was read; only it writes the watermark). A batch that fails
its checks can be committed as rejected (:class:`RejectedBatch`): recorded with its reason and checksum, not
counted, and not offered again until its content changes. A run that fails before the commit leaves the watermark as it
was, so its batches are taken again by the next run and never counted twice; a batch whose content changed after it was
counted raises :class:`ChangedBatchError` unless ``on_changed="reprocess"``. The layout, the guarantees and the cost of
a run (listings, hashes, fingerprints) are described in ``docs/reestimation.md``, "The target store".
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np

from .._validation import check_probabilities
from ..errors import ConflictError, FormatError, InputError, ObjectNotFoundError
from ..storage import LocalStore, ObjectInfo, Store, json_default, validate_key

__all__ = [
    "STATE_PREFIX", "WATERMARK_KEY", "BATCH_SUFFIX", "CORRECTED_SUFFIX", "SUMMARY_SUFFIX",
    "TargetBatch", "RejectedBatch", "Watermark", "ChangedBatchError", "ConcurrentRunError",
    "is_batch_key", "list_batches", "read_watermark", "find_new_batches", "load_batch", "write_batch_outputs",
    "commit_watermark",
]

logger = logging.getLogger(__name__)

STATE_PREFIX = "_labelshift/"
WATERMARK_KEY = "_labelshift/watermark.json"
BATCH_SUFFIX = ".npy"
CORRECTED_SUFFIX = ".corrected.npy"
#: every batch format's suffix (``.parquet``: prediction logs or tabular inputs, :mod:`labelshift.monitoring.batches`)
BATCH_SUFFIXES = (BATCH_SUFFIX, ".parquet")
CORRECTED_SUFFIXES = (CORRECTED_SUFFIX, ".corrected.parquet")
SUMMARY_SUFFIX = ".summary.json"

WATERMARK_FORMAT = "labelshift-watermark"
#: the major version: a reader refuses a larger one. Compatible additions keep it and are optional fields that
#: older readers ignore (``fingerprints`` is one: watermarks without it read as having none).
WATERMARK_VERSION = 1

#: keys of a history entry set by :func:`commit_watermark`; a record passed in may not use them
HISTORY_KEYS = ("sequence", "time", "run_id", "batches", "replaced", "rejected")
#: keys of a batch summary set by :func:`write_batch_outputs`
SUMMARY_KEYS = ("input", "output")

_FLOAT_SIZES = (2, 4, 8)  # float16, float32, float64
_HEX = set("0123456789abcdef")
_CHECKSUM_THREADS = 8


class ChangedBatchError(InputError):
    """A batch's content is not the content that was counted (or listed) under its key.

    :attr:`changed` maps each such key to ``(checksum counted, checksum now)``.
    """

    def __init__(self, message: str, changed: Mapping[str, tuple[str, str]] | None = None):
        super().__init__(message)
        self.changed = dict(changed or {})


class ConcurrentRunError(ConflictError):
    """Another run moved the watermark between this run's read and its commit; this run's commit was refused."""


# -- batches ---------------------------------------------------------------------------------------------------------
def _batch_suffix(key: str) -> str | None:
    return next((s for s in BATCH_SUFFIXES if key.endswith(s)), None)


def is_batch_key(key: str) -> bool:
    """True when ``key`` names an input batch: ends in ``.npy`` or ``.parquet``, is not an output, is not under
    ``_labelshift/``."""
    suffix = _batch_suffix(key)
    return suffix is not None and not key.endswith(CORRECTED_SUFFIXES) and not key.startswith(STATE_PREFIX) \
        and len(key.rsplit("/", 1)[-1]) > len(suffix)


@dataclass(frozen=True)
class TargetBatch:
    """One input batch of a target: its key in the target store and the SHA-256 of its content when listed.

    ``fingerprint`` is the listing's :class:`~labelshift.storage.ObjectInfo` of the object, taken before the content
    was hashed (None when unknown); :func:`commit_watermark` records it so that the next runs need not hash the batch
    again. It takes no part in equality: two TargetBatch are equal when key and content are.
    """

    key: str
    checksum: str
    fingerprint: ObjectInfo | None = field(default=None, compare=False)

    def __post_init__(self):
        validate_key(self.key, "batch key")
        if not is_batch_key(self.key):
            raise InputError(
                f"{self.key!r} is not a batch key: batches end in {BATCH_SUFFIX!r}, outputs end in "
                f"{CORRECTED_SUFFIX!r} and keys under {STATE_PREFIX!r} belong to the system."
            )
        if not _is_checksum(self.checksum):
            raise InputError(f"checksum of batch {self.key!r} must be 64 lowercase hex digits, got {self.checksum!r}.")
        if self.fingerprint is not None and not isinstance(self.fingerprint, ObjectInfo):
            raise InputError(f"fingerprint of batch {self.key!r} must be an ObjectInfo or None, got "
                             f"{type(self.fingerprint).__name__}.")

    @property
    def name(self) -> str:
        """The key without ``.npy`` / ``.parquet`` (``2026/11/25/part-0``)."""
        return self.key[: -len(_batch_suffix(self.key))]

    @property
    def corrected_key(self) -> str:
        return self.name + (CORRECTED_SUFFIX if self.key.endswith(BATCH_SUFFIX) else CORRECTED_SUFFIXES[1])

    @property
    def summary_key(self) -> str:
        return self.name + SUMMARY_SUFFIX


@dataclass(frozen=True)
class RejectedBatch:
    """A batch that failed its checks (:func:`load_batch`), with the reason: committed as rejected, it is not counted
    and not offered again by :func:`find_new_batches` until its content (checksum) changes."""

    batch: TargetBatch
    reason: str

    def __post_init__(self):
        if not isinstance(self.batch, TargetBatch):
            raise InputError(f"RejectedBatch.batch must be a TargetBatch, got {type(self.batch).__name__}.")
        if not isinstance(self.reason, str) or not self.reason:
            raise InputError("RejectedBatch.reason must be a non-empty string saying what is wrong with the batch.")

    @property
    def key(self) -> str:
        return self.batch.key


def _is_checksum(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _checksums(store: Store, keys: list[str]) -> dict[str, str]:
    """SHA-256 of each key, several at once: the recorded one (a HEAD request on S3, a sidecar read locally), or for
    an object another tool wrote, computed from its whole content. Keys deleted meanwhile are left out."""

    def one(key: str) -> str | None:
        try:
            return store.checksum(key).lower()
        except ObjectNotFoundError:
            logger.info("batch %s disappeared while the target was being listed; skipped", store.url(key))
            return None

    if len(keys) <= 2:
        found = [one(k) for k in keys]
    else:
        with ThreadPoolExecutor(max_workers=min(_CHECKSUM_THREADS, len(keys))) as pool:
            found = list(pool.map(one, keys))
    return {k: c for k, c in zip(keys, found) if c is not None}


def _trusted(info: ObjectInfo | None, recorded: ObjectInfo | None) -> bool:
    """True when the listing's fingerprint proves the object is the one whose fingerprint was recorded."""
    return info is not None and info.version is not None and info == recorded


def _scan(store: Store, watermark: Watermark | None = None) -> tuple[list[str], list[TargetBatch]]:
    """All keys, and every batch with its checksum: from ``watermark`` for a counted (or rejected) batch whose
    fingerprint matches the recorded one, else hashed (the listing comes first, so a fingerprint is never newer than
    its hash)."""
    infos = store.list_info()
    keys = list(infos)
    batch_keys = [k for k in keys if is_batch_key(k)]
    known = {}
    if watermark is not None:
        known = {k: watermark.processed[k] for k in batch_keys
                 if k in watermark.processed and _trusted(infos[k], watermark.fingerprints.get(k))}
        known.update({k: entry["sha256"] for k, entry in watermark.rejected.items()
                      if k in infos and k not in known and _trusted(infos[k], _rejected_info(entry))})
    hashed = _checksums(store, [k for k in batch_keys if k not in known])
    logger.debug("%s: %d batch(es) listed, %d known by fingerprint, %d hashed", store.uri, len(batch_keys),
                 len(known), len(hashed))
    checksums = {**known, **hashed}
    return keys, [TargetBatch(k, checksums[k], infos[k]) for k in batch_keys if k in checksums]


def list_batches(store: Store, watermark: Watermark | None = None) -> list[TargetBatch]:
    """Every input batch of the target, sorted by key, with its checksum (outputs and ``_labelshift/`` excluded).

    Without ``watermark`` every batch is hashed (a full read of each one from another tool); with it, a counted
    batch whose fingerprint matches the recorded one gets its recorded checksum instead.
    """
    return _scan(store, watermark)[1]


# -- the watermark ---------------------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Watermark:
    """What the successful runs on a target have counted so far.

    Attributes:
        sequence: number of successful runs (0 when none).
        processed: batch key -> SHA-256 of the content counted, for every batch ever counted.
        updated_at: ISO 8601 UTC time of the last commit (None when none).
        history: one small dict per successful run, oldest first: ``sequence``, ``time``, ``run_id``, ``batches``
            (keys counted by that run), ``replaced`` (keys whose changed content it counted, if any) and whatever the
            flow recorded (prior, p-value...).
        run_id: random id of the commit that wrote this watermark (None when none); the compare-and-set token.
        fingerprints: batch key -> :class:`~labelshift.storage.ObjectInfo` (size and version token) listed for the
            content counted under ``processed``, for counted batches that still exist and whose token could be
            trusted; a cache that spares hashing them again (see "Cost of a run"). Takes no part in equality.
        rejected: batch key -> ``{"sha256", "reason", "time", "sequence"}`` (and ``size``, ``version`` of the
            listing when known) for batches a run rejected (quarantined) and that are still there: not counted,
            and not offered again while their content is the one rejected.
        token: the store's version token of the watermark as it was read (None: there was none); the commit
            writes only if the watermark is still that version. Not written, and no part of equality.
    """

    sequence: int = 0
    processed: dict[str, str] = field(default_factory=dict)
    updated_at: str | None = None
    history: list[dict] = field(default_factory=list)
    run_id: str | None = None
    fingerprints: dict[str, ObjectInfo] = field(default_factory=dict, compare=False)
    rejected: dict[str, dict] = field(default_factory=dict)
    token: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict:
        """A JSON-ready dict (the content of ``_labelshift/watermark.json``)."""
        return {
            "format": WATERMARK_FORMAT,
            "version": WATERMARK_VERSION,
            "sequence": self.sequence,
            "updated_at": self.updated_at,
            "run_id": self.run_id,
            "processed": dict(sorted(self.processed.items())),
            "fingerprints": {key: {"size": info.size, "version": info.version}
                             for key, info in sorted(self.fingerprints.items())},
            "history": [dict(entry) for entry in self.history],
            **({"rejected": {key: dict(entry) for key, entry in sorted(self.rejected.items())}}
               if self.rejected else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "watermark") -> "Watermark":
        """Validate and build a watermark; :class:`FormatError` naming ``source``, the field and the fix otherwise."""

        def bad(problem: str) -> FormatError:
            return FormatError(f"{source} is not a valid labelshift watermark: {problem}. {_RECOVERY}")

        if not isinstance(data, Mapping):
            raise bad(f"expected a JSON object, found {type(data).__name__}")
        if data.get("format") != WATERMARK_FORMAT:
            raise bad(f"field 'format' must be {WATERMARK_FORMAT!r}, found {data.get('format')!r}")
        version = data.get("version")
        if not _is_int(version) or version < 1:
            raise bad(f"field 'version' must be a positive integer, found {version!r}")
        if version > WATERMARK_VERSION:
            raise FormatError(
                f"{source} has watermark version {version}, newer than this labelshift understands "
                f"({WATERMARK_VERSION}); upgrade labelshift to run on this target."
            )
        sequence = data.get("sequence")
        if not _is_int(sequence) or sequence < 0:
            raise bad(f"field 'sequence' must be a non-negative integer, found {sequence!r}")
        updated_at = data.get("updated_at")
        if updated_at is not None:
            try:
                datetime.fromisoformat(updated_at)
            except (TypeError, ValueError):
                raise bad(f"field 'updated_at' must be an ISO 8601 time or null, found {updated_at!r}") from None
        run_id = data.get("run_id")
        if run_id is not None and not isinstance(run_id, str):
            raise bad(f"field 'run_id' must be a string or null, found {run_id!r}")
        processed = data.get("processed")
        if not isinstance(processed, Mapping):
            raise bad(f"field 'processed' must be an object of batch key -> sha256, found {type(processed).__name__}")
        for key, checksum in processed.items():
            if not isinstance(key, str) or not is_batch_key(key):
                raise bad(f"field 'processed' holds {key!r}, which is not a batch key")
            if not _is_checksum(checksum):
                raise bad(f"field 'processed' gives {key!r} the checksum {checksum!r}, not 64 lowercase hex digits")
        fingerprints = _parse_fingerprints(data.get("fingerprints", {}), processed, bad)
        rejected = _parse_rejected(data.get("rejected", {}), bad)
        history = data.get("history")
        if not isinstance(history, list) or not all(isinstance(entry, Mapping) for entry in history):
            raise bad("field 'history' must be a list of objects")
        for entry in history:
            if not _is_int(entry.get("sequence")) or not 1 <= entry["sequence"] <= sequence:
                raise bad(f"a 'history' entry has sequence {entry.get('sequence')!r}, outside 1..{sequence}")
        if sequence == 0 and (processed or updated_at is not None):
            raise bad("field 'sequence' is 0 (no successful run) but the watermark records processed batches")
        return cls(sequence=sequence, processed=dict(processed), updated_at=updated_at,
                   history=[dict(entry) for entry in history], run_id=run_id, fingerprints=fingerprints,
                   rejected=rejected)


def _parse_fingerprints(value: Any, processed: Mapping[str, str], bad) -> dict[str, ObjectInfo]:
    """The optional ``fingerprints`` field (absent in watermarks written before it existed)."""
    hint = " (a cache: deleting the field is safe, the batches are then hashed once more)"
    if not isinstance(value, Mapping):
        raise bad(f"field 'fingerprints' must be an object of batch key -> size and version{hint}")
    out = {}
    for key, entry in value.items():
        if key not in processed:
            raise bad(f"field 'fingerprints' holds {key!r}, which is not in 'processed'{hint}")
        size = entry.get("size") if isinstance(entry, Mapping) else None
        version = entry.get("version") if isinstance(entry, Mapping) else None
        if not _is_int(size) or size < 0 or not isinstance(version, str) or not version:
            raise bad(f"field 'fingerprints' gives {key!r} {entry!r}; expected a non-negative integer 'size' and a "
                      f"non-empty string 'version'{hint}")
        out[key] = ObjectInfo(size=size, version=version)
    return out


def _parse_rejected(value: Any, bad) -> dict[str, dict]:
    """The optional ``rejected`` field (batches in quarantine)."""
    hint = " (deleting an entry, or the field, lets the next run try that batch again)"
    if not isinstance(value, Mapping):
        raise bad(f"field 'rejected' must be an object of batch key -> sha256 and reason{hint}")
    out = {}
    for key, entry in value.items():
        if not isinstance(key, str) or not is_batch_key(key):
            raise bad(f"field 'rejected' holds {key!r}, which is not a batch key{hint}")
        if not isinstance(entry, Mapping) or not _is_checksum(entry.get("sha256")) \
                or not isinstance(entry.get("reason"), str):
            raise bad(f"field 'rejected' gives {key!r} {entry!r}; expected a 'sha256' of 64 lowercase hex digits "
                      f"and a 'reason'{hint}")
        out[key] = dict(entry)
    return out


def _rejected_info(entry: Mapping) -> ObjectInfo | None:
    size, version = entry.get("size"), entry.get("version")
    if _is_int(size) and isinstance(version, str) and version:
        return ObjectInfo(size=size, version=version)
    return None


_RECOVERY = (
    "To recover: restore the file from a backup; or, if its content is a valid watermark that a crash left with a "
    "stale checksum, write the same content again through the store (Store.put_bytes); or delete it, and the next "
    "run processes every batch in the target again (overwriting their outputs) with the sequence starting over."
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_watermark(store: Store) -> Watermark:
    """The target's watermark; an empty one (sequence 0) when the target has none yet.

    Raises :class:`FormatError` naming the key and how to recover when the file is corrupt (not JSON, wrong fields,
    or content that does not match its recorded checksum).
    """
    uri = store.url(WATERMARK_KEY)
    for attempt in range(2):
        try:
            data, token = store.read_versioned(WATERMARK_KEY)
            break
        except ObjectNotFoundError:
            # a missing bucket raises from exists() too; only an absent key means "no run yet"
            if not store.exists(WATERMARK_KEY):
                return Watermark()
            if attempt == 1:
                raise
            # another run wrote it just now: read that one
        except FormatError as exc:  # the store's checksum check failed
            raise FormatError(f"the watermark {uri} is corrupt: {exc} {_RECOVERY}") from None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"the watermark {uri} is not valid UTF-8 JSON ({exc}). {_RECOVERY}") from None
    return replace(Watermark.from_dict(parsed, source=f"the watermark {uri}"), token=token)


# -- finding work ----------------------------------------------------------------------------------------------------
def _no_batch_message(store: Store, keys: list[str]) -> str:
    if isinstance(store, LocalStore) and not store.root.is_dir():
        why = "the folder does not exist"
    elif not keys:
        why = "it holds no objects (the prefix is empty or does not exist)"
    else:
        others = [k for k in keys if not k.startswith(STATE_PREFIX)]
        shown = ", ".join(repr(k) for k in others[:5]) + (", ..." if len(others) > 5 else "")
        why = f"it holds {len(keys)} object(s) but none is an input batch" + (f" ({shown})" if shown else "")
    return (
        f"no target batch under {store.uri}: {why}. Put the unlabelled data there as NAME.npy files, each a float "
        f"array of shape (n, *model input shape) saved with numpy.save (e.g. {store.url('2026/01/31/part-0.npy')}); "
        f"*{CORRECTED_SUFFIX} outputs and keys under {STATE_PREFIX} are not batches. To try re-estimation, "
        f"`labelshift data simulate-target mnist-5k --to {store.uri}` writes label-shifted test images there."
    )


def find_new_batches(
    store: Store,
    watermark: Watermark | None = None,
    *,
    on_changed: Literal["error", "reprocess"] = "error",
) -> tuple[list[TargetBatch], Watermark]:
    """The batches not counted yet (sorted by key) and the watermark they were compared against.

    Args:
        store: the target.
        watermark: compare against this one instead of reading the target's (pass it on to :func:`commit_watermark`).
        on_changed: what to do with a batch that was counted but whose content changed under the same key:
            ``"error"`` (default) raises :class:`ChangedBatchError` naming each one; ``"reprocess"`` returns it with
            the new ones so that its new content is counted in place of the old.

    Returns ``[]`` when every batch was already counted, including when every counted batch has since been deleted
    (retention) and none came. A batch rejected earlier (``watermark.rejected``) whose content is still the one
    rejected is not returned; with new content it is new again. Raises :class:`InputError` when the target holds no
    batch and the watermark never counted one (empty or missing prefix), saying which URI and what is expected. Writes
    nothing.

    Only new batches and counted ones whose listing fingerprint differs from the recorded one are hashed (see
    "Cost of a run"). The watermark returned is the one compared against, with its fingerprints brought up to date
    (batches deleted dropped, new tokens of unchanged content taken); pass it to :func:`commit_watermark`, which
    writes them.
    """
    if on_changed not in ("error", "reprocess"):
        raise InputError(f"on_changed must be 'error' or 'reprocess', got {on_changed!r}.")
    if watermark is None:
        watermark = read_watermark(store)
    if not isinstance(watermark, Watermark):
        raise InputError(f"watermark must be a Watermark (from read_watermark), got {type(watermark).__name__}.")
    keys, batches = _scan(store, watermark)
    if not batches:
        if watermark.sequence > 0:
            logger.info("%s: no batch left (all %d counted batch(es) deleted) and none new", store.uri,
                        len(watermark.processed))
            return [], replace(watermark, fingerprints={}, rejected={})
        raise InputError(_no_batch_message(store, keys))
    # in quarantine: rejected with the content listed now; left alone until that content changes
    listed = {b.key for b in batches}
    held = {b.key for b in batches if watermark.rejected.get(b.key, {}).get("sha256") == b.checksum}
    rejected = {k: entry for k, entry in watermark.rejected.items() if k in listed}
    batches = [b for b in batches if b.key not in held]
    changed = {b.key: (watermark.processed[b.key], b.checksum) for b in batches
               if b.key in watermark.processed and watermark.processed[b.key] != b.checksum}
    if changed and on_changed == "error":
        listed = "; ".join(f"{store.url(k)} (counted sha256 {old[:12]}..., now {new[:12]}...)"
                           for k, (old, new) in list(changed.items())[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ChangedBatchError(
            f"{len(changed)} batch(es) already counted have changed content under the same key: {listed}{more}. "
            "A batch is counted once; put new data under a new key (e.g. NAME-v2.npy) and restore the original "
            "content, or, to count the new content in place of the old, run with on_changed='reprocess'.",
            changed,
        )
    new = [b for b in batches if b.key not in watermark.processed or b.key in changed]
    # fingerprints of the counted batches that are still there with the content counted
    fingerprints = {b.key: b.fingerprint for b in batches
                    if b.key in watermark.processed and b.key not in changed
                    and b.fingerprint is not None and b.fingerprint.version is not None}
    logger.info("%s: %d batch(es), %d new%s%s", store.uri, len(batches) + len(held), len(new),
                f" ({len(changed)} changed, reprocessed)" if changed else "",
                f", {len(held)} rejected earlier and unchanged" if held else "")
    return new, replace(watermark, fingerprints=fingerprints, rejected=rejected)


# -- reading a batch -------------------------------------------------------------------------------------------------
def _npy_header(data: bytes, uri: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and data offset from a .npy header, without reading (or unpickling) the data."""
    from numpy.lib import format as npy_format

    stream = io.BytesIO(data)
    try:
        version = npy_format.read_magic(stream)
    except ValueError as exc:
        raise FormatError(
            f"{uri} is not a .npy file ({exc}); write batches with numpy.save (an .npz archive, a pickle or a "
            "truncated upload cannot be read)."
        ) from None
    if version == (1, 0):
        read_header = npy_format.read_array_header_1_0
    elif version == (2, 0):
        read_header = npy_format.read_array_header_2_0
    else:  # 3.0 exists only for structured dtypes with non-ASCII field names
        raise InputError(
            f"{uri} uses .npy format version {version[0]}.{version[1]} (a structured dtype); save a plain float "
            "array instead: numpy.save(path, arr.astype(numpy.float32))."
        )
    try:
        shape, fortran_order, dtype = read_header(stream)
    except (ValueError, EOFError, SyntaxError) as exc:
        raise FormatError(f"{uri} has a corrupt .npy header ({exc}); write it again with numpy.save.") from None
    return tuple(int(n) for n in shape), bool(fortran_order), dtype, stream.tell()


def _check_dtype(dtype: np.dtype, uri: str) -> None:
    expected = "expected float32 (float16 and float64 are accepted and converted)"
    if dtype.kind == "f" and dtype.itemsize in _FLOAT_SIZES:
        return
    if dtype.hasobject:
        fix = ("object arrays hold pickled Python objects, which are never loaded; save a numeric array: "
               "numpy.save(path, numpy.asarray(arr, dtype=numpy.float32))")
    elif dtype.kind in "iub":
        fix = ("convert it with arr.astype(numpy.float32), after the same preprocessing the model was trained "
               "with (e.g. uint8 pixels scaled to [0, 1]), and save it again")
    elif dtype.kind == "c":
        fix = "complex values have no meaning as model input; save the real-valued features as float32"
    elif dtype.kind == "f":
        fix = "convert it with arr.astype(numpy.float32) and save it again"
    else:
        fix = "save a plain float array: numpy.save(path, arr.astype(numpy.float32))"
    raise InputError(f"batch {uri} has dtype {dtype} ({expected}): {fix}.")


def _check_shape(shape: tuple[int, ...], input_shape: tuple[int, ...] | None, uri: str) -> None:
    if len(shape) < 2 and input_shape is None:
        raise InputError(
            f"batch {uri} has shape {shape}; a batch is (n, *input shape) with one row per example, at least "
            "2-D. Save a single example as arr[None] and a 1-D feature column as arr[:, None]."
        )
    if input_shape is not None and (len(shape) == 0 or shape[1:] != input_shape):
        dims = ", ".join(str(d) for d in input_shape)
        expected = f"(n, {dims})" if dims else "(n,)"
        per_row = math.prod(input_shape)
        hint = ""
        if len(shape) > 1 and math.prod(shape[1:]) == per_row:
            hint = f" The sizes agree: save arr.reshape(-1, {dims}) instead."
        elif len(shape) == 1 and per_row > 1 and shape[0] % per_row == 0:
            hint = f" A 1-D array is a flattened example or batch: save arr.reshape(-1, {dims}) instead."
        raise InputError(
            f"batch {uri} has shape {shape}, but the model takes {expected}: one row per example of input shape "
            f"{input_shape}.{hint}"
        )
    if shape[0] == 0:
        raise InputError(f"batch {uri} holds zero rows (shape {shape}); delete it or put at least one example in it.")


def load_batch(store: Store, batch: TargetBatch, *, input_shape: Sequence[int] | None,
               max_rows: int | None = None) -> np.ndarray:
    """Read and check one batch; returns a C-contiguous float32 array of shape (n, *input_shape).

    Checks, in this order (each failure names the batch's URI and the fix; nothing is written):

    - the content is what was listed (checksum), else :class:`ChangedBatchError`;
    - it is a .npy file whose byte count matches its header, else :class:`FormatError` (garbage, truncated,
      .npz, pickle). Objects are never unpickled: ``allow_pickle=False`` and the dtype is checked from the header
      before any data is read;
    - dtype float16/float32/float64 (converted to float32), else :class:`InputError` naming the dtype found and
      how to convert (integers, bool, complex, object, strings, structured);
    - shape ``(n, *input_shape)`` with ``n >= 1`` (``input_shape=None``: any shape of at least 2 dimensions) and
      ``n <= max_rows`` when given, else :class:`InputError`;
    - every value finite after the conversion (float64 beyond float32's range becomes inf), else :class:`InputError`.
    """
    uri = store.url(batch.key)
    if input_shape is not None:
        try:
            input_shape = tuple(int(d) for d in input_shape)
        except (TypeError, ValueError):
            raise InputError(f"input_shape must be a tuple of integers like (1, 28, 28), got {input_shape!r}.") \
                from None
        if any(d < 1 for d in input_shape):
            raise InputError(f"input_shape must hold positive sizes, got {input_shape}.")
    if max_rows is not None and (not _is_int(max_rows) or max_rows < 1):
        raise InputError(f"max_rows must be a positive integer or None, got {max_rows!r}.")
    data = store.get_bytes(batch.key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != batch.checksum:
        raise ChangedBatchError(
            f"batch {uri} changed after this run listed it (listed sha256 {batch.checksum[:12]}..., read "
            f"{digest[:12]}...): it was replaced while the run was going. Run again; the new content is then "
            "listed and read together.",
            {batch.key: (batch.checksum, digest)},
        )
    shape, fortran_order, dtype, offset = _npy_header(data, uri)
    _check_dtype(dtype, uri)
    _check_shape(shape, input_shape, uri)
    if max_rows is not None and shape[0] > max_rows:
        raise InputError(
            f"batch {uri} has {shape[0]} rows, more than max_rows={max_rows}; split it into smaller batches "
            "(several NAME.npy files) or raise max_rows."
        )
    expected = offset + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "followed by extra bytes"
        raise FormatError(
            f"batch {uri} is {state}: its header promises {expected} bytes for shape {shape} of {dtype}, the "
            f"object has {len(data)}. Upload it again (numpy.save, then copy the whole file)."
        )
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # checked above; kept so no numpy error escapes unexplained
        raise FormatError(f"batch {uri} is not a readable .npy array ({exc}); write it again with numpy.save.") \
            from None
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, reported just below
        out = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        bad_rows = np.flatnonzero(~finite.reshape(out.shape[0], -1).all(axis=1))
        raise InputError(
            f"batch {uri} has {out.size - int(np.count_nonzero(finite))} NaN or infinite value(s) (as float32; "
            f"float64 values beyond +-3.4e38 overflow) in {bad_rows.size} row(s), first row {int(bad_rows[0])}; "
            "remove or impute those rows and save the batch again."
        )
    return out


# -- writing outputs -------------------------------------------------------------------------------------------------
def _encode(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, indent=2, default=json_default).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InputError(f"{what} cannot be written as JSON ({exc}); pass numbers, strings, lists and dicts.") \
            from None


def write_batch_outputs(store: Store, batch: TargetBatch, corrected: Any, summary: Mapping[str, Any], *,
                        n_rows: int | None = None) -> dict:
    """Write the corrected predictions of ``batch`` and then its summary, each atomically.

    ``corrected`` holds p_t(y|x) per row, shape (n, k): rows of non-negative numbers that sum to 1, as the paper's
    correction p_t(y|x) proportional to w_y f_y(x) gives (Section 2); it is stored as float32 under
    ``NAME.corrected.npy``. ``n_rows``, when given, must equal n (the batch's row count).

    The summary is written last under ``NAME.summary.json``, so a summary never refers to predictions that are not
    there yet. Two fields are added (a summary passed in may not use them): ``input`` (key, uri, sha256 and rows of
    the batch) and ``output`` (key, uri, sha256 and classes of the corrected predictions). Everything is checked,
    and the summary encoded, before the first write. Writing again overwrites both. Returns the summary as written.
    """
    if not isinstance(summary, Mapping):
        raise InputError(f"summary must be a dict, got {type(summary).__name__}.")
    taken = [k for k in SUMMARY_KEYS if k in summary]
    if taken:
        raise InputError(f"summary fields {taken} are set by write_batch_outputs; rename them in the summary.")
    probs = check_probabilities(corrected, f"corrected predictions for {store.url(batch.key)}", 2)
    if n_rows is not None and probs.shape[0] != n_rows:
        raise InputError(
            f"corrected predictions for {store.url(batch.key)} have {probs.shape[0]} rows but the batch has "
            f"{n_rows}; pass one row per example."
        )
    array = probs.astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    payload = buffer.getvalue()
    record = dict(summary)
    record["input"] = {"key": batch.key, "uri": store.url(batch.key), "sha256": batch.checksum,
                       "rows": int(array.shape[0])}
    record["output"] = {"key": batch.corrected_key, "uri": store.url(batch.corrected_key),
                        "sha256": hashlib.sha256(payload).hexdigest(), "classes": int(array.shape[1])}
    text = _encode(record, f"the summary of {store.url(batch.key)}")
    store.put_bytes(batch.corrected_key, payload, content_type="application/octet-stream")
    store.put_bytes(batch.summary_key, text, content_type="application/json")
    return json.loads(text)


# -- committing ------------------------------------------------------------------------------------------------------
def _check_commit(store: Store, previous: Watermark, batches, record, rejected, history_limit):
    """The arguments of :func:`commit_watermark` checked (InputError as documented there). Returns (batches,
    rejected, the keys of both) as lists and the watermark's uri."""
    if not isinstance(previous, Watermark):
        raise InputError(f"previous must be the Watermark returned by find_new_batches, got {type(previous).__name__}.")
    if not isinstance(record, Mapping):
        raise InputError(f"record must be a dict, got {type(record).__name__}.")
    taken = [k for k in HISTORY_KEYS if k in record]
    if taken:
        raise InputError(f"record fields {taken} are set by commit_watermark; rename them in the record.")
    if history_limit is not None and (not _is_int(history_limit) or history_limit < 1):
        raise InputError(f"history_limit must be a positive integer or None, got {history_limit!r}.")
    batches, rejected = list(batches), list(rejected)
    if not all(isinstance(b, TargetBatch) for b in batches):
        raise InputError("batches must be TargetBatch objects (as returned by find_new_batches).")
    if not all(isinstance(r, RejectedBatch) for r in rejected):
        raise InputError("rejected must be RejectedBatch objects (a TargetBatch and the reason).")
    if not batches and not rejected:
        raise InputError("nothing to commit: pass the batches counted or the batches rejected.")
    keys = [b.key for b in batches] + [r.key for r in rejected]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise InputError(f"batches {duplicates} are listed more than once; count or reject each batch once.")
    uri = store.url(WATERMARK_KEY)
    again = [b.key for b in batches if previous.processed.get(b.key) == b.checksum]
    if again:
        raise InputError(
            f"batches {again[:5]} are already counted in {uri} with the same content; committing them again would "
            "count them twice. Commit only the batches find_new_batches returned."
        )
    return batches, rejected, keys, uri


def _kept_fingerprints(previous: Watermark, batches: list) -> dict:
    """The fingerprints of the next watermark: those ``previous`` carries for batches it counts, then those of the
    batches counted now (a batch without a trusted token gets none)."""
    # fingerprints: those ``previous`` carries (refreshed by find_new_batches) for batches still counted with the
    # same content, then those of the batches counted now; a batch without a trusted token gets none
    fingerprints = {k: info for k, info in previous.fingerprints.items()
                    if isinstance(info, ObjectInfo) and info.version is not None and k in previous.processed}
    for b in batches:
        fingerprints.pop(b.key, None)
        if b.fingerprint is not None and b.fingerprint.version is not None:
            fingerprints[b.key] = b.fingerprint
    return fingerprints


def _quarantine(previous: Watermark, rejected: list, keys: list, now: str, sequence: int) -> dict:
    """The rejected batches of the next watermark: those of ``previous`` not committed now, and ``rejected`` with
    their checksum, reason, time, sequence (and size and version where trusted)."""
    quarantine = {k: v for k, v in previous.rejected.items() if k not in keys}
    for r in rejected:
        held = {"sha256": r.batch.checksum, "reason": r.reason, "time": now, "sequence": sequence}
        if r.batch.fingerprint is not None and r.batch.fingerprint.version is not None:
            held.update(size=r.batch.fingerprint.size, version=r.batch.fingerprint.version)
        quarantine[r.key] = held
    return quarantine


def _next_watermark(previous: Watermark, batches: list, rejected: list, keys: list, record: Mapping[str, Any],
                    history_limit: int | None) -> Watermark:
    """The watermark after this commit: sequence + 1, ``batches`` processed, a history entry with ``record``, a new
    run id; not written."""
    replaced = [b.key for b in batches if b.key in previous.processed]
    now = _now()
    run_id = uuid.uuid4().hex
    sequence = previous.sequence + 1
    entry = {"sequence": sequence, "time": now, "run_id": run_id, "batches": [b.key for b in batches]}
    if replaced:
        entry["replaced"] = replaced
    if rejected:
        entry["rejected"] = [r.key for r in rejected]
    entry.update(record)
    history = [*previous.history, entry]
    if history_limit is not None:
        history = history[-history_limit:]
    return Watermark(
        sequence=sequence,
        processed={**previous.processed, **{b.key: b.checksum for b in batches}},
        updated_at=now,
        history=json.loads(_encode(history, "the watermark history")),
        run_id=run_id,
        fingerprints=_kept_fingerprints(previous, batches),
        rejected=_quarantine(previous, rejected, keys, now, sequence),
    )


def _swap_in(store: Store, previous: Watermark, new: Watermark, uri: str) -> tuple[str, bool]:
    """Write ``new`` if the watermark is still ``previous``'s version; ConcurrentRunError if another run committed.
    Returns (the version token written, whether it was found on reading back after a refused retry of this write)."""
    payload = _encode(new.to_dict(), f"the watermark {uri}")
    try:
        return store.compare_and_swap(WATERMARK_KEY, payload, previous.token, content_type="application/json"), False
    except ConflictError:
        current = read_watermark(store)
        if current.run_id == new.run_id:  # this very write landed; a retry of it, after its answer was lost, was refused
            return current.token, True
        raise ConcurrentRunError(
            f"the watermark {uri} moved to sequence {current.sequence} (updated {current.updated_at}) since this run "
            f"read sequence {previous.sequence}: another run committed meanwhile. Nothing was counted by this run; "
            "its batches are taken by the next run and its outputs rewritten then. Run again, and give the "
            "deployment a concurrency limit of one."
        ) from None


def _check_not_overwritten(store: Store, new: Watermark, uri: str) -> None:
    """On a store that cannot write conditionally: ConcurrentRunError when another run's write replaced ``new``."""
    if not store.conditional_writes(WATERMARK_KEY):
        written = read_watermark(store)
        if written.run_id != new.run_id:
            raise ConcurrentRunError(
                f"the watermark {uri} was overwritten by another run (sequence {written.sequence}) right after this "
                "run's commit (this store does not write conditionally, so two commits can both pass). Batches the "
                "winning run did not count are processed again by the next run; none is counted twice. Give the "
                "deployment a concurrency limit of one."
            )


def commit_watermark(store: Store, previous: Watermark, batches: Sequence[TargetBatch], record: Mapping[str, Any],
                     *, rejected: Sequence[RejectedBatch] = (), history_limit: int | None = None) -> Watermark:
    """Count ``batches`` as processed: write sequence + 1, with them in ``processed`` and ``record`` in ``history``.

    Compare-and-swap: the watermark is written only if it is still the version ``previous`` was read as
    (``previous.token``; :meth:`~labelshift.storage.Store.compare_and_swap`: ``If-Match`` on S3, an exclusive lock
    on a local folder); otherwise nothing is written and :class:`ConcurrentRunError` is raised: another run
    committed meanwhile, and the batches of this run are taken by the next one. Of any number of concurrent commits
    on the same version exactly one succeeds. On a store that cannot write conditionally
    (``store.conditional_writes()`` False) the watermark is compared, written, then read back, and the same error
    raised if another run's write replaced it: a narrower window, not none.

    ``rejected`` batches (:class:`RejectedBatch`) are recorded under ``rejected`` with their reason and checksum,
    not counted; a commit may hold only rejections (``batches`` empty). ``record`` (JSON-serialisable, e.g. prior
    and p-value) goes into the new history entry beside ``sequence``, ``time``, ``run_id``, ``batches``, for batches
    counted again with new content ``replaced``, and the keys ``rejected``; it may not use those names.
    ``history_limit`` keeps only the most recent entries (``processed`` always keeps every batch). Returns the new
    watermark.

    A batch already counted with the same checksum is refused (:class:`InputError`): it would be counted twice.
    """
    batches, rejected, keys, uri = _check_commit(store, previous, batches, record, rejected, history_limit)
    new = _next_watermark(previous, batches, rejected, keys, record, history_limit)
    token, retried = _swap_in(store, previous, new, uri)
    if retried:
        return replace(new, token=token)
    _check_not_overwritten(store, new, uri)
    logger.info("%s: committed sequence %d with %d batch(es)%s", uri, new.sequence, len(batches),
                f", {len(rejected)} rejected" if rejected else "")
    return replace(new, token=token)
