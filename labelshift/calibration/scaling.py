"""Scaling calibrators: temperature scaling and its bias-corrected and vector variants.

All four apply a softmax to an affine map of the log-scores z (logits, or log(max(p, 1e-12)) for probability
inputs) and are fit by minimising the mean negative log-likelihood of held-out labelled source outputs with
scipy's L-BFGS-B and analytic gradients (above :data:`LBFGS_MAX_CLASSES` classes: Newton's method with the exact
Hessian, ``docs/calibration.md``), starting from the identity map (T = 1 or a = 1, b = 0):

=========================  ============================  ==================================================
class                      map g(z)                      source
=========================  ============================  ==================================================
``TemperatureScaling``     softmax(z / T)                Guo et al. (ICML 2017)
``BCTS``                   softmax(z / T + b)            Alexandari et al. (ICML 2020); Appendix A of Garg
                                                         et al. (NeurIPS 2020)
``VectorScaling``          softmax(a * z + b)            Guo et al. (2017); Alexandari et al. (2020)
``NBVS``                   softmax(a * z)                Alexandari et al. (2020)
=========================  ============================  ==================================================

Parametrisation: T is optimised as log T (so T > 0; log T is kept in [-30, 30] to avoid overflow); a is per class
and unconstrained. The bias b is identified only up to an additive constant (softmax is invariant to adding the same
number to every class), so the optimiser pins b_0 = 0 and the fitted ``bias_`` is then centred to sum to zero, which
leaves the predictions unchanged.

The fit minimises the NLL plus a weak Gaussian prior (``prior_sd``, default :data:`PRIOR_SD` = 50): log T, a - 1 and
the centred biases b - mean(b) each ~ N(0, prior_sd^2), i.e. the total NLL plus P(theta) = |theta - theta_0|^2 /
(2 prior_sd^2) (the mean NLL plus P / n). On a holdout the model separates, the NLL alone has no minimum (it falls
towards 0 as T -> 0 and the biases run off); the prior gives the fit a unique, finite optimum there, and moves an
ordinary fit by well under 1% of a standard error. ``prior_sd=None`` fits the plain NLL (as before the prior existed).
Derivation, size and measured effect: ``docs/calibration.md``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import minimize

from ..errors import InputError
from ._base import PREDICT_BLOCK_ENTRIES, Calibrator, float_lists, log_probabilities, log_softmax

_LOG_T_BOUND = 30.0
#: standard deviation of the fit's Gaussian prior on log T, the vector scales a - 1 and the centred biases
#: (docs/calibration.md: large enough to move an ordinary fit by < 1% of a standard error, finite on separable data)
PRIOR_SD = 50.0
#: max |gradient| of the mean objective at which a fit that L-BFGS-B ends "ABNORMAL" still counts as converged
CONVERGED_GRADIENT = 1e-6
#: at most this many classes, the scaling calibrators are fit by L-BFGS-B; above it by Newton's method with the exact
#: Hessian (about ten passes over the rows, where L-BFGS-B took hundreds of iterations and over ten minutes at
#: k = 1,000, n = 50,000; docs/calibration.md). Fits at k <= LBFGS_MAX_CLASSES are as before, to the bit
LBFGS_MAX_CLASSES = 100
#: rows per block of a Newton pass (float64 temporaries of a block: 8 MB at k = 1,000)
_NEWTON_ROWS = 1024
#: largest |gradient| of the mean objective below which a Newton step reuses the last Hessian (near the optimum the
#: Hessian hardly moves, and its k^2 product is most of a pass)
_FRESH_HESSIAN_GRADIENT = 1e-4


class _ScalingCalibrator(Calibrator):
    """softmax(scale * z + bias) fit by NLL. Subclasses choose a temperature or a per-class scale, and a bias.

    Parameters:
        input_kind: see :class:`~labelshift.calibration.Calibrator`.
        max_iter: L-BFGS-B iterations at most.
        tol: L-BFGS-B's gradient tolerance on the mean objective.
        prior_sd: standard deviation of the Gaussian prior on log T, a - 1 and the centred biases (default
            :data:`PRIOR_SD`; see the module docstring); None fits the plain NLL, which has no optimum on a holdout
            the model separates.
    """

    _temperature: bool = True     # one temperature (scale = 1/T) instead of a per-class scale a
    _bias: bool = True            # per-class bias b (b_0 pinned to 0 while fitting)
    _settings = ("input_kind", "max_iter", "tol", "prior_sd")
    _reads_float32_blocks = True
    # a saved calibrator without settings.prior_sd was written before the prior existed and was fit without it
    _legacy_settings = {"prior_sd": None}

    def __init__(self, input_kind: str = "auto", max_iter: int = 1000, tol: float = 1e-9,
                 prior_sd: float | None = PRIOR_SD):
        super().__init__(input_kind=input_kind)
        self.max_iter = max_iter
        self.tol = tol
        self.prior_sd = prior_sd

    def _check_settings(self):
        super()._check_settings()
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise InputError(f"max_iter must be a positive integer, got {self.max_iter!r}.")
        if not isinstance(self.tol, (int, float, np.floating)) or not self.tol > 0:
            raise InputError(f"tol must be a positive number, got {self.tol!r}.")
        sd = self.prior_sd
        if sd is not None and (isinstance(sd, bool) or not isinstance(sd, (int, float, np.floating))
                               or not 0 < sd < np.inf):
            raise InputError(f"prior_sd must be a positive finite number (the standard deviation of the fit's prior "
                             f"on log T, the scales and the biases; default {PRIOR_SD:g}) or None for no prior, got "
                             f"{sd!r}.")

    # -- parameter vector theta: [log T] or [a_0..a_{k-1}], then [b_1..b_{k-1}] -------------------------------
    def _n_scale(self, k: int) -> int:
        return 1 if self._temperature else k

    def _initial_theta(self, k: int) -> np.ndarray:
        scale0 = np.zeros(1) if self._temperature else np.ones(k)   # log T = 0, or a = 1
        return np.concatenate([scale0, np.zeros(k - 1 if self._bias else 0)])

    def _unpack(self, theta: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ns = self._n_scale(k)
        scale = np.exp(-theta[:1]) if self._temperature else theta[:ns]
        bias = np.zeros(k)
        if self._bias:
            bias[1:] = theta[ns:]
        return scale, bias

    def _penalty(self, theta: np.ndarray, k: int) -> tuple[float, np.ndarray]:
        """The prior's P(theta) = (|scale part - its start|^2 + |b - mean(b)|^2) / (2 prior_sd^2) and its gradient
        (0 without a prior). The bias part is that of the centred biases, so it does not depend on which b is
        pinned; its gradient in the free b_j is (b_j - mean(b)) / prior_sd^2."""
        if self.prior_sd is None:
            return 0.0, np.zeros_like(theta)
        ns = self._n_scale(k)
        d = theta - self._initial_theta(k)
        if self._bias:
            b = np.concatenate([[0.0], theta[ns:]])
            d[ns:] = (b - b.mean())[1:]
            value = float(d[:ns] @ d[:ns] + np.sum((b - b.mean()) ** 2))
        else:
            value = float(d @ d)
        precision = 1.0 / float(self.prior_sd) ** 2
        return 0.5 * precision * value, precision * d

    def penalty_terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Gradient and Hessian of the fitted calibrator's prior P at its parameters, in the coordinates in which its
        calibrated logits are linear: the scale 1/T (TS, BCTS) or a (VS, NBVS), then the biases b_1..b_{k-1}
        (b_0 fixed). Zero without a prior. With s = 1/T the log-T prior is P = (log s)^2 / (2 sd^2), so
        dP/ds = log s / (s sd^2) and d2P/ds2 = (1 - log s) / (s^2 sd^2). For the sandwich of
        :func:`labelshift.inference.source_aware.source_aware_interval`, whose score is the NLL's plus grad P / n."""
        self._check_fitted()
        k = int(self.n_classes_)
        ns = self._n_scale(k)
        q = ns + (k - 1 if self._bias else 0)
        grad, hess = np.zeros(q), np.zeros((q, q))
        if self.prior_sd is None:
            return grad, hess
        precision = 1.0 / float(self.prior_sd) ** 2
        if self._temperature:
            log_s = -math.log(self.temperature_)
            s = 1.0 / self.temperature_
            grad[0] = precision * log_s / s
            hess[0, 0] = precision * (1.0 - log_s) / s ** 2
        else:
            grad[:ns] = precision * (np.asarray(self.scale_, float) - 1.0)
            hess[:ns, :ns] = precision * np.eye(ns)
        if self._bias:
            b = np.asarray(self.bias_, float)
            grad[ns:] = precision * (b - b.mean())[1:]
            hess[ns:, ns:] = precision * (np.eye(k - 1) - 1.0 / k)
        return grad, hess

    def _objective(self, theta: np.ndarray, z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean NLL of softmax(scale * z + bias) plus P(theta) / n (the prior, :meth:`_penalty`) and its gradient
        with respect to theta."""
        n, k = z.shape
        scale, bias = self._unpack(theta, k)
        logp = log_softmax(z * scale + bias)
        rows = np.arange(n)
        loss = -np.mean(logp[rows, y])
        resid = np.exp(logp)                 # d loss / d s_ij = (p_ij - 1[y_i = j]) / n
        resid[rows, y] -= 1.0
        resid /= n
        if self._temperature:                # scale = exp(-log T): d/d log T = -scale * sum(resid * z)
            g_scale = np.array([-scale[0] * np.sum(resid * z)])
        else:
            g_scale = np.sum(resid * z, axis=0)
        parts = [g_scale]
        if self._bias:
            parts.append(np.sum(resid, axis=0)[1:])
        penalty, g_penalty = self._penalty(theta, k)
        return float(loss + penalty / n), np.concatenate(parts) + g_penalty / n

    # -- fitting ---------------------------------------------------------------------------------------------
    def _fit(self, x, y, k, kind, prior):
        z = x if kind == "logits" else log_probabilities(x)
        theta0 = self._initial_theta(k)
        if k > LBFGS_MAX_CLASSES:
            theta, self.n_iter_, success, message, fun, grad = self._minimize_newton(z, y, theta0)
        else:
            theta, self.n_iter_, success, message, fun, grad = self._minimize_lbfgs(z, y, theta0)
        if not np.isfinite(fun) or fun > self.nll_before_:
            theta = theta0                   # never return a map worse than the identity on the fit data
        scale, bias = self._unpack(theta, k)
        self._set_fitted(scale, bias - bias.mean())
        grad_norm = float(np.max(np.abs(grad(theta))))
        self.converged_ = bool(success or grad_norm < CONVERGED_GRADIENT)
        if not self.converged_:
            warnings.warn(f"{type(self).__name__}: {'Newton' if k > LBFGS_MAX_CLASSES else 'L-BFGS'} did not "
                          f"converge in {self.n_iter_} iterations ({message}; max |gradient| {grad_norm:.2e}); raise "
                          "max_iter.", RuntimeWarning, stacklevel=3)
        if k > LBFGS_MAX_CLASSES:            # the mean NLL of the fitted map: the objective less the prior's part
            self.nll_after_ = float(fun - self._penalty(theta, k)[0] / z.shape[0]) if theta is not theta0 \
                else float(self.nll_before_)
        else:
            self.nll_after_ = float(-np.mean(self._log_proba_of_scores(z)[np.arange(z.shape[0]), y]))

    def _minimize_lbfgs(self, z, y, theta0):
        """L-BFGS-B from theta0 (k <= LBFGS_MAX_CLASSES): (theta, iterations, success, message, objective at
        theta, the gradient as a function of theta); sets ``nll_before_``."""
        ns = self._n_scale(z.shape[1])
        bounds = [(-_LOG_T_BOUND, _LOG_T_BOUND)] if self._temperature else [(None, None)] * ns
        bounds += [(None, None)] * (theta0.size - len(bounds))
        self.nll_before_ = self._objective(theta0, z, y)[0]
        res = minimize(self._objective, theta0, args=(z, y), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": int(self.max_iter), "gtol": float(self.tol), "ftol": 1e-15,
                                "maxcor": 20})
        # L-BFGS-B stops with "ABNORMAL" when the line search cannot improve in floating point, which at a
        # gradient this small just means it is at the optimum (the caller's CONVERGED_GRADIENT check)
        return res.x, int(res.nit), bool(res.success), res.message, res.fun, lambda t: self._objective(t, z, y)[1]

    def _minimize_newton(self, z, y, theta0):
        """Newton's method with the exact Hessian and a backtracking (Armijo) line search, from theta0, until the
        largest |gradient| of the mean objective is at most ``tol`` (k > LBFGS_MAX_CLASSES; docs/calibration.md).
        Each iteration is one pass over the rows in blocks (:meth:`_newton_pass`); the objective is the one
        L-BFGS-B minimises. Once the gradient is below _FRESH_HESSIAN_GRADIENT the Hessian of the last point that
        had one is reused (a chord step: no k^2 product; it is refreshed if its step finds no decrease). Returns
        what :meth:`_minimize_lbfgs` does; sets ``nll_before_``."""
        f, g, H = self._newton_pass(theta0, z, y, hessian=True)
        self.nll_before_ = f
        theta, it, fresh, message = theta0, 0, True, "iteration limit reached"
        while it < int(self.max_iter):
            if np.max(np.abs(g)) <= float(self.tol):
                message = "gradient below tol"
                break
            step = self._newton_step(theta, f, g, H, z, y, np.max(np.abs(g)) > _FRESH_HESSIAN_GRADIENT)
            if step is None and fresh:       # no decrease in floating point: at the optimum to rounding
                message = "line search found no decrease"
                break
            if step is None:
                H, fresh = self._newton_pass(theta, z, y, hessian=True)[2], True
                continue
            theta, f, g, H_step = step
            H, fresh, it = (H, False, it + 1) if H_step is None else (H_step, True, it + 1)
        success = bool(np.max(np.abs(g)) <= float(self.tol))
        return theta, it, success, message, f, lambda t: g if t is theta else self._newton_pass(t, z, y, False)[1]

    def _newton_step(self, theta, f, g, H, z, y, hessian: bool):
        """One damped Newton step: (theta', objective, gradient, Hessian if ``hessian`` else None) at the first
        t = 1, 1/2, 1/4, ... with the Armijo decrease (or, to rounding, no increase and a smaller gradient); None
        when t falls below 1e-10."""
        d = _newton_direction(H, g)
        t, slope, g_max = 1.0, float(g @ d), float(np.max(np.abs(g)))
        while t >= 1e-10:
            trial = theta + t * d
            if self._temperature:
                trial[0] = np.clip(trial[0], -_LOG_T_BOUND, _LOG_T_BOUND)
            ft, gt, Ht = self._newton_pass(trial, z, y, hessian=hessian)
            if ft <= f + 1e-4 * t * slope or (ft <= f and np.max(np.abs(gt)) < g_max):
                return trial, ft, gt, Ht
            t *= 0.5
        return None

    def _newton_pass(self, theta, z, y, hessian: bool):
        """(mean objective, its gradient in theta, its Hessian in theta or None) -- the objective of
        :meth:`_objective` -- in one pass over row blocks of _NEWTON_ROWS: no (n, k) temporary. The NLL's Hessian
        in the coordinates the logits are linear in (phi: 1/T or a, then b_1..b_{k-1}) is
        (1/n) sum_i [sum_c p_ic X_icr X_ics - xbar_ir xbar_is], xbar_i = sum_c p_ic X_ic (as the source-aware
        interval's J); then the chain rule to log T, and the prior's."""
        n, k = z.shape
        scale, bias = self._unpack(theta, k)
        sums = _NewtonSums(k, self._temperature, self._bias, hessian)
        nll = 0.0
        for a in range(0, n, _NEWTON_ROWS):
            zb, yb = z[a:a + _NEWTON_ROWS], y[a:a + _NEWTON_ROWS]
            rows = np.arange(yb.size)
            u = zb * scale + bias
            u -= u.max(axis=1, keepdims=True)
            u_y = u[rows, yb]
            np.exp(u, out=u)
            total = u.sum(axis=1)
            nll += float(np.sum(np.log(total) - u_y))
            u /= total[:, None]              # the calibrated probabilities p of the block
            sums.add(zb, yb, u, zb[rows, yb])
        g, H = sums.result(n)
        if self._temperature:                # phi_0 = s = exp(-log T): d/d log T = -s d/ds, d2 = s^2 d2/ds2 + s d/ds
            s = float(scale[0])
            if H is not None:
                H[0, 0] = s * s * H[0, 0] + s * g[0]
                H[0, 1:] *= -s
                H[1:, 0] *= -s
            g[0] *= -s
        penalty, g_penalty = self._penalty(theta, k)
        if H is not None and self.prior_sd is not None:
            H += self._penalty_hessian(k) / n
        return nll / n + penalty / n, g + g_penalty / n, H

    def _penalty_hessian(self, k: int) -> np.ndarray:
        """The Hessian of :meth:`_penalty` in theta (constant): 1 / prior_sd^2 times the identity on the scale part
        and (I - 1 1^T / k) on the free biases."""
        ns = self._n_scale(k)
        q = ns + (k - 1 if self._bias else 0)
        hess = np.eye(q)
        if self._bias:
            hess[ns:, ns:] -= 1.0 / k
        return hess / float(self.prior_sd) ** 2

    def _predict_proba(self, x):
        return np.exp(self._log_proba_rows(x))

    def predict_log_proba(self, outputs) -> np.ndarray:
        """Log of :meth:`predict_proba`, computed without underflow to -inf."""
        x = self._check_predict_outputs(outputs, "outputs")
        return self._log_proba_rows(x)

    def _log_proba_rows(self, x: np.ndarray) -> np.ndarray:
        """The calibrated log-probabilities of outputs x, float64. Above PREDICT_BLOCK_ENTRIES entries row block by
        row block into one output array (each row's arithmetic is the same; a float32 x is converted a block at a
        time): the whole-array form's float64 temporaries are four times the output (3.2 GB at 100,000 rows of
        1,000 classes)."""
        if x.size <= PREDICT_BLOCK_ENTRIES:
            return self._log_proba_of_scores(self._as_log_scores(x))
        out = np.empty(x.shape)
        step = max(1, PREDICT_BLOCK_ENTRIES // x.shape[1])
        for a in range(0, x.shape[0], step):
            out[a:a + step] = self._log_proba_of_scores(self._as_log_scores(x[a:a + step].astype(np.float64)))
        return out

    # -- subclass hooks --------------------------------------------------------------------------------------
    def _set_fitted(self, scale: np.ndarray, bias: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _log_proba_of_scores(self, z: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _fit_info(self) -> dict[str, Any]:
        return {"nll_before": float(self.nll_before_), "nll_after": float(self.nll_after_),
                "n_iter": int(self.n_iter_), "converged": bool(self.converged_)}

    def _read_fit_info(self, reader) -> None:
        info = reader.optional("fit_info", {}) or {}
        self.nll_before_ = float(info.get("nll_before", np.nan))
        self.nll_after_ = float(info.get("nll_after", np.nan))
        self.n_iter_ = int(info.get("n_iter", 0))
        self.converged_ = bool(info.get("converged", True))


class _NewtonSums:
    """Float64 sums over row blocks for :meth:`_ScalingCalibrator._newton_pass`: the NLL gradient in phi (1/T or a,
    then b_1..b_{k-1}) and, with ``hessian``, the per-class sums of p, p z, p z^2 and the products of the row means
    xbar (sum_c p_ic z_ic for 1/T, p_ic z_ic for a_c, p_ic for b_c)."""

    def __init__(self, k: int, temperature: bool, bias: bool, hessian: bool):
        self.k, self.temperature, self.bias, self.hessian = k, temperature, bias, hessian
        self.g_z, self.g_1 = np.zeros(k), np.zeros(k)       # sum_i (p_ic - 1[y_i = c]) z_ic, and without z
        if hessian:
            self.s0, self.s1, self.s2 = np.zeros(k), np.zeros(k), np.zeros(k)
            self.zz, self.zp = (0.0, np.zeros(k)) if temperature else (np.zeros((k, k)), np.zeros((k, k)))
            self.pp = np.zeros((k, k)) if bias else None

    def add(self, zb: np.ndarray, yb: np.ndarray, p: np.ndarray, z_y: np.ndarray) -> None:
        k = self.k
        pz = p * zb
        col_pz, col_p = pz.sum(axis=0), p.sum(axis=0)
        self.g_z += col_pz - np.bincount(yb, weights=z_y, minlength=k)
        self.g_1 += col_p - np.bincount(yb, minlength=k)
        if not self.hessian:
            return
        self.s0 += col_p
        self.s1 += col_pz
        self.s2 += np.einsum("ic,ic->c", pz, zb)
        if self.temperature:
            zbar = pz.sum(axis=1)
            self.zz += float(zbar @ zbar)
            if self.bias:
                self.zp += zbar @ p
        else:
            self.zz += pz.T @ pz
            if self.bias:
                self.zp += pz.T @ p
        if self.bias:
            self.pp += p.T @ p

    def result(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(gradient, Hessian or None) of the mean NLL in phi."""
        g = [np.array([self.g_z.sum()]) if self.temperature else self.g_z]
        if self.bias:
            g.append(self.g_1[1:])
        g = np.concatenate(g) / n
        if not self.hessian:
            return g, None
        if self.temperature:
            scale = np.array([[self.s2.sum() - self.zz]])
            cross = (self.s1 - self.zp)[None, 1:]
        else:
            scale = np.diag(self.s2) - self.zz
            cross = (np.diag(self.s1) - self.zp)[:, 1:]
        if not self.bias:
            return g, scale / n
        bias = (np.diag(self.s0) - self.pp)[1:, 1:]
        return g, np.block([[scale, cross], [cross.T, bias]]) / n


def _newton_direction(H: np.ndarray, g: np.ndarray) -> np.ndarray:
    """-H^{-1} g by Cholesky; where H is not positive definite (log T far from its optimum: the objective is convex
    in 1/T, not in log T), the eigenvalues are replaced by their absolute values, floored at 1e-10 of the largest."""
    try:
        return -cho_solve(cho_factor(H), g)
    except np.linalg.LinAlgError:
        lam, vec = np.linalg.eigh(H)
        lam = np.maximum(np.abs(lam), 1e-10 * np.max(np.abs(lam)))
        return -vec @ ((vec.T @ g) / lam)


class TemperatureScaling(_ScalingCalibrator):
    """Temperature scaling, g(z) = softmax(z / T) with T > 0 (Guo et al., ICML 2017).

    Fitted attributes: ``temperature_``, ``nll_before_`` / ``nll_after_`` (mean NLL on the fit data before and
    after), ``n_iter_``, ``converged_``.
    """

    kind = "TS"
    aliases = ("TemperatureScaling",)
    _temperature, _bias = True, False

    def _set_fitted(self, scale, bias):
        self.temperature_ = float(1.0 / scale[0])

    def _log_proba_of_scores(self, z):
        return log_softmax(z / self.temperature_)

    def _params_to_dict(self):
        return {"temperature": self.temperature_, "fit_info": self._fit_info()}

    def _params_from_dict(self, reader, k):
        self.temperature_ = reader.scalar("temperature", positive=True)
        self._read_fit_info(reader)


class BCTS(_ScalingCalibrator):
    """Bias-corrected temperature scaling, g_j(z) = softmax(z / T + b)_j with T > 0.

    Alexandari et al., "Maximum likelihood with bias-corrected calibration is hard-to-beat at label shift
    adaptation" (ICML 2020); the map is written out in Appendix A of Garg et al. (NeurIPS 2020) with z = log x for
    probability inputs x. ``bias_`` is centred (sums to 0); see the module docstring.

    Fitted attributes: ``temperature_``, ``bias_`` (k,), ``nll_before_``, ``nll_after_``, ``n_iter_``,
    ``converged_``.
    """

    kind = "BCTS"
    aliases = ("BiasCorrectedTemperatureScaling",)
    _temperature, _bias = True, True

    def _set_fitted(self, scale, bias):
        self.temperature_ = float(1.0 / scale[0])
        self.bias_ = bias

    def _log_proba_of_scores(self, z):
        return log_softmax(z / self.temperature_ + self.bias_)

    def _params_to_dict(self):
        return {"temperature": self.temperature_, "bias": float_lists(self.bias_), "fit_info": self._fit_info()}

    def _params_from_dict(self, reader, k):
        self.temperature_ = reader.scalar("temperature", positive=True)
        self.bias_ = reader.array("bias", (k,))
        self._read_fit_info(reader)


class VectorScaling(_ScalingCalibrator):
    """Vector scaling, g(z) = softmax(a * z + b) with a per-class scale a and bias b (Guo et al., ICML 2017;
    used for label shift by Alexandari et al., ICML 2020). ``bias_`` is centred (sums to 0).

    Fitted attributes: ``scale_`` (k,), ``bias_`` (k,), ``nll_before_``, ``nll_after_``, ``n_iter_``,
    ``converged_``.
    """

    kind = "VS"
    aliases = ("VectorScaling",)
    _temperature, _bias = False, True

    def _set_fitted(self, scale, bias):
        self.scale_ = np.array(scale, dtype=np.float64)
        self.bias_ = bias

    def _log_proba_of_scores(self, z):
        return log_softmax(z * self.scale_ + self.bias_)

    def _params_to_dict(self):
        return {"scale": float_lists(self.scale_), "bias": float_lists(self.bias_), "fit_info": self._fit_info()}

    def _params_from_dict(self, reader, k):
        self.scale_ = reader.array("scale", (k,))
        self.bias_ = reader.array("bias", (k,))
        self._read_fit_info(reader)


class NBVS(_ScalingCalibrator):
    """No-bias vector scaling, g(z) = softmax(a * z) with a per-class scale a (Alexandari et al., ICML 2020).

    Fitted attributes: ``scale_`` (k,), ``nll_before_``, ``nll_after_``, ``n_iter_``, ``converged_``.
    """

    kind = "NBVS"
    aliases = ("NoBiasVectorScaling",)
    _temperature, _bias = False, False

    def _set_fitted(self, scale, bias):
        self.scale_ = np.array(scale, dtype=np.float64)

    def _log_proba_of_scores(self, z):
        return log_softmax(z * self.scale_)

    def _params_to_dict(self):
        return {"scale": float_lists(self.scale_), "fit_info": self._fit_info()}

    def _params_from_dict(self, reader, k):
        self.scale_ = reader.array("scale", (k,))
        self._read_fit_info(reader)


TS = TemperatureScaling
VS = VectorScaling
BiasCorrectedTemperatureScaling = BCTS
NoBiasVectorScaling = NBVS
