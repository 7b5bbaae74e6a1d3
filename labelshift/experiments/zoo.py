"""A zoo of classifiers a user may bring to re-estimation: the cases of issue 20 as typed generators.

Each case is a :class:`ZooCase`: for a seed it gives a labelled holdout (the model's raw outputs and the labels,
:meth:`ZooCase.holdout`) and a target set drawn under a known label shift (:meth:`ZooCase.target`: raw outputs,
the labels and the population prior they were drawn from). The class-conditional distribution of the outputs is
the same in holdout and target, so every target is truly label-shifted; the truth an interval on p_t must cover is
the population prior (the paper's w* = p_t / p_s, Section 6: "sample a target label distribution p_t(y), then
each example's label y ~ p_t(y)"); :attr:`TargetSet.empirical_prior` holds the drawn rows' label frequencies too.

Two families:

* :class:`GaussianCase` -- k Gaussian classes whose model logits are ``scale`` times the exact source posterior's
  plus a per-class bias (:class:`~labelshift.experiments.well_specified.WellSpecifiedGaussians`, so BCTS contains
  the exact posterior): near-separable, under- and over-confident, a rare class, a fraud-like binary model, k from
  2 to 1,000, a tiny holdout or target, a class absent from the target, float16 logits.
* :class:`MisspecifiedCase` -- a model no temperature-and-bias calibration makes canonically calibrated (a logistic
  regression on classes of two clusters each, Gaussian naive Bayes on correlated features), trained once on rows of
  scikit-learn's ``make_classification``; holdout and target are fresh rows of a large pool of the same
  distribution. MLLS with BCTS is biased on them by an amount no holdout removes (the paper's miscalibration
  term; ``benchmarks/bench_miscalibration.py``).
* :class:`SklearnCase` -- a scikit-learn model (logistic regression, a random forest) trained once on part of one
  of scikit-learn's bundled datasets; per seed, the rows not used for training are split at random into a holdout
  half and a target pool, and the target is drawn per class from the pool without replacement, so the target
  rows are disjoint from the training and holdout rows and from each other.

:data:`CASES` names them all; :func:`fast_cases` those that run in seconds (the tests), the others (k = 100 and
1,000) are for ``benchmarks/bench_zoo.py``. Nothing here runs an estimator: the runner is
``tests/zoo_support.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import InputError
from .well_specified import WellSpecifiedGaussians

__all__ = ["LabelledOutputs", "TargetSet", "ZooCase", "GaussianCase", "SklearnCase", "CASES", "case", "fast_cases",
           "dirichlet_target", "fixed_target", "draw_with_replacement", "OutputsCase", "sklearn_outputs",
           "MisspecifiedCase", "misspecified_outputs"]

#: a rule for the target prior of one seed: (rng, source prior) -> p_t
PriorRule = Callable[[np.random.Generator, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class LabelledOutputs:
    """A labelled holdout: the model's raw outputs (n, k) (logits or probabilities) and the labels (n,) 0..k-1."""

    outputs: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class TargetSet:
    """A target set under known label shift: raw outputs (m, k), the true labels (m,) and the population prior
    p_t (k,) the labels were drawn from."""

    outputs: np.ndarray
    labels: np.ndarray
    prior: np.ndarray

    @property
    def empirical_prior(self) -> np.ndarray:
        """The label frequencies of the drawn rows, (k,)."""
        k = len(self.prior)
        return np.bincount(self.labels, minlength=k) / max(len(self.labels), 1)


def draw_with_replacement(outputs: np.ndarray, labels: np.ndarray, prior: np.ndarray, m: int,
                          rng: np.random.Generator) -> TargetSet:
    """Section 6's target (Garg et al. 2020): m labels i.i.d. from ``prior``, then for each row an example of its
    class drawn *with replacement* from the pool (``outputs``, ``labels``), so that rows repeat once a class's draws
    approach its pool size. Raises InputError when a class drawn has no example in the pool."""
    k = len(prior)
    counts = rng.multinomial(m, prior)
    parts = []
    for c in np.flatnonzero(counts):
        members = np.flatnonzero(labels == c)
        if members.size == 0:
            raise InputError(f"the target pool has no example of class {int(c)}, which the prior draws; use a pool "
                             "that holds every class.")
        parts.append(rng.choice(members, counts[c], replace=True))
    idx = rng.permutation(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    return TargetSet(outputs[idx], labels[idx], np.asarray(prior, dtype=np.float64)[:k])


def dirichlet_target(alpha: float = 1.0, absent: tuple[int, ...] = ()) -> PriorRule:
    """p_t ~ Dirichlet(alpha) per seed; the classes in ``absent`` get p_t = 0 (the rest renormalised)."""

    def rule(rng: np.random.Generator, source_prior: np.ndarray) -> np.ndarray:
        p = rng.dirichlet(np.full(len(source_prior), float(alpha)))
        p[list(absent)] = 0.0
        return p / p.sum()

    return rule


def fixed_target(prior) -> PriorRule:
    """The same p_t for every seed."""
    p = np.asarray(prior, dtype=np.float64)

    def rule(rng: np.random.Generator, source_prior: np.ndarray) -> np.ndarray:
        return p / p.sum()

    return rule


def _streams(name: str, seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Independent generators of one case and seed: the holdout, the target, and what both share (a split). The
    case's name is part of the seed, so that two cases never share their draws."""
    key = int.from_bytes(name.encode(), "little") % (2 ** 63)
    holdout, target, shared = np.random.SeedSequence([int(seed), 20, key]).spawn(3)
    return np.random.default_rng(holdout), np.random.default_rng(target), np.random.default_rng(shared)


@dataclass(frozen=True)
class ZooCase:
    """One classifier of the zoo (abstract: :class:`GaussianCase`, :class:`SklearnCase`).

    Attributes:
        name: short id (``--cases`` of the benchmark, the test ids).
        description: one line on what it is.
        n_classes: k.
        output_kind: ``"logits"`` or ``"probabilities"`` (what the model logs, as a reference declares it).
        m: target rows per draw.
        target_prior: the rule that draws p_t per seed.
        fast: runs in seconds on today's code (the tests); False: the benchmark only.
    """

    name: str
    description: str
    n_classes: int
    output_kind: str
    m: int
    target_prior: PriorRule = field(repr=False)
    fast: bool = True

    def holdout(self, seed: int) -> LabelledOutputs:    # pragma: no cover - abstract
        raise NotImplementedError

    def target(self, seed: int) -> TargetSet:            # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class GaussianCase(ZooCase):
    """Gaussian classes with a model of known miscalibration (:class:`WellSpecifiedGaussians`).

    Attributes (beside :class:`ZooCase`'s): ``n`` holdout rows; ``sep`` class separation; ``scale`` the model's
    over-confidence (< 1: under-confident); ``source_prior`` p_s (None: mildly imbalanced, from ``problem_seed``);
    ``dtype`` of the outputs as logged (float16 rounds the logits); ``pool``: None draws the target's rows fresh,
    a number draws a pool of about that many rows per class (balanced, fresh per seed) and the target from it with
    replacement (:func:`draw_with_replacement`, Section 6's sampling: rows repeat).
    """

    n: int = 2000
    sep: float = 3.0
    scale: float = 1.8
    source_prior: tuple[float, ...] | None = None
    dtype: str = "float64"
    problem_seed: int = 0
    pool: int | None = None

    @property
    def problem(self) -> WellSpecifiedGaussians:
        return _gaussian_problem(self.n_classes, self.sep, self.scale, self.source_prior, self.problem_seed)

    def _rows(self, prior, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        z, y = self.problem.draw(prior, n, rng)
        order = rng.permutation(len(y))
        return z[order].astype(self.dtype), y[order]

    def holdout(self, seed: int) -> LabelledOutputs:
        """``n`` labelled rows, labels i.i.d. from p_s."""
        z, y = self._rows(self.problem.source_prior, self.n, _streams(self.name, seed)[0])
        return LabelledOutputs(z, y)

    def target(self, seed: int) -> TargetSet:
        """``m`` rows, labels i.i.d. from this seed's p_t."""
        rng = _streams(self.name, seed)[1]
        prior = self.target_prior(rng, self.problem.source_prior)
        if self.pool is not None:
            balanced = np.full(self.n_classes, 1.0 / self.n_classes)
            z, y = self._rows(balanced, self.pool * self.n_classes, rng)
            return draw_with_replacement(z, y, prior, self.m, rng)
        z, y = self._rows(prior, self.m, rng)
        return TargetSet(z, y, prior)


@lru_cache(maxsize=32)
def _gaussian_problem(k: int, sep: float, scale: float, source_prior, seed: int) -> WellSpecifiedGaussians:
    problem = WellSpecifiedGaussians.make(k, sep=sep, scale=scale, seed=seed)
    if source_prior is not None:
        p = np.asarray(source_prior, dtype=np.float64)
        problem = WellSpecifiedGaussians(source_prior=p / p.sum(), sep=sep, scale=scale, offset=problem.offset)
    return problem


@dataclass(frozen=True)
class SklearnCase(ZooCase):
    """A scikit-learn model on one of scikit-learn's bundled datasets.

    Attributes (beside :class:`ZooCase`'s): ``dataset`` (``"iris"``, ``"wine"``, ``"breast_cancer"``,
    ``"digits"``), ``model`` (``"logistic"`` or ``"forest"``), ``train_fraction`` of the rows (stratified, fixed)
    the model is trained on; the other rows are split in half per seed: holdout and target pool.
    """

    dataset: str = "iris"
    model: str = "logistic"
    train_fraction: float = 0.4

    def split(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(holdout rows, target-pool rows) of this seed: disjoint halves of the rows the model was not trained on
        (indices into them)."""
        n_rest = len(_sklearn_outputs(self.dataset, self.model, self.train_fraction)[1])
        order = _streams(self.name, seed)[2].permutation(n_rest)
        return order[:n_rest // 2], order[n_rest // 2:]

    def _pools(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(holdout outputs, holdout labels, target-pool outputs, target-pool labels) of this seed's split."""
        outputs, labels = _sklearn_outputs(self.dataset, self.model, self.train_fraction)
        h, t = self.split(seed)
        return outputs[h], labels[h], outputs[t], labels[t]

    def holdout(self, seed: int) -> LabelledOutputs:
        """This seed's holdout half of the rows the model was not trained on."""
        z, y, _, _ = self._pools(seed)
        return LabelledOutputs(z, y)

    def target(self, seed: int) -> TargetSet:
        """``m`` rows drawn per class *without* replacement from this seed's target pool, so that holdout and target
        are disjoint simple random samples of each class (exchangeable, as independent draws would be; resampling
        with replacement would make the target a copy of a pool smaller than itself). The labels are i.i.d. from
        p_t; p_t is redrawn until m p_t(y) + 3 sqrt(m p_t(y)) rows of each class fit in the pool, the counts until
        they fit. Raises InputError when no drawn prior fits (m too large for the pool)."""
        _, yh, pool, labels = self._pools(seed)
        rng = _streams(self.name, seed)[1]
        source = np.bincount(yh, minlength=self.n_classes) / len(yh)
        return _draw_without_replacement(self, pool, labels, lambda: self.target_prior(rng, source), rng)


def _draw_without_replacement(case: ZooCase, pool: np.ndarray, labels: np.ndarray,
                              draw_prior: Callable[[], np.ndarray], rng: np.random.Generator) -> TargetSet:
    """``case.m`` rows of the pool drawn per class without replacement, under a prior from ``draw_prior`` that fits
    the pool (:func:`_fitting_prior`), the class counts redrawn until they fit; the rows in random order."""
    available = np.bincount(labels, minlength=case.n_classes)
    prior = _fitting_prior(draw_prior, case.m, available, case.name)
    counts = rng.multinomial(case.m, prior)
    while np.any(counts > available):
        counts = rng.multinomial(case.m, prior)
    idx = np.concatenate([rng.choice(np.flatnonzero(labels == c), counts[c], replace=False)
                          for c in range(case.n_classes)])
    idx = rng.permutation(idx)
    return TargetSet(pool[idx], labels[idx], prior)


def _fitting_prior(draw: Callable[[], np.ndarray], m: int, available: np.ndarray, name: str) -> np.ndarray:
    """A prior from ``draw`` whose expected class counts, plus three standard deviations, fit in ``available``."""
    for _ in range(10_000):
        prior = draw()
        mean = m * prior
        if np.all(mean + 3.0 * np.sqrt(mean) <= available):
            return prior
    raise InputError(f"zoo case {name!r}: no target prior drawn fits m = {m} rows into a pool with class counts "
                     f"{available.tolist()}; use a smaller m.")


def sklearn_outputs(dataset: str, model: str, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The outputs of scikit-learn's ``model`` (``"logistic"`` or ``"forest"``) on ``dataset``'s rows it was not
    trained on, and their labels (the :class:`SklearnCase` pools; trained once per process, fixed seed)."""
    return _sklearn_outputs(dataset, model, train_fraction)


@lru_cache(maxsize=16)
def _sklearn_outputs(dataset: str, model: str, train_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The model's outputs and the labels of every row it was not trained on (trained once, fixed seed)."""
    from sklearn import datasets
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    loaders = {"iris": datasets.load_iris, "wine": datasets.load_wine, "breast_cancer": datasets.load_breast_cancer,
               "digits": datasets.load_digits}
    if dataset not in loaders:
        raise InputError(f"dataset must be one of {sorted(loaders)}, got {dataset!r}.")
    x, y = loaders[dataset](return_X_y=True)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, train_size=train_fraction, stratify=y, random_state=0)
    if model == "logistic":
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    elif model == "forest":
        clf = RandomForestClassifier(n_estimators=50, random_state=0)
    else:
        raise InputError(f"model must be 'logistic' or 'forest', got {model!r}.")
    clf.fit(x_train, y_train)
    return np.asarray(clf.predict_proba(x_rest), dtype=np.float64), np.asarray(y_rest, dtype=np.int64)


#: the generators of :class:`MisspecifiedCase`: make_classification's arguments (fixed seed 0) and the model
_MISSPECIFIED = {
    # 4 classes of two Gaussian clusters each: a linear model's logits cannot be made canonically calibrated
    "two-cluster-logistic": (dict(n_features=6, n_informative=3, n_redundant=0, n_classes=4, n_clusters_per_class=2,
                                  class_sep=0.7), "logistic"),
    # 3 classes, 3 informative features and 5 linear combinations of them: naive Bayes counts the evidence 6 times
    "correlated-naive-bayes": (dict(n_features=8, n_informative=3, n_redundant=5, n_classes=3, n_clusters_per_class=1,
                                    class_sep=1.0), "naive_bayes"),
    # kept back (not tuned on): a depth-limited tree's leaf frequencies, 5 classes
    "shallow-tree": (dict(n_features=6, n_informative=4, n_redundant=1, n_classes=5, n_clusters_per_class=2,
                          class_sep=1.0), "tree"),
}
#: rows make_classification draws once per generator (the first _TRAIN_ROWS train the model, the rest are the pool)
_POOL_ROWS, _TRAIN_ROWS = 400_000, 20_000


@lru_cache(maxsize=4)
def _misspecified_outputs(generator: str) -> tuple[np.ndarray, np.ndarray]:
    """The model's logits (log-probabilities) and the labels of the pool rows it was not trained on."""
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.tree import DecisionTreeClassifier

    if generator not in _MISSPECIFIED:
        raise InputError(f"generator must be one of {sorted(_MISSPECIFIED)}, got {generator!r}.")
    kwargs, model = _MISSPECIFIED[generator]
    x, y = make_classification(n_samples=_POOL_ROWS, random_state=0, **kwargs)
    clf = {"logistic": lambda: LogisticRegression(max_iter=2000), "naive_bayes": GaussianNB,
           "tree": lambda: DecisionTreeClassifier(max_depth=3, random_state=0)}[model]()
    clf.fit(x[:_TRAIN_ROWS], y[:_TRAIN_ROWS])
    rest = x[_TRAIN_ROWS:]
    if model == "logistic":
        z = clf.decision_function(rest)
    else:      # log-probabilities, floored so that a tree's empty-class leaves stay finite
        z = np.log(np.maximum(clf.predict_proba(rest), 1e-4))
    return np.asarray(z, dtype=np.float64), np.asarray(y[_TRAIN_ROWS:], dtype=np.int64)


def misspecified_outputs(generator: str) -> tuple[np.ndarray, np.ndarray]:
    """The pool of a :class:`MisspecifiedCase` generator: the model's logits and the labels (trained once)."""
    return _misspecified_outputs(generator)


@dataclass(frozen=True)
class MisspecifiedCase(ZooCase):
    """A model that temperature-and-bias scaling cannot make canonically calibrated (the paper's miscalibration
    term): one of :data:`_MISSPECIFIED`'s generators, the model trained once on its first rows; per seed, ``n``
    holdout rows are drawn from the pool at random and the target from the other rows per class without
    replacement (:class:`SklearnCase`'s draw), so holdout and target are fresh rows of one distribution (the pool is
    380,000 rows, many times either).

    Attributes (beside :class:`ZooCase`'s): ``generator``, ``n``.
    """

    generator: str = "two-cluster-logistic"
    n: int = 3000

    def _split(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        z, y = _misspecified_outputs(self.generator)
        order = _streams(self.name, seed)[2].permutation(len(y))
        h, t = order[:self.n], order[self.n:]
        return z[h], y[h], z[t], y[t]

    def holdout(self, seed: int) -> LabelledOutputs:
        """``n`` rows of the pool, at random."""
        z, y, _, _ = self._split(seed)
        return LabelledOutputs(z, y)

    def target(self, seed: int) -> TargetSet:
        """``m`` of the other rows under this seed's p_t, per class without replacement."""
        _, yh, pool, labels = self._split(seed)
        rng = _streams(self.name, seed)[1]
        source = np.bincount(yh, minlength=self.n_classes) / len(yh)
        return _draw_without_replacement(self, pool, labels, lambda: self.target_prior(rng, source), rng)


def _cases() -> tuple[ZooCase, ...]:
    dir1 = dirichlet_target(1.0)
    g, s = GaussianCase, SklearnCase
    return (
        g("gauss-k2", "k = 2, ~90% accurate, over-confident logits (x1.8)", 2, "logits", 2000, dir1, sep=1.8),
        g("gauss-k10", "k = 10, ~91% accurate", 10, "logits", 5000, dir1, n=5000, sep=3.0),
        g("gauss-k30", "k = 30 balanced, ~92% accurate", 30, "logits", 10_000, dir1, n=10_000, sep=3.6,
          source_prior=(1.0,) * 30),
        g("separable", "k = 5, 100% accurate holdout (classes far apart)", 5, "logits", 2000, dir1, sep=12.0),
        g("under-confident", "k = 5, ~91% accurate, logits x0.3", 5, "logits", 2000, dir1, scale=0.3),
        g("over-confident", "k = 5, ~94% accurate, logits x6", 5, "logits", 2000, dir1, scale=6.0),
        g("rare-0.1pct", "k = 5, one class 0.1% of a 10,000-row holdout", 5, "logits", 10_000, dir1, n=10_000,
          source_prior=(0.001, 0.25, 0.25, 0.25, 0.249)),
        g("fraud", "binary, 1% positives in a 20,000-row holdout, 3% in the target", 2, "logits", 20_000,
          fixed_target((0.97, 0.03)), n=20_000, sep=3.0, source_prior=(0.99, 0.01)),
        g("tiny-holdout", "k = 3, 60-row holdout", 3, "logits", 2000, dir1, n=60),
        g("tiny-target", "k = 3, 30-row target", 3, "logits", 30, dir1),
        g("absent-class", "k = 5, class 0 absent from the target", 5, "logits", 2000, dirichlet_target(1.0, (0,))),
        g("float16", "k = 10, logits logged as float16 (x4, rounded)", 10, "logits", 5000, dir1, n=5000, scale=4.0,
          dtype="float16"),
        s("rf-breast-cancer", "random forest (50 trees) on breast_cancer: probabilities with 0s, 1s, ties", 2,
          "probabilities", 60, dir1, dataset="breast_cancer", model="forest"),
        s("rf-wine", "random forest (50 trees) on wine: probabilities with 0s, 1s, ties", 3, "probabilities", 20,
          dir1, dataset="wine", model="forest"),
        s("lr-iris", "logistic regression on iris", 3, "probabilities", 20, dir1, dataset="iris", train_fraction=0.3),
        s("lr-wine", "logistic regression on wine", 3, "probabilities", 20, dir1, dataset="wine"),
        s("lr-breast-cancer", "logistic regression on breast_cancer", 2, "probabilities", 60, dir1,
          dataset="breast_cancer"),
        s("lr-digits", "logistic regression on digits", 10, "probabilities", 150, dir1, dataset="digits"),
        g("gauss-k10-repeated", "k = 10, target drawn with replacement from ~300 rows a class (Section 6): most "
          "rows repeat", 10, "logits", 5000, dir1, n=5000, sep=3.0, pool=300),
        MisspecifiedCase("lr-two-clusters", "logistic regression on 4 classes of two clusters each (~59% accurate): "
                         "no BCTS makes it canonically calibrated", 4, "logits", 5000, dir1),
        MisspecifiedCase("nb-correlated", "Gaussian naive Bayes on 3 classes with 5 redundant (correlated) features",
                         3, "logits", 5000, dir1, generator="correlated-naive-bayes"),
        MisspecifiedCase("tree-shallow", "a depth-3 decision tree's leaf frequencies on 5 classes (kept back: not "
                         "tuned on)", 5, "logits", 5000, dir1, generator="shallow-tree"),
        g("gauss-k100", "k = 100 balanced, ~94% accurate, n = 10,000, m = 100,000", 100, "logits", 100_000, dir1,
          n=10_000, sep=4.2, source_prior=(1.0,) * 100, fast=False),
        g("gauss-k1000", "k = 1,000 balanced, n = 50,000, m = 100,000", 1000, "logits", 100_000, dir1, n=50_000,
          sep=5.0, source_prior=(1.0,) * 1000, fast=False),
    )


#: every case of the zoo, by name
CASES: dict[str, ZooCase] = {c.name: c for c in _cases()}


def case(name: str) -> ZooCase:
    """The case called ``name``. Raises InputError naming the cases when there is none."""
    if name not in CASES:
        raise InputError(f"no zoo case {name!r}; the cases are {', '.join(CASES)}.")
    return CASES[name]


def fast_cases() -> list[ZooCase]:
    """The cases that run in seconds (the tests)."""
    return [c for c in CASES.values() if c.fast]


PoolsLoader = Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class OutputsCase(ZooCase):
    """A trained model's outputs on two labelled pools of real examples (e.g. a network's logits on Fashion-MNIST's
    validation and test images): the holdout is ``n`` rows of the first pool without replacement; the target is
    ``m`` rows of the second, fresh (drawn per class without replacement, as :class:`SklearnCase`) or, with
    ``replace``, Section 6's with replacement (:func:`draw_with_replacement`), from the pool's first ``pool_rows``
    rows when given (fewer items: more repeats). With ``split`` the two pools hold the same items row for row (e.g.
    the test images and the same images shifted in look): the rows are cut per seed into two random halves, the
    holdout drawn from the first pool's half and the target from the second pool's other half, so that without a
    shift both are exchangeable samples of one distribution (label shift holds exactly; Fashion-MNIST's training
    and test files, for one, differ slightly in look).

    Attributes (beside :class:`ZooCase`'s): ``pools`` a picklable callable returning (holdout-pool outputs, labels,
    target-pool outputs, labels); ``n``; ``replace``; ``pool_rows``; ``split``.
    """

    pools: PoolsLoader | None = field(default=None, repr=False)
    n: int = 5000
    replace: bool = False
    pool_rows: int | None = None
    split: bool = False

    def _loaded(self, seed: int):
        if self.pools is None:
            raise InputError(f"zoo case {self.name!r} has no pools; pass pools=a callable returning the outputs.")
        zh, yh, zt, yt = self.pools()
        if not self.split:
            return zh, yh, zt, yt
        if len(yh) != len(yt):
            raise InputError(f"zoo case {self.name!r}: split needs two pools of the same rows, got {len(yh)} and "
                             f"{len(yt)} rows.")
        order = _streams(self.name, seed)[2].permutation(len(yt))
        h, t = order[:len(yt) // 2], order[len(yt) // 2:]
        return zh[h], yh[h], zt[t], yt[t]

    def holdout(self, seed: int) -> LabelledOutputs:
        """``n`` rows of the holdout pool, without replacement."""
        z, y, _, _ = self._loaded(seed)
        idx = _streams(self.name, seed)[0].choice(len(y), min(self.n, len(y)), replace=False)
        return LabelledOutputs(z[idx], y[idx])

    def target(self, seed: int) -> TargetSet:
        """``m`` rows of the target pool under this seed's p_t, fresh or with replacement (see the class)."""
        _, yh, pool, labels = self._loaded(seed)
        if self.pool_rows is not None:
            pool, labels = pool[:self.pool_rows], labels[:self.pool_rows]
        rng = _streams(self.name, seed)[1]
        source = np.bincount(yh, minlength=self.n_classes) / len(yh)
        if self.replace:
            return draw_with_replacement(pool, labels, self.target_prior(rng, source), self.m, rng)
        return _draw_without_replacement(self, pool, labels, lambda: self.target_prior(rng, source), rng)
