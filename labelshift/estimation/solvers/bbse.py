"""Confusion matrices, mean predictions and the BBSE solve (Lipton et al., ICML 2018)."""
from __future__ import annotations

import numpy as np

from ... import rows as _rows
from .batch import as_batch


def one_hot_argmax(probs) -> np.ndarray:
    """One-hot encoding of the argmax along the last axis (ties go to the lowest index, as ``numpy.argmax``)."""
    P = np.asarray(probs, dtype=np.float64)
    k = P.shape[-1]
    return (np.argmax(P, axis=-1)[..., None] == np.arange(k)).astype(np.float64)


def confusion_matrix(probs, labels, n_classes: int | None = None, soft: bool = False) -> np.ndarray:
    """Joint confusion matrix C[predicted, true] on labelled source outputs; its entries sum to 1.

    Hard (Lipton et al. 2018): C[i, j] = (1/n) #{x : argmax f(x) = i, y = j}. Soft: the one-hot prediction is
    replaced by the probability vector, C[i, j] = (1/n) sum_{x: y = j} f_i(x). Column j sums to the label frequency
    of class j and row i to the mean prediction for class i, so C 1 is the source mean prediction.
    """
    P = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    k = P.shape[1] if n_classes is None else int(n_classes)
    n = y.shape[0]
    if soft:
        C = np.zeros((k, k))
        for j in range(k):  # column j: sum of the probability vectors of the examples of class j
            C[:, j] = P[y == j].sum(axis=0)
    else:
        pred = np.argmax(P, axis=1)
        C = np.bincount(pred * k + y, minlength=k * k).reshape(k, k).astype(np.float64)
    return C / n


def mean_prediction(probs, mask=None, soft: bool = False) -> np.ndarray:
    """Mean prediction on target outputs: mu_t = (1/m) sum_x onehot(argmax f(x)) (hard) or (1/m) sum_x f(x) (soft).

    Batched: ``probs`` (S, M, k) with ``mask`` (S, M) returns (S, k). Hard counts are exact integers divided by m.
    """
    if _rows.is_large(probs, mask):
        R = _rows.single_set(probs, mask)
        mu = (_rows.column_sums(R) if soft else _rows.argmax_counts(R)) / R.shape[0]
        return mu if np.ndim(probs) == 2 else mu[None]
    P, c, single = as_batch(probs, mask)
    S, M, k = P.shape
    if soft:
        mu = np.matmul(c[:, None, :], P)[:, 0, :]
    else:   # weighted counts of the argmax predictions (the sums of one-hot rows, without forming them)
        cells = (np.arange(S)[:, None] * k + np.argmax(P, axis=-1)).ravel()
        mu = np.bincount(cells, weights=c.ravel(), minlength=S * k).reshape(S, k)
    mu = mu / c.sum(axis=1)[:, None]
    return mu[0] if single else mu


def bbse_solve(confusion, mu) -> np.ndarray:
    """Solve C w = mu_t (BBSE, Lipton et al. 2018) for one (k,) or many (S, k) right-hand sides.

    Each right-hand side is solved with its own (identical) LU factorisation, so a batch gives bit-identical answers
    to one-at-a-time calls. The answer is unconstrained: w may have negative entries when mu_t is noisy.
    """
    C = np.asarray(confusion, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    single = mu.ndim == 1
    mu2 = mu[None] if single else mu
    Cb = np.broadcast_to(C, (mu2.shape[0],) + C.shape)
    w = np.linalg.solve(Cb, mu2[..., None])[..., 0]
    return w[0] if single else w
