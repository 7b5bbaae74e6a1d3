"""Confidence intervals on the target prior that include the error of the labelled source holdout.

:func:`labelshift.inference.intervals.fisher_interval` treats the calibrated predictor f and the source prior p_s as
known. In practice both are estimated from the same n labelled holdout rows: the calibrator's parameters theta by
minimising the NLL, and p_s = the mean calibrated prediction on the holdout (how the ``reestimate`` flow defines it,
``ModelBundle.source_prior``). Their O(n^{-1/2}) error moves the MLLS estimate (eq. (mlls-sample) of Garg et al.,
NeurIPS 2020) as much as the target's own O(m^{-1/2}) error once m is not small next to n, and the target-only interval
is then too short.

:func:`source_aware_interval` stacks the three estimating equations -- the calibrator's NLL score on the holdout,
the p_s mean equation on the holdout, the MLLS optimality conditions on the target -- and forms the M-estimation
(sandwich) covariance of (theta, p_s, w) over the two independent samples. The derivation, and what the interval
covers and what it does not (the calibration term of eq. (bound-main)), are in ``docs/intervals.md``.

Supported calibrators: the scaling family of :mod:`labelshift.calibration.scaling` (TS, BCTS, VS, NBVS), whose
calibrated logits are linear in the parameters; the derivatives are analytic.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np
from scipy.stats import norm

from .. import rows as _rows
from .._validation import as_float_array, as_float_rows, check_all_classes_present, check_labels, check_level
from ..calibration import PROB_FLOOR, log_softmax
from ..calibration.scaling import CONVERGED_GRADIENT
from ..errors import IllConditionedWarning, InputError, NotMaximiserError
from ..partitions import NOT_PARTITIONED, PartitionedRows, add_in_order, is_partitioned
from ..estimation.solvers import PIN_TOL, mlls_newton, mlls_optimality
from .holdout_conditional import check_inflation, interval_inflation
from .repeats import clustered_covariance
from .identifiability import MAX_STANDARD_ERROR, class_label, weight_label
from .intervals import PriorInterval, fisher_interval
from .intervals import pinned_bounds as _pinned_bounds
from .mlls_inputs import accepted_gap, gap_tolerance

__all__ = ["SourceAwareInterval", "source_aware_interval", "MIN_ROWS_PER_PARAMETER", "METHOD",
           "SUPPORTED_CALIBRATORS"]

#: the ``method`` name of the result (the name the flow's ``interval=`` parameter should use)
METHOD = "source-aware"
#: the holdout must have at least this many rows per calibrator parameter (BCTS on k classes has k parameters: the
#: temperature and k - 1 free biases; VS 2k - 1; TS 1; NBVS k), and at least 2 k rows: see :func:`min_holdout_rows`
MIN_ROWS_PER_PARAMETER = 10
#: labelled holdout rows of a class below which the interval is not trusted (its holdout part is a normal
#: approximation that undercovers with fewer); chosen on the zoo's tiny-holdout runs (docs/intervals.md)
MIN_CLASS_HOLDOUT_ROWS = 50
#: kinds of calibrator the sandwich knows the parameters of
SUPPORTED_CALIBRATORS = ("TS", "BCTS", "VS", "NBVS")

_LOG_T_BOUND = 30.0                 # the scaling calibrators' bound on |log T| (a fit at the bound is not interior)
_SCORE_TOL = 0.05                   # |mean holdout score| above this many standard errors: not fit on these rows
                                    # (and above the fit's own stopping gradient: _check_fit_on_holdout)
#: how far (relative) the calibrated target rows made here in float64, and p_s, may be from those the given weights
#: were solved with: the library keeps a target given in float32 so (labelshift.rows), and a float32 rounding of the
#: rows and another of p_s move the gap no more than one of twice the size (gap_tolerance)
_TARGET_ROWS_EPS = 2.0 * float(np.finfo(np.float32).eps)
_COND_MAX = 1e12                    # condition number of the NLL Hessian above which theta is not identified
_BORDERED_MIN_CLASSES = 100         # above: a pinned class's variances from one column of H_GG^{-1} (_pinned_column)
_HOLDOUT_ROWS_MIN_CLASSES = 100     # above: the holdout's terms in row blocks (_holdout_terms_rows)
#: :meth:`SourceAwareInterval.to_dict` writes the three (k, k) covariance matrices up to this many classes; above, it
#: writes their diagonals (``variance``, ``variance_target``, ``variance_holdout``) instead: at k = 1,000 the matrices
#: are 3 million numbers, about 60 MB of JSON in every stored summary (docs/intervals.md)
STORED_COVARIANCE_MAX_CLASSES = 100


# ---------------------------------------------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceAwareInterval(PriorInterval):
    """A :class:`~labelshift.inference.intervals.PriorInterval` (``method="source-aware"``) whose covariance includes
    the holdout's error. Every field of PriorInterval keeps its meaning; ``std_error`` is the total standard error of
    p_t(y). Added:

    Attributes:
        source_prior: (k,) p_s = the mean calibrated prediction on the holdout (the prior the interval is for).
        covariance: (k, k) total covariance of the estimate of p_t = p_s * w (target + holdout parts).
        covariance_target: (k, k) the part from the target sample alone (= that of ``fisher_interval``).
        covariance_holdout: (k, k) the part from the holdout (calibrator parameters and p_s).
        weights_covariance: (k, k) total covariance of w (rows/columns of pinned classes are 0).
        weights_std_error: (k,) total standard error of w (nan for pinned classes).
        n_source: holdout rows n.
        calibrator: the calibrator's kind (e.g. ``"BCTS"``).
        trustworthy: False when the estimate is poorly identified (see ``reasons``); the interval is then still
            returned, but should be reported as Untrustworthy.
        reasons: one sentence per failed check, naming the number and its threshold.
        target_only: the present target-only interval (``method="fisher"``, as
            :func:`~labelshift.inference.intervals.fisher_interval` computes it) for the same estimate, for
            comparison.
        holdout_influence: (n, k) the influence of each holdout row on the estimate of p_t (centred, in holdout row
            order): p_t_hat - p_t ~ (target part) + (1/n) sum_j holdout_influence[j], and
            ``covariance_holdout = kappa holdout_influence.T @ holdout_influence / n**2`` (kappa =
            ``extra["holdout_inflation"]``, 1 unless the holdout is counted more than once: given one holdout). For
            quantities estimated on the same holdout rows whose error is correlated with the prior's
            (:mod:`labelshift.inference.accuracy`). Not serialised by ``to_dict``.
        target_terms: on a large target, (g_F, H_FF^{-1}) on the free classes F:
            the mean of s_i = f_i / f_i^T w and the pseudo-inverse of H_FF, H = (1/m) sum_i s_i s_i^T (the
            calibrated rows of a large target made block by block), so that
            :func:`labelshift.inference.accuracy.expected_accuracy` need not make them again; else None. Not
            serialised by ``to_dict``.
    """

    source_prior: np.ndarray = None
    covariance: np.ndarray = None
    covariance_target: np.ndarray = None
    covariance_holdout: np.ndarray = None
    weights_covariance: np.ndarray = None
    weights_std_error: np.ndarray = None
    n_source: int | None = None
    calibrator: str | None = None
    trustworthy: bool = True
    reasons: list = field(default_factory=list)
    target_only: PriorInterval | None = field(default=None, repr=False)
    holdout_influence: np.ndarray | None = field(default=None, repr=False, compare=False)
    target_terms: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def holdout_share(self) -> np.ndarray:
        """(k,) the holdout's share of the variance of each p_t(y) (nan for pinned classes)."""
        tot = np.diag(self.covariance)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(tot > 0, np.diag(self.covariance_holdout) / tot, np.nan)

    def to_dict(self) -> dict:
        """:meth:`PriorInterval.to_dict` plus the added fields (matrices as nested lists)."""
        d = super().to_dict()

        def mat(a):
            return [[float(v) for v in row] for row in np.asarray(a, dtype=np.float64)]

        if len(self.source_prior) <= STORED_COVARIANCE_MAX_CLASSES:
            matrices = {"covariance": mat(self.covariance), "covariance_target": mat(self.covariance_target),
                        "covariance_holdout": mat(self.covariance_holdout)}
        else:                           # the diagonals only (STORED_COVARIANCE_MAX_CLASSES)
            matrices = {f"variance{part}": [float(v) for v in np.diag(getattr(self, f"covariance{part}"))]
                        for part in ("", "_target", "_holdout")}
        d.update({"source_prior": [float(v) for v in self.source_prior], **matrices,
                  "weights_std_error": [None if not math.isfinite(v) else float(v) for v in self.weights_std_error],
                  "n_source": int(self.n_source), "calibrator": self.calibrator,
                  "trustworthy": bool(self.trustworthy), "reasons": list(self.reasons)})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SourceAwareInterval":
        """The interval that :meth:`to_dict` wrote; ``from_dict(d).to_dict() == d`` (the target-only interval and
        the covariance of w are not stored, and read back as None; above STORED_COVARIANCE_MAX_CLASSES classes the
        three covariance matrices read back as the diagonal matrices of their stored variances)."""
        base = PriorInterval.from_dict(d)
        if "covariance" not in d and all(f"variance{part}" in d for part in ("", "_target", "_holdout")):
            # written above STORED_COVARIANCE_MAX_CLASSES classes: the variances only, read back as diagonal matrices
            d = {**d, **{f"covariance{part}": np.diag(np.asarray(d[f"variance{part}"], dtype=np.float64))
                         for part in ("", "_target", "_holdout")}}
        missing = [key for key in ("source_prior", "covariance", "covariance_target", "covariance_holdout",
                                   "weights_std_error", "n_source") if key not in d]
        if missing:
            raise InputError(f"a source-aware interval dict lacks {', '.join(missing)}; pass what "
                             "SourceAwareInterval.to_dict() wrote.")

        def arr(values):
            return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)

        return cls(**{f.name: getattr(base, f.name) for f in fields(PriorInterval)},
                   source_prior=arr(d["source_prior"]), covariance=np.asarray(d["covariance"], dtype=np.float64),
                   covariance_target=np.asarray(d["covariance_target"], dtype=np.float64),
                   covariance_holdout=np.asarray(d["covariance_holdout"], dtype=np.float64),
                   weights_std_error=arr(d["weights_std_error"]), n_source=int(d["n_source"]),
                   calibrator=d.get("calibrator"), trustworthy=bool(d.get("trustworthy", True)),
                   reasons=list(d.get("reasons") or []))


# ---------------------------------------------------------------------------------------------------------------
# the calibrator's parameters: calibrated logits s_ic = sum_r X_icr theta_r (linear in theta)
# ---------------------------------------------------------------------------------------------------------------
class _Design:
    """The design of a scaling calibrator: blocks of parameters, each a 'scalar scale' (X_ic = z_ic, one
    parameter: 1/T), a 'vector scale' (X_icr = z_ic [c = r], k parameters) or 'bias' (X_icr = [c = r] for
    r = 1..k-1; b_0 is pinned, softmax being invariant to a common shift)."""

    def __init__(self, blocks: tuple[str, ...], k: int):
        self.blocks = blocks
        self.k = k
        sizes = {"scalar": 1, "vector": k, "bias": k - 1}
        self.sizes = [sizes[b] for b in blocks]
        self.q = sum(self.sizes)

    def row_mean(self, Z: np.ndarray, Wt: np.ndarray) -> np.ndarray:
        """(rows, q): sum_c Wt_ic X_icr (e.g. Wt = the calibrated probabilities: the mean of X under them)."""
        out = []
        for b in self.blocks:
            if b == "scalar":
                out.append(np.einsum("ic,ic->i", Wt, Z)[:, None])
            elif b == "vector":
                out.append(Wt * Z)
            else:
                out.append(Wt[:, 1:])
        return np.concatenate(out, axis=1)

    def weighted_sum(self, Z: np.ndarray, A: np.ndarray) -> np.ndarray:
        """(k, q): sum_i A_ic X_icr."""
        k = self.k
        out = []
        for b in self.blocks:
            if b == "scalar":
                out.append(np.einsum("ic,ic->c", A, Z)[:, None])
            elif b == "vector":
                out.append(np.diag(np.einsum("ic,ic->c", A, Z)))
            else:
                out.append(np.diag(A.sum(axis=0))[:, 1:] if k > 1 else np.zeros((k, 0)))
        return np.concatenate(out, axis=1)

    def cross(self, S: np.ndarray, Z: np.ndarray, Q: np.ndarray, StS: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(k, q): S^T row_mean(Z, Q) for Q = S diag(w), given StS = S^T S: a bias block's S^T Q[:, 1:] is
        StS[:, 1:] w[1:] (no second k^2 m product); the other blocks as row_mean."""
        out = []
        for b in self.blocks:
            if b == "scalar":
                out.append(S.T @ np.einsum("ic,ic->i", Q, Z)[:, None])
            elif b == "vector":
                out.append(S.T @ (Q * Z))
            else:
                out.append(StS[:, 1:] * w[None, 1:])
        return np.concatenate(out, axis=1)

    def products(self, P: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(X^T X, P^T X) for X = row_mean(Z, P): a bias block of X is P[:, 1:], so its columns of both come from
        one P^T P (the holdout's two rows x k^2 products become one; X^T X symmetrised)."""
        if "bias" not in self.blocks:
            return X.T @ X, P.T @ X
        PtP = P.T @ P
        starts = np.cumsum([0] + self.sizes)
        cols = [slice(starts[i], starts[i + 1]) for i in range(len(self.blocks))]
        px = np.empty((self.k, self.q))
        xx = np.empty((self.q, self.q))
        for b, c in zip(self.blocks, cols):
            px[:, c] = PtP[:, 1:] if b == "bias" else P.T @ X[:, c]
        for b, c in zip(self.blocks, cols):
            xx[c] = px[1:] if b == "bias" else X[:, c].T @ X
        return 0.5 * (xx + xx.T), px

    def gram(self, Z: np.ndarray, Wt: np.ndarray) -> np.ndarray:
        """(q, q): sum_i sum_c Wt_ic X_icr X_ics, from three (k,) sums in O(rows k) -- every block of X is z_ic or 1
        times an indicator of c (or of nothing, for the scalar), so the product of two blocks is diagonal in c
        (the dense (rows, k, q) design it replaces cost rows k q^2; docs/intervals.md)."""
        k = self.k
        s0 = Wt.sum(axis=0)
        s1 = np.einsum("ic,ic->c", Wt, Z)
        s2 = np.einsum("ic,ic->c", Wt, Z * Z)
        # X^a_ic X^b_ic per class c, as (power of z_ic, column of c in block a, in block b)
        power = {"scalar": 1, "vector": 1, "bias": 0}
        sums = (s0, s1, s2)
        out = np.zeros((self.q, self.q))
        starts = np.cumsum([0] + self.sizes)
        for i, a in enumerate(self.blocks):
            for j, b in enumerate(self.blocks):
                block = (_indicator_block(a, k) * sums[power[a] + power[b]]) @ _indicator_block(b, k).T
                out[starts[i]:starts[i + 1], starts[j]:starts[j + 1]] = block
        return out


def _indicator_block(block: str, k: int) -> np.ndarray:
    """(parameters of the block, k): which classes c each parameter r of a design block touches (X_icr = z_ic^p
    times this)."""
    if block == "scalar":
        return np.ones((1, k))
    if block == "vector":
        return np.eye(k)
    return np.eye(k)[1:]


def _calibrator_map(calibrator, k: int):
    """(design, scale, bias) of a fitted scaling calibrator: calibrated logits = scale * z + bias."""
    kind = getattr(calibrator, "kind", None)
    if kind not in SUPPORTED_CALIBRATORS or not getattr(calibrator, "is_fitted", False):
        if kind in SUPPORTED_CALIBRATORS:
            raise InputError(f"calibrator is a {kind} that is not fitted; pass the calibrator fit on "
                             "holdout_outputs, holdout_labels (e.g. BCTS().fit(holdout_outputs, holdout_labels)).")
        raise InputError(f"calibrator must be a fitted scaling calibrator ({', '.join(SUPPORTED_CALIBRATORS)}) "
                         f"of labelshift.calibration, got {calibrator!r}; the source-aware interval needs the "
                         "calibrator's parameters. For other calibrators use interval='bootstrap' or "
                         "interval='fisher' (which treat the calibrator as known).")
    if int(calibrator.n_classes_) != k:
        raise InputError(f"calibrator was fit on {calibrator.n_classes_} classes but the outputs have {k} "
                         "columns; pass the calibrator fit on this classifier's holdout outputs.")
    if kind == "TS":
        return _Design(("scalar",), k), 1.0 / calibrator.temperature_, np.zeros(k)
    if kind == "BCTS":
        return _Design(("scalar", "bias"), k), 1.0 / calibrator.temperature_, np.asarray(calibrator.bias_, float)
    if kind == "VS":
        return (_Design(("vector", "bias"), k), np.asarray(calibrator.scale_, float),
                np.asarray(calibrator.bias_, float))
    return _Design(("vector",), k), np.asarray(calibrator.scale_, float), np.zeros(k)


def _log_scores(calibrator, x: np.ndarray, name: str) -> np.ndarray:
    """The calibrator's view of raw outputs: logits as they are, probabilities as log(max(p, 1e-12))."""
    if calibrator.input_kind_ == "probs":
        if np.any(x < 0) or np.max(np.abs(x.sum(axis=1) - 1.0)) > 1e-4:
            raise InputError(f"{name} must be probabilities (this calibrator was fit on probabilities); pass the "
                             "classifier's raw outputs of the same kind as at fit.")
        return np.log(np.maximum(x, PROB_FLOOR))
    return x


# ---------------------------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------------------------
def _check_outputs(x, name: str, k: int | None, rows: bool = False) -> np.ndarray | PartitionedRows:
    """The outputs as a float array (or, ``rows``, the target's rows in partitions as they are, one (m, k) set),
    InputError when empty or not k columns wide."""
    if rows and is_partitioned(x):
        arr = x.single()
    else:
        arr = as_float_rows(x, name) if rows else as_float_array(x, name, 2)
    if arr.shape[0] == 0:
        raise InputError(f"{name} has no rows; pass the classifier's outputs on the {name.split('_')[0]} rows.")
    if k is not None and arr.shape[1] != k:
        raise InputError(f"{name} has {arr.shape[1]} class columns but holdout_outputs has {k}; pass outputs of the "
                         "same classifier on both.")
    return arr


def _given_weights(weights, k: int, ps: np.ndarray) -> np.ndarray:
    w = as_float_array(weights, "weights", 1)
    if w.shape != (k,) or np.any(w < -1e-9) or abs(float(w @ ps) - 1.0) > 1e-6:
        raise InputError("weights must be the MLLS estimate for these target rows with p_s = the mean calibrated "
                         "holdout prediction (k non-negative entries, sum_y w_y p_s(y) = 1); pass None to "
                         "solve MLLS here.")
    return np.maximum(w, 0.0)


def _check_given_gap(gap: float, m: int, k: int) -> None:
    """NotMaximiserError unless given weights' duality gap on the calibrated target rows made here (float64, from
    the raw outputs) is within what an MLLS maximiser solved on the same rows and p_s kept in float32 (as the
    library keeps a float32 target) can read as (:func:`~labelshift.inference.mlls_inputs.gap_tolerance`)."""
    tol = max(accepted_gap(m, k), gap_tolerance(m, k, _TARGET_ROWS_EPS))
    if gap > tol:
        raise NotMaximiserError(f"weights are not the MLLS maximiser for these target rows (duality gap {gap:.3g} > "
                                f"{tol:.3g}, more than float32 rounding of the rows explains); pass the MLLS weights "
                                "solved on these rows' calibrated outputs, or weights=None to solve MLLS here.")


def _calibrated_block(Xb: np.ndarray, calibrator, scale, bias) -> tuple[np.ndarray, np.ndarray]:
    """(Z, P) of a block of target rows, float64, as the whole-array code computes them."""
    Zb = _log_scores(calibrator, Xb.astype(np.float64), "target_outputs")
    return Zb, np.exp(log_softmax(Zb * scale + bias))


def _calibrated_rows(Xt: np.ndarray, calibrator, scale, bias) -> np.ndarray:
    """The calibrated target rows of a large set as a float32 (m, k) array (made block by block): for the MLLS
    solve without given weights and the target-only bound of pinned classes (float32 rounding, relative 1e-7).
    Raw outputs in partitions: the same rows made on each partition's worker and kept there
    (:meth:`~labelshift.partitions.PartitionedRows.derived`, this function per partition)."""
    if is_partitioned(Xt):
        return Xt.derived(_calibrated_rows, calibrator, scale, bias, dtype=np.float32)
    out = np.empty(Xt.shape, dtype=np.float32)
    for sl in _rows.blocks(Xt.shape[0], width=Xt.shape[1]):
        out[sl] = _calibrated_block(Xt[sl], calibrator, scale, bias)[1]
    return out


def _calibrated_probabilities(Xb: np.ndarray, calibrator, scale, bias) -> np.ndarray:
    """The calibrated rows of raw outputs Xb, float64 (the per-partition transform of rows kept on workers; a
    partition of no rows gives no rows)."""
    if Xb.shape[0] == 0:
        return np.empty(Xb.shape, dtype=np.float64)
    return _calibrated_block(Xb, calibrator, scale, bias)[1]


def _calibrated_dot(Xt: np.ndarray, calibrator, scale, bias, v: np.ndarray, float32: bool = False) -> np.ndarray:
    """(m,) float64 f_i^T v over the calibrated rows of a large target, made block by block ((m, c) for a (k, c)
    matrix v); ``float32``: of the rows rounded to float32 (as :func:`_calibrated_rows` holds them)."""
    out = np.empty(Xt.shape[:1] + np.shape(v)[1:])
    with _rows.pass_threads(Xt.shape[1]):
        for sl in _rows.blocks(Xt.shape[0], width=Xt.shape[1]):
            Pb = _calibrated_block(Xt[sl], calibrator, scale, bias)[1]
            out[sl] = (Pb.astype(np.float32).astype(np.float64) if float32 else Pb) @ v
    return out


def _target_pass_rows(Xt: np.ndarray, calibrator, scale, bias, design: "_Design", w: np.ndarray):
    """g = mean_i s_i, H = (1/m) sum_i s_i s_i^T and A = (1/m) sum_i d s_i / d theta over a large target, in one
    pass over row blocks with float64 sums (the whole-array formulas of :func:`source_aware_interval`). Raw outputs
    in partitions: :func:`_target_pass_sums` on each partition's worker (the calibrator sent along), the sums added
    in partition order."""
    m = Xt.shape[0]
    if is_partitioned(Xt):
        gs, H, A = add_in_order(Xt.run(_target_pass_sums, calibrator, scale, bias, design, w))
    else:
        gs, H, A = _target_pass_sums(Xt, calibrator, scale, bias, design, w)
    return gs / m, H / m, A / m


def _target_pass_sums(Xt: np.ndarray, calibrator, scale, bias, design: "_Design", w: np.ndarray):
    """The unnormalised sums of :func:`_target_pass_rows` over the raw outputs Xt (m, k): sum_i s_i,
    sum_i s_i s_i^T and sum_i d s_i / d theta, s_i = f_i / f_i^T w, calibrated a row block at a time."""
    m, k = Xt.shape
    gs = np.zeros(k)
    H = np.zeros((k, k))
    A = np.zeros((k, design.q))
    reuse = k > _HOLDOUT_ROWS_MIN_CLASSES        # above: a bias block's S^T Q from S^T S (_Design.cross)
    with _rows.pass_threads(k):
        for sl in _rows.blocks(m, width=k):
            Zb, Pb = _calibrated_block(Xt[sl], calibrator, scale, bias)
            Sb = Pb / (Pb @ w)[:, None]
            gs += Sb.sum(axis=0)
            StS = Sb.T @ Sb
            H += StS
            cross = design.cross(Sb, Zb, Sb * w, StS, w) if reuse else Sb.T @ design.row_mean(Zb, Sb * w)
            A += design.weighted_sum(Zb, Sb) - cross
    return gs, H, A


def _holdout_terms_rows(calibrator, Zh: np.ndarray, y: np.ndarray, design: _Design, scale, bias):
    """(J, p_s, psi, b_inf, a_map) of :func:`_holdout_fit`'s whole-array section -- the penalised NLL Hessian, the
    mean calibrated prediction, the holdout rows' penalised scores psi (n, q), whose influence on theta is
    psi a_map (a_map = -J^+; the product is left to the callers), and their influence on p_s (n, k) -- in two passes
    over row blocks with float64 sums (the same formulas; Zh may be float32 and is converted a block at a time), and the
    "fit on these rows" check from the score's sums. The whole-array section keeps five (n, k) float64 arrays and
    their temporaries (over 3 GB at n = 50,000, k = 1,000); this keeps the two results. The calibrated rows of the
    first pass wait in b_inf's rows for the second (one softmax pass, not two)."""
    n, k = Zh.shape
    q = design.q
    pen_grad, pen_hess = calibrator.penalty_terms() if hasattr(calibrator, "penalty_terms") else (0.0, 0.0)

    def scores(sl, Pb):
        Zb = Zh[sl].astype(np.float64)
        Rb = Pb.copy()
        Rb[np.arange(Rb.shape[0]), y[sl]] -= 1.0
        return Zb, design.row_mean(Zb, Rb) + pen_grad / n

    gram, xx, ws, px = np.zeros((q, q)), np.zeros((q, q)), np.zeros((k, q)), np.zeros((k, q))
    s_psi, ss_psi, s_p = np.zeros(q), np.zeros(q), np.zeros(k)
    b_inf = np.empty((n, k))
    for sl in _rows.blocks(n, width=k):
        Pb = b_inf[sl]
        Pb[...] = np.exp(log_softmax(Zh[sl].astype(np.float64) * scale + bias))
        Zb, psi_b = scores(sl, Pb)
        Xb = design.row_mean(Zb, Pb)
        gram += design.gram(Zb, Pb)
        xx_b, px_b = design.products(Pb, Xb)
        xx += xx_b
        ws += design.weighted_sum(Zb, Pb)
        px += px_b
        s_psi += psi_b.sum(axis=0)
        ss_psi += np.einsum("ir,ir->r", psi_b, psi_b)
        s_p += Pb.sum(axis=0)
    J = (gram - xx) / n + pen_hess / n
    Dp = (ws - px) / n
    mean = s_psi / n
    _check_fit_scores(calibrator, design, scale, mean, np.sqrt(np.maximum(ss_psi / n - mean ** 2, 0.0) / n))
    with _rows.one_blas_thread():                # k > _HOLDOUT_ROWS_MIN_CLASSES: rows.decomposition_threads
        Jinv = np.linalg.pinv(J, rcond=1e-14, hermitian=True)
    ps = s_p / n
    ps = ps / ps.sum()
    a_map = -Jinv                                # influence on theta = psi a_map: kept as psi (one product less)
    psi_to_p = a_map @ Dp.T
    psi = np.empty((n, q))
    for sl in _rows.blocks(n, width=k):
        Pb = b_inf[sl]
        _, psi[sl] = scores(sl, Pb)
        b_inf[sl] = (Pb - ps) + psi[sl] @ psi_to_p
    return J, ps, psi, b_inf, a_map


def _influence_rows(a_inf: np.ndarray, b_inf: np.ndarray, A: np.ndarray, G: np.ndarray,
                    Hinv: np.ndarray, a_map: np.ndarray | None = None) -> np.ndarray:
    """(a_inf A_G^T - b_inf[:, G]) H_GG^{-1}, the holdout rows' influence on w_G, a row block at a time (no (n, k)
    temporaries); with ``a_map``, a_inf a_map in place of a_inf (:class:`_HoldoutFit`)."""
    n, k = b_inf.shape
    out = np.empty((n, G.size))
    AG = A[G].T if a_map is None else a_map @ A[G].T
    for sl in _rows.blocks(n, width=k):
        out[sl] = (a_inf[sl] @ AG - b_inf[sl][:, G]) @ Hinv
    return out


def _pinned_column(y: int, F: np.ndarray, H: np.ndarray, Hinv_F: np.ndarray, g: np.ndarray, ps: np.ndarray, m: int,
                   n: int, a_inf: np.ndarray, b_inf: np.ndarray, A: np.ndarray, a_map: np.ndarray | None = None):
    """(w_u, target variance, holdout variance) of the pinned class y with y freed (G = F + {y}) -- the [y, y]
    entries that :func:`_free_set_covariance` (G) gives -- from the column h of H_GG^{-1} for y alone:
    by the bordered inverse (Schur complement s = H_yy - H_yF H_FF^{-1} H_Fy: h_y = 1 / s, h_F = -H_FF^{-1} H_Fy / s),
    O(k^2 + n k) where that costs a pseudo-inverse and (n, k) products (docs/intervals.md). None when s is not
    clearly positive (H_GG numerically singular): the caller then takes its pseudo-inverse."""
    b = H[F, y]
    u = Hinv_F @ b
    s = float(H[y, y] - b @ u)
    if not s > 1e-10 * float(H[y, y]):
        return None
    h = np.zeros(H.shape[0])                       # the column as a k-vector, 0 outside G
    h[F] = -u / s
    h[y] = 1.0 / s
    w_u = min(float(h @ (g - ps)), 0.0)            # unconstrained estimate of w_y (<= 0)
    vt = float(h @ H @ h - (h @ g) ** 2) / m
    theta_h = A.T @ h if a_map is None else a_map @ (A.T @ h)
    infl = a_inf @ theta_h - b_inf @ h             # the holdout rows' influence on w_y
    infl -= infl.mean()
    return w_u, vt, float(infl @ infl) / n ** 2


def _normal_bound(w_u: float, v: float, z: float) -> float:
    """The likelihood-ratio upper bound on a coordinate constrained to >= 0 whose unconstrained estimate w_u <= 0 is
    normal with variance v: the t >= 0 where (t - w_u)^2 - w_u^2 = z^2 v, i.e. w_u + sqrt(w_u^2 + z^2 v)."""
    return w_u + math.sqrt(w_u * w_u + z * z * max(v, 0.0))


def _few_holdout_rows(counts: np.ndarray, class_names=None) -> str | None:
    """The reason when some class has fewer than MIN_CLASS_HOLDOUT_ROWS labelled holdout rows (the normal
    approximation of the calibrator's and p_s's error then undercovers: ``docs/intervals.md``); None otherwise."""
    few = np.flatnonzero(counts < MIN_CLASS_HOLDOUT_ROWS)
    if not few.size:
        return None
    few = few[np.argsort(counts[few], kind="stable")]
    named = ", ".join(f"{class_label(y, class_names)} ({counts[y]} rows)" for y in few[:5]) + \
        (f" and {few.size - 5} more" if few.size > 5 else "")
    return (f"too few labelled holdout rows for an honest interval: {named}, below {MIN_CLASS_HOLDOUT_ROWS} "
            "(MIN_CLASS_HOLDOUT_ROWS); with so few rows of a class the error of its calibration is too far from "
            "normal for the interval to hold. Label more holdout rows of those classes")


def min_holdout_rows(calibrator_kind: str, k: int) -> int:
    """The smallest holdout accepted: MIN_ROWS_PER_PARAMETER rows per calibrator parameter, and at least 2 k.

    The sandwich rests on the normal approximation of the calibrator's M-estimate; ten rows per parameter is the
    usual rule of thumb for a logistic-type model (and the two-sample terms need a few rows per class). A holdout
    at this minimum gives an interval whose coverage is not measured in docs/intervals.md (n >= 500 is); one with
    few rows of some class is flagged by the identifiability checks instead."""
    q = {"TS": 1, "BCTS": k, "VS": 2 * k - 1, "NBVS": k}[calibrator_kind]
    return max(MIN_ROWS_PER_PARAMETER * q, 2 * k)


def _parameter_name(design: _Design, r: int) -> str:
    """Plain name of parameter r of the design: "1/T", "a_3" (the scale of class 3), "b_2" (the bias of class 2)."""
    for block, size in zip(design.blocks, design.sizes):
        if r < size:
            return {"scalar": "1/T (the inverse temperature)", "vector": f"a_{r} (the scale of class {r})",
                    "bias": f"b_{r + 1} (the bias of class {r + 1})"}[block]
        r -= size
    raise IndexError(r)  # pragma: no cover - r < design.q


def _check_fit_on_holdout(calibrator, design: _Design, scale, psi: np.ndarray) -> None:
    """InputError unless the calibrator's penalised NLL score psi (n, q) has mean 0 on these rows, as at its fit.

    A parameter fails the check when its mean score exceeds both _SCORE_TOL standard errors of that mean (a
    calibrator fit on other rows of the same size misses by about sqrt(2) of them) and the gradient at which the
    fit itself stops: max(tol, CONVERGED_GRADIENT) for the optimiser's parameter (log T for a temperature, whose
    score is s times that of s = 1/T). On a holdout the model separates, every row's score is tiny and so is its
    standard error; only the second bound then tells a fit on these rows, stopped at its tolerance, from one on
    other rows. The message names the parameter that fails by the widest margin."""
    _check_fit_scores(calibrator, design, scale, psi.mean(axis=0), psi.std(axis=0) / math.sqrt(psi.shape[0]))


def _check_fit_scores(calibrator, design: _Design, scale, score_mean: np.ndarray, score_se: np.ndarray) -> None:
    """:func:`_check_fit_on_holdout` from the mean penalised score and its standard error."""
    optimiser_score = score_mean.copy()
    if design.blocks[0] == "scalar":                               # the optimiser's log T: d/d log T = -s d/ds
        optimiser_score[0] *= float(np.ravel(scale)[0])
    stop = max(float(getattr(calibrator, "tol", 0.0)), CONVERGED_GRADIENT)
    margin = np.minimum(np.abs(score_mean) / np.maximum(_SCORE_TOL * score_se, 1e-300),
                        np.abs(optimiser_score) / stop)
    r = int(np.argmax(margin))
    if not margin[r] > 1.0:
        return
    unconverged = "" if getattr(calibrator, "converged_", True) else (
        " (its fit did not converge: refit it with a larger max_iter)")
    n_se = abs(score_mean[r]) / max(score_se[r], 1e-300)
    raise InputError(
        f"calibrator was not fit on these holdout rows{unconverged}: its mean NLL score (with the fit's prior) on "
        f"them in parameter {_parameter_name(design, r)} is {score_mean[r]:.3g}, {n_se:.3g} "
        f"standard errors (at most {_SCORE_TOL:g} of one, or a gradient of {stop:.0e}, at the fit). Pass the "
        f"holdout the calibrator was fit on, or refit it: {calibrator.kind}().fit(holdout_outputs, holdout_labels).")


# ---------------------------------------------------------------------------------------------------------------
# the interval
# ---------------------------------------------------------------------------------------------------------------
class _Inputs(NamedTuple):
    """The checked inputs of :func:`source_aware_interval` and the calibrator's view of them."""
    Xt: np.ndarray              # (m, k) raw target outputs (a large float32 set as it is)
    y: np.ndarray               # (n,) holdout labels
    counts: np.ndarray          # (k,) holdout rows per class
    n: int
    k: int
    m: int
    large: bool                 # the target is read in row blocks (labelshift.rows)
    holdout_rows: bool          # the holdout's terms are summed in row blocks (k > _HOLDOUT_ROWS_MIN_CLASSES)
    design: _Design
    scale: np.ndarray | float
    bias: np.ndarray
    kind: str
    Zh: np.ndarray              # (n, k) the calibrator's log scores of the holdout
    Zt: np.ndarray | None       # (m, k) those of the target (None when large)


class _HoldoutFit(NamedTuple):
    """The holdout's part: p_s, each holdout row's influence on theta and on p_s, and why theta is not trusted."""
    ps: np.ndarray              # (k,) p_s, the mean calibrated holdout prediction
    a_inf: np.ndarray           # (n, q) influence on theta
    b_inf: np.ndarray           # (n, k) influence on p_s
    reasons: list
    in_row_blocks: bool         # products with a_inf and b_inf are taken a row block at a time (_influence_rows)
    a_map: np.ndarray | None = None   # in row blocks: a_inf holds the scores psi (n, q), the influence is psi a_map


class _TargetFit(NamedTuple):
    """The target's part: the MLLS weights, g = mean_i s_i, the Hessian H and A = mean_i d s_i / d theta."""
    w: np.ndarray
    g: np.ndarray
    H: np.ndarray
    A: np.ndarray
    Pt: np.ndarray | None       # (m, k) calibrated target rows (None when large)
    # (k, k) per-row covariance of the scores s_i when target rows repeat: the clustered (1/m) sum_g c_g^2 (s_g - g)
    # (s_g - g)^T over distinct rows (labelshift.inference.repeats); None: the rows are independent, H - g g^T
    meat: np.ndarray | None = None


class _FreeSetCovariance(NamedTuple):
    """Target and holdout covariance of w_G on a free set G, the holdout rows' influence on w_G, and H_GG^{-1}."""
    target: np.ndarray
    holdout: np.ndarray
    influence: np.ndarray
    H_inv: np.ndarray


class _Covariances(NamedTuple):
    """The covariances of w and of p_t = p_s * w (target part, holdout part, total) and the holdout influence on
    p_t."""
    w_target: np.ndarray
    w: np.ndarray
    pt_target: np.ndarray
    pt_holdout: np.ndarray
    pt: np.ndarray
    pt_influence: np.ndarray
    free_H_inv: np.ndarray      # H_FF^{-1} on the free set F (for the bordered inverse of _pinned_column)


class _Bounds(NamedTuple):
    """The per-class intervals on p_t and w (total), those of the target-only part, and the standard errors."""
    lo: np.ndarray
    hi: np.ndarray
    w_lo: np.ndarray
    w_hi: np.ndarray
    t_w_lo: np.ndarray
    t_w_hi: np.ndarray
    se_pt: np.ndarray
    se_w: np.ndarray
    se_pt_t: np.ndarray


def _interval_inputs(holdout_outputs, holdout_labels, target_outputs, calibrator) -> _Inputs:
    """The inputs of :func:`source_aware_interval` checked (InputError as documented there) and read through the
    calibrator."""
    Xh = _check_outputs(holdout_outputs, "holdout_outputs", None,
                        rows=np.shape(holdout_outputs)[-1] > _HOLDOUT_ROWS_MIN_CLASSES)
    n, k = Xh.shape
    if k < 2:
        raise InputError(f"holdout_outputs has {k} class column; pass one column per class (at least 2).")
    Xt = _check_outputs(target_outputs, "target_outputs", k, rows=True)
    m = Xt.shape[0]
    large = _rows.is_large(Xt)
    design, scale, bias = _calibrator_map(calibrator, k)
    kind = calibrator.kind
    y = check_labels(holdout_labels, "holdout_labels", k, n_rows=n)
    counts = check_all_classes_present(
        y, k, "holdout_labels", why=": the calibrator's bias and p_s(y) of such a class are not estimable, so "
        "neither is its error. Add labelled holdout rows of those classes (and refit the calibrator on them).")
    n_min = min_holdout_rows(kind, k)
    if n < n_min:
        raise InputError(
            f"holdout_outputs has {n} rows, too few to refit a {kind} calibrator ({design.q} parameters) and "
            f"estimate its error: the source-aware interval needs at least {n_min} "
            f"(MIN_ROWS_PER_PARAMETER = {MIN_ROWS_PER_PARAMETER} per parameter). Label more holdout rows, or use "
            "interval='fisher', which treats the calibrator and p_s as known (and is too short when m is not small "
            "next to n).")
    Zh = _log_scores(calibrator, Xh, "holdout_outputs")
    Zt = None if large else _log_scores(calibrator, Xt, "target_outputs")
    return _Inputs(Xt=Xt, y=y, counts=counts, n=n, k=k, m=m, large=large,
                   holdout_rows=k > _HOLDOUT_ROWS_MIN_CLASSES, design=design, scale=scale, bias=bias, kind=kind,
                   Zh=Zh, Zt=Zt)


def _holdout_fit(inp: _Inputs, calibrator) -> _HoldoutFit:
    """The holdout's scores, NLL Hessian J and d p_s / d theta, and each holdout row's influence on (theta, p_s);
    InputError when the calibrator was not fit on these rows. Above _HOLDOUT_ROWS_MIN_CLASSES classes the same
    terms are summed over row blocks (:func:`_holdout_terms_rows`)."""
    n, y, design, Zh = inp.n, inp.y, inp.design, inp.Zh
    if inp.holdout_rows:
        J, ps, psi, b_inf, a_map = _holdout_terms_rows(calibrator, Zh, y, design, inp.scale, inp.bias)
        return _HoldoutFit(ps=ps, a_inf=psi, b_inf=b_inf, reasons=_unidentified_calibrator(J, inp.kind, calibrator),
                           in_row_blocks=True, a_map=a_map)
    Ph = np.exp(log_softmax(Zh * inp.scale + inp.bias))
    R = Ph.copy()
    R[np.arange(n), y] -= 1.0
    psi = design.row_mean(Zh, R)                                   # (n, q) per-row NLL score
    Xbar = design.row_mean(Zh, Ph)                                 # (n, q) mean of X under f
    J = (design.gram(Zh, Ph) - Xbar.T @ Xbar) / n                 # (1/n) sum_i X_i^T (diag f_i - f_i f_i^T) X_i
    # the fit's prior P (calibration/scaling.py): the penalised score psi_j + grad P / n is what is 0 at the fit,
    # and its Jacobian is J + hess P / n (docs/calibration.md)
    pen_grad, pen_hess = calibrator.penalty_terms() if hasattr(calibrator, "penalty_terms") else (0.0, 0.0)
    psi = psi + pen_grad / n
    J = J + pen_hess / n
    Dp = (design.weighted_sum(Zh, Ph) - Ph.T @ Xbar) / n           # (k, q) mean d f / d theta on the holdout
    _check_fit_on_holdout(calibrator, design, inp.scale, psi)
    reasons = _unidentified_calibrator(J, inp.kind, calibrator)
    a_inf = -psi @ np.linalg.pinv(J, rcond=1e-14, hermitian=True)   # (n, q) influence on theta (J symmetric)
    ps = Ph.mean(axis=0)
    ps = ps / ps.sum()
    b_inf = (Ph - ps) + a_inf @ Dp.T                               # (n, k) influence on p_s
    return _HoldoutFit(ps=ps, a_inf=a_inf, b_inf=b_inf, reasons=reasons, in_row_blocks=False)


def _unidentified_calibrator(J: np.ndarray, kind: str, calibrator) -> list:
    """Why the calibrator's parameters are not identified (NLL Hessian J ill-conditioned, temperature at its
    bound); empty when they are."""
    with _rows.decomposition_threads(int(calibrator.n_classes_)):
        ev = np.linalg.eigvalsh(J)
    reasons = []
    if not ev[0] > ev[-1] / _COND_MAX:
        reasons.append(f"the calibrator's parameters are not identified by the holdout: its NLL Hessian has "
                       f"condition number {ev[-1] / max(ev[0], 1e-300):.3g} > {_COND_MAX:.0e} (separable classes, "
                       "or a class the classifier never scores)")
    if kind in ("TS", "BCTS") and abs(math.log(calibrator.temperature_)) >= _LOG_T_BOUND - 1e-6:
        reasons.append(f"the calibrator's temperature {calibrator.temperature_:.3g} sits at its bound "
                       f"exp(+-{_LOG_T_BOUND:g}); the normal approximation of its error does not hold")
    return reasons


def _target_fit(inp: _Inputs, calibrator, ps: np.ndarray, weights) -> _TargetFit:
    """The calibrated target rows, the MLLS weights (solved, or the given ones checked by their duality gap), the
    Hessian H and A = mean d s_i / d theta."""
    Xt, m, large, design, scale, bias = inp.Xt, inp.m, inp.large, inp.design, inp.scale, inp.bias
    Pt = None if large else np.exp(log_softmax(inp.Zt * scale + bias))
    if weights is None:
        w = np.maximum(mlls_newton(Pt if not large else _calibrated_rows(Xt, calibrator, scale, bias),
                                   ps).weights, 0.0)
    else:
        w = _given_weights(weights, inp.k, ps)
    if large:
        # one large set: the calibrated rows are made block by block (never a whole (m, k) float64 array)
        g, H, A = _target_pass_rows(Xt, calibrator, scale, bias, design, w)
        gap = float(np.max(g / ps) - 1.0)
    elif weights is not None:
        gap = float(mlls_optimality(Pt, w, ps))
    if weights is not None:
        _check_given_gap(gap, m, inp.k)
    if not large:
        fw = Pt @ w
        scaled = Pt / fw[:, None]                                  # s_i = f_i / f_i^T w
        g = scaled.mean(axis=0)
        H = scaled.T @ scaled / m
        posterior = scaled * w                                     # target posterior q_i = w * f_i / f_i^T w
        # (k, q): d s_ic / d theta_r = s_ic (X_icr - E_q X_ir)
        A = (design.weighted_sum(inp.Zt, scaled) - design.cross(scaled, inp.Zt, posterior, H * m, w)) / m
    return _TargetFit(w=w, g=g, H=H, A=A, Pt=Pt)


def _clustered_target(inp: _Inputs, calibrator, tgt: _TargetFit, repeats) -> _TargetFit:
    """``tgt`` with the clustered score covariance of target rows that repeat (``repeats`` from
    :func:`labelshift.inference.repeats.find_repeats`, some copies counted as one draw); as it is otherwise."""
    if repeats is None or not repeats.adjusts:
        return tgt
    if is_partitioned(inp.Xt):
        raise TypeError("the clustered covariance of repeated target rows: " + NOT_PARTITIONED)
    repeats.check(inp.m)

    def scores(rows: np.ndarray) -> np.ndarray:
        F = (tgt.Pt[rows] if tgt.Pt is not None
             else _calibrated_rows(inp.Xt[rows], calibrator, inp.scale, inp.bias)).astype(np.float64)
        return F / (F @ tgt.w)[:, None]

    return tgt._replace(meat=clustered_covariance(scores, repeats, inp.k, tgt.g))


def _free_set_covariance(G: np.ndarray, tgt: _TargetFit, hold: _HoldoutFit, m: int, n: int) -> _FreeSetCovariance:
    """Target and holdout covariance of w_G (free set G), the holdout influence on w_G, and H_GG^{-1}."""
    HG = tgt.H[np.ix_(G, G)]
    with _rows.decomposition_threads(tgt.H.shape[0]):
        Hinv = np.linalg.pinv(HG, rcond=1e-14, hermitian=True)
    cov_s = HG - np.outer(tgt.g[G], tgt.g[G]) if tgt.meat is None else tgt.meat[np.ix_(G, G)]
    cov_t = Hinv @ cov_s @ Hinv / m
    if hold.in_row_blocks:                                         # the same, a row block at a time
        infl = _influence_rows(hold.a_inf, hold.b_inf, tgt.A, G, Hinv, hold.a_map)
    else:
        infl = (hold.a_inf @ tgt.A[G].T - hold.b_inf[:, G]) @ Hinv  # (n, |G|) influence of holdout rows on w_G
    infl -= infl.mean(axis=0)                                       # in place: one (n, |G|) array
    cov_h = infl.T @ infl / n ** 2
    return _FreeSetCovariance(target=cov_t, holdout=cov_h, influence=infl, H_inv=Hinv)


def _covariances(F: np.ndarray, tgt: _TargetFit, hold: _HoldoutFit, k: int, m: int, n: int) -> _Covariances:
    """The covariances of w and p_t = p_s * w on the free set F (0 on the pinned classes), target and holdout."""
    ps, w = hold.ps, tgt.w
    cov_t_F, cov_h_F, infl_F, Hinv_F = _free_set_covariance(F, tgt, hold, m, n)
    cov_w_t = np.zeros((k, k))
    cov_w_h = np.zeros((k, k))
    cov_w_t[np.ix_(F, F)] = cov_t_F
    cov_w_h[np.ix_(F, F)] = cov_h_F
    if hold.in_row_blocks:                                         # as below, without an (n, k) infl_w
        infl_pt = hold.b_inf * w
        for sl in _rows.blocks(n, width=k):                        # no (n, |F|) temporaries
            infl_pt[sl, F] += infl_F[sl] * ps[F]
        del infl_F
    else:
        infl_w = np.zeros((n, k))
        infl_w[:, F] = infl_F
        infl_pt = hold.b_inf * w + infl_w * ps                     # p_t = p_s * w: both move
    infl_pt -= infl_pt.mean(axis=0)
    cov_pt_h = infl_pt.T @ infl_pt / n ** 2
    cov_pt_t = cov_w_t * np.outer(ps, ps)
    return _Covariances(w_target=cov_w_t, w=cov_w_t + cov_w_h, pt_target=cov_pt_t, pt_holdout=cov_pt_h,
                        pt=cov_pt_t + cov_pt_h, pt_influence=infl_pt, free_H_inv=Hinv_F)


def _inflated(cov: _Covariances, level: float, kappa: float | None) -> tuple[_Covariances, float]:
    """``cov`` with the holdout's parts of p_t's and w's covariances counted kappa times, and kappa. kappa None:
    the largest over the classes of :func:`~labelshift.inference.holdout_conditional.interval_inflation` at p_t's
    own holdout shares, so that every class gets at least its own; one factor for all keeps the covariance of p_t
    positive semi-definite with (1, ..., 1) in its null space (p_t sums to 1). 1: ``cov`` as it is."""
    if kappa is None:
        kappa = float(np.max(interval_inflation(np.diag(cov.pt_target), np.diag(cov.pt_holdout), level)))
    if kappa == 1.0:
        return cov, 1.0
    pt_holdout = kappa * cov.pt_holdout
    w = cov.w_target + kappa * (cov.w - cov.w_target)
    return cov._replace(pt_holdout=pt_holdout, pt=cov.pt_target + pt_holdout, w=w), kappa


def _normal_bounds(prior: np.ndarray, w: np.ndarray, ps: np.ndarray, cov: _Covariances, z: float) -> _Bounds:
    """The normal intervals +- z se on p_t (clipped to [0, 1]) and on w (to [0, 1 / p_s]), total and
    target-only."""
    se_pt = np.sqrt(np.clip(np.diag(cov.pt), 0.0, None))
    se_w = np.sqrt(np.clip(np.diag(cov.w), 0.0, None))
    w_max = 1.0 / ps
    lo = np.clip(prior - z * se_pt, 0.0, 1.0)
    hi = np.clip(prior + z * se_pt, 0.0, 1.0)
    w_lo = np.clip(w - z * se_w, 0.0, w_max)
    w_hi = np.clip(w + z * se_w, 0.0, w_max)
    se_w_t = np.sqrt(np.clip(np.diag(cov.w_target), 0.0, None))
    t_w_lo = np.clip(w - z * se_w_t, 0.0, w_max)
    t_w_hi = np.clip(w + z * se_w_t, 0.0, w_max)
    return _Bounds(lo=lo, hi=hi, w_lo=w_lo, w_hi=w_hi, t_w_lo=t_w_lo, t_w_hi=t_w_hi, se_pt=se_pt, se_w=se_w,
                   se_pt_t=ps * se_w_t)


def _poorly_identified(F: np.ndarray, w: np.ndarray, cov_w: np.ndarray, class_names=None) -> str | None:
    """The reason when the worst direction of w's total covariance on F, relative to max(w_y, 1), has a standard
    error above MAX_STANDARD_ERROR; None otherwise."""
    # (an absolute bound of 1/2 on w, as for the target-only check, would flag every class with a large weight --
    # w_y = 6 known to +-10% -- while the point is whether the data pin w down: so the error is measured relative
    # to max(w_y, 1), which is the absolute 1/2 of labelshift.inference.identifiability for weights up to 1)
    if not F.size:
        return None
    scale_w = np.maximum(w[F], 1.0)
    rel = cov_w[np.ix_(F, F)] / np.outer(scale_w, scale_w)
    with _rows.decomposition_threads(len(w)):
        lam, vec = np.linalg.eigh(rel)
    worst = float(np.sqrt(max(lam[-1], 0.0)))
    if worst <= MAX_STANDARD_ERROR:
        return None
    top = int(F[np.argmax(np.abs(vec[:, -1]))])
    return (f"w is poorly identified: its standard error relative to max(w, 1) in the worst direction "
            f"(mostly {class_label(top, class_names)}) is {worst:.3g} > {MAX_STANDARD_ERROR:g}, target and holdout error "
            "together; more labelled holdout rows (or target rows) would narrow it")


def _target_only_upper(inp: _Inputs, calibrator, tgt: _TargetFit, ps: np.ndarray, free: np.ndarray, z: float,
                       level: float) -> np.ndarray:
    """The target-only profile-likelihood upper bounds on w of :func:`fisher_interval` (used for pinned classes).
    Raw outputs in partitions: on their calibrated rows kept on the workers (float32 above _BORDERED_MIN_CLASSES
    classes, as below), each Newton step one pass for all pinned classes
    (:func:`~labelshift.inference.intervals.pinned_bounds`)."""
    if is_partitioned(inp.Xt):
        calibrate = _calibrated_rows if inp.k > _BORDERED_MIN_CLASSES else _calibrated_probabilities
        rows = inp.Xt.derived(calibrate, calibrator, inp.scale, inp.bias,
                              dtype=np.float32 if inp.k > _BORDERED_MIN_CLASSES else np.float64)
        return _pinned_bounds(rows, tgt.w, tgt.H, ps, free, z)
    if inp.large:         # the target-only profile bound, on calibrated rows made block by block
        if inp.k > _BORDERED_MIN_CLASSES:        # one pass for all pinned classes, on the rows rounded to float32
            def rows_dot(v):
                return _calibrated_dot(inp.Xt, calibrator, inp.scale, inp.bias, v, float32=True)
        else:
            def rows_dot(v):
                return _calibrated_dot(inp.Xt, calibrator, inp.scale, inp.bias, v)
        return _pinned_bounds(None, tgt.w, tgt.H, ps, free, z, m=inp.m, rows_dot=rows_dot)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedWarning)
        return fisher_interval(tgt.Pt, tgt.w, ps, level=level).weights_upper


def _pinned_class_variances(yy: int, F: np.ndarray, tgt: _TargetFit, hold: _HoldoutFit, Hinv_F: np.ndarray, m: int,
                            n: int) -> tuple[float, float, float]:
    """(w_u, target variance, holdout variance) of the pinned class yy with yy freed (G = F + {yy}): above
    _BORDERED_MIN_CLASSES classes from one column of H_GG^{-1} (:func:`_pinned_column`), else (or when that column
    is numerically singular) from the free-set covariance on G."""
    ps = hold.ps
    if tgt.H.shape[0] > _BORDERED_MIN_CLASSES:
        one = _pinned_column(yy, F, tgt.H, Hinv_F, tgt.g, ps, m, n, hold.a_inf, hold.b_inf, tgt.A, hold.a_map)
        if one is not None:
            return one
    G = np.sort(np.append(F, yy))
    on_G = _free_set_covariance(G, tgt, hold, m, n)
    j = int(np.flatnonzero(G == yy)[0])
    w_u = min(float((on_G.H_inv @ (tgt.g[G] - ps[G]))[j]), 0.0)      # unconstrained estimate of w_y (<= 0)
    return w_u, float(on_G.target[j, j]), float(on_G.holdout[j, j])


def _pinned_class_bounds(inp: _Inputs, calibrator, tgt: _TargetFit, hold: _HoldoutFit, Hinv_F: np.ndarray,
                         free: np.ndarray, z: float, level: float, bounds: _Bounds, reasons: list,
                         class_names=None, kappa: float = 1.0) -> _Bounds:
    """The one-sided intervals [0, U_y] of the classes pinned at w_y = 0, written into ``bounds``' arrays (their
    standard errors become nan); appends to ``reasons`` each pinned class that is not identified. The holdout's
    variance counted ``kappa`` times (that of the free classes, :func:`_inflated`)."""
    ps, pinned, F = hold.ps, ~free, np.flatnonzero(free)
    w_max = 1.0 / ps
    t_upper = _target_only_upper(inp, calibrator, tgt, ps, free, z, level)
    for yy in np.flatnonzero(pinned):
        w_u, vt, vh = _pinned_class_variances(int(yy), F, tgt, hold, Hinv_F, inp.m, inp.n)
        vh *= kappa

        bounds.t_w_lo[yy], bounds.t_w_hi[yy] = 0.0, float(t_upper[yy])
        u = float(t_upper[yy]) + _normal_bound(w_u, vt + vh, z) - _normal_bound(w_u, vt, z)
        u = min(u, w_max[yy])
        bounds.w_lo[yy], bounds.w_hi[yy] = 0.0, u
        bounds.lo[yy], bounds.hi[yy] = 0.0, min(ps[yy] * u, 1.0)
        one_se = _normal_bound(w_u, vt + vh, 1.0)
        if not one_se <= MAX_STANDARD_ERROR:
            reasons.append(f"{class_label(yy, class_names)} is estimated at w = 0 but not identified: its "
                           f"one-standard-error bound on {weight_label(yy, class_names)} (normal model, target and "
                           f"holdout error) is {one_se:.3g} > "
                           f"{MAX_STANDARD_ERROR:g}")
    return bounds._replace(se_pt=np.where(pinned, np.nan, bounds.se_pt), se_w=np.where(pinned, np.nan, bounds.se_w),
                           se_pt_t=np.where(pinned, np.nan, bounds.se_pt_t))


def source_aware_interval(holdout_outputs, holdout_labels, target_outputs, calibrator, *, level: float = 0.95,
                          weights=None, repeats=None, class_names=None,
                          holdout_inflation=None) -> SourceAwareInterval:
    """Normal confidence intervals on the target prior p_t = p_s * w of MLLS (eq. (mlls-sample) of Garg et al.,
    NeurIPS 2020) whose covariance includes (a) the target sample, (b) the calibrator's parameters fit on the
    holdout and (c) p_s, the mean calibrated prediction on the holdout.

    The covariance is the M-estimation sandwich of the stacked estimating equations (on the holdout rows the
    calibrator's NLL score and f_theta(x_j) - p_s; on the target rows the MLLS optimality conditions on the free
    classes): the target-only Fisher covariance of :func:`~labelshift.inference.intervals.fisher_interval` plus
    the holdout rows' influence on p_t. Interval per class: p_t_hat(y) +- z se(y), z = Phi^{-1}((1 + level) / 2),
    clipped to [0, 1] (w: to [0, 1 / p_s(y)]). Classes pinned at w_y = 0 (w_y <= PIN_TOL) get the one-sided
    interval [0, U_y]: the target-only profile likelihood bound of fisher_interval, widened by the holdout's share.
    Derivation: ``docs/intervals.md`` ("The covariance (M-estimation sandwich)", "Classes pinned at w = 0").

    Given one holdout its error is fixed: the holdout's covariance counts kappa >= 1 times, the least with which a
    holdout at the 90th percentile of its error in a class covers it w.p. 0.90 (the largest over classes of
    :func:`~labelshift.inference.holdout_conditional.interval_inflation`; ``docs/intervals.md``, "Given one holdout").

    Args:
        holdout_outputs: (n, k) the classifier's raw outputs (logits, or probabilities if the calibrator was fit
            on probabilities) on the labelled source holdout the calibrator was fit on.
        holdout_labels: (n,) their labels 0..k-1; every class must occur.
        target_outputs: (m, k) the classifier's raw outputs on the target rows.
        calibrator: a TS, BCTS, VS or NBVS calibrator fit on exactly (holdout_outputs, holdout_labels) -- checked:
            its mean NLL score on these rows must be 0 to within 5% of a standard error.
        level: confidence level in (0, 1).
        weights: optional MLLS estimate w for the calibrated target rows and p_s = mean calibrated holdout
            prediction (checked by its duality gap, to within what float32 rounding of the rows explains:
            :func:`~labelshift.inference.mlls_inputs.gap_tolerance`); None solves MLLS here.
        repeats: optional :func:`~labelshift.inference.repeats.find_repeats` of the calibrated target rows: when
            rows repeat, the target part of the covariance takes each distinct row with its multiplicity as one
            cluster (the clustered meat of :func:`~labelshift.inference.repeats.clustered_covariance`) instead of
            m independent rows (``docs/intervals.md``, "Rows that repeat").
        class_names: optional k names the reasons call the classes by (else 0..k-1).
        holdout_inflation: None (default): kappa as above; a number >= 1 fixes it (1: valid on average over
            holdouts, as before). In ``extra["holdout_inflation"]``; ``covariance_holdout`` is inflated.

    Returns:
        :class:`SourceAwareInterval` (a PriorInterval with ``method="source-aware"``).

    Raises:
        InputError: level outside (0, 1); a holdout smaller than :func:`min_holdout_rows`; a class without a
            holdout example; an unsupported or unfitted calibrator, or one not fit on these holdout rows;
            mismatched shapes; NotMaximiserError (an InputError): weights that are not the MLLS estimate.
    """
    level = check_level(level, example="e.g. 0.95 for a 95% interval")
    kappa = check_inflation(holdout_inflation)
    inp = _interval_inputs(holdout_outputs, holdout_labels, target_outputs, calibrator)
    z = float(norm.ppf(0.5 * (1.0 + level)))
    hold = _holdout_fit(inp, calibrator)
    tgt = _clustered_target(inp, calibrator, _target_fit(inp, calibrator, hold.ps, weights), repeats)
    ps, w, m, n = hold.ps, tgt.w, inp.m, inp.n
    free = w > PIN_TOL
    cov, kappa = _inflated(_covariances(np.flatnonzero(free), tgt, hold, inp.k, m, n), level, kappa)
    prior = ps * w
    bounds = _normal_bounds(prior, w, ps, cov, z)
    reasons = hold.reasons
    for reason in (_poorly_identified(np.flatnonzero(free), w, cov.w, class_names),
                   _few_holdout_rows(inp.counts, class_names)):
        if reason:
            reasons.append(reason)
    pinned = ~free
    if pinned.any():
        bounds = _pinned_class_bounds(inp, calibrator, tgt, hold, cov.free_H_inv, free, z, level, bounds, reasons,
                                      class_names, kappa)
    fisher = PriorInterval(target_prior=prior, lower=np.clip(ps * bounds.t_w_lo, 0.0, 1.0),
                           upper=np.clip(ps * bounds.t_w_hi, 0.0, 1.0), weights=w, weights_lower=bounds.t_w_lo,
                           weights_upper=bounds.t_w_hi, std_error=bounds.se_pt_t, level=level, method="fisher",
                           pinned=pinned, n_target=m, extra={"z": z})

    return SourceAwareInterval(
        target_prior=prior, lower=bounds.lo, upper=bounds.hi, weights=w, weights_lower=bounds.w_lo,
        weights_upper=bounds.w_hi, std_error=bounds.se_pt, level=level, method=METHOD, pinned=pinned, n_target=m,
        extra={"z": z, "n_source": n, "calibrator": inp.kind, "n_parameters": inp.design.q,
               "holdout_inflation": kappa},
        source_prior=ps, covariance=cov.pt, covariance_target=cov.pt_target, covariance_holdout=cov.pt_holdout,
        weights_covariance=cov.w, weights_std_error=bounds.se_w, n_source=n, calibrator=inp.kind,
        trustworthy=not reasons, reasons=reasons, target_only=fisher, holdout_influence=cov.pt_influence,
        target_terms=(tgt.g[free], cov.free_H_inv) if inp.large else None)
