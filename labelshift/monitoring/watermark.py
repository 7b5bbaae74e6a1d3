"""The watermark of a target: what the successful runs have counted, read and committed.

``_labelshift/watermark.json`` (:data:`~labelshift.monitoring.layout.WATERMARK_KEY`) lists every batch counted, by
key and SHA-256, and one history entry per run. This module keeps those books and knows nothing about models or
estimators.

A run calls :func:`~labelshift.monitoring.listing.find_new_batches` (reads only),
:func:`~labelshift.monitoring.inputs.load_batch` per batch (reads and checks the content it was listed with),
:func:`~labelshift.monitoring.outputs.write_batch_outputs` per batch, and last :func:`commit_watermark` (an atomic
compare-and-swap of the watermark on the version that was read; only it writes the watermark). A batch that fails
its checks can be committed as rejected (:class:`~labelshift.monitoring.layout.RejectedBatch`): recorded with its
reason and checksum, not counted, and not offered again until its content changes. A run that fails before the
commit leaves the watermark as it was, so its batches are taken again by the next run and never counted twice; a
batch whose content changed after it was counted raises :class:`~labelshift.monitoring.layout.ChangedBatchError`
unless ``on_changed="reprocess"``. The layout, the guarantees and the cost of a run (listings, hashes, fingerprints)
are described in ``docs/reestimation.md``, "The target store".
"""
from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from ..errors import ConflictError, FormatError, InputError, ObjectNotFoundError
from ..storage import ObjectInfo, Store, encode_json
from .layout import WATERMARK_KEY, RejectedBatch, TargetBatch, is_batch_key, is_checksum

__all__ = ["Watermark", "ConcurrentRunError", "read_watermark", "commit_watermark", "rejected_fingerprint",
           "HISTORY_KEYS", "check_owner"]

logger = logging.getLogger(__name__)

WATERMARK_FORMAT = "labelshift-watermark"
#: the major version: a reader refuses a larger one. Compatible additions keep it and are optional fields that
#: older readers ignore (``fingerprints`` is one: watermarks without it read as having none).
WATERMARK_VERSION = 1

#: keys of a history entry set by :func:`commit_watermark`; a record passed in may not use them
HISTORY_KEYS = ("sequence", "time", "run_id", "batches", "replaced", "rejected")
#: keys of a batch summary set by :func:`write_batch_outputs`


class ConcurrentRunError(ConflictError):
    """Another run moved the watermark between this run's read and its commit; this run's commit was refused."""



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
            if not is_checksum(checksum):
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
        if not isinstance(entry, Mapping) or not is_checksum(entry.get("sha256")) \
                or not isinstance(entry.get("reason"), str):
            raise bad(f"field 'rejected' gives {key!r} {entry!r}; expected a 'sha256' of 64 lowercase hex digits "
                      f"and a 'reason'{hint}")
        out[key] = dict(entry)
    return out


def rejected_fingerprint(entry: Mapping) -> ObjectInfo | None:
    """The listing fingerprint (size and version) recorded with a rejected batch's entry, None when it has none."""
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


def check_owner(watermark: Watermark, model: str, uri: str) -> None:
    """InputError when ``watermark`` counts the runs of another registered model than ``model`` (the ``model`` of
    its history's last run that names one): a watermark belongs to one model, since the batches it counts are
    processed for that model, and a second model on the same target would see them as done ("No new data").
    Versions of one registered model (a retrained one under the same name) share their target's watermark."""
    owner = next((e["model"] for e in reversed(watermark.history) if e.get("model")), None)
    if owner is not None and owner != model:
        raise InputError(f"the target {uri} is re-estimated for the registered model {owner!r} (its watermark counts "
                         f"{len(watermark.processed)} batch(es) for it, last run {watermark.sequence}); {model!r} would "
                         f"see them as already processed. Give {model!r} a target folder of its own (copy or write "
                         f"the batches there), or re-estimate this target with models:/{owner}@ALIAS.")


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
        history=json.loads(encode_json(history, "the watermark history")),
        run_id=run_id,
        fingerprints=_kept_fingerprints(previous, batches),
        rejected=_quarantine(previous, rejected, keys, now, sequence),
    )


def _swap_in(store: Store, previous: Watermark, new: Watermark, uri: str) -> tuple[str, bool]:
    """Write ``new`` if the watermark is still ``previous``'s version; ConcurrentRunError if another run committed.
    Returns (the version token written, whether it was found on reading back after a refused retry of this write)."""
    payload = encode_json(new.to_dict(), f"the watermark {uri}")
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
