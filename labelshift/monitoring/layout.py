"""The layout of a target store: which keys are input batches, outputs and state, and a batch as it was listed.

A target (a :class:`~labelshift.storage.Store`: an S3 prefix or a local folder) receives unlabelled batches, keys
ending in ``.npy`` or ``.parquet`` outside ``_labelshift/``. Beside each batch ``NAME.npy`` a run writes
``NAME.corrected.npy`` (``NAME.corrected.parquet`` beside a Parquet batch) and then ``NAME.summary.json``
(:mod:`labelshift.monitoring.outputs`); ``_labelshift/watermark.json`` lists every batch counted
(:mod:`labelshift.monitoring.watermark`). :class:`TargetBatch` is a batch as listed (key and SHA-256 of its content),
:class:`RejectedBatch` one that failed its checks, and :class:`ChangedBatchError` says that a batch's content is not
the content listed or counted under its key.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..storage import ObjectInfo, validate_key

__all__ = [
    "STATE_PREFIX", "WATERMARK_KEY", "BATCH_SUFFIX", "BATCH_SUFFIXES", "CORRECTED_SUFFIX", "CORRECTED_SUFFIXES",
    "SUMMARY_SUFFIX", "TargetBatch", "RejectedBatch", "ChangedBatchError", "is_batch_key", "is_checksum",
]

STATE_PREFIX = "_labelshift/"
WATERMARK_KEY = "_labelshift/watermark.json"
BATCH_SUFFIX = ".npy"
CORRECTED_SUFFIX = ".corrected.npy"
#: every batch format's suffix (``.parquet``: prediction logs or tabular inputs, :mod:`labelshift.monitoring.batches`)
BATCH_SUFFIXES = (BATCH_SUFFIX, ".parquet")
CORRECTED_SUFFIXES = (CORRECTED_SUFFIX, ".corrected.parquet")
SUMMARY_SUFFIX = ".summary.json"

_HEX = set("0123456789abcdef")


class ChangedBatchError(InputError):
    """A batch's content is not the content that was counted (or listed) under its key.

    :attr:`changed` maps each such key to ``(checksum counted, checksum now)``.
    """

    def __init__(self, message: str, changed: Mapping[str, tuple[str, str]] | None = None):
        super().__init__(message)
        self.changed = dict(changed or {})


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
    was hashed (None when unknown); :func:`~labelshift.monitoring.watermark.commit_watermark` records it so that
    the next runs need not hash the batch again. It takes no part in equality: two TargetBatch are equal when key and content are.
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
        if not is_checksum(self.checksum):
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
    """A batch that failed its checks (:func:`~labelshift.monitoring.inputs.load_batch`), with the reason: committed
    as rejected, it is not counted and not offered again by :func:`~labelshift.monitoring.listing.find_new_batches`
    until its content (checksum) changes."""

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


def is_checksum(value: Any) -> bool:
    """True when ``value`` is a SHA-256 as recorded: 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX
