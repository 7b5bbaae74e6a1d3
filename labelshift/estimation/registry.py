"""One registry of the estimators by name: the sweeps, the ``reestimate`` flow and the CLI all build from it.

Each name maps to an :class:`EstimatorSpec`: how to build a fresh, unfitted estimator and what it offers (an MLLS
likelihood, and so the Fisher interval and the Hessian diagnostic of Section 5; whether re-estimation may use it).
Names are the paper's (Section 6): ``RLLS`` is RLLS on the hard confusion matrix, ``MLLS-binned`` needs a number
of bins.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["EstimatorSpec", "ESTIMATORS", "METHOD_NAMES", "HESSIAN_METHODS", "REESTIMATION_ESTIMATORS",
           "INTERVALS", "RLLS_EXPERIMENT_RHO_SCALE", "make_estimator", "check_methods", "check_interval"]

#: RLLS's rho in the experiments: the public RLLS code that Garg et al. ran (Section 6, footnote) scales the
#: 3 Delta_C of Azizzadenesheli et al. (2019) by 0.01. The unscaled value (the estimator's default) exceeds
#: sigma_min(C) for k = 10 and n_source ~ 1000 and shrinks every estimate to w = 1, which is not the RLLS of the
#: paper's figures.
RLLS_EXPERIMENT_RHO_SCALE = 0.01


@dataclass(frozen=True)
class EstimatorSpec:
    """What a method name stands for.

    Attributes:
        name: the paper's name of the method.
        build: ``build(n_bins)`` returns a fresh, unfitted estimator.
        likelihood: the estimate maximises the MLLS likelihood (eq. mlls-sample), so its Hessian's minimum
            eigenvalue (Section 5) and the Fisher interval apply.
        reestimation: the ``reestimate`` flow may use it as its estimator or a cross-check.
        needs_bins: ``build`` needs a number of bins.
    """

    name: str
    build: Callable[[int | None], object]
    likelihood: bool = False
    reestimation: bool = False
    needs_bins: bool = False


def _estimators():
    from . import estimators as E  # imported late: keeps this module importable on its own

    return E


def _binned(n_bins: int | None):
    if n_bins is None:
        raise InputError("method 'MLLS-binned' needs a number of bins: use a setting with n_bins set "
                         "(settings_grid('bins', ...)) or pass n_bins.")
    return _estimators().MLLSBinned(n_bins=int(n_bins))


ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in (
    EstimatorSpec("BBSE-hard", lambda _: _estimators().BBSE(soft=False), reestimation=True),
    EstimatorSpec("BBSE-soft", lambda _: _estimators().BBSE(soft=True), reestimation=True),
    EstimatorSpec("RLLS", lambda _: _estimators().RLLS(soft=False, rho_scale=RLLS_EXPERIMENT_RHO_SCALE)),
    EstimatorSpec("RLLS-soft", lambda _: _estimators().RLLS(soft=True, rho_scale=RLLS_EXPERIMENT_RHO_SCALE)),
    EstimatorSpec("MLLS-CM", lambda _: _estimators().MLLSCM(), likelihood=True),
    EstimatorSpec("MLLS", lambda _: _estimators().MLLS(), likelihood=True, reestimation=True),
    EstimatorSpec("MLLS-binned", _binned, likelihood=True, needs_bins=True),
    EstimatorSpec("PCC", lambda _: _estimators().PCC()),
)}

#: every method name the sweeps understand
METHOD_NAMES: tuple[str, ...] = tuple(ESTIMATORS)
#: methods whose diagnostic is the minimum eigenvalue of the negated MLLS Hessian (Section 5)
HESSIAN_METHODS = frozenset(name for name, spec in ESTIMATORS.items() if spec.likelihood)
#: the estimators a re-estimation can use (the main one and the cross-checks)
REESTIMATION_ESTIMATORS: tuple[str, ...] = tuple(name for name, spec in ESTIMATORS.items() if spec.reestimation)
#: interval methods of a re-estimation: the MLLS sandwich that includes the holdout's error (calibrator and p_s),
#: the MLLS likelihood's Fisher information (target only), or a bootstrap over target rows (target only)
INTERVALS: tuple[str, ...] = ("source-aware", "fisher", "bootstrap")


def make_estimator(method: str, *, n_bins: int | None = None):
    """A fresh, unfitted estimator for a method name of :data:`METHOD_NAMES`."""
    spec = ESTIMATORS.get(method)
    if spec is None:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHOD_NAMES)}.")
    return spec.build(n_bins)


def check_methods(methods, *, allowed: tuple[str, ...] = METHOD_NAMES, argument: str = "methods") -> list[str]:
    """``methods`` as a list of distinct names from ``allowed``; InputError naming the bad ones otherwise."""
    if isinstance(methods, str):
        methods = [methods]
    methods = list(methods)
    if not methods:
        raise InputError(f"{argument} is empty; choose from {', '.join(allowed)}.")
    bad = [m for m in methods if m not in allowed]
    if bad:
        raise InputError(f"unknown method(s) {bad} in {argument}; choose from {', '.join(allowed)}.")
    if len(set(methods)) != len(methods):
        raise InputError(f"{argument} has duplicates: {methods}.")
    return methods


def check_interval(estimator: str, interval: str) -> None:
    """The estimator/interval combination of a re-estimation: the source-aware and Fisher intervals need a
    likelihood estimator."""
    check_methods([estimator], allowed=REESTIMATION_ESTIMATORS, argument="estimator")
    if interval not in INTERVALS:
        raise InputError(f"interval must be one of {', '.join(INTERVALS)}, got {interval!r}.")
    if interval in ("fisher", "source-aware") and not ESTIMATORS[estimator].likelihood:
        raise InputError(f"interval {interval!r} comes from the MLLS likelihood; with estimator {estimator!r} use "
                         "interval 'bootstrap' (or estimator 'MLLS').")
