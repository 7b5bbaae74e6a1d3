"""Is it label shift at all? A goodness-of-fit test of the label-shift assumption on the calibrated outputs.

Under label shift (Garg, Wu, Balakrishnan & Lipton, "A Unified View of Label Shift Estimation", NeurIPS 2020,
Section 2: p_t(x | y) = p_s(x | y)) every function g of the input has

    E_t[g(x)] = sum_y p_t(y) E_s[g(x) | y] = E_s[w(y) g(x)],        w(y) = p_t(y) / p_s(y),

in particular every function of the classifier's calibrated output f(x). A new class, covariate shift or a broken
input pipeline changes p(x | y), and with it the distribution of f(x) in ways that no reweighting of the holdout's
classes reproduces. :func:`label_shift_test` checks this identity on regions of the output simplex (predicted
class x confidence bin, set on the labelled holdout) by a likelihood ratio whose null fit estimates w and the
holdout's class-conditional histograms jointly (p-value from a parametric bootstrap of that fit by default), and,
up to 20 classes, on the log-odds profiles inside each predicted class (:mod:`.log_odds`);
the reported p-value splits the level 30/70 between the two parts (:func:`combine_p_values`). A Wald form with the
MLLS weights is kept for comparison (``method="wald"``). Derivation, measured size and power, and what to do when
it fires: ``docs/label_shift_test.md``.

    from labelshift.inference.label_shift_test import label_shift_test, prepare_holdout
    res = label_shift_test(holdout_probs, holdout_labels, target_probs)   # calibrated outputs, holdout labels
    if res.rejects(0.05):
        print(res.summary())          # "Not label shift: p = ... (regions chi2 = ..., p = ...; log-odds ...); ..."
    prepared = prepare_holdout(holdout_probs, holdout_labels)           # many targets against one holdout
    res = label_shift_test(holdout_probs, holdout_labels, target_probs, prepared=prepared)     # the same result
"""
from __future__ import annotations

import numpy as np
from scipy.stats import norm

from ...errors import InputError
from .holdout import MAX_CONFIDENCE_BINS, MIN_REGION_ROWS, PreparedHoldout
from .holdout_noise import class_inflation
from .inputs import BOOTSTRAP_DRAWS, test_inputs, TestInputs
from .log_odds import HoldoutSide, log_odds_test
from .null_fit import fit_under_null
from .regions import region_name, Regions
from .regions_fit import (class_z_scores, likelihood_ratio_fit, region_counts, region_evidence, RegionCounts,
                          RegionsFit, wald_fit)
from .result import LabelShiftTest, combine_p_values

def _world_shares(regions: Regions, pi: np.ndarray, q: np.ndarray, p: np.ndarray, iterations: int = 100):
    """For the log-odds part's bootstrap world: a function of target output rows Z (T, k) giving each class's share
    of every row under the null fit (pi, q). Within a row the shares start from the calibrated posterior under the
    fitted shift, (q_y / p_y) f_y normalised (the E-step of MLLS, eq. mlls-sample); then, by iterative proportional
    fitting, the rows of each region r are rescaled per class until they split among the classes as the regions'
    fit says, q_y pi_y[r] / sum_y' q_y' pi_y'[r]. Calibration thus only orders the rows inside a region; how many
    of a region's rows each class gets comes from the holdout's labels (shares by region alone blur the classes'
    profiles inside a region; why this world: ``docs/label_shift_test.md``). A row of a region the fit gives no
    mass gets share 0 everywhere."""
    joint = q[:, None] * pi
    mix = joint.sum(axis=0)
    rho = np.where(mix > 0, joint / np.where(mix > 0, mix, 1.0), 0.0)          # (k, J): class shares per region
    k, J = rho.shape
    ratio = q / p

    def shares(Z: np.ndarray) -> np.ndarray:
        r = regions.assign(Z)
        want = np.bincount(r, minlength=J)[:, None] * rho.T                    # (J, k): the class totals per region
        R = Z * ratio[None, :]
        cell = (r[:, None] * k + np.arange(k)).ravel()                         # (row, class) -> region r, class
        for _ in range(iterations):
            R /= np.maximum(R.sum(axis=1, keepdims=True), 1e-300)
            # every class's total per region in one pass (the same sums, row after row, as one bincount a class)
            have = np.bincount(cell, weights=R.ravel(), minlength=J * k).reshape(J, k)
            scale = np.where(have > 0, want / np.maximum(have, 1e-300), 0.0)     # at most 1e300 x rows: finite
            if np.all(np.abs(scale[have > 0] - 1.0) < 1e-8):
                break
            R *= scale[r]
        return R / np.maximum(R.sum(axis=1, keepdims=True), 1e-300)
    return shares


def _with_log_odds(inp: TestInputs, rc: RegionCounts, fit: RegionsFit, method: str, class_names,
                   side: HoldoutSide | None = None) -> RegionsFit:
    """The regions fit with the log-odds part added: both p-values in ``extra``, the reported one combined by
    :func:`combine_p_values`."""
    # the second look (log_odds.py); the two p-values are combined by a weighted Bonferroni
    # bound (combine_p_values), so the combined test keeps its level whatever the dependence between them
    # its bootstrap world is the completed data of a null fit (the regions' fit; for the Wald form, one is made)
    if method != "likelihood-ratio":
        pi, q_null = fit_under_null(rc.N, rc.T, inp.p)[:2]
    else:
        pi, q_null = fit.pi, fit.q
    kappa = class_inflation(inp.holdout_inflation, inp.n_y, inp.Pt.shape[0], q_null)
    part = log_odds_test(inp.Ph, inp.y, inp.Pt, inp.bootstrap_draws, inp.seed,
                         _world_shares(rc.regions, pi, q_null, inp.p), q_null, side, kappa)
    extra = dict(fit.extra)
    extra.setdefault("holdout_inflation", kappa.tolist())
    extra.update(p_value_regions=fit.p_value, p_value_log_odds=part.p_value, log_odds_statistic=part.statistic,
                 p_value_log_odds_diagonal=part.p_value_diagonal, p_value_log_odds_block=part.p_value_block,
                 p_value_log_odds_sum=part.p_value_sum, log_odds_block_statistic=part.block_statistic,
                 log_odds_sum_statistic=part.sum_statistic, log_odds_draws_used=part.draws_used,
                 log_odds_moments=part.moments, log_odds_class=int(np.argmax(part.class_share)),
                 log_odds_class_share=float(np.max(part.class_share)),
                 log_odds_where=region_name((int(np.argmax(part.class_share)),), 0.0, 1.0, class_names))
    return fit._replace(p_value=combine_p_values(fit.p_value, part.p_value), extra=extra)


def _test_result(inp: TestInputs, rc: RegionCounts, fit: RegionsFit, method: str,
                 class_names) -> LabelShiftTest:
    """The :class:`LabelShiftTest` of a fit."""
    (m, k), n, J = inp.Pt.shape, inp.Ph.shape[0], rc.regions.n_regions
    items = region_evidence(rc, fit, class_names)
    bonf = float(norm.isf(0.05 / (2 * J)))
    return LabelShiftTest(statistic=fit.stat, dof=fit.dof, p_value=fit.p_value, weights=fit.w, source_prior=inp.p,
                          regions=items, class_z=class_z_scores(rc.regions, fit, k), n_target=m, n_holdout=n,
                          bonferroni_z=bonf, method=method,
                          extra={"n_regions": J, "min_region_rows": inp.min_region_rows,
                                 "max_confidence_bins": inp.max_confidence_bins, **fit.extra})


def _check_prepared(prepared, inp: TestInputs) -> None:
    """InputError unless ``prepared`` is None or was made from this holdout with this region rule."""
    if prepared is not None and not prepared.matches(inp.Ph, inp.y, inp.min_region_rows, inp.max_confidence_bins):
        raise InputError("prepared was made from another holdout or region rule than this test's; pass "
                         "prepare_holdout(holdout_probs, holdout_labels) of this holdout with the same "
                         "min_region_rows and max_confidence_bins, or prepared=None.")


def label_shift_test(holdout_probs, holdout_labels, target_probs, *, weights=None, source_prior=None,
                     min_region_rows: int = MIN_REGION_ROWS, max_confidence_bins: int = MAX_CONFIDENCE_BINS,
                     class_names=None, method: str = "likelihood-ratio", calibration: str = "bootstrap",
                     bootstrap_draws: int = BOOTSTRAP_DRAWS, seed: int = 0,
                     log_odds: bool | None = None, prepared: PreparedHoldout | None = None,
                     holdout_inflation: float | str | None = None) -> LabelShiftTest:
    """Test H0: the target differs from the source by label shift only (p_t(x | y) = p_s(x | y), Garg et al. 2020,
    Section 2), from the calibrated outputs of one classifier on a labelled holdout and on unlabelled target rows.

    Under H0, for each region R of the output simplex, P_t(f(x) in R) = sum_y p_t(y) P_s(f(x) in R | y). Regions:
    predicted class x confidence bin (max_y f_y), bins at holdout quantiles holding at least ``min_region_rows``
    holdout rows each, at most ``max_confidence_bins`` per predicted class; classes predicted fewer than
    ``min_region_rows`` times on the holdout are pooled into one region (the degenerate-bin rule).

    ``method="likelihood-ratio"`` (default): the likelihood ratio of the multinomial model in which the class
    weights (a binned MLLS) and the holdout's class-conditional histograms are fitted jointly under H0 (EM), against
    free target frequencies; its reference law is a parametric bootstrap of the null fit (``calibration=
    "bootstrap"``, ``bootstrap_draws`` draws, p = (1 + #{LR* >= LR}) / (B + 1)) or chi^2 with J - k dof
    (``"chi2"``; conservative under shifted priors). ``method="wald"``: the MLLS weights with a delta-method
    covariance, kept for comparison (liberal under severe shift). ``log_odds=True`` adds the log-odds profiles
    inside each predicted class (:mod:`.log_odds`); the reported ``p_value`` is then
    ``combine_p_values(p_regions, p_log_odds)`` = min(1, p_regions / 0.3, p_log_odds / 0.7) (weighted Bonferroni,
    :data:`REGIONS_SHARE` = 0.3), both parts in ``extra``. Per-region z-scores rank where the target disagrees
    (they ignore the estimation of w; the p-value does not).

    Given one holdout: its error is fixed for every target tested against it, so both bootstraps draw class y's
    holdout error kappa_y times over in variance (:mod:`.holdout_noise`; 2 by default, 1: valid only on average
    over holdouts; ``"derived"``: from the holdout's share of class y's variance). Derivation and measured rates:
    ``docs/label_shift_test.md``, "Given one holdout".

    Assumes independent rows; the regions and the calibrator (both fit on the holdout) are held fixed. Validity
    does not need calibrated outputs (the identity holds for any fixed f), only the regions' meaning does. It
    cannot see a violation that leaves f(x) a mixture of the holdout's class-conditional laws (e.g. drift along
    directions the classifier ignores). Statistic, null fit, bootstrap, evidence and cost:
    ``docs/label_shift_test.md`` ("The statistic and its null distribution"); measured size and power:
    ``benchmarks/README.md`` ("Label-shift test: size and power").

    Args:
        holdout_probs: (n, k) calibrated outputs on the labelled holdout (the rows the calibrator was fit on).
        holdout_labels: (n,) integer labels 0..k-1; every class needs at least :data:`MIN_CLASS_ROWS` rows.
        target_probs: (m, k) calibrated outputs on the target rows.
        weights: the MLLS weights for these target rows relative to ``source_prior`` (checked for optimality): the
            starting point of the null fit (likelihood ratio) or the weights tested (Wald); None (default) starts
            the null fit at w = 1, or solves MLLS here for Wald.
        source_prior: p_s; default the holdout's class frequencies (what ``MLLS().fit`` uses).
        min_region_rows, max_confidence_bins: the region rule above.
        class_names: optional k names used in the region names.
        method: ``"likelihood-ratio"`` (default) or ``"wald"``.
        calibration: reference law of the likelihood ratio: ``"bootstrap"`` (default) or ``"chi2"``; ignored by
            the Wald form (chi^2).
        bootstrap_draws: B, at least 19 (default :data:`BOOTSTRAP_DRAWS` = 200; the smallest p-value is 1/(B+1)).
        seed: seed of the bootstrap draws (default 0: the same inputs give the same p-value).
        log_odds: add the log-odds part; it uses ``bootstrap_draws`` and ``seed`` too. None (default): for
            k <= BLOCK_MAX_CLASSES = 20 classes, not above (its size at k = 100 is not the level, see the docs).
        prepared: optional, :func:`prepare_holdout` of this holdout with this region rule, for many tests against
            one holdout: its work on the holdout is reused (the result is the same).
        holdout_inflation: kappa >= 1, the variance factor of the holdout's error in the bootstraps' draws, for
            every class; ``"derived"``: kappa_y per class as above; None (the default):
            :data:`.holdout_noise.HOLDOUT_INFLATION` = 2; 1: the law averaged over holdouts, the test before. The
            kappa_y used are recorded in ``extra["holdout_inflation"]`` (a list of k).

    Returns:
        :class:`LabelShiftTest`.

    Raises:
        InputError: shapes or classes that do not match, a class with too few holdout rows, a holdout smaller than
            :data:`MIN_HOLDOUT` or a target smaller than :data:`MIN_TARGET`, weights that are not the MLLS optimum,
            ``holdout_inflation`` below 1 or neither a number nor "derived",
            ``prepared`` made from another holdout or region rule.
    """
    inp = test_inputs(holdout_probs, holdout_labels, target_probs, weights, source_prior, min_region_rows,
                       max_confidence_bins, class_names, method, calibration, bootstrap_draws, seed, log_odds,
                       holdout_inflation)
    _check_prepared(prepared, inp)
    rc = region_counts(inp, prepared)
    fit = likelihood_ratio_fit(inp, rc, calibration) if method == "likelihood-ratio" else wald_fit(inp, rc)
    if inp.log_odds:
        fit = _with_log_odds(inp, rc, fit, method, class_names, None if prepared is None else prepared.log_odds)
    return _test_result(inp, rc, fit, method, class_names)
