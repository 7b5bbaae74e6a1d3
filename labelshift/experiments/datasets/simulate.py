"""Simulated target data for re-estimation: batches of model inputs drawn from a dataset's test pool under a chosen
label distribution (the label-shift assumption of the paper, Section 2: p(x|y) from the pool, p_t(y) chosen).

Used to try the ``reestimate`` flow on the offline datasets (``labelshift data simulate-target``) and in tests.
The inputs are what the image networks of :mod:`labelshift.experiments.models` take and what the training task registers
as their input example: float32 in [0, 1], shape (n, C, H, W).
"""
from __future__ import annotations

import numpy as np

from ...errors import InputError
from ..shift import dirichlet_prior

__all__ = ["images_as_inputs", "simulate_target_batches", "repeated_classes"]


def images_as_inputs(x: np.ndarray) -> np.ndarray:
    """uint8 images (N, H, W) or (N, C, H, W) as the float32 inputs of the networks: [0, 1], (N, C, H, W)."""
    arr = np.asarray(x)
    if arr.ndim == 3:
        arr = arr[:, None]
    if arr.ndim != 4:
        raise InputError(f"images must have shape (N, H, W) or (N, C, H, W), got {arr.shape}.")
    if arr.dtype == np.uint8:
        return arr.astype(np.float32) / 255.0
    return arr.astype(np.float32)


def simulate_target_batches(pool_x: np.ndarray, pool_y: np.ndarray, n_classes: int, *, rows: int,
                            n_batches: int = 1, target_prior=None, alpha: float | None = None,
                            seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Draw ``n_batches`` batches of ``rows`` inputs each with label distribution ``target_prior`` (or one drawn
    from Dirichlet(``alpha``), Section 6). The class counts of each batch are multinomial; the examples of a class
    are drawn from the pool's members of that class *without* replacement, across all batches, as long as the pool
    holds enough of them -- a random subset of an i.i.d. pool is itself i.i.d., which the label-shift test assumes
    -- and with replacement only for a class that needs more rows than the pool has (see :func:`repeated_classes`).

    Returns (inputs per batch, labels per batch, the target prior used).
    """
    if (target_prior is None) == (alpha is None):
        raise InputError("give exactly one of target_prior (k probabilities) or alpha (a Dirichlet concentration).")
    if rows < 1 or n_batches < 1:
        raise InputError(f"rows and n_batches must be positive, got {rows} and {n_batches}.")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7A6]))
    prior = dirichlet_prior(alpha, n_classes, rng) if alpha is not None else np.asarray(target_prior, float)
    if prior.shape != (n_classes,):
        raise InputError(f"target_prior must have {n_classes} entries (one per class), got {prior.shape[0]}.")
    labels = np.asarray(pool_y)
    members = [np.flatnonzero(labels == c) for c in range(n_classes)]
    missing = [c for c in range(n_classes) if prior[c] > 0 and members[c].size == 0]
    if missing:
        raise InputError(f"the pool has no example of class(es) {missing}, which target_prior gives weight; give "
                         "them weight 0 or use a pool with every class.")
    counts = rng.multinomial(rows, prior / prior.sum(), size=n_batches)          # (n_batches, k)
    drawn = []
    for c in range(n_classes):
        need = int(counts[:, c].sum())
        if need <= members[c].size:
            drawn.append(rng.permutation(members[c])[:need])
        else:
            drawn.append(rng.choice(members[c], size=need, replace=True))
    xs, ys, at = [], [], np.zeros(n_classes, dtype=int)
    for b in range(n_batches):
        idx = np.concatenate([drawn[c][at[c]:at[c] + counts[b, c]] for c in range(n_classes)])
        at += counts[b]
        idx = idx[rng.permutation(idx.size)]
        xs.append(images_as_inputs(pool_x[idx]))
        ys.append(labels[idx])
    return xs, ys, prior


def repeated_classes(pool_y, labels_per_batch) -> list[int]:
    """The classes whose rows in the simulated batches (``labels_per_batch``, as returned by
    :func:`simulate_target_batches`) outnumber the pool's members of that class, so that some rows repeat."""
    pool = np.bincount(np.asarray(pool_y))
    used = np.bincount(np.concatenate([np.asarray(y) for y in labels_per_batch]), minlength=pool.size)
    return [int(c) for c in np.flatnonzero(used[:pool.size] > pool)]
