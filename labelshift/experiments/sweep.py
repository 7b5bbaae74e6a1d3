"""A per-setting experiment runner shared by the synthetic and image experiments (Section 6 of the paper).

One *setting* is one point of a sweep (a shift, a target size, a number of bins...). For a setting the runner
fits every estimator once on the source held-out outputs, estimates w for the target sets of all seeds as one
batch, and scores each estimate against the true weights with the weight MSE of Section 6. The results of a
sweep are plain numpy arrays in two dataclasses:

* :class:`SettingResult` -- per seed and method: weights, true weights, MSE, minimum Hessian eigenvalue;
  ``a + b`` joins two results of the same setting computed on different seeds (a flow can split the seeds of a
  setting across tasks and join them afterwards);
* :class:`SweepResult` -- per setting and method: mean MSE, its standard error over seeds, mean eigenvalue.

Randomness: :func:`seed_generator` gives every (base_seed, setting, seed) its own generator, from
``np.random.SeedSequence([base_seed, setting_key, seed])``, so a seed's draws do not depend on which other seeds
are run in the same call.
"""
from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..estimation.diagnostics import weight_mse
from ..errors import IllConditionedWarning, InputError
from ..estimation.registry import HESSIAN_METHODS, METHOD_NAMES, check_methods, make_estimator
from .._numbers import nan_as_none

__all__ = ["METHOD_NAMES", "HESSIAN_METHODS", "make_estimator", "stable_key", "seed_generator",
           "source_generator", "check_seeds", "check_methods", "estimate_all", "score", "SettingResult", "SweepResult",
           "aggregate"]

#: spawn key of the source stream, so it never coincides with a seed's stream (see :func:`source_generator`)
_SOURCE_STREAM = (0x50C,)


def stable_key(*parts) -> int:
    """A 32-bit integer that names ``parts`` (strings, ints, floats) identically in every process.

    Python's ``hash`` of a string changes between runs; this uses BLAKE2b of a canonical text instead (floats by
    ``repr``, so 0.1 and 0.1000000001 differ but 1 and 1.0 do not).
    """
    canon = []
    for p in parts:
        if isinstance(p, (bool, np.bool_)):
            canon.append(str(bool(p)))
        elif isinstance(p, (int, np.integer)):
            canon.append(repr(float(p)) if abs(int(p)) < 2 ** 53 else str(int(p)))
        elif isinstance(p, (float, np.floating)):
            canon.append(repr(float(p)))
        elif p is None:
            canon.append("None")
        else:
            canon.append(str(p))
    digest = hashlib.blake2b("|".join(canon).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def check_seeds(seeds) -> np.ndarray:
    """Seeds as a 1-D int64 array of non-negative integers (an int n means range(n))."""
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        seeds = np.arange(int(seeds))
    arr = np.asarray(seeds)
    if arr.ndim != 1 or arr.size == 0:
        raise InputError(f"seeds must be a non-empty 1-D list of integers, got shape {arr.shape}.")
    if arr.dtype.kind not in "iu":
        raise InputError(f"seeds must be integers, got dtype {arr.dtype}.")
    if arr.min() < 0:
        raise InputError(f"seeds must be >= 0, got {int(arr.min())}.")
    return arr.astype(np.int64)


def seed_generator(base_seed: int, key: int, seed: int) -> np.random.Generator:
    """The generator of one seed of one setting: ``SeedSequence([base_seed, key, seed])``."""
    return np.random.default_rng(np.random.SeedSequence([int(base_seed), int(key), int(seed)]))


def source_generator(base_seed: int, key: int) -> np.random.Generator:
    """The generator of a setting's source data, shared by all its seeds.

    Built from ``[base_seed, key]`` with a spawn key, which numpy assembles into a longer entropy pool than any
    ``[base_seed, key, seed]``, so it never repeats a seed's stream.
    """
    return np.random.default_rng(np.random.SeedSequence([int(base_seed), int(key)], spawn_key=_SOURCE_STREAM))


def estimate_all(methods: Sequence[str], source_probs: np.ndarray, source_labels: np.ndarray,
                 target_probs, *, source_prior=None, n_bins: int | None = None,
                 estimator_factory: Callable[..., object] = make_estimator) -> dict:
    """Fit each method once on the source outputs and estimate w for a batch of target sets.

    Args:
        methods: method names (:data:`METHOD_NAMES`).
        source_probs, source_labels: held-out labelled source outputs (probabilities) and labels.
        target_probs: a batch of target outputs, (S, m, k) or a list of (m_s, k) arrays.
        source_prior: p_s(y) handed to every estimator's ``fit`` (None: the empirical source frequencies).
        n_bins: for "MLLS-binned".

    Returns:
        dict with ``weights`` (S, n_methods, k), ``min_eigenvalue`` (S, n_methods; NaN for methods outside
        :data:`HESSIAN_METHODS`), ``converged`` and ``ill_conditioned`` (S, n_methods) bools, and ``seconds``
        (method -> wall time of fit plus batched estimate). Ill-conditioning and non-convergence warnings are
        recorded in the arrays instead of being raised once per setting.
    """
    methods = check_methods(methods)
    out_w, out_eig, out_conv, out_ill, seconds = [], [], [], [], {}
    for method in methods:
        t0 = time.perf_counter()
        est = estimator_factory(method, n_bins=n_bins)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IllConditionedWarning)
            warnings.filterwarnings("ignore", message=".*did not converge.*", category=RuntimeWarning)
            est.fit(source_probs, source_labels, source_prior=source_prior)
            res = est.estimate(target_probs)
        seconds[method] = time.perf_counter() - t0
        w = np.asarray(res.weights, dtype=np.float64)
        if w.ndim != 2:
            raise InputError("estimate_all needs a batch of target sets ((S, m, k) or a list of arrays).")
        S = w.shape[0]
        out_w.append(w)
        diag = np.broadcast_to(np.asarray(res.diagnostic, dtype=np.float64), (S,))
        out_eig.append(diag if method in HESSIAN_METHODS else np.full(S, np.nan))
        out_conv.append(np.broadcast_to(np.asarray(res.converged, dtype=bool), (S,)))
        out_ill.append(np.broadcast_to(np.asarray(res.ill_conditioned, dtype=bool), (S,)))
    return dict(weights=np.stack(out_w, axis=1), min_eigenvalue=np.stack(out_eig, axis=1),
                converged=np.stack(out_conv, axis=1), ill_conditioned=np.stack(out_ill, axis=1),
                seconds=seconds)


@dataclass
class SettingResult:
    """Per-seed results of one setting.

    Attributes:
        setting: the setting (any object with ``kind`` and ``value``; e.g. :class:`gaussian.Setting`).
        seeds: (n_seeds,) the seeds, in row order.
        methods: method names, in column order.
        weights: (n_seeds, n_methods, k) estimated w.
        true_weights: (n_seeds, k) w from the empirical label frequencies of each target set and of the source data.
        mse: (n_seeds, n_methods) weight MSE (mean over classes).
        min_eigenvalue: (n_seeds, n_methods) minimum eigenvalue of the negated MLLS Hessian at the estimate
            (Section 5); NaN for methods that are not MLLS.
        converged, ill_conditioned: (n_seeds, n_methods) solver flags of each estimate.
        seconds: method -> wall time (fit + batched estimate), summed over joined chunks.
    """

    setting: object
    seeds: np.ndarray
    methods: list[str]
    weights: np.ndarray
    true_weights: np.ndarray
    mse: np.ndarray
    min_eigenvalue: np.ndarray
    converged: np.ndarray | None = None
    ill_conditioned: np.ndarray | None = None
    seconds: dict = field(default_factory=dict)

    def __post_init__(self):
        n, M = len(self.seeds), len(self.methods)
        if self.converged is None:
            self.converged = np.ones((n, M), dtype=bool)
        if self.ill_conditioned is None:
            self.ill_conditioned = np.zeros((n, M), dtype=bool)

    @property
    def n_classes(self) -> int:
        return int(self.true_weights.shape[-1])

    def __add__(self, other: "SettingResult") -> "SettingResult":
        """Join two results of the same setting and methods computed on different seeds (rows concatenated)."""
        if not isinstance(other, SettingResult):
            return NotImplemented
        if other.setting != self.setting or list(other.methods) != list(self.methods):
            raise InputError("only results of the same setting and methods can be joined; got "
                             f"{self.setting} {self.methods} and {other.setting} {other.methods}.")
        if np.intersect1d(self.seeds, other.seeds).size:
            raise InputError("the two results share seeds; join results of disjoint seed chunks.")
        cat = lambda a, b: np.concatenate([a, b], axis=0)   # noqa: E731
        secs = {m: self.seconds.get(m, 0.0) + other.seconds.get(m, 0.0)
                for m in set(self.seconds) | set(other.seconds)}
        return SettingResult(self.setting, cat(self.seeds, other.seeds), list(self.methods),
                             cat(self.weights, other.weights), cat(self.true_weights, other.true_weights),
                             cat(self.mse, other.mse), cat(self.min_eigenvalue, other.min_eigenvalue),
                             cat(self.converged, other.converged), cat(self.ill_conditioned, other.ill_conditioned),
                             secs)

    def _setting_fields(self) -> dict:
        s = self.setting
        d = {"kind": getattr(s, "kind", None), "value": nan_as_none(getattr(s, "value", np.nan))}
        for name in ("m", "p1", "alpha", "n_bins"):
            if hasattr(s, name):
                v = getattr(s, name)
                d[name] = v if v is None or isinstance(v, (int, str)) else nan_as_none(v)
        return d

    def to_records(self) -> list[dict]:
        """One row per (seed, method): kind, value (plus the setting's m, p1, n_bins...), seed, method, mse,
        w_0.., w_true_0.., min_eig (None where not defined), converged, ill_conditioned. Plain Python values."""
        base = self._setting_fields()
        rows = []
        k = self.n_classes
        for i, seed in enumerate(self.seeds):
            for j, method in enumerate(self.methods):
                r = dict(base, seed=int(seed), method=method, mse=nan_as_none(self.mse[i, j]))
                r.update({f"w_{c}": nan_as_none(self.weights[i, j, c]) for c in range(k)})
                r.update({f"w_true_{c}": nan_as_none(self.true_weights[i, c]) for c in range(k)})
                r["min_eig"] = nan_as_none(self.min_eigenvalue[i, j])
                r["converged"] = bool(self.converged[i, j])
                r["ill_conditioned"] = bool(self.ill_conditioned[i, j])
                rows.append(r)
        return rows


@dataclass
class SweepResult:
    """Per-setting summaries of a sweep (rows: settings in increasing ``value``; columns: methods).

    Attributes:
        kind: the sweep's kind (e.g. "shift", "size", "bins").
        values: (n_values,) the swept values.
        methods: method names.
        mse_mean: (n_values, n_methods) weight MSE averaged over seeds.
        mse_se: (n_values, n_methods) its standard error, std (ddof=1) / sqrt(n_seeds).
        min_eigenvalue_mean: (n_values, n_methods) mean minimum Hessian eigenvalue (NaN for non-MLLS methods).
        results: the per-seed :class:`SettingResult` of each value.
    """

    kind: str
    values: np.ndarray
    methods: list[str]
    mse_mean: np.ndarray
    mse_se: np.ndarray
    min_eigenvalue_mean: np.ndarray
    results: list[SettingResult]

    @property
    def n_seeds(self) -> np.ndarray:
        return np.array([len(r.seeds) for r in self.results])

    def mse(self, method: str) -> np.ndarray:
        """Mean MSE of one method across the sweep's values."""
        return self.mse_mean[:, self.methods.index(method)]

    def to_records(self) -> list[dict]:
        """One row per (value, method): kind, value (plus the setting's fields), method, n_seeds, mse_mean,
        mse_se, min_eig_mean (None where not defined). For per-seed rows use ``r.to_records()`` of ``results``."""
        rows = []
        for i, res in enumerate(self.results):
            base = res._setting_fields()
            for j, method in enumerate(self.methods):
                rows.append(dict(base, method=method, n_seeds=len(res.seeds), mse_mean=nan_as_none(self.mse_mean[i, j]),
                                 mse_se=nan_as_none(self.mse_se[i, j]),
                                 min_eig_mean=nan_as_none(self.min_eigenvalue_mean[i, j])))
        return rows


def aggregate(results: Iterable[SettingResult]) -> SweepResult:
    """Summarise the results of one sweep: join chunks of the same setting (``+``), order by value, average.

    All results must share the sweep kind and the methods. The standard error is the sample standard deviation
    over seeds (ddof=1) divided by sqrt(n_seeds); it is NaN with a single seed.
    """
    results = list(results)
    if not results:
        raise InputError("aggregate needs at least one SettingResult.")
    kinds = {getattr(r.setting, "kind", None) for r in results}
    if len(kinds) != 1:
        raise InputError(f"results mix sweep kinds {sorted(map(str, kinds))}; aggregate one sweep at a time.")
    methods = list(results[0].methods)
    if any(list(r.methods) != methods for r in results):
        raise InputError("results have different methods; run every setting of a sweep with the same methods.")
    joined: dict = {}
    for r in results:
        joined[r.setting] = joined[r.setting] + r if r.setting in joined else r
    ordered = sorted(joined.values(), key=lambda r: float(r.setting.value))
    values = np.array([float(r.setting.value) for r in ordered])
    if np.unique(values).size != values.size:
        raise InputError("two different settings share a value; aggregate one sweep at a time.")
    mse_mean = np.stack([r.mse.mean(axis=0) for r in ordered])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # ddof=1 with one seed, all-NaN eigenvalue columns
        mse_se = np.stack([r.mse.std(axis=0, ddof=1) / np.sqrt(len(r.seeds)) if len(r.seeds) > 1
                           else np.full(len(methods), np.nan) for r in ordered])
        eig = np.stack([np.nanmean(r.min_eigenvalue, axis=0) for r in ordered])
    return SweepResult(kind=str(kinds.pop()), values=values, methods=methods, mse_mean=mse_mean, mse_se=mse_se,
                       min_eigenvalue_mean=eig, results=ordered)


def score(weights: np.ndarray, true_w: np.ndarray) -> np.ndarray:
    """(S, n_methods) weight MSE of (S, n_methods, k) estimates against (S, k) true weights."""
    return weight_mse(weights, true_w[:, None, :])
