"""Simulated target data for re-estimation: batches of model inputs drawn from a dataset's test pool under a chosen
label distribution (the label-shift assumption of the paper, Section 2: p(x|y) from the pool, p_t(y) chosen).

Used to try the ``reestimate`` flow on the offline datasets (``labelshift data simulate-target``) and in tests.
The inputs are what the image networks of :mod:`labelshift.models` take and what the training task registers as
their input example: float32 in [0, 1], shape (n, C, H, W).
"""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..shift import dirichlet_prior, sample_target

__all__ = ["images_as_inputs", "simulate_target_batches"]


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
    from Dirichlet(``alpha``), Section 6), examples drawn per class with replacement from the pool.

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
    xs, ys = [], []
    for _ in range(n_batches):
        idx = sample_target(pool_y, prior, rows, rng)
        xs.append(images_as_inputs(pool_x[idx]))
        ys.append(np.asarray(pool_y)[idx])
    return xs, ys, prior
