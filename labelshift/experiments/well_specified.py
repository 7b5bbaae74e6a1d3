"""A label-shift problem on which the scaling calibrators are *well specified*, for testing interval coverage.

Classes are Gaussian in d = k dimensions, x | y ~ N(sep * e_y, I_k), with source prior p_s. The exact source
posterior then has logits linear in x,

    log p_s(y | x) = sep * x_y - sep^2 / 2 + log p_s(y) + const(x),

and the "model" outputs ``scale * (those logits) + offset`` (``scale > 1``: over-confident; ``offset``: a per-class
bias). BCTS (softmax(z / T + b)) contains the exact posterior at T = scale, b = -offset / scale, so a BCTS fit on
labelled source rows is consistent and the calibration term of the paper's eq. (bound-main) is zero; vector scaling
contains it as well. (TS contains it only when ``offset`` is None or the same for every class.)

Target rows are drawn from the same class-conditionals with another prior (label shift). The truth an interval
on the target prior must cover is that population prior, not the label frequencies of the drawn rows.

Everything is drawn from a caller's ``numpy.random.Generator``; labels of a set of size m come from one
multinomial draw, so a set costs one (m, k) normal draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError

__all__ = ["WellSpecifiedGaussians"]


@dataclass(frozen=True)
class WellSpecifiedGaussians:
    """k Gaussian classes N(sep * e_y, I_k) with source prior ``source_prior``; model outputs
    ``scale * z + offset`` where z are the exact source-posterior logits.

    Attributes:
        source_prior: (k,) p_s, strictly positive.
        sep: distance of each class mean from the origin (accuracy rises with it; 3.0 gives ~0.97 at k = 3 and
            ~0.91 at k = 10 for the problems of ``make(k)``).
        scale: over-confidence of the model (the BCTS temperature that undoes it).
        offset: (k,) per-class bias of the model's outputs.
    """

    source_prior: np.ndarray
    sep: float = 3.0
    scale: float = 1.8
    offset: np.ndarray | None = None

    @classmethod
    def make(cls, k: int, *, sep: float = 3.0, scale: float = 1.8, imbalance: float = 0.5,
             bias: float = 0.5, seed: int = 0) -> "WellSpecifiedGaussians":
        """A problem with k classes: p_s proportional to exp(imbalance * u), offsets ``bias * v`` with u, v
        standard normal draws from ``seed`` (so p_s is mildly imbalanced and the model mildly biased)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise InputError(f"k must be an integer >= 2, got {k!r}.")
        rng = np.random.default_rng(seed)
        ps = np.exp(imbalance * rng.standard_normal(k))
        return cls(source_prior=ps / ps.sum(), sep=float(sep), scale=float(scale),
                   offset=bias * rng.standard_normal(k))

    @property
    def n_classes(self) -> int:
        return len(self.source_prior)

    def true_logits(self, x: np.ndarray) -> np.ndarray:
        """The exact source-posterior logits of rows x (up to a per-row constant)."""
        return self.sep * x - 0.5 * self.sep ** 2 + np.log(self.source_prior)

    def outputs(self, x: np.ndarray) -> np.ndarray:
        """The model's (miscalibrated) logits of rows x."""
        off = 0.0 if self.offset is None else self.offset
        return self.scale * self.true_logits(x) + off

    def posterior(self, x: np.ndarray) -> np.ndarray:
        """The exact source posterior p_s(y | x)."""
        z = self.true_logits(x)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def draw(self, prior, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n rows with labels from ``prior``: (outputs (n, k), labels (n,)). Labels are sorted by class (one
        multinomial draw); shuffle them if order matters."""
        prior = np.asarray(prior, dtype=np.float64)
        k = self.n_classes
        if prior.shape != (k,) or np.any(prior < 0) or abs(prior.sum() - 1.0) > 1e-8:
            raise InputError(f"prior must be a probability vector of length {k}, got {prior!r}.")
        counts = rng.multinomial(int(n), prior / prior.sum())
        y = np.repeat(np.arange(k), counts)
        x = rng.standard_normal((int(n), k))
        x[np.arange(int(n)), y] += self.sep
        return self.outputs(x), y

    def holdout(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """n labelled source rows (labels i.i.d. from p_s, so the label frequencies vary between draws)."""
        return self.draw(self.source_prior, n, rng)
