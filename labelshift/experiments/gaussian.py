"""The two-Gaussian experiments of the paper (Example 1 in Section 4 and the GMM panels of Section 6).

The source distribution is p_s(x | y=0) = N(mu, 1), p_s(x | y=1) = N(-mu, 1) with p_s(y) = [1/2, 1/2], and mu = 1
as in the paper. The predictor is the true source posterior p_s(y | x), which is canonically calibrated:

    p_s(y=0 | x) = sigmoid(2 mu x),   p_s(y=1 | x) = sigmoid(-2 mu x).

Three sweeps reproduce the paper's figures:

* :func:`mse_vs_shift` -- weight MSE against p_t(y=1) at m = 1000 (Figure 1a);
* :func:`mse_vs_size` -- weight MSE against the target size m at p_t(y=1) = 0.01 (Figure 1d);
* :func:`mse_vs_bins` -- MSE and minimum Hessian eigenvalue of MLLS on a binned predictor against the number of
  bins, with MLLS-CM as reference (Figure 2).

How one setting is run (:func:`run_setting`). The labelled source held-out set (``n_source`` points with exactly
balanced labels, so its empirical prior is the known [1/2, 1/2]) is drawn once per (base_seed, mu, n_source) --
the same set for every setting of a sweep -- and every estimator is fit on it once. Each seed then draws its own
target set (m labels from [1 - p1, p1], then x from the class-conditional Gaussians) from
``SeedSequence([base_seed, setting_key, seed])``, and the target sets of all seeds are estimated as one batch.
Splitting the seeds over several calls and joining the results with ``+`` therefore gives exactly the rows of one
call. The setting key names what draws the data (mu, n_source, m, p1), not the swept label, so e.g. every point
of the bins sweep sees the same target sets (common random numbers: the curve shows the effect of the bins alone).

Consequence of the shared source set: its sampling error (about sqrt(Phi(1) (1 - Phi(1)) / 5000) = 0.005 in the
confusion matrix for n_source = 10000) is one draw common to all seeds and settings, so for the confusion-matrix
methods the MSE levels off at that draw's error as m grows, instead of averaging over source sets. MLLS only uses
the (known) source prior and is unaffected. ``fresh_source=True`` gives each seed its own source set (the seed's
own stream), fits the estimators per seed and so averages the source error too, at the cost of one fit and one
estimate call per seed and method.

Methods: "BBSE-hard", "BBSE-soft" (Lipton et al. 2018), "RLLS" (hard confusion matrix, as in the paper's figure)
and "RLLS-soft" (Azizzadenesheli et al. 2019), "MLLS-CM" (eq. cm-log), "MLLS" (eq. mlls-sample, with the known
source prior [1/2, 1/2]), "MLLS-binned" (MLLS on p_s(y|x) averaged over ``n_bins`` equal-width bins of p(y=1|x), the bin
 averages estimated on the source set; Section 6),
"PCC" (mean prediction). The MSE is the weight MSE of Section 6: mean over the two classes of
(w_hat - w)^2, with w from the empirical label frequencies of the target set (and of the balanced source set).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from ..estimation.diagnostics import true_weights
from ..errors import InputError
from .shift import binary_prior
from .sweep import SettingResult, SweepResult, aggregate, check_methods, check_seeds, estimate_all, score, \
    seed_generator, source_generator, stable_key

__all__ = ["METHODS", "BINS_METHODS", "DEFAULT_SHIFTS", "DEFAULT_SIZES", "DEFAULT_BINS", "Setting", "SettingResult",
           "SweepResult", "settings_grid", "run_setting", "aggregate", "mse_vs_shift", "mse_vs_size",
           "mse_vs_bins", "posterior", "sample_source", "sample_target_set", "setting_key", "source_key"]

#: default methods of the shift and size sweeps (the paper's Figure 1)
METHODS = ("BBSE-hard", "BBSE-soft", "RLLS", "MLLS-CM", "MLLS")
#: default methods of the bins sweep (the paper's Figure 2)
BINS_METHODS = ("MLLS-binned", "MLLS-CM")
#: default grids, close to the x-axes of the paper's figures
DEFAULT_SHIFTS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
DEFAULT_SIZES = (100, 200, 500, 1000, 2000, 5000, 10000)
DEFAULT_BINS = (2, 3, 4, 5, 6, 8, 10, 15, 20, 30)

_KINDS = ("shift", "size", "bins")
N_CLASSES = 2


@dataclass(frozen=True)
class Setting:
    """One point of a sweep.

    Attributes:
        kind: "shift" (value = p_t(y=1)), "size" (value = m) or "bins" (value = number of bins).
        value: the swept value (the x-axis).
        m: target set size.
        p1: p_t(y=1).
        n_bins: number of bins for "MLLS-binned" (None outside the bins sweep).
    """

    kind: str
    value: float
    m: int
    p1: float
    n_bins: int | None = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise InputError(f"kind must be one of {_KINDS}, got {self.kind!r}.")
        if isinstance(self.m, bool) or not isinstance(self.m, (int, np.integer)) or self.m < 1:
            raise InputError(f"m (target size) must be a positive integer, got {self.m!r}.")
        if not 0.0 <= float(self.p1) <= 1.0:
            raise InputError(f"p1 = p_t(y=1) must lie in [0, 1], got {self.p1}.")
        if self.n_bins is not None and (not isinstance(self.n_bins, (int, np.integer)) or self.n_bins < 1):
            raise InputError(f"n_bins must be a positive integer or None, got {self.n_bins!r}.")


def settings_grid(kind: str, values, *, m: int = 1000, p1: float = 0.01) -> list[Setting]:
    """The settings of one sweep: ``values`` are p_t(y=1) ("shift"; ``p1`` unused), target sizes ("size"; ``m``
    unused) or numbers of bins ("bins"; at the given ``m`` and ``p1``)."""
    if kind not in _KINDS:
        raise InputError(f"kind must be one of {_KINDS}, got {kind!r}.")
    vals = list(np.atleast_1d(np.asarray(values)).tolist())
    if not vals:
        raise InputError("values is empty; pass at least one value to sweep.")
    out = []
    for v in vals:
        if kind == "shift":
            out.append(Setting("shift", float(v), int(m), float(v)))
        elif kind == "size":
            if float(v) != int(v):
                raise InputError(f"target sizes must be integers, got {v}.")
            out.append(Setting("size", float(v), int(v), float(p1)))
        else:
            if float(v) != int(v):
                raise InputError(f"numbers of bins must be integers, got {v}.")
            out.append(Setting("bins", float(v), int(m), float(p1), n_bins=int(v)))
    return out


def posterior(x, mu: float = 1.0) -> np.ndarray:
    """The true source posterior p_s(y | x) of the two-Gaussian model with p_s(y) = [1/2, 1/2]; shape x.shape + (2,).

    p_s(y=0 | x) = N(x; mu, 1) / (N(x; mu, 1) + N(x; -mu, 1)) = sigmoid(2 mu x), computed without overflow.
    """
    x = np.asarray(x, dtype=np.float64)
    p0 = expit(2.0 * mu * x)
    return np.stack([p0, expit(-2.0 * mu * x)], axis=-1)


def _sample_x(labels: np.ndarray, mu: float, rng: np.random.Generator) -> np.ndarray:
    means = np.where(labels == 0, mu, -mu)
    return means + rng.standard_normal(labels.shape)


def sample_source(n: int, rng: np.random.Generator, mu: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A labelled source set: (x, y) with exactly balanced labels (n // 2 of class 0, the rest class 1, in random
    order) and x | y from the class-conditional Gaussians."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise InputError(f"n_source must be an integer >= 2, got {n!r}.")
    y = np.zeros(int(n), dtype=np.int64)
    y[n // 2:] = 1
    y = rng.permutation(y)
    return _sample_x(y, mu, rng), y


def sample_target_set(m: int, p1: float, rng: np.random.Generator, mu: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A target set of size m: each label drawn from [1 - p1, p1] (Section 6), then x from its Gaussian."""
    prior = binary_prior(p1)
    y = (rng.random(int(m)) < prior[1]).astype(np.int64)
    return _sample_x(y, mu, rng), y


def setting_key(setting: Setting, mu: float, n_source: int) -> int:
    """The stable integer that names the target data of a setting (what draws it: mu, n_source, m, p1)."""
    return stable_key("gaussian", float(mu), int(n_source), int(setting.m), float(setting.p1))


def source_key(mu: float, n_source: int) -> int:
    """The stable integer that names the source held-out set (shared by the settings of a sweep)."""
    return stable_key("gaussian-source", float(mu), int(n_source))


def run_setting(setting: Setting, seeds, methods=METHODS, *, mu: float = 1.0, n_source: int = 10_000,
                base_seed: int = 0, fresh_source: bool = False) -> SettingResult:
    """Run one setting for the given seeds (see the module docstring for the sampling scheme).

    By default the source held-out set is drawn once per (base_seed, mu, n_source) and every estimator is fit on
    it once; the seeds' target sets are then estimated together with the batched ``estimate``. MLLS is given the
    known source prior [1/2, 1/2] (the balanced source set has exactly these frequencies, so every method sees
    the same prior and the true weights use it too).

    Args:
        setting: the point of the sweep (:func:`settings_grid`).
        seeds: non-negative integer seeds (an int n means range(n)).
        methods: method names; "MLLS-binned" needs ``setting.n_bins``.
        mu: class means are +mu (class 0) and -mu (class 1).
        n_source: size of the labelled source held-out set used for confusion matrices and binning.
        base_seed: the first entry of every SeedSequence.
        fresh_source: draw a source set per seed and fit per seed (slower; averages the source error).

    Returns:
        :class:`SettingResult` with one row per seed, in the order given.
    """
    if not isinstance(setting, Setting):
        raise InputError(f"setting must be a gaussian.Setting, got {type(setting).__name__}.")
    seeds = check_seeds(seeds)
    methods = check_methods(methods)
    if "MLLS-binned" in methods and setting.n_bins is None:
        raise InputError("'MLLS-binned' needs setting.n_bins; build the settings with settings_grid('bins', ...).")
    key, skey = setting_key(setting, mu, n_source), source_key(mu, n_source)
    xt = np.empty((len(seeds), setting.m))
    yt = np.empty((len(seeds), setting.m), dtype=np.int64)
    for i, seed in enumerate(seeds):
        xt[i], yt[i] = sample_target_set(setting.m, setting.p1, seed_generator(base_seed, key, seed), mu)
    target_probs = posterior(xt, mu)
    # balanced source labels: the empirical source prior is [1/2, 1/2] (up to one example for odd n_source)
    source_freq = np.array([n_source // 2, n_source - n_source // 2]) / n_source
    w_true = true_weights(yt, source_freq, N_CLASSES)
    if not fresh_source:
        xs, ys = sample_source(n_source, source_generator(base_seed, skey), mu)
        out = estimate_all(methods, posterior(xs, mu), ys, target_probs, source_prior=source_freq,
                           n_bins=setting.n_bins)
    else:
        parts = []
        for i, seed in enumerate(seeds):
            xs, ys = sample_source(n_source, seed_generator(base_seed, skey, seed), mu)
            parts.append(estimate_all(methods, posterior(xs, mu), ys, target_probs[i:i + 1],
                                      source_prior=source_freq, n_bins=setting.n_bins))
        out = {name: np.concatenate([p[name] for p in parts], axis=0)
               for name in ("weights", "min_eigenvalue", "converged", "ill_conditioned")}
        out["seconds"] = {m: sum(p["seconds"][m] for p in parts) for m in methods}
    return SettingResult(setting=setting, seeds=seeds, methods=methods, weights=out["weights"],
                         true_weights=w_true, mse=score(out["weights"], w_true),
                         min_eigenvalue=out["min_eigenvalue"], converged=out["converged"],
                         ill_conditioned=out["ill_conditioned"], seconds=out["seconds"])


def _sweep(kind, values, n_seeds, methods, *, m=1000, p1=0.01, **kw) -> SweepResult:
    seeds = check_seeds(n_seeds)
    return aggregate([run_setting(s, seeds, methods, **kw) for s in settings_grid(kind, values, m=m, p1=p1)])


def mse_vs_shift(p1_values=DEFAULT_SHIFTS, *, m: int = 1000, n_seeds=100, methods=METHODS, **kw) -> SweepResult:
    """Weight MSE against p_t(y=1) at target size m (the paper's Figure 1a). ``kw``: mu, n_source, base_seed,
    fresh_source (see :func:`run_setting`).
    ``n_seeds`` is a count (seeds 0..n-1) or an explicit list of seeds."""
    return _sweep("shift", p1_values, n_seeds, methods, m=m, **kw)


def mse_vs_size(sizes=DEFAULT_SIZES, *, p1: float = 0.01, n_seeds=100, methods=METHODS, **kw) -> SweepResult:
    """Weight MSE against target size m at p_t(y=1) = p1 (the paper's Figure 1d, log-log)."""
    return _sweep("size", sizes, n_seeds, methods, p1=p1, **kw)


def mse_vs_bins(n_bins_values=DEFAULT_BINS, *, p1: float = 0.01, m: int = 1000, n_seeds=100,
                methods=BINS_METHODS, **kw) -> SweepResult:
    """MSE and minimum Hessian eigenvalue of MLLS on the binned predictor against the number of equal-width bins,
    with MLLS-CM as reference (the paper's Figure 2). All values share the same source and target sets."""
    return _sweep("bins", n_bins_values, n_seeds, methods, m=m, p1=p1, **kw)
