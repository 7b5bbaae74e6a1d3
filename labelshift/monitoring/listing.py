"""Listing a target's batches and finding those not counted yet.

:func:`list_batches` lists every input batch of a target with the SHA-256 of its content; :func:`find_new_batches`
compares the listing with the watermark (:mod:`labelshift.monitoring.watermark`) and returns the batches not counted
yet. Both read only. A counted (or rejected) batch whose listing fingerprint matches the one the watermark recorded
takes its recorded checksum instead of being hashed again; the cost of a run (listings, hashes, fingerprints) is
described in ``docs/reestimation.md``, "The target store".
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Literal

from ..errors import InputError, ObjectNotFoundError
from ..storage import LocalStore, ObjectInfo, Store
from .layout import CORRECTED_SUFFIX, STATE_PREFIX, ChangedBatchError, TargetBatch, is_batch_key
from .watermark import Watermark, read_watermark, rejected_fingerprint

__all__ = ["list_batches", "find_new_batches", "NoBatchError", "ANY_MODEL_BATCHES"]

logger = logging.getLogger(__name__)

_CHECKSUM_THREADS = 8


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
                      if k in infos and k not in known and _trusted(infos[k], rejected_fingerprint(entry))})
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


#: what a target's batches are, whatever the model (a caller that knows the model says it exactly)
ANY_MODEL_BATCHES = (
    "a NAME.parquet file: your model's logged outputs, one column per class, for a reference registered with "
    "`labelshift reference register`, or its input feature columns for a registered scikit-learn or pyfunc model; "
    "or NAME.npy, a float array of shape (n, *model input shape) saved with numpy.save")


class NoBatchError(InputError):
    """A target that holds no batch and never counted one. ``uri`` and ``why`` are kept so that a caller which knows
    the model can say exactly which batches it takes (:meth:`for_model`)."""

    def __init__(self, uri: str, why: str, expected: str = ANY_MODEL_BATCHES):
        self.uri, self.why, self.expected = uri, why, expected
        super().__init__(f"no target batch under {uri}: {why}. Write each batch of new data there as {expected}; "
                         f"*{CORRECTED_SUFFIX} outputs and keys under {STATE_PREFIX} are not batches.")

    def __reduce__(self):              # pickled (a process boundary, Prefect's results) with its own arguments
        return type(self), (self.uri, self.why, self.expected)

    def for_model(self, expected: str) -> "NoBatchError":
        """The same error, saying what this model's batches are (``expected``, a phrase after "as")."""
        return NoBatchError(self.uri, self.why, expected)


def _suffix(key: str) -> str:
    """A batch key's format suffix (``.parquet``, ``.npy``)."""
    return key[key.rfind("."):] if "." in key.rsplit("/", 1)[-1] else ""


def _no_batch_error(store: Store, keys: list[str]) -> NoBatchError:
    if isinstance(store, LocalStore) and not store.root.is_dir():
        why = "the folder does not exist"
    elif not keys:
        why = "it holds no objects (the prefix is empty or does not exist)"
    else:
        others = [k for k in keys if not k.startswith(STATE_PREFIX)]
        shown = ", ".join(repr(k) for k in others[:5]) + (", ..." if len(others) > 5 else "")
        why = f"it holds {len(keys)} object(s) but none is an input batch" + (f" ({shown})" if shown else "")
    return NoBatchError(store.uri, why)


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
    rejected is not returned; with new content it is new again. Raises :class:`NoBatchError` (an InputError) when the
    target holds no batch and the watermark never counted one (empty or missing prefix), saying which URI and what
    is expected. Writes nothing.

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
        raise _no_batch_error(store, keys)
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
            f"A batch is counted once; put new data under a new key (e.g. NAME-v2{_suffix(next(iter(changed)))}) and "
            "restore the original content, or, to count the new content in place of the old, run with "
            "on_changed='reprocess' (`labelshift estimate --reprocess-changed`).",
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
