"""Scaling calibrators: temperature scaling and its bias-corrected and vector variants.

All four apply a softmax to an affine map of the log-scores z (logits, or log(max(p, 1e-12)) for probability
inputs) and are fit by minimising the mean negative log-likelihood of held-out labelled source outputs with
scipy's L-BFGS-B and analytic gradients, starting from the identity map (T = 1 or a = 1, b = 0):

=========================  ============================  ==================================================
class                      map g(z)                      source
=========================  ============================  ==================================================
``TemperatureScaling``     softmax(z / T)                Guo et al. (ICML 2017)
``BCTS``                   softmax(z / T + b)            Alexandari et al. (ICML 2020); Appendix A of Garg
                                                         et al. (NeurIPS 2020)
``VectorScaling``          softmax(a * z + b)            Guo et al. (2017); Alexandari et al. (2020)
``NBVS``                   softmax(a * z)                Alexandari et al. (2020)
=========================  ============================  ==================================================

Parametrisation: T is optimised as log T (so T > 0; log T is kept in [-30, 30] to avoid overflow on separable
data); a is per class and unconstrained. The bias b is identified only up to an additive constant (softmax is
invariant to adding the same number to every class), so the optimiser pins b_0 = 0 and the fitted ``bias_`` is
then centred to sum to zero, which leaves the predictions unchanged.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy.optimize import minimize

from ..errors import InputError
from ._base import Calibrator, _floats, log_probabilities, log_softmax

_LOG_T_BOUND = 30.0


class _ScalingCalibrator(Calibrator):
    """softmax(scale * z + bias) fit by NLL. Subclasses choose a temperature or a per-class scale, and a bias."""

    _temperature: bool = True     # one temperature (scale = 1/T) instead of a per-class scale a
    _bias: bool = True            # per-class bias b (b_0 pinned to 0 while fitting)
    _settings = ("input_kind", "max_iter", "tol")

    def __init__(self, input_kind: str = "auto", max_iter: int = 1000, tol: float = 1e-9):
        super().__init__(input_kind=input_kind)
        self.max_iter = max_iter
        self.tol = tol

    def _check_settings(self):
        super()._check_settings()
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise InputError(f"max_iter must be a positive integer, got {self.max_iter!r}.")
        if not isinstance(self.tol, (int, float, np.floating)) or not self.tol > 0:
            raise InputError(f"tol must be a positive number, got {self.tol!r}.")

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

    def _objective(self, theta: np.ndarray, z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean NLL of softmax(scale * z + bias) and its gradient with respect to theta."""
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
        return float(loss), np.concatenate(parts)

    # -- fitting ---------------------------------------------------------------------------------------------
    def _fit(self, x, y, k, kind, prior):
        z = x if kind == "logits" else log_probabilities(x)
        theta0 = self._initial_theta(k)
        ns = self._n_scale(k)
        bounds = [(-_LOG_T_BOUND, _LOG_T_BOUND)] if self._temperature else [(None, None)] * ns
        bounds += [(None, None)] * (theta0.size - len(bounds))
        self.nll_before_ = self._objective(theta0, z, y)[0]
        res = minimize(self._objective, theta0, args=(z, y), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": int(self.max_iter), "gtol": float(self.tol), "ftol": 1e-15,
                                "maxcor": 20})
        theta = res.x
        if not np.isfinite(res.fun) or res.fun > self.nll_before_:
            theta = theta0                   # never return a map worse than the identity on the fit data
        scale, bias = self._unpack(theta, k)
        self._set_fitted(scale, bias - bias.mean())
        self.n_iter_ = int(res.nit)
        # L-BFGS-B stops with "ABNORMAL" when the line search cannot improve in floating point, which at a
        # gradient this small just means it is at the optimum
        grad_norm = float(np.max(np.abs(self._objective(theta, z, y)[1])))
        self.converged_ = bool(res.success or grad_norm < 1e-6)
        if not self.converged_:
            warnings.warn(f"{type(self).__name__}: L-BFGS did not converge in {self.n_iter_} iterations "
                          f"({res.message}; max |gradient| {grad_norm:.2e}); raise max_iter.", RuntimeWarning,
                          stacklevel=3)
        self.nll_after_ = float(-np.mean(self._log_proba_of_scores(z)[np.arange(z.shape[0]), y]))

    def _predict_proba(self, x):
        return np.exp(self._log_proba_of_scores(self._as_log_scores(x)))

    def predict_log_proba(self, outputs) -> np.ndarray:
        """Log of :meth:`predict_proba`, computed without underflow to -inf."""
        x = self._check_predict_outputs(outputs, "outputs")
        return self._log_proba_of_scores(self._as_log_scores(x))

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
        return {"temperature": self.temperature_, "bias": _floats(self.bias_), "fit_info": self._fit_info()}

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
        return {"scale": _floats(self.scale_), "bias": _floats(self.bias_), "fit_info": self._fit_info()}

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
        return {"scale": _floats(self.scale_), "fit_info": self._fit_info()}

    def _params_from_dict(self, reader, k):
        self.scale_ = reader.array("scale", (k,))
        self._read_fit_info(reader)


TS = TemperatureScaling
VS = VectorScaling
BiasCorrectedTemperatureScaling = BCTS
NoBiasVectorScaling = NBVS
