"""The Dirichlet-shift experiments on image classifiers (Section 6 of the paper; Figure 1 b, c, e, f).

The black-box predictor (a network trained on the dataset's *train* pool) is run once on the *valid* and *test*
pools; its logits are calibrated with BCTS fit on the valid pool (Alexandari et al. 2020). This module works on
those precomputed outputs only, so a sweep costs no network evaluation:

* source: the valid pool *as is* (calibrated probabilities and labels). Its empirical class frequencies are the
  source prior handed to every estimator and used for the true weights. Pools are carved out by stratified
  splits, so this is the training prior too: exactly uniform for ``mnist-5k`` (100 per class) and within one
  example per class of uniform for ``digits``, MNIST and CIFAR-10 (the paper's "uniform source").
* target: for each seed, p_t(y) ~ Dirichlet(alpha) (:func:`labelshift.experiments.shift.dirichlet_prior`), then m
  examples drawn with replacement from the test pool by :func:`labelshift.experiments.shift.sample_target`; the true
  weights are the target set's empirical label frequencies over the source prior (as in the paper's MSE).

Settings: kind ``"alpha"`` (MSE vs alpha at a fixed m; paper m = 5000) and kind ``"size"`` (MSE vs m at a fixed
alpha; paper alpha = 0.1). Methods: every name of :data:`labelshift.experiments.sweep.METHOD_NAMES` plus
``"MLLS-uncal"``. Which predictor each method sees:

* ``BBSE-hard``, ``BBSE-soft``, ``RLLS``, ``RLLS-soft``, ``MLLS-CM``, ``PCC``: the raw softmax of the network
  (the confusion-matrix methods use its argmax, as in Lipton et al. 2018 and eq. cm-log of the paper);
* ``MLLS``: the BCTS-calibrated probabilities (the paper's MLLS);
* ``MLLS-uncal``: MLLS on the raw softmax, for contrast (shows what calibration buys);
* ``<estimator>@<calibration>`` (e.g. ``MLLS@VS``, ``BBSE-soft@TS``, ``RLLS@none``): the estimator on the outputs
  of one named calibration of :data:`CALIBRATIONS` -- ``none`` (the raw softmax) or a calibrator fit on the valid
  pool (the pools carry each calibrator's probabilities in :attr:`Pools.calibrated`) -- so a sweep can compare
  every calibration x estimator pair on the same target sets. :func:`method_calibration` says which calibration
  each name uses.

Randomness is chunk-invariant, as in :mod:`.gaussian`: seed ``s`` of a setting draws its prior and its target set
from ``SeedSequence([base_seed, setting_key, s])``; the key names the predictions (their fingerprint), m and
alpha. Draws can be spread over several trained models (Alexandari et al. use 10 models x 10 draws): seed ``s``
uses model ``s % n_models``, so again nothing depends on how seeds are chunked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..estimation.diagnostics import true_weights
from ..errors import IllConditionedError, InputError
from .shift import class_indices, dirichlet_prior, sample_target
from .sweep import (METHOD_NAMES, SettingResult, SweepResult, aggregate, check_methods, check_seeds, estimate_all,
                    score, seed_generator, stable_key)

__all__ = ["METHODS", "IMAGE_METHOD_NAMES", "DEFAULT_ALPHAS", "DEFAULT_SIZES", "Setting", "Pools",
           "settings_grid", "run_setting", "mse_vs_alpha", "mse_vs_size", "SettingResult", "SweepResult",
           "aggregate", "setting_key", "RAW_METHODS", "CALIBRATIONS", "CALIBRATED_ESTIMATORS",
           "CALIBRATED_METHOD_PATTERN", "split_method", "method_calibration", "calibration_grid", "SWEEP_DEFAULTS",
           "check_image_methods"]

#: default methods: the paper's four plus MLLS on the uncalibrated softmax
METHODS = ("BBSE-hard", "RLLS", "MLLS-CM", "MLLS", "MLLS-uncal")
#: every method name understood here
IMAGE_METHOD_NAMES = (*METHOD_NAMES, "MLLS-uncal")
#: methods that see the raw softmax (all others see the calibrated probabilities)
RAW_METHODS = frozenset({"BBSE-hard", "BBSE-soft", "RLLS", "RLLS-soft", "MLLS-CM", "PCC", "MLLS-uncal"})
#: default grids: Dirichlet alpha (log-spaced, severe to mild) and target sizes
DEFAULT_ALPHAS = (0.1, 0.3, 1.0, 3.0, 10.0)
DEFAULT_SIZES = (100, 200, 500, 1000, 2000, 5000, 10000)
#: what ``<estimator>@<calibration>`` may name after the "@": the raw softmax, or a calibrator fit on the valid pool
CALIBRATIONS = ("none", "TS", "BCTS", "VS", "NBVS")
#: estimators that can be paired with a calibration
CALIBRATED_ESTIMATORS = tuple(m for m in METHOD_NAMES if m != "MLLS-binned")
#: the regular expression of the ``<estimator>@<calibration>`` names
CALIBRATED_METHOD_PATTERN = f"^({'|'.join(CALIBRATED_ESTIMATORS)})@({'|'.join(CALIBRATIONS)})$"


def split_method(method: str) -> tuple[str, str | None]:
    """("MLLS", "TS") for "MLLS@TS"; (estimator, None) for a plain name ("MLLS-uncal" is MLLS)."""
    if "@" in method:
        estimator, _, calibration = method.partition("@")
        return estimator, calibration
    return ("MLLS" if method == "MLLS-uncal" else method), None


def method_calibration(method: str, first_calibrator: str = "BCTS") -> tuple[str, str]:
    """(estimator, calibration) of a method name: plain names of :data:`RAW_METHODS` run on ``"none"``, the other
    plain names (MLLS) on the sweep's first calibrator."""
    estimator, calibration = split_method(method)
    if calibration is None:
        calibration = "none" if method in RAW_METHODS else first_calibrator
    return estimator, calibration


def calibration_grid(estimators, calibrations, *, first_calibrator: str = "BCTS") -> list[str]:
    """Method names covering every (calibration, estimator) pair once, the paper's own under their plain names.

    A pair that a plain name already stands for (see :func:`method_calibration`: ``BBSE-hard``, ``BBSE-soft``,
    ``RLLS`` ... with ``none``, ``MLLS`` with ``first_calibrator``, ``MLLS-uncal`` for MLLS with ``none``) keeps
    that name, so the Section 6 comparisons (by plain name) and the full grid come from one sweep; every other pair
    is ``<estimator>@<calibration>``. Ordered by calibration, then estimator.
    """
    plain = {method_calibration(m, first_calibrator): m for m in IMAGE_METHOD_NAMES if m != "MLLS-binned"}
    return [plain.get((e, c), f"{e}@{c}") for c in calibrations for e in estimators]


#: the sweep of an image dataset where it differs from the general defaults (``flows.params`` fills these in for
#: a parameter left at its general default). fashion-mnist: every calibration x estimator pair of
#: :func:`calibration_grid` plus MLLS-CM, alpha 0.1 / 1 / 10 (at m = 5,000), m from 100 to 10,000 (at alpha = 0.1),
#: 100 seeds a setting: estimation is a few minutes of a 2-core CPU, training the network most of the rest
#: (benchmarks/README.md, "Fashion-MNIST at full scale").
SWEEP_DEFAULTS: dict[str, dict] = {
    "fashion-mnist": dict(
        alpha_values=[0.1, 1.0, 10.0], calibrators=["BCTS", "TS", "VS", "NBVS"],
        methods=[*calibration_grid(("BBSE-hard", "BBSE-soft", "RLLS", "MLLS"), CALIBRATIONS), "MLLS-CM"]),
}

_KINDS = ("alpha", "size")


@dataclass(frozen=True)
class Setting:
    """One point of an image sweep: kind "alpha" (value = alpha) or "size" (value = m)."""

    kind: str
    value: float
    m: int
    alpha: float

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise InputError(f"kind must be one of {_KINDS}, got {self.kind!r}.")
        if isinstance(self.m, bool) or not isinstance(self.m, (int, np.integer)) or self.m < 1:
            raise InputError(f"m (target size) must be a positive integer, got {self.m!r}.")
        if not (np.isfinite(self.alpha) and self.alpha > 0):
            raise InputError(f"alpha (Dirichlet concentration) must be > 0, got {self.alpha}.")


def settings_grid(kind: str, values, *, m: int = 5000, alpha: float = 0.1) -> list[Setting]:
    """The settings of one sweep: ``values`` are alphas ("alpha", at target size ``m``) or target sizes
    ("size", at Dirichlet ``alpha``)."""
    if kind not in _KINDS:
        raise InputError(f"kind must be one of {_KINDS}, got {kind!r}.")
    vals = list(np.atleast_1d(np.asarray(values, dtype=float)).tolist())
    if not vals:
        raise InputError("values is empty; pass at least one value to sweep.")
    if kind == "alpha":
        return [Setting("alpha", float(v), int(m), float(v)) for v in vals]
    bad = [v for v in vals if v != int(v)]
    if bad:
        raise InputError(f"target sizes must be integers, got {bad}.")
    return [Setting("size", float(v), int(v), float(alpha)) for v in vals]


@dataclass
class Pools:
    """A trained model's outputs on the valid (source) and test (target) pools.

    Attributes:
        valid_raw, valid_cal: (n_valid, k) raw softmax and calibrated probabilities of the valid pool.
        valid_y: (n_valid,) labels.
        test_raw, test_cal: (n_test, k) the same for the test pool; test_y its labels.
        fingerprint: a string naming these outputs (model key + calibrator); part of every setting key, so two
            models draw different target sets and the same model always draws the same ones.
        calibrated: calibrator name -> (valid, test) probabilities of that calibrator, for the
            ``<estimator>@<calibration>`` methods (``valid_cal``/``test_cal`` are those of the first calibrator).
    """

    valid_raw: np.ndarray
    valid_cal: np.ndarray
    valid_y: np.ndarray
    test_raw: np.ndarray
    test_cal: np.ndarray
    test_y: np.ndarray
    fingerprint: str = "pools"
    calibrated: dict = field(default_factory=dict, repr=False)
    _index: list = field(default=None, repr=False)

    def __post_init__(self):
        k = self.valid_raw.shape[1]
        for name in ("valid_raw", "valid_cal", "test_raw", "test_cal"):
            a = getattr(self, name)
            if a.ndim != 2 or a.shape[1] != k:
                raise InputError(f"{name} must be (n, {k}) probabilities, got shape {a.shape}.")
        if len(self.valid_y) != len(self.valid_raw) or len(self.valid_y) != len(self.valid_cal):
            raise InputError("valid probabilities and labels differ in length.")
        if len(self.test_y) != len(self.test_raw) or len(self.test_y) != len(self.test_cal):
            raise InputError("test probabilities and labels differ in length.")
        self.valid_y = np.asarray(self.valid_y, dtype=np.int64)
        self.test_y = np.asarray(self.test_y, dtype=np.int64)
        for name, (valid, test) in self.calibrated.items():
            if name not in CALIBRATIONS or name == "none":
                raise InputError(f"calibrated: unknown calibration {name!r}; use {', '.join(CALIBRATIONS[1:])}.")
            if np.shape(valid) != self.valid_raw.shape or np.shape(test) != self.test_raw.shape:
                raise InputError(f"calibrated[{name!r}] must hold (valid, test) probabilities shaped like "
                                 f"valid_raw {self.valid_raw.shape} and test_raw {self.test_raw.shape}.")

    @property
    def n_classes(self) -> int:
        return int(self.valid_raw.shape[1])

    @property
    def source_prior(self) -> np.ndarray:
        """Empirical class frequencies of the valid pool (the source prior; see the module docstring)."""
        counts = np.bincount(self.valid_y, minlength=self.n_classes)
        return counts / counts.sum()

    def outputs(self, method: str) -> tuple[str, np.ndarray, np.ndarray]:
        """(estimator name, valid probabilities, test probabilities) that ``method`` runs on (module docstring)."""
        estimator, calibration = split_method(method)
        if calibration is None:
            if method in RAW_METHODS:
                return estimator, self.valid_raw, self.test_raw
            return estimator, self.valid_cal, self.test_cal
        if calibration == "none":
            return estimator, self.valid_raw, self.test_raw
        if calibration not in self.calibrated:
            raise InputError(f"method {method!r} needs the {calibration} calibration, which these pools lack (they "
                             f"hold {', '.join(self.calibrated) or 'none'}); fit it (add {calibration} to the "
                             "calibrators).")
        valid, test = self.calibrated[calibration]
        return estimator, valid, test

    @property
    def test_index(self) -> list:
        if self._index is None:
            self._index = class_indices(self.test_y, self.n_classes)
        return self._index


def check_image_methods(methods) -> list[str]:
    """``methods`` as a list of distinct names of :data:`IMAGE_METHOD_NAMES` or ``<estimator>@<calibration>``
    (estimator from :data:`CALIBRATED_ESTIMATORS`, calibration from :data:`CALIBRATIONS`); InputError otherwise."""
    methods = [methods] if isinstance(methods, str) else list(methods)
    paired = [m for m in methods if re.match(CALIBRATED_METHOD_PATTERN, m)]
    plain = [m for m in methods if m not in paired]
    bad = [m for m in plain if "@" in m]
    if bad:
        raise InputError(f"unknown method(s) {bad} in methods; a method on one calibration is "
                         f"<estimator>@<calibration> with an estimator of {', '.join(CALIBRATED_ESTIMATORS)} and a "
                         f"calibration of {', '.join(CALIBRATIONS)}.")
    if plain or not methods:
        check_methods(plain or methods, allowed=IMAGE_METHOD_NAMES)
    if len(set(methods)) != len(methods):
        raise InputError(f"methods has duplicates: {methods}.")
    if "MLLS-binned" in methods:
        raise InputError("'MLLS-binned' is not part of the image sweeps.")
    return methods


def setting_key(setting: Setting, fingerprint: str) -> int:
    """The stable integer naming a setting's target draws: the predictions' fingerprint, m and alpha."""
    return stable_key("images", fingerprint, int(setting.m), float(setting.alpha))


def _draw(setting: Setting, pools: Pools, seeds: np.ndarray, base_seed: int) -> np.ndarray:
    """(S, m) test-pool indices of the seeds' target sets."""
    key = setting_key(setting, pools.fingerprint)
    out = np.empty((len(seeds), setting.m), dtype=np.int64)
    for i, seed in enumerate(seeds):
        rng = seed_generator(base_seed, key, int(seed))
        prior = dirichlet_prior(setting.alpha, pools.n_classes, rng)
        out[i] = sample_target(pools.test_y, prior, setting.m, rng, pool_index=pools.test_index)
    return out


def _estimate_one(method: str, pools: Pools, idx: np.ndarray) -> dict:
    """One method's estimates for the target sets ``idx``. A source confusion matrix too ill-conditioned to fit
    (:class:`~labelshift.errors.IllConditionedError`, e.g. from a weak network) gives NaN weights flagged
    ill-conditioned for that method instead of failing the whole setting; so does a numerical breakdown of the
    solver (LinAlgError, FloatingPointError). Their MSE is NaN, which shows as "-" in tables."""
    name, src, test = pools.outputs(method)
    tgt = test[idx]
    try:
        out = estimate_all([name], src, pools.valid_y, tgt, source_prior=pools.source_prior)
    except (IllConditionedError, np.linalg.LinAlgError, FloatingPointError):
        # also a solver that breaks down numerically (seen: MLLS-CM's eigenvalue diagnostic when a class has zero
        # probability under the confusion-matrix predictor): NaN for this method rather than no result at all
        S, k = idx.shape[0], pools.n_classes
        return dict(weights=np.full((S, k), np.nan), min_eigenvalue=np.full(S, np.nan),
                    converged=np.zeros(S, dtype=bool), ill_conditioned=np.ones(S, dtype=bool), seconds=0.0)
    return dict(weights=out["weights"][:, 0], min_eigenvalue=out["min_eigenvalue"][:, 0],
                converged=out["converged"][:, 0], ill_conditioned=out["ill_conditioned"][:, 0],
                seconds=out["seconds"][name])


def _estimate(methods: list[str], pools: Pools, idx: np.ndarray) -> dict:
    """Estimates of every method for the target sets ``idx`` (columns in the order of ``methods``)."""
    parts = {m: _estimate_one(m, pools, idx) for m in methods}
    res = {name: np.stack([parts[m][name] for m in methods], axis=1)
           for name in ("weights", "min_eigenvalue", "converged", "ill_conditioned")}
    res["seconds"] = {m: parts[m]["seconds"] for m in methods}
    return res


def run_setting(setting: Setting, seeds, pools, methods=METHODS, *, base_seed: int = 0) -> SettingResult:
    """Run one setting for ``seeds`` on precomputed outputs (see the module docstring).

    Args:
        setting: from :func:`settings_grid`.
        seeds: non-negative integer seeds (an int n means range(n)).
        pools: one :class:`Pools`, or a list of them (one per trained model): seed s uses ``pools[s % len]``.
        methods: names from :data:`IMAGE_METHOD_NAMES`.
        base_seed: first entry of every SeedSequence.

    Returns:
        :class:`SettingResult` with one row per seed in the order given; the eigenvalue column of "MLLS-uncal"
        holds MLLS's diagnostic on the raw softmax.
    """
    if not isinstance(setting, Setting):
        raise InputError(f"setting must be an images.Setting, got {type(setting).__name__}.")
    seeds = check_seeds(seeds)
    methods = check_image_methods(methods)
    pool_list = [pools] if isinstance(pools, Pools) else list(pools)
    if not pool_list or not all(isinstance(p, Pools) for p in pool_list):
        raise InputError("pools must be a Pools or a non-empty list of Pools.")
    k = pool_list[0].n_classes
    if any(p.n_classes != k for p in pool_list):
        raise InputError("all pools must have the same number of classes.")
    S, M = len(seeds), len(methods)
    weights = np.empty((S, M, k))
    w_true = np.empty((S, k))
    eig = np.empty((S, M))
    conv = np.empty((S, M), dtype=bool)
    ill = np.empty((S, M), dtype=bool)
    seconds = {m: 0.0 for m in methods}
    which = seeds % len(pool_list)
    for model in np.unique(which):
        rows = np.flatnonzero(which == model)
        pools_m = pool_list[int(model)]
        idx = _draw(setting, pools_m, seeds[rows], base_seed)
        out = _estimate(methods, pools_m, idx)
        weights[rows], eig[rows] = out["weights"], out["min_eigenvalue"]
        conv[rows], ill[rows] = out["converged"], out["ill_conditioned"]
        w_true[rows] = true_weights(pools_m.test_y[idx], pools_m.source_prior, k)
        for m in methods:
            seconds[m] += out["seconds"][m]
    return SettingResult(setting=setting, seeds=seeds, methods=methods, weights=weights, true_weights=w_true,
                         mse=_mse(weights, w_true), min_eigenvalue=eig, converged=conv, ill_conditioned=ill,
                         seconds=seconds)


def _mse(weights: np.ndarray, w_true: np.ndarray) -> np.ndarray:
    """Weight MSE of Section 6 (mean over classes), as :func:`.sweep.score`, but NaN for a method whose
    estimate failed (NaN weights) instead of an error."""
    ok = np.all(np.isfinite(weights), axis=-1)
    out = np.full(weights.shape[:2], np.nan)
    if ok.any():
        full = np.where(ok[..., None], weights, 0.0)
        out = np.where(ok, score(full, w_true), np.nan)
    return out


def _sweep(kind, values, pools, n_seeds, methods, *, m=5000, alpha=0.1, base_seed=0) -> SweepResult:
    seeds = check_seeds(n_seeds)
    return aggregate([run_setting(s, seeds, pools, methods, base_seed=base_seed)
                      for s in settings_grid(kind, values, m=m, alpha=alpha)])


def mse_vs_alpha(pools, alphas=DEFAULT_ALPHAS, *, m: int = 5000, n_seeds=100, methods=METHODS,
                 base_seed: int = 0) -> SweepResult:
    """Weight MSE against the Dirichlet alpha at target size m (the paper's Figure 1 b, c; m = 5000)."""
    return _sweep("alpha", alphas, pools, n_seeds, methods, m=m, base_seed=base_seed)


def mse_vs_size(pools, sizes=DEFAULT_SIZES, *, alpha: float = 0.1, n_seeds=100, methods=METHODS,
                base_seed: int = 0) -> SweepResult:
    """Weight MSE against the target size m at Dirichlet alpha (the paper's Figure 1 e, f; alpha = 0.1)."""
    return _sweep("size", sizes, pools, n_seeds, methods, alpha=alpha, base_seed=base_seed)
