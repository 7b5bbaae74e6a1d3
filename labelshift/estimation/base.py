"""The shape every estimator shares: ``fit`` on labelled source outputs, ``estimate`` on unlabelled target outputs.

``estimate`` takes one target set (an (m, k) array) and returns an :class:`Estimate` whose arrays are 1-D, or a
batch (an (S, m, k) array, or a list of (m_s, k) arrays of different sizes) and returns one :class:`Estimate`
whose arrays carry a leading batch axis of length S. ``len(result)`` and ``result[i]`` give the number of sets
and the i-th set's estimate, so batched and one-at-a-time code read alike.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

import numpy as np

from .._validation import check_all_classes_present, check_labels, check_prior, check_probabilities, check_target_batch
from ..errors import IllConditionedWarning, NotFittedError


@dataclass(frozen=True)
class Estimate:
    """Result of :meth:`LabelShiftEstimator.estimate`.

    Attributes (leading axis S only for a batch):
        weights: w_hat(y) = p_t(y) / p_s(y), shape (k,) or (S, k).
        target_prior: w_hat(y) * p_s(y), renormalised to sum to 1.
        source_prior: p_s(y) used by the estimator, shape (k,).
        method: estimator name, e.g. ``"MLLS"``.
        converged: solver reached its tolerance (always True for closed forms).
        iterations: solver iterations (0 for closed forms).
        ill_conditioned: the problem is poorly identified; ``diagnostic`` says by how much.
        diagnostic: the number behind the flag: smallest singular value of the confusion matrix (BBSE, RLLS)
            or the minimum eigenvalue of the negated MLLS Hessian (MLLS family), Section 5 of the paper.
    """

    weights: np.ndarray
    target_prior: np.ndarray
    source_prior: np.ndarray
    method: str
    converged: np.ndarray | bool = True
    iterations: np.ndarray | int = 0
    ill_conditioned: np.ndarray | bool = False
    diagnostic: np.ndarray | float = float("nan")
    extra: dict = field(default_factory=dict)

    @property
    def is_batch(self) -> bool:
        return np.ndim(self.weights) == 2

    def __len__(self) -> int:
        if not self.is_batch:
            raise TypeError("a single Estimate has no length; only batched estimates do")
        return int(np.shape(self.weights)[0])

    def __getitem__(self, i: int) -> "Estimate":
        if not self.is_batch:
            raise TypeError("a single Estimate cannot be indexed; only batched estimates can")
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("weights", "target_prior", "converged", "iterations", "ill_conditioned", "diagnostic"):
                v = np.asarray(v)[i]
                v = v.item() if np.ndim(v) == 0 else v
            elif f.name == "extra":
                v = {k: (np.asarray(a)[i] if np.ndim(a) >= 1 else a) for k, a in v.items()}
            kw[f.name] = v
        return Estimate(**kw)


def prior_from_weights(weights: np.ndarray, source_prior: np.ndarray) -> np.ndarray:
    """p_t(y) = w(y) p_s(y), clipped at 0 and renormalised (an unconstrained solver may give negative w)."""
    p = np.clip(weights, 0.0, None) * source_prior
    s = p.sum(axis=-1, keepdims=True)
    k = source_prior.shape[-1]
    return np.where(s > 0, p / np.where(s > 0, s, 1.0), 1.0 / k)


class LabelShiftEstimator:
    """Base class. Subclasses implement ``_fit(probs, labels)`` and ``_solve(probs, mask) -> dict``.

    ``_solve`` receives a padded batch ``probs`` (S, M, k) and ``mask`` (S, M) of 0/1 row weights and returns a
    dict with ``weights`` (S, k) and optionally ``converged``, ``iterations``, ``diagnostic`` (S,) arrays and
    ``ill_conditioned`` (S,) bools. Everything is vectorised over S: a batch is solved together.
    """

    name = "estimator"

    def fit(self, source_probs, source_labels, source_prior=None):
        """Fit on held-out labelled source outputs (probabilities, rows summing to 1) and labels 0..k-1.

        ``source_prior`` defaults to the empirical label frequencies of ``source_labels``.
        """
        probs = check_probabilities(source_probs, "source_probs", 2)
        k = probs.shape[1]
        labels = check_labels(source_labels, "source_labels", k, n_rows=probs.shape[0])
        counts = check_all_classes_present(labels, k, "source_labels")
        self.n_classes_ = k
        self.source_prior_ = (check_prior(source_prior, "source_prior", k) if source_prior is not None
                              else counts / counts.sum())
        self._fit(probs, labels)
        return self

    def estimate(self, target_probs) -> Estimate:
        """Estimate w for one target set ((m, k) array) or a batch ((S, m, k) array or list of (m_s, k))."""
        if not hasattr(self, "n_classes_"):
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call .fit(source_probs, source_labels) first.")
        probs, mask, is_batch = check_target_batch(target_probs, "target_probs", self.n_classes_)
        out = self._solve(probs, mask)
        S = probs.shape[0]
        weights = np.asarray(out["weights"], dtype=np.float64)
        res = dict(
            weights=weights,
            target_prior=prior_from_weights(weights, self.source_prior_),
            converged=np.asarray(out.get("converged", np.ones(S, bool))),
            iterations=np.asarray(out.get("iterations", np.zeros(S, int))),
            ill_conditioned=np.asarray(out.get("ill_conditioned", np.zeros(S, bool))),
            diagnostic=np.asarray(out.get("diagnostic", np.full(S, np.nan)), dtype=np.float64),
        )
        extra = out.get("extra", {})
        n_bad = int(np.sum(res["ill_conditioned"]))
        if n_bad:
            warnings.warn(
                f"{self.name}: {n_bad} of {S} estimate(s) are ill-conditioned (diagnostic "
                f"{np.nanmin(res['diagnostic']):.3g}); see Estimate.ill_conditioned and .diagnostic.",
                IllConditionedWarning, stacklevel=2)
        n_nc = int(S - np.sum(res["converged"]))
        if n_nc:
            warnings.warn(f"{self.name}: {n_nc} of {S} estimate(s) did not converge; raise max_iter.",
                          RuntimeWarning, stacklevel=2)
        if not is_batch:
            res = {k: (v[0].item() if np.ndim(v[0]) == 0 else v[0]) for k, v in res.items()}
            extra = {k: np.asarray(v)[0] for k, v in extra.items()}
        return Estimate(source_prior=self.source_prior_.copy(), method=self.name, extra=extra, **res)

    # -- for subclasses -------------------------------------------------------------------------------------
    def _fit(self, probs: np.ndarray, labels: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _solve(self, probs: np.ndarray, mask: np.ndarray) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError
