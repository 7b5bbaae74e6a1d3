"""Simulated label shift, as in Section 6 of the paper (after Lipton et al. 2018).

A shifted target set is built in two steps: choose a target label distribution p_t(y), then draw each target
example by first drawing its label y ~ p_t(y) and then an example of that class, with replacement, from a labelled
pool (the test split). p(x | y) is untouched, so the result is label shift by construction.

The target priors come from

* :func:`dirichlet_prior` -- the multiclass "Dirichlet shift" p_t(y) ~ Dir(alpha); smaller alpha is more severe;
* :func:`binary_prior` -- the two-class shift of the Gaussian experiments, indexed by p_t(y = 1).

Every random function takes an explicit :class:`numpy.random.Generator`; nothing reads global random state, so a
seed fixes the result.
"""
from __future__ import annotations

import numpy as np

from .._validation import ROW_SUM_TOL
from ..errors import InputError

__all__ = ["dirichlet_prior", "binary_prior", "class_indices", "sample_target", "sample_targets"]


def _check_rng(rng, name: str = "rng") -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"{name} must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), "
                         f"got {type(rng).__name__}.")
    return rng


def _check_n_classes(n_classes) -> int:
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
        raise InputError(f"n_classes must be an integer >= 2, got {n_classes!r}.")
    return int(n_classes)


def _check_size(m, name: str) -> int:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise InputError(f"{name} must be a positive integer, got {m!r}.")
    return int(m)


def dirichlet_prior(alpha, n_classes: int, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
    """Draw target label distributions p_t(y) ~ Dirichlet(alpha) (the "Dirichlet shift" of Section 6).

    Args:
        alpha: concentration, a positive scalar (the same for every class, as in the paper) or a length-k vector.
            Small alpha (e.g. 0.1) puts most mass on a few classes: severe shift; large alpha is close to uniform.
        n_classes: k, the number of classes.
        rng: the generator to draw from.
        size: None for one prior of shape (k,), or an int S for S priors of shape (S, k).

    Returns:
        Probability vectors (non-negative, rows summing to 1). With a very small alpha some entries may be exactly 0.
    """
    k = _check_n_classes(n_classes)
    rng = _check_rng(rng)
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(k, float(a))
    if a.shape != (k,):
        raise InputError(f"alpha must be a positive scalar or a vector of {k} entries, got shape {a.shape}.")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise InputError(f"alpha must be finite and > 0 (Dirichlet concentration), got {a.tolist()}; "
                         "use e.g. alpha=0.1 for severe shift or alpha=10 for mild shift.")
    if size is not None:
        size = _check_size(size, "size")
    p = rng.dirichlet(a, size=size)
    # numpy's Dirichlet can return rows of tiny values whose sum is not exactly 1; renormalise them.
    return p / p.sum(axis=-1, keepdims=True)


def binary_prior(p1: float) -> np.ndarray:
    """The two-class target prior [1 - p1, p1], indexed by p_t(y = 1) (the x-axis of the paper's Figure 1a)."""
    try:
        p1 = float(p1)
    except (TypeError, ValueError):
        raise InputError(f"p1 must be a number in [0, 1], got {p1!r}.") from None
    if not (0.0 <= p1 <= 1.0):
        raise InputError(f"p1 = p_t(y=1) must lie in [0, 1], got {p1}.")
    return np.array([1.0 - p1, p1])


def _check_pool_labels(pool_labels, n_classes: int | None) -> tuple[np.ndarray, int]:
    y = np.asarray(pool_labels)
    if y.ndim != 1 or y.size == 0:
        raise InputError(f"pool_labels must be a non-empty 1-D array of class indices, got shape {y.shape}.")
    if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu":
        raise InputError(f"pool_labels must hold integer class indices, got dtype {y.dtype}.")
    y = y.astype(np.int64, copy=False)
    k = int(y.max()) + 1 if n_classes is None else _check_n_classes(n_classes)
    if y.min() < 0 or y.max() >= k:
        raise InputError(f"pool_labels must lie in 0..{k - 1} (found {int(y.min())}..{int(y.max())}); "
                         "labels must match the entries of the target prior.")
    return y, k


def class_indices(pool_labels, n_classes: int | None = None) -> list[np.ndarray]:
    """Positions of each class in ``pool_labels``: a list of k index arrays (ascending; empty for absent classes).

    ``n_classes`` defaults to ``max(label) + 1``.
    """
    y, k = _check_pool_labels(pool_labels, n_classes)
    order = np.argsort(y, kind="stable")
    bounds = np.cumsum(np.bincount(y, minlength=k))[:-1]
    return np.split(order, bounds)


def _check_target_prior(target_prior, name: str = "target_prior") -> np.ndarray:
    p = np.asarray(target_prior, dtype=np.float64)
    if p.ndim != 1 or p.shape[0] < 2:
        raise InputError(f"{name} must be a 1-D probability vector over >= 2 classes, got shape {p.shape}.")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise InputError(f"{name} must be finite and non-negative, got {p.tolist()}.")
    if abs(p.sum() - 1.0) > ROW_SUM_TOL:
        raise InputError(f"{name} must sum to 1, it sums to {p.sum():.6g}; normalise it (p / p.sum()).")
    return p / p.sum()


def sample_target(pool_labels, target_prior, m: int, rng: np.random.Generator,
                  pool_index: list[np.ndarray] | None = None) -> np.ndarray:
    """Indices into the pool of a target set of ``m`` examples with label distribution ``target_prior``.

    Each target example's label is drawn from ``target_prior``; the example itself is then drawn uniformly, with
    replacement, from the pool members of that class (Section 6). Done class by class, vectorised: all labels are
    drawn first, then each class's slots are filled in one call. The returned order is the random draw order.

    Args:
        pool_labels: (n,) labels of the pool, integers 0..k-1 with k = len(target_prior).
        target_prior: (k,) p_t(y), non-negative, summing to 1.
        m: target set size.
        rng: the generator to draw from.
        pool_index: optional precomputed ``class_indices(pool_labels, k)`` (saves a sort when drawing many sets).

    Returns:
        (m,) int64 indices into the pool; ``pool_labels[idx]`` are the target labels.

    Raises:
        InputError: bad prior, bad m, labels out of range, or a class with positive target mass that has no
            example in the pool.
    """
    p = _check_target_prior(target_prior)
    k = p.shape[0]
    m = _check_size(m, "m")
    rng = _check_rng(rng)
    if pool_index is None:
        pool_index = class_indices(pool_labels, k)
    elif len(pool_index) != k:
        raise InputError(f"pool_index has {len(pool_index)} classes but target_prior has {k}.")
    sizes = np.array([len(ix) for ix in pool_index])
    missing = np.flatnonzero((sizes == 0) & (p > 0))
    if missing.size:
        raise InputError(f"the pool has no examples of class(es) {missing.tolist()}, which have positive target "
                         f"mass {p[missing].tolist()}; add pool examples of those classes or give them zero mass.")
    labels = rng.choice(k, size=m, p=p)
    out = np.empty(m, dtype=np.int64)
    for c in range(k):
        slots = np.flatnonzero(labels == c)
        if slots.size:
            out[slots] = pool_index[c][rng.integers(0, sizes[c], size=slots.size)]
    return out


def sample_targets(pool_labels, target_priors, m: int, rng: np.random.Generator) -> np.ndarray:
    """S target sets at once: ``target_priors`` is (S, k); returns (S, m) pool indices (one :func:`sample_target`
    per row, drawn in order from ``rng``)."""
    P = np.asarray(target_priors, dtype=np.float64)
    if P.ndim != 2:
        raise InputError(f"target_priors must be (S, k), got shape {P.shape}.")
    index = class_indices(pool_labels, P.shape[1])
    return np.stack([sample_target(pool_labels, p, m, rng, pool_index=index) for p in P])
