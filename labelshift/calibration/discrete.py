"""Calibration by aggregation: the confusion-matrix calibrator and the binning calibrator.

Both predict, for an input x, the source label frequencies among the held-out source examples that fall in the
same cell of a partition of the output space: f(x) = p_s(y | g(x)) for a cell map g. By Proposition (ltt-calib)
of Garg et al. (NeurIPS 2020), after Vaicenavicius et al. (2019), such a predictor is canonically calibrated on
the source distribution whatever g is; the finer the partition, the less information is lost (Section 6, Figure 2).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError
from ._base import Calibrator, float_lists, softmax


def _row_frequencies(counts: np.ndarray, fallback: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalise the last axis of ``counts`` to frequencies; cells with no examples get ``fallback``.

    Returns the frequencies and a boolean mask of the empty cells.
    """
    totals = counts.sum(axis=-1, keepdims=True)
    empty = totals[..., 0] == 0
    freq = counts / np.where(totals > 0, totals, 1.0)
    freq[empty] = fallback
    return freq, empty


class ConfusionMatrixCalibrator(Calibrator):
    """Hard confusion-matrix calibration: f(x) = p_s(y | yhat(x)), yhat(x) = argmax of the outputs.

    This is the predictor behind MLLS-CM, eq. (cm-log) in Section 4.4 of Garg et al. (NeurIPS 2020); by
    Proposition (ltt-calib) it is calibrated. The argmax of logits and of probabilities agree, so the input kind only
    matters for validation. Ties in the argmax go to the lowest class index (``numpy.argmax``).

    Fitted attributes:
        joint_: the hard joint confusion matrix C[predicted, true] on the fit data (entries sum to 1); the BBSE
            matrix of Lipton et al. (2018).
        conditional_: its rows normalised, p_s(y | yhat) (rows sum to 1).
        empty_rows_: predicted classes that never occur on the fit data. Their rows have no data; they are set to
            the source label frequencies ``source_prior_`` (the calibrated answer when nothing is known about x
            beyond its being a source example).
        source_prior_: label frequencies of the fit data.
    """

    kind = "ConfusionMatrix"
    aliases = ("CM",)

    def _fit(self, x, y, k, kind, prior):
        pred = np.argmax(x, axis=1)
        counts = np.bincount(pred * k + y, minlength=k * k).reshape(k, k).astype(np.float64)
        self.joint_ = counts / counts.sum()
        self.conditional_, empty = _row_frequencies(counts, prior)
        self.empty_rows_ = np.flatnonzero(empty)

    def _predict_proba(self, x):
        return self.conditional_[np.argmax(x, axis=1)].copy()

    def _params_to_dict(self) -> dict[str, Any]:
        return {"joint": float_lists(self.joint_), "conditional": float_lists(self.conditional_),
                "empty_rows": self.empty_rows_.tolist()}

    def _params_from_dict(self, reader, k):
        self.joint_ = reader.array("joint", (k, k))
        self.conditional_ = reader.array("conditional", (k, k))
        self.empty_rows_ = reader.indices("empty_rows", 0, k)


CM = ConfusionMatrixCalibrator


class BinningCalibrator(Calibrator):
    """Binned calibration: f(x) = p_s(y | bin(x)), the label frequencies of the fit examples in x's bin.

    The aggregated predictor of Section 6 (Figure 2) of Garg et al. (NeurIPS 2020): partitioning the outputs and
    predicting the source label frequencies per cell gives a calibrated predictor (Vaicenavicius et al., 2019),
    and more bins lose less information.

    Bins:
        * k = 2: ``n_bins`` bins of the score p(y=1|x) on [0, 1] (softmax of logits first).
        * k > 2: bins of (predicted class, top-class confidence): for each predicted class c = argmax, ``n_bins``
          bins of max_y p(y|x) on [1/k, 1]. With ``n_bins=1`` this is exactly :class:`ConfusionMatrixCalibrator`.

        ``strategy="uniform"`` uses equal-width bins; ``"quantile"`` puts the inner edges at quantiles of the fit
        scores (per predicted class when k > 2), so bins hold about equal numbers of fit examples (tied scores can
        leave some quantile bins empty). Bins are closed on the right, (e_j, e_{j+1}], the first also on the
        left, so for k = 2 and ``n_bins=2`` uniform bins a score of exactly 0.5 falls with class 0, as argmax ties do,
        and the calibrator equals the confusion-matrix one.

    Empty bins (no fit example): predict the pooled label frequencies of the nearest non-empty bins of the same
    predicted class (nearest by bin index; at equal distance on both sides, both are pooled), i.e. the empty bin
    is merged into its neighbours, which keeps the predictor an aggregation and so calibrated. If a predicted class
    has no fit example at all (k > 2), its bins get the source label frequencies, as in the confusion-matrix
    calibrator. Empty bins are listed in ``empty_bins_`` as (group, bin) pairs.

    Fitted attributes:
        edges_: bin edges, shape (G, n_bins + 1), one row per group: G = 1 for k = 2 (the score p(y=1|x)), G = k
            for k > 2 (one row per predicted class).
        bin_counts_: (G, n_bins, k) fit examples per bin and true label.
        bin_probs_: (G, n_bins, k) the predicted probabilities of each bin.
        empty_bins_: (n_empty, 2) integer array of (group, bin) pairs with no fit example.
        source_prior_: label frequencies of the fit data.
    """

    kind = "Binning"
    _settings = ("n_bins", "strategy", "input_kind")

    def __init__(self, n_bins: int = 10, strategy: str = "uniform", input_kind: str = "auto"):
        super().__init__(input_kind=input_kind)
        self.n_bins = n_bins
        self.strategy = strategy

    def _check_settings(self):
        super()._check_settings()
        if isinstance(self.n_bins, bool) or not isinstance(self.n_bins, (int, np.integer)) or self.n_bins < 1:
            raise InputError(f"n_bins must be a positive integer, got {self.n_bins!r}.")
        if self.strategy not in ("uniform", "quantile"):
            raise InputError(f"strategy must be 'uniform' or 'quantile', got {self.strategy!r}.")

    # -- the cell map ----------------------------------------------------------------------------------------
    def _group_and_score(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if p.shape[1] == 2:
            return np.zeros(p.shape[0], dtype=np.int64), p[:, 1]
        return np.argmax(p, axis=1), np.max(p, axis=1)

    def _bin_of(self, groups: np.ndarray, scores: np.ndarray) -> np.ndarray:
        bins = np.zeros(scores.shape[0], dtype=np.int64)
        for g in np.unique(groups):
            rows = groups == g
            # number of inner edges strictly below the score: bins (e_j, e_{j+1}], the first one closed
            bins[rows] = np.searchsorted(self.edges_[g, 1:-1], scores[rows], side="left")
        return bins

    def assign_bins(self, outputs) -> np.ndarray:
        """The flat cell index group * n_bins + bin of each row of ``outputs`` (for diagnostics and tests)."""
        x = self._check_predict_outputs(outputs, "outputs")
        g, s = self._group_and_score(self._as_probabilities(x))
        return g * int(self.n_bins) + self._bin_of(g, s)

    # -- fitting ---------------------------------------------------------------------------------------------
    def _fit(self, x, y, k, kind, prior):
        B = int(self.n_bins)
        p = x if kind == "probs" else softmax(x)
        groups, scores = self._group_and_score(p)
        G = 1 if k == 2 else k
        lo = 0.0 if k == 2 else 1.0 / k
        edges = np.tile(np.linspace(lo, 1.0, B + 1), (G, 1))
        if self.strategy == "quantile":
            for g in range(G):
                s = scores[groups == g]
                if s.size:
                    q = np.quantile(s, np.linspace(0.0, 1.0, B + 1))
                    q[0], q[-1] = lo, 1.0
                    edges[g] = np.maximum.accumulate(np.clip(q, lo, 1.0))
        self.edges_ = edges
        bins = self._bin_of(groups, scores)
        counts = np.bincount((groups * B + bins) * k + y, minlength=G * B * k).reshape(G, B, k).astype(np.float64)
        self.bin_counts_ = counts
        self.bin_probs_, empty = _fill_empty_bins(counts, prior)
        self.empty_bins_ = np.argwhere(empty).astype(np.int64).reshape(-1, 2)

    def _predict_proba(self, x):
        g, s = self._group_and_score(self._as_probabilities(x))
        return self.bin_probs_[g, self._bin_of(g, s)].copy()

    # -- persistence -----------------------------------------------------------------------------------------
    def _params_to_dict(self) -> dict[str, Any]:
        return {"edges": float_lists(self.edges_), "bin_counts": float_lists(self.bin_counts_),
                "bin_probs": float_lists(self.bin_probs_), "empty_bins": self.empty_bins_.tolist()}

    def _params_from_dict(self, reader, k):
        G, B = (1 if k == 2 else k), int(self.n_bins)
        self.edges_ = reader.array("edges", (G, B + 1))
        self.bin_counts_ = reader.array("bin_counts", (G, B, k))
        self.bin_probs_ = reader.array("bin_probs", (G, B, k))
        self.empty_bins_ = reader.indices("empty_bins", 2, max(G, B))


def _fill_empty_bins(counts: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Frequencies per bin; an empty bin pools the counts of the nearest non-empty bins of its group.

    ``counts`` is (G, B, k). A group with no example at all gets ``prior`` in every bin.
    """
    G, B, _ = counts.shape
    probs, empty = _row_frequencies(counts, prior)
    for g in range(G):
        filled = np.flatnonzero(~empty[g])
        if filled.size == 0:
            continue  # the whole group is empty: keep the prior
        for j in np.flatnonzero(empty[g]):
            dist = np.abs(filled - j)
            pooled = counts[g, filled[dist == dist.min()]].sum(axis=0)
            probs[g, j] = pooled / pooled.sum()
    return probs, empty
