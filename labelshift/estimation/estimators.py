"""Label-shift estimators: estimate w(y) = p_t(y) / p_s(y) from labelled source outputs and unlabelled target outputs.

All share one API (see :class:`~labelshift.estimation.base.LabelShiftEstimator`)::

    est = MLLS().fit(source_probs, source_labels)        # optional source_prior=...
    res = est.estimate(target_probs)                      # (m, k) -> Estimate with (k,) arrays
    res = est.estimate(batch)                             # (S, m, k) or list of (m_s, k) -> arrays with axis S

Inputs are probability vectors (rows summing to 1): apply a calibrator (e.g. BCTS) or a softmax to logits first.
A batch is solved together, vectorised, and gives the same answer as one-at-a-time calls.

Estimators (Garg, Wu, Balakrishnan & Lipton, "A Unified View of Label Shift Estimation", NeurIPS 2020):
:class:`BBSE` (Section 4.1), :class:`RLLS` (Section 3), :class:`MLLS` (eq. (mlls-sample)), :class:`MLLSCM`
(eq. (cm-log)), :class:`MLLSBinned` (Section 6, Figure 2) and the :class:`PCC` baseline; the table of what each
computes is in ``docs/estimators.md``.

Conditioning is reported, never silent: each :class:`~labelshift.estimation.base.Estimate` carries
``ill_conditioned`` and the ``diagnostic`` behind it (sigma_min(C) for BBSE and RLLS; the minimum eigenvalue of
the negated MLLS Hessian, Section 5, for the MLLS family), and a flagged estimate raises an
:class:`~labelshift.errors.IllConditionedWarning`. The thresholds are :data:`BBSE_SINGULAR_SNR` (BBSE raises
:class:`~labelshift.errors.IllConditionedError` at ``fit``), :data:`BBSE_FLAG_SNR` and :data:`MLLS_FLAG_M_SIGMA`;
their derivation: ``docs/estimators.md`` ("Conditioning").
"""
from __future__ import annotations

import numpy as np

from . import solvers
from .. import rows as _rows
from .base import Estimate, LabelShiftEstimator
from ..errors import IllConditionedError, InputError

__all__ = ["BBSE", "RLLS", "MLLS", "MLLSCM", "MLLSBinned", "PCC", "Estimate",
           "BBSE_SINGULAR_SNR", "BBSE_FLAG_SNR", "MLLS_FLAG_M_SIGMA"]

#: BBSE raises when sigma_min(C) * sqrt(n_source) is below this (C indistinguishable from singular)
BBSE_SINGULAR_SNR = 1.0
#: BBSE and RLLS flag an estimate when sigma_min(C) * sqrt(n_source) is below this
BBSE_FLAG_SNR = 2.0
#: the MLLS family flags an estimate when m * sigma_free is below this (worst-direction standard error > 1/2)
MLLS_FLAG_M_SIGMA = 4.0


# -----------------------------------------------------------------------------------------------------------------
# parameter checks and the scikit-learn style repr
# -----------------------------------------------------------------------------------------------------------------
def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False, got {value!r}.")


def _check_positive(value, name, integer=False):
    kind = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kind) or not np.isfinite(value) or value <= 0:
        what = "a positive integer" if integer else "a positive number"
        raise InputError(f"{name} must be {what}, got {value!r}.")


class _Params:
    _param_names: tuple[str, ...] = ()

    def get_params(self) -> dict:
        """Constructor arguments as a dict."""
        return {name: getattr(self, name) for name in self._param_names}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


# -----------------------------------------------------------------------------------------------------------------
# confusion-matrix estimators: BBSE, RLLS
# -----------------------------------------------------------------------------------------------------------------
class _ConfusionEstimator(_Params, LabelShiftEstimator):
    """Shared fit of BBSE and RLLS: the joint confusion matrix and its conditioning."""

    soft: bool
    _raise_if_singular = True

    def _fit(self, probs, labels):
        self._check_params()
        k = self.n_classes_
        n = labels.shape[0]
        joint = solvers.confusion_matrix(probs, labels, k, soft=self.soft)
        empirical = np.bincount(labels, minlength=k) / n
        # C[:, y] = p_s(yhat | y) p_s(y): the joint matrix, re-weighted if the caller gave another source prior
        # (the factor is exactly 1.0 for the default empirical prior, so C is then the joint matrix itself)
        self.confusion_ = joint * (self.source_prior_ / empirical)[None, :]
        with _rows.decomposition_threads(k):
            self.singular_values_ = np.linalg.svd(self.confusion_, compute_uv=False)
        self.sigma_min_ = float(self.singular_values_[-1])
        self.n_source_ = int(n)
        snr = self.sigma_min_ * np.sqrt(n)
        if self._raise_if_singular and snr < BBSE_SINGULAR_SNR:
            kind = "soft" if self.soft else "hard"
            never = np.flatnonzero(self.confusion_.sum(axis=1) == 0)
            hint = (f" Classes {never.tolist()} are never predicted on the source data." if never.size else "")
            raise IllConditionedError(
                f"source_probs give a singular or near-singular {kind} confusion matrix: its smallest singular value "
                f"{self.sigma_min_:.3g} is below the sampling noise 1/sqrt(n) = {1 / np.sqrt(n):.3g} of its entries "
                f"(n = {n} source examples), so BBSE cannot identify w.{hint} Fix: add labelled source data, merge "
                "classes the classifier confuses, use the soft confusion matrix (BBSE(soft=True)), or use RLLS or "
                "MLLS.", value=self.sigma_min_)
        self.ill_conditioned_ = bool(snr < BBSE_FLAG_SNR)

    def _conditioning(self, S):
        return dict(diagnostic=np.full(S, self.sigma_min_), ill_conditioned=np.full(S, self.ill_conditioned_))

    def _target_means(self, probs, mask):
        return solvers.mean_prediction(probs, mask, soft=self.soft)


class BBSE(_ConfusionEstimator):
    """Black Box Shift Estimation (Lipton, Wang & Smola, ICML 2018); Section 4.1 of Garg et al. (NeurIPS 2020).

    With the joint confusion matrix C[i, j] = p_s(yhat = i, y = j) estimated on the labelled source outputs and
    mu_t(i) = p_t(yhat = i) on the target outputs, label shift gives mu_t = C w, so w = C^{-1} mu_t. Hard: yhat is
    the argmax prediction; soft (``soft=True``): the one-hot prediction is replaced by the probability vector
    f(x) in both C and mu_t. The solution is not constrained: noisy mu_t can give negative weights (the reported
    ``target_prior`` clips them at 0 and renormalises; ``weights`` are returned as solved).

    Raises :class:`~labelshift.errors.IllConditionedError` at ``fit`` when C is singular or near-singular
    (sigma_min(C) sqrt(n) < 1; ``docs/estimators.md``) and flags estimates when sigma_min(C) sqrt(n) < 2.

    Fitted attributes: ``confusion_`` (k x k, index [predicted, true], entries sum to 1), ``singular_values_``,
    ``sigma_min_``, ``n_source_``, ``ill_conditioned_``, ``source_prior_``, ``n_classes_``.
    """

    _param_names = ("soft",)

    def __init__(self, soft: bool = False):
        self.soft = soft

    @property
    def name(self):
        return "BBSE-soft" if self.soft else "BBSE-hard"

    def _check_params(self):
        _check_bool(self.soft, "soft")

    def _solve(self, probs, mask):
        mu = self._target_means(probs, mask)
        return dict(weights=solvers.bbse_solve(self.confusion_, mu), **self._conditioning(probs.shape[0]))


class RLLS(_ConfusionEstimator):
    """Regularized Learning under Label Shift (Azizzadenesheli, Liu, Yang & Anandkumar, ICLR 2019, eq. (6)).

        theta = argmin_{theta >= -1} ||C theta - b||_2 + rho ||theta||_2,   b = mu_t - C 1,   w = 1 + theta,

    with *unsquared* norms (a second-order cone program, solved by :func:`labelshift.estimation.solvers.rlls_solve` to
    an objective gap of ``tol``). C and mu_t are as in :class:`BBSE` (hard, or soft with ``soft=True``). With ``rho=0``
    and a BBSE solution satisfying w >= 0, RLLS returns the BBSE solution.

    Args:
        soft: use the soft confusion matrix and soft target means.
        delta: confidence level of the default rho.
        rho: regularisation strength; ``None`` (default) uses the authors' rho = 3 Delta_C with
            Delta_C = 2 log(2k/delta) / (3n) + sqrt(2 log(2k/delta) / n), n the number of source examples
            (:func:`labelshift.estimation.solvers.rlls_rho`; the ``compute_3deltaC`` of their public code).
        rho_scale: multiplies the default rho. The theory's value is 1; the authors' experiments and public code
            use 0.01 times it (abstention's RLLS default ``alpha=0.01``); pass ``rho_scale=0.01`` to reproduce them.
        tol, max_iter: interior-point tolerance (objective gap) and iteration cap.

    RLLS never raises for an ill-conditioned C (regularisation is its remedy); it flags as BBSE does.
    Fitted attributes: those of :class:`BBSE` plus ``rho_``.
    """

    _param_names = ("soft", "delta", "rho", "rho_scale", "tol", "max_iter")
    _raise_if_singular = False

    def __init__(self, soft: bool = False, delta: float = 0.05, rho: float | None = None, rho_scale: float = 1.0,
                 tol: float = 1e-10, max_iter: int = 500):
        self.soft = soft
        self.delta = delta
        self.rho = rho
        self.rho_scale = rho_scale
        self.tol = tol
        self.max_iter = max_iter

    @property
    def name(self):
        return "RLLS-soft" if self.soft else "RLLS-hard"

    def _check_params(self):
        _check_bool(self.soft, "soft")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float, np.floating)) or \
                not 0 < self.delta < 1:
            raise InputError(f"delta must be a probability in (0, 1), got {self.delta!r}.")
        if self.rho is not None and (isinstance(self.rho, bool) or not isinstance(self.rho, (int, float, np.floating))
                                     or not np.isfinite(self.rho) or self.rho < 0):
            raise InputError(f"rho must be None or a non-negative number, got {self.rho!r}.")
        _check_positive(self.rho_scale, "rho_scale")
        _check_positive(self.tol, "tol")
        _check_positive(self.max_iter, "max_iter", integer=True)

    def _fit(self, probs, labels):
        super()._fit(probs, labels)
        if self.rho is None:
            self.rho_ = self.rho_scale * solvers.rlls_rho(self.n_classes_, self.n_source_, self.delta)
        else:
            self.rho_ = float(self.rho)

    def _solve(self, probs, mask):
        mu = self._target_means(probs, mask)
        res = solvers.rlls_solve(self.confusion_, mu, self.rho_, tol=self.tol, max_iter=self.max_iter)
        return dict(weights=res.weights, converged=res.converged, iterations=res.iterations,
                    **self._conditioning(probs.shape[0]))


# -----------------------------------------------------------------------------------------------------------------
# MLLS family
# -----------------------------------------------------------------------------------------------------------------
_SOLVERS = ("newton", "em")
_DEFAULT_MAX_ITER = {"newton": 200, "em": 100_000}
#: classes above which an MLLS estimate keeps its negated Hessian in ``Estimate.extra["hessian"]``, so that the
#: identifiability report reuses it (a k^2 m product: issue 20)
KEEP_HESSIAN_CLASSES = 100


class _MLLSBase(_Params, LabelShiftEstimator):
    """Shared machinery of the MLLS estimators: the solver call and the Hessian diagnostics."""

    _param_names = ("solver", "tol", "max_iter")

    def __init__(self, solver: str = "newton", tol: float = 1e-10, max_iter: int | None = None):
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter

    def _fit(self, probs, labels):
        self._check_params()

    def _check_params(self):
        if self.solver not in _SOLVERS:
            raise InputError(f"solver must be one of {_SOLVERS}, got {self.solver!r}.")
        _check_positive(self.tol, "tol")
        if self.max_iter is not None:
            _check_positive(self.max_iter, "max_iter", integer=True)

    def _mlls(self, rows, weights) -> dict:
        """Solve eq. (mlls-sample) for a batch of (S, R, k) rows with (S, R) row weights (0/1 or counts)."""
        max_iter = self.max_iter if self.max_iter is not None else _DEFAULT_MAX_ITER[self.solver]
        solve = solvers.mlls_newton if self.solver == "newton" else solvers.mlls_em
        res = solve(rows, self.source_prior_, weights, tol=self.tol, max_iter=max_iter)
        # the Newton solver's last Hessian where it was taken at the solution (a large set), else one more pass
        H = res.hessian if res.hessian is not None else solvers.mlls_hessian(rows, res.weights, weights)
        with _rows.decomposition_threads(H.shape[-1]):
            sigma = np.linalg.eigvalsh(H)[:, 0]
            sigma_free = solvers.restricted_min_eigenvalue(H, res.weights > solvers.PIN_TOL)
        m = weights.sum(axis=1)
        ill = ~(m * np.nan_to_num(sigma_free, nan=0.0) >= MLLS_FLAG_M_SIGMA)
        extra = dict(sigma_free=sigma_free, duality_gap=res.optimality)
        if H.shape[-1] > KEEP_HESSIAN_CLASSES:
            extra["hessian"] = H
        return dict(weights=res.weights, converged=res.converged, iterations=res.iterations, diagnostic=sigma,
                    ill_conditioned=ill, extra=extra)


class MLLS(_MLLSBase):
    """Maximum Likelihood Label Shift, eq. (mlls-sample) of Garg et al. (NeurIPS 2020), Section 4.2:

        w_hat = argmax_{w in W} (1/m) sum_i log f(x_i)^T w,   W = {w >= 0, sum_y w_y p_s(y) = 1},

    where f = the calibrated source posterior p_s(y | x) (pass calibrated probabilities, e.g. BCTS outputs; by
    Theorem (consistency) MLLS is consistent when f is canonically calibrated).

    Args:
        solver: ``"newton"`` (default) -- :func:`labelshift.estimation.solvers.mlls_newton`: a SQUAREM-accelerated EM
            warm start (Varadhan & Roland 2008) in float32, then a few float64 Newton steps on the face of W it points
            to, certified by the duality gap; the primal-dual interior-point method (``method="ipm"`` of the solver) is
            its fallback. Robust under severe shift and several times faster than EM there. Or ``"em"`` -- the EM
            algorithm of Saerens, Latinne & Decaestecker (2002), :func:`labelshift.estimation.solvers.mlls_em`, which
            converges slowly when the optimum lies on the boundary of W. Both stop on a tight optimality test
            (Frank-Wolfe duality gap <= tol and a step / error estimate <= tol), not on an iteration cap, and reach the
            same optimum.
        tol: accuracy of w (max-norm) and duality-gap tolerance (default 1e-10).
        max_iter: iteration cap (default 200 for Newton, 100000 for EM); problems that hit it are reported as not
            converged (``Estimate.converged``) with a warning.

    p_s(y) (``source_prior_``) enters both W and the EM ratio. It defaults to the empirical label frequencies of
    the source data the estimator is fit on, which is what a predictor calibrated on that data is consistent
    with (a calibrated f satisfies E_s[f(x)] = p_s(y); BCTS, fit by NLL with class biases, matches the label
    frequencies on its fit data). Pass ``source_prior`` to ``fit`` to override.

    ``Estimate.diagnostic`` is sigma, the minimum eigenvalue of the negated Hessian at the solution (Section 5,
    eq. (bound-main)); ``Estimate.extra`` holds ``sigma_free`` (the flag's basis: ``docs/estimators.md``) and
    ``duality_gap``, and above KEEP_HESSIAN_CLASSES classes ``hessian`` (the negated Hessian at w_hat).
    """

    name = "MLLS"

    def _solve(self, probs, mask):
        return self._mlls(probs, mask)


def _calibration():
    from .. import calibration  # imported when needed: the calibrators are only used by MLLS-CM / MLLS-binned
    return calibration


class MLLSCM(_MLLSBase):
    """MLLS with the hard confusion-matrix calibration (MLLS-CM), eq. (cm-log) of Garg et al. (NeurIPS 2020):

        max_{w in W} (1/m) sum_i log sum_y p_s(y | yhat(x_i)) w_y,   yhat(x) = argmax f_hat(x),

    where p_s(y | yhat) is the yhat-th row of the hard joint confusion matrix (index [predicted, true]),
    normalised -- the predictor of :class:`labelshift.calibration.ConfusionMatrixCalibrator`, which is calibrated
    (Proposition (ltt-calib)). It is the BBSE analogue inside MLLS (Section 4.4). A target set enters only through
    its predicted-class counts, so the problem is solved on k weighted rows.

    Args and diagnostics as :class:`MLLS`. Fitted attributes: ``calibrator_``, ``rows_`` (k x k, p_s(y | yhat)).
    """

    name = "MLLS-CM"

    def _fit(self, probs, labels):
        self._check_params()
        k = self.n_classes_
        self.calibrator_ = _calibration().ConfusionMatrixCalibrator(input_kind="probs").fit(probs, labels)
        self.rows_ = self.calibrator_.predict_proba(np.eye(k))   # row yhat: p_s(y | argmax = yhat)

    def _solve(self, probs, mask):
        S, M, k = probs.shape
        counts = np.matmul(mask[:, None, :], solvers.one_hot_argmax(probs))[:, 0, :]   # (S, k) predicted counts
        rows = np.broadcast_to(self.rows_, (S, k, k))
        return self._mlls(rows, counts)


class MLLSBinned(_MLLSBase):
    """MLLS on a binned calibration of the predictor (Section 6 and Figure 2 of Garg et al., NeurIPS 2020).

    f(x) = p_s(y | bin(x)), the source label frequencies in x's bin, from
    :class:`labelshift.calibration.BinningCalibrator` (``n_bins`` bins of p(y=1|x) for two classes; bins of
    (predicted class, confidence) otherwise). Aggregating a calibrated predictor keeps it calibrated but loses
    information: with fewer bins the minimum Hessian eigenvalue sigma falls and the MSE rises (Figure 2). A target
    set enters only through its bin counts, so the problem is solved on the bins' rows.

    Args: ``n_bins`` and ``strategy`` (``"uniform"`` or ``"quantile"``) of the binning calibrator; the rest as
    :class:`MLLS`. Fitted attributes: ``calibrator_``, ``rows_`` (n_cells x k predicted probabilities per cell).
    """

    name = "MLLS-binned"
    _param_names = ("n_bins", "strategy", "solver", "tol", "max_iter")

    def __init__(self, n_bins: int = 10, strategy: str = "uniform", solver: str = "newton", tol: float = 1e-10,
                 max_iter: int | None = None):
        self.n_bins = n_bins
        self.strategy = strategy
        super().__init__(solver, tol, max_iter)

    def _fit(self, probs, labels):
        self._check_params()
        cal = _calibration().BinningCalibrator(n_bins=self.n_bins, strategy=self.strategy, input_kind="probs")
        self.calibrator_ = cal.fit(probs, labels)
        self.rows_ = cal.bin_probs_.reshape(-1, self.n_classes_)

    def _solve(self, probs, mask):
        S, M, k = probs.shape
        n_cells = self.rows_.shape[0]
        cells = self.calibrator_.assign_bins(probs.reshape(S * M, k)).reshape(S, M)
        flat = (np.arange(S)[:, None] * n_cells + cells).ravel()
        counts = np.bincount(flat, weights=mask.ravel(), minlength=S * n_cells).reshape(S, n_cells)
        rows = np.broadcast_to(self.rows_, (S, n_cells, k))
        return self._mlls(rows, counts)


# -----------------------------------------------------------------------------------------------------------------
# baseline
# -----------------------------------------------------------------------------------------------------------------
class PCC(_Params, LabelShiftEstimator):
    """Probabilistic classify-and-count (mean prediction) baseline: p_t(y) ~ (1/m) sum_i f_y(x_i), w = that / p_s.

    Biased under label shift (it ignores that f is a *source* posterior: E_t[f(x)] = C_soft w, not w p_s), so it
    serves as the no-correction reference point against which the estimators of Garg et al. are compared.
    """

    name = "PCC"

    def _fit(self, probs, labels):
        pass

    def _solve(self, probs, mask):
        mu = solvers.mean_prediction(probs, mask, soft=True)
        return dict(weights=mu / self.source_prior_)
