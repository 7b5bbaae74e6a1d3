"""Forms for many classes: exact reformulations checked against the forms they replace, and the
label-shift test's paths above 20 classes (restricted-support regions fit, neighbour log-odds moments)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.close import ATOL, RTOL

from labelshift.inference.label_shift_test import DENSE_MAX_CLASSES, label_shift_test
from labelshift.inference.label_shift_test import log_odds as lot
from labelshift.inference.label_shift_test.null_fit import fit_under_null
from labelshift.inference.label_shift_test.sparse_null import own_regions, sparse_bootstrap_null, sparse_null_fit, support
from labelshift.inference.source_aware import _Design
from labelshift import Holdout, Target, AssessmentSettings


def _dense_design(blocks, Z):
    """The dense (rows, k, q) design the closed forms replaced (X_icr of docs/intervals.md)."""
    r, k = Z.shape
    out = []
    for b in blocks:
        if b == "scalar":
            out.append(Z[:, :, None])
        elif b == "vector":
            out.append(Z[:, :, None] * np.eye(k)[None])
        else:
            out.append(np.broadcast_to(np.eye(k)[None, :, 1:], (r, k, k - 1)))
    return np.concatenate(out, axis=2)


@pytest.mark.parametrize("blocks", [("scalar",), ("scalar", "bias"), ("vector", "bias"), ("vector",)])
def test_design_gram_and_cross_equal_the_dense_design(blocks):
    # the closed forms sum the same products in another order: equal to rounding (1e-12 relative is ~1e4 ulps)
    rng = np.random.default_rng(0)
    k, rows = 5, 300
    design = _Design(blocks, k)
    Z = rng.normal(size=(rows, k)) * 3
    Wt = rng.dirichlet(np.ones(k), size=rows)
    X = _dense_design(blocks, Z)
    dense = np.einsum("ic,icr,ics->rs", Wt, X, X)
    np.testing.assert_allclose(design.gram(Z, Wt), dense, rtol=1e-12, atol=1e-12 * np.abs(dense).max())
    w = rng.uniform(0.2, 3.0, size=k)
    S = Wt / (Wt @ w)[:, None]
    Q = S * w
    cross = S.T @ design.row_mean(Z, Q)
    np.testing.assert_allclose(design.cross(S, Z, Q, S.T @ S, w), cross, rtol=1e-12,
                               atol=1e-12 * np.abs(cross).max())


def test_sparse_null_fit_on_the_full_support_is_the_dense_fit():
    # with every (class, region) in the support the restricted model is the full one: both EMs start at the same
    # point and stop at a relative log-likelihood change of 1e-12, so the statistics agree far inside 1e-6
    rng = np.random.default_rng(1)
    k, J = 4, 12
    pi = rng.dirichlet(np.ones(J), size=k)
    N = np.stack([rng.multinomial(400, pi[c]) for c in range(k)]).astype(float)
    T = rng.multinomial(3000, rng.dirichlet(np.ones(k)) @ pi).astype(float)
    q0 = N.sum(axis=1) / N.sum()
    dense = fit_under_null(N, T, q0)
    sparse = sparse_null_fit(N, T, q0, np.ones((k, J), dtype=bool), np.arange(J))
    assert sparse[2] == pytest.approx(dense[2], rel=1e-6, abs=1e-6)
    np.testing.assert_allclose(sparse[1], dense[1], atol=1e-5)


def test_sparse_null_fit_keeps_its_support_and_its_bootstrap_is_reproducible():
    rng = np.random.default_rng(2)
    k, J = 5, 15
    N = np.zeros((k, J))
    for c in range(k):                        # class c is seen in its own 3 regions and one region of class c+1
        N[c, 3 * c:3 * c + 3] = rng.integers(20, 60, size=3)
        N[c, (3 * c + 3) % J] = 2
    group, region_group = np.arange(k), np.repeat(np.arange(k), 3)
    own = own_regions(group, region_group)
    T = rng.multinomial(2000, np.full(J, 1.0 / J)).astype(float)
    pi, q, stat, _ = sparse_null_fit(N, T, N.sum(axis=1) / N.sum(), own, region_group)
    allowed = support(N, own, region_group)
    # class c's support: its own group's 3 regions and the 3 regions of the group it was seen in once
    assert np.array_equal(allowed.sum(axis=1), np.full(k, 6))
    assert np.all(pi[~allowed] == 0.0)
    np.testing.assert_allclose(pi.sum(axis=1), 1.0)
    assert stat >= 0.0 and q.sum() == pytest.approx(1.0)
    a = np.concatenate(list(sparse_bootstrap_null(pi, q, N.sum(axis=1), 2000, 25, 7, own, region_group)))
    b = np.concatenate(list(sparse_bootstrap_null(pi, q, N.sum(axis=1), 2000, 25, 7, own, region_group)))
    assert np.array_equal(a, b) and np.all(a >= 0.0) and np.ptp(a) > 0
    # fitted in batches of 4 draws, each draw's statistic is the one fitted with all 25 at once (the same counts;
    # the fits' sums in another order: equal to float64 rounding, tests/close.py)
    batched = list(sparse_bootstrap_null(pi, q, N.sum(axis=1), 2000, 25, 7, own, region_group, 4))
    assert [x.size for x in batched] == [4] * 6 + [1]
    np.testing.assert_allclose(np.concatenate(batched), a, rtol=RTOL, atol=ATOL)


def test_label_shift_test_above_the_dense_limit_runs_on_neighbour_moments():
    # k = 24 > DENSE_MAX_CLASSES: the restricted regions fit and k (1 + NEIGHBOURS) log-odds moments at most
    rng = np.random.default_rng(3)
    k, d = 24, 12
    assert k > DENSE_MAX_CLASSES and k > lot.BLOCK_MAX_CLASSES
    means = rng.normal(size=(k, d)) * 1.3

    def outputs(prior, rows):
        y = rng.choice(k, size=rows, p=prior)
        z = (means[y] + rng.normal(size=(rows, d))) @ means.T - 0.5 * (means ** 2).sum(axis=1)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(axis=1, keepdims=True), y

    S, ys = outputs(np.full(k, 1.0 / k), 4000)
    P, _ = outputs(rng.dirichlet(np.ones(k)), 3000)
    res = label_shift_test(S, ys, P, bootstrap_draws=39, log_odds=True)
    assert 0.0 < res.p_value <= 1.0 and res.statistic >= 0.0
    assert 0 < res.extra["log_odds_moments"] <= k * (1 + lot.NEIGHBOURS)
    assert np.isnan(res.extra["p_value_log_odds_block"])
    again = label_shift_test(S, ys, P, bootstrap_draws=39, log_odds=True)
    assert again.to_dict() == res.to_dict()
    # the default above BLOCK_MAX_CLASSES: the regions part alone, the same regions p-value
    default = label_shift_test(S, ys, P, bootstrap_draws=39)
    assert "p_value_log_odds" not in default.extra
    assert default.p_value == res.extra["p_value_regions"]


def test_neighbour_columns_pick_the_classes_rows_lean_towards():
    # block 0's rows lean towards class 2, then 1; class 3 never shows: the two neighbours of block 0 are 1 and 2
    k = 4
    probs = np.array([[0.6, 0.15, 0.25, 1e-9], [0.7, 0.1, 0.2, 1e-9], [0.1, 0.8, 0.05, 0.05]])
    probs /= probs.sum(axis=1, keepdims=True)
    cols = lot._neighbour_columns(lot._features(probs, k), k, 2)
    assert list(cols[:k]) == list(range(k))
    block0 = sorted(int(c) - k for c in cols[k:k + 2])
    assert block0 == [1, 2]


def _gauss_case(k: int, n: int, m: int, seed: int, absent: int = 0):
    """Raw float32 logits of k Gaussian classes (the benchmark's data, 90% accurate) on a holdout of n rows and a
    target of m rows from a Dirichlet(1) prior, without the target rows of the first ``absent`` classes."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    from bench_many_classes import synthetic
    zs, ys, zt, yt = synthetic(k, n, m, 0.9, seed=seed)
    return zs, ys, zt[yt >= absent], yt[yt >= absent]


def test_pinned_class_variances_from_one_bordered_column_equal_the_pseudo_inverse(monkeypatch):
    # above _BORDERED_MIN_CLASSES a pinned class's bound comes from one column of H_GG^{-1} by the Schur complement;
    # forced here at k = 30 with 6 classes absent from the target: the same bounds as parts(G)'s pseudo-inverse
    from labelshift.calibration import BCTS
    from labelshift.inference import source_aware as sa
    zs, ys, zt, _ = _gauss_case(30, 6000, 4000, seed=3, absent=6)
    cal = BCTS().fit(zs, ys)
    ref = sa.source_aware_interval(zs, ys, zt, cal)
    assert ref.pinned[:6].all()
    monkeypatch.setattr(sa, "_BORDERED_MIN_CLASSES", 0)
    new = sa.source_aware_interval(zs, ys, zt, cal, weights=ref.weights)
    for key in ("weights_upper", "upper", "weights_lower", "lower"):
        np.testing.assert_allclose(getattr(new, key), getattr(ref, key), rtol=1e-9, atol=1e-15, err_msg=key)
    assert new.reasons == ref.reasons


def test_source_aware_dict_above_the_stored_limit_keeps_the_variances(monkeypatch):
    from labelshift.calibration import BCTS
    from labelshift.inference import source_aware as sa
    zs, ys, zt, _ = _gauss_case(5, 1000, 2000, seed=4)
    iv = sa.source_aware_interval(zs, ys, zt, BCTS().fit(zs, ys))
    full = iv.to_dict()
    assert "covariance" in full and "variance" not in full
    monkeypatch.setattr(sa, "STORED_COVARIANCE_MAX_CLASSES", 4)
    d = iv.to_dict()
    assert not {"covariance", "covariance_target", "covariance_holdout"} & set(d)
    np.testing.assert_array_equal(d["variance_holdout"], np.diag(iv.covariance_holdout))
    back = sa.SourceAwareInterval.from_dict(d)
    assert back.to_dict() == d
    np.testing.assert_array_equal(back.std_error, iv.std_error)


@pytest.mark.parametrize("kind", ["BCTS", "VS"])
def test_holdout_terms_in_row_blocks_equal_the_whole_array_section(monkeypatch, kind):
    # above _HOLDOUT_ROWS_MIN_CLASSES the holdout's J, p_s and influences are summed over row blocks; forced here at
    # k = 30 with blocks of 1,000 rows: the interval equals the whole-array one to rounding (summation order)
    from labelshift import rows
    from labelshift.calibration import BCTS, VS
    from labelshift.inference import source_aware as sa
    zs, ys, zt, _ = _gauss_case(30, 6000, 4000, seed=3, absent=4)
    cal = (BCTS if kind == "BCTS" else VS)().fit(zs, ys)
    ref = sa.source_aware_interval(zs, ys, zt, cal)
    monkeypatch.setattr(sa, "_HOLDOUT_ROWS_MIN_CLASSES", 0)
    monkeypatch.setattr(rows, "BLOCK_ENTRIES", 30 * 1000)
    new = sa.source_aware_interval(zs, ys, zt, cal, weights=ref.weights)
    for key in ("covariance", "covariance_holdout", "holdout_influence"):
        a = getattr(ref, key)
        np.testing.assert_allclose(getattr(new, key), a, rtol=1e-10, atol=1e-10 * np.abs(a).max(), err_msg=key)
    for key in ("lower", "upper", "weights_upper", "std_error"):
        np.testing.assert_allclose(getattr(new, key), getattr(ref, key), rtol=1e-9, atol=1e-15, err_msg=key)
    assert new.reasons == ref.reasons


def test_holdout_cov_above_the_dense_limit_is_the_per_class_sum(monkeypatch):
    from labelshift.inference.label_shift_test import regions_fit as sd
    rng = np.random.default_rng(5)
    k, J = 40, 150
    N = rng.integers(0, 20, size=(k, J)).astype(float)
    q = rng.dirichlet(np.ones(k))
    fast = sd._holdout_cov(N, None, q)                      # k > DENSE_MAX_CLASSES: one product
    monkeypatch.setattr(sd, "DENSE_MAX_CLASSES", k)
    np.testing.assert_allclose(fast, sd._holdout_cov(N, None, q), rtol=0, atol=1e-12 * np.abs(fast).max())


def test_default_path_at_150_classes_completes_with_the_many_class_forms(monkeypatch):
    # a proxy of k = 1,000 (benchmarks/bench_many_classes.py): k = 150 > 100 takes the Newton calibrator fit, the
    # holdout's row blocks, the bordered column of pinned classes and the summary without k x k matrices; a smaller
    # LARGE_ENTRIES sends the target through the blocked passes as at k = 1,000, m = 100,000
    import json
    import warnings
    from labelshift import rows
    from labelshift.calibration import BCTS
    from labelshift.inference.report import VERDICTS, ShiftReport, assess_shift
    monkeypatch.setattr(rows, "LARGE_ENTRIES", 1 << 19)
    k = 150
    zs, ys, zt, yt = _gauss_case(k, 7500, 4000, seed=5, absent=3)
    assert rows.is_large(zt)
    cal = BCTS().fit(zs, ys)
    assert cal.converged_
    S, P = cal.predict_proba(zs), cal.predict_proba(zt)
    prior = S.mean(axis=0) / S.mean(axis=0).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = assess_shift(Holdout(S, ys, prior, outputs=zs, calibrator=cal),
                           Target(P, zt),
                           AssessmentSettings(estimator="MLLS", cross_check=["BBSE-soft"], interval="source-aware"))
    assert rep.verdict in VERDICTS and rep.failures == [] and rep.accuracy is not None
    iv = rep.interval
    assert np.all(iv.lower <= iv.target_prior + 1e-12) and np.all(iv.target_prior <= iv.upper + 1e-12)
    assert iv.target_prior.sum() == pytest.approx(1.0) and iv.pinned.any()
    # each class's 95% interval covers the target's own class share in about 95% of classes (the intervals are
    # approximate at 50 holdout rows a class, docs/intervals.md: 0.90-0.95 measured from 33 rows); 0.8 is more than
    # 7 binomial standard errors (0.018 at 150 classes) below
    share = np.bincount(yt, minlength=k) / yt.size
    assert np.mean((iv.lower <= share + 1e-12) & (share <= iv.upper + 1e-12)) >= 0.8
    d = rep.to_dict()
    assert "variance" in d["interval"] and "covariance" not in d["interval"]
    assert ShiftReport.from_dict(json.loads(json.dumps(d))).to_dict() == d
