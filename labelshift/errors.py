"""One exception family for mistakes a user can make (bad input, missing data, unreachable service).

Every message says what was wrong and how to fix it. Catch :class:`LabelShiftError` to handle them all.
Programming errors inside the library are *not* in this family and surface as ordinary exceptions.
"""
from __future__ import annotations


class LabelShiftError(Exception):
    """Base class of every user-facing error raised by labelshift."""


class InputError(LabelShiftError, ValueError):
    """An argument has the wrong shape, dtype, range or content (NaN, negative probabilities, bad labels...)."""


class NotMaximiserError(InputError):
    """Given weights are not the MLLS maximiser for the rows they are used with: their duality gap is more than the
    rounding of those rows explains. ``weights=None`` solves MLLS on those rows instead."""


class NotFittedError(LabelShiftError, RuntimeError):
    """An estimator or calibrator was used before ``fit`` (or ``load``)."""


class IllConditionedError(LabelShiftError, ArithmeticError):
    """The estimation problem is singular or too close to singular to give a meaningful answer.

    Carries the diagnostic that triggered it (smallest singular value of a confusion matrix or minimum
    eigenvalue of the MLLS Hessian) in :attr:`value`.
    """

    def __init__(self, message: str, value: float | None = None):
        super().__init__(message)
        self.value = value


class FormatError(LabelShiftError, ValueError):
    """A saved file (JSON, manifest, array) is of the wrong kind or version, or is corrupted."""


class StorageError(LabelShiftError, OSError):
    """Object store problem: missing bucket or key, missing credentials, unreachable endpoint, bad URI."""


class ConflictError(StorageError):
    """A conditional write was refused: the object is no longer the version it was read as (another writer moved
    it), or it exists where it was expected not to."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The bucket, key or local path does not exist."""


class CredentialsError(StorageError, PermissionError):
    """No credentials were found, or they were refused by the store."""


class ServiceUnavailableError(LabelShiftError, ConnectionError):
    """A service (MLflow, Prefect, S3 endpoint) could not be reached."""


class PartitionError(LabelShiftError, RuntimeError):
    """A partition of a target's rows held elsewhere (a Dask cluster's workers) could not be loaded, or loaded as
    something other than (m, k) probabilities; the message names the partition, what went wrong and the fix."""


class IllConditionedWarning(UserWarning):
    """Warned (and flagged on the result) when an estimate is returned for a poorly identified problem."""
