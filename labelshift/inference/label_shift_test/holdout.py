"""The holdout's part of the label-shift test: its checks (size, rows per class, the region rule) and
:func:`prepare_holdout`, what the test computes from the labelled holdout alone, made once for many targets."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._validation import check_labels, check_probabilities
from ...errors import InputError
from .log_odds import BLOCK_MAX_CLASSES, HoldoutSide, holdout_side
from .regions import make_regions, Regions
#: the test refuses holdouts smaller than this (its size is measured from n = 500 up; see docs/label_shift_test.md)
MIN_HOLDOUT = 200
#: ... and holdouts with fewer than this many examples of some class (its class-conditional region frequencies
#: would rest on a handful of rows)
MIN_CLASS_ROWS = 5

#: default: a confidence bin must hold at least this many holdout rows (the degenerate-bin rule)
MIN_REGION_ROWS = 25
#: default: at most this many confidence bins per predicted class
MAX_CONFIDENCE_BINS = 4


def check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)


@dataclass(frozen=True, eq=False)
class PreparedHoldout:
    """What :func:`label_shift_test` computes from the labelled holdout alone -- its regions and their class
    counts, and the log-odds part's holdout moments -- made once by :func:`prepare_holdout` and passed to every
    test against that holdout (``label_shift_test(..., prepared=...)``, e.g. each segment of a target), which
    then gives exactly the result it gives without it.

    Attributes:
        holdout_probs, holdout_labels: the holdout it was made from (float64 (n, k), int (n,)).
        min_region_rows, max_confidence_bins: the region rule it was made with.
        regions: the regions of the output simplex; N (k, J): the holdout rows of each class in each.
        log_odds: the log-odds part's holdout side, or None (not prepared: computed by each test that runs it).
    """

    holdout_probs: np.ndarray
    holdout_labels: np.ndarray
    min_region_rows: int
    max_confidence_bins: int
    regions: Regions
    N: np.ndarray
    log_odds: HoldoutSide | None

    def matches(self, holdout_probs: np.ndarray, holdout_labels: np.ndarray, min_region_rows: int,
                max_confidence_bins: int) -> bool:
        """Whether it was made from this holdout (the same values) with this region rule."""
        return (self.min_region_rows == min_region_rows and self.max_confidence_bins == max_confidence_bins
                and self.holdout_probs.shape == np.shape(holdout_probs)
                and np.array_equal(self.holdout_labels, holdout_labels)
                and np.array_equal(self.holdout_probs, holdout_probs))


def prepare_holdout(holdout_probs, holdout_labels, *, min_region_rows: int = MIN_REGION_ROWS,
                    max_confidence_bins: int = MAX_CONFIDENCE_BINS, log_odds: bool | None = None) -> PreparedHoldout:
    """The holdout's part of :func:`label_shift_test` (same arguments, same defaults), for many tests against one
    holdout: the regions and the holdout's counts in them, and -- when ``log_odds`` (None: up to
    BLOCK_MAX_CLASSES classes) -- the log-odds part's holdout moments.

    Raises:
        InputError: as :func:`label_shift_test` for the holdout (too small, a class with too few rows).
    """
    Ph, y, n_y = _holdout_inputs(holdout_probs, holdout_labels)
    min_region_rows = check_int(min_region_rows, "min_region_rows", 1)
    max_confidence_bins = check_int(max_confidence_bins, "max_confidence_bins", 1)
    k = Ph.shape[1]
    regions = make_regions(Ph, min_region_rows, max_confidence_bins)
    N = np.zeros((k, regions.n_regions))
    np.add.at(N, (y, regions.assign(Ph)), 1.0)
    side = holdout_side(Ph, y, k) if check_log_odds(log_odds, k) else None
    return PreparedHoldout(holdout_probs=Ph, holdout_labels=y, min_region_rows=min_region_rows,
                           max_confidence_bins=max_confidence_bins, regions=regions, N=N, log_odds=side)


def check_holdout_size(n: int) -> None:
    if n < MIN_HOLDOUT:
        raise InputError(f"the holdout has n = {n} rows, fewer than MIN_HOLDOUT = {MIN_HOLDOUT}: the null "
                         "distribution of the test rests on the holdout's class-conditional output frequencies and "
                         "is not reliable with so few rows (its size is measured for n >= 500). Collect a larger "
                         "labelled holdout.")


def class_rows(y: np.ndarray, k: int) -> np.ndarray:
    """The holdout's rows per class (k,); InputError when a class has fewer than MIN_CLASS_ROWS."""
    n_y = np.bincount(y, minlength=k)
    few = np.flatnonzero(n_y < MIN_CLASS_ROWS)
    if few.size:
        raise InputError(f"holdout_labels has fewer than MIN_CLASS_ROWS = {MIN_CLASS_ROWS} examples of class(es) "
                         f"{few.tolist()} (counts {n_y[few].tolist()}); the test needs each class's outputs on the "
                         "holdout to know what that class looks like. Add labelled holdout examples of those "
                         "classes.")
    return n_y


def _holdout_inputs(holdout_probs, holdout_labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The holdout checked as :func:`label_shift_test` checks it: (probabilities (n, k), labels, rows per class)."""
    Ph = check_probabilities(holdout_probs, "holdout_probs", 2)
    n, k = Ph.shape
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    check_holdout_size(n)
    return Ph, y, class_rows(y, k)


def check_log_odds(log_odds, k: int) -> bool:
    """``log_odds`` as a bool, None meaning the default for k classes; InputError for anything else."""
    if log_odds is None:
        # the default: the log-odds part up to BLOCK_MAX_CLASSES classes; above, its measured size at k = 100 was
        # far above the level (docs/label_shift_test.md, "Many classes"), the regions part's was not
        log_odds = k <= BLOCK_MAX_CLASSES
    if not isinstance(log_odds, (bool, np.bool_)):
        raise InputError(f"log_odds must be True or False (or None, the default for the number of classes), got "
                         f"{log_odds!r}.")
    return log_odds
