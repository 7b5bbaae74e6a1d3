"""The Dirichlet-shift runner on synthetic precomputed outputs (no network) and the results page's claim checks."""
from __future__ import annotations

import numpy as np
import pytest

from labelshift.calibration import softmax
from labelshift.errors import InputError
from labelshift.experiments import images
from tasks.sweep.results_page import claims

K = 5


def _pools(fingerprint="p", n=500, seed=0):
    rng = np.random.default_rng(seed)

    def pool(n):
        y = np.repeat(np.arange(K), n // K)
        z = rng.normal(size=(len(y), K))
        z[np.arange(len(y)), y] += 3.0
        return softmax(z), y

    pv, yv = pool(n)
    pt, yt = pool(n)
    # x | y ~ N(3 e_y, I): the exact posterior is softmax(3 x) = softmax(3 log softmax(x)) ("calibrated"), while
    # softmax(x) is an under-confident version of it ("raw")
    return images.Pools(pv, softmax(3 * np.log(pv)), yv, pt, softmax(3 * np.log(pt)), yt, fingerprint=fingerprint)


def test_seed_chunks_and_models_do_not_change_numbers():
    pools = [_pools("a"), _pools("b", seed=1)]
    s = images.settings_grid("alpha", [0.1], m=300)[0]
    whole = images.run_setting(s, range(6), pools)
    parts = images.run_setting(s, [0, 1, 2], pools) + images.run_setting(s, [3, 4, 5], pools)
    # the draws are identical; the batched solvers may differ in the last bit with the batch's composition (RLLS's
    # barrier method sums in BLAS), so weights agree to rounding, far below the solvers' 1e-10 tolerance
    np.testing.assert_allclose(whole.weights, parts.weights, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(whole.true_weights, parts.true_weights)
    # seed s uses model s % 2: the even seeds alone equal a run on model a alone with those seeds
    only_a = images.run_setting(s, [0, 2, 4], pools[0])
    np.testing.assert_allclose(whole.weights[[0, 2, 4]], only_a.weights, rtol=0, atol=1e-12)


def test_sweep_shapes_and_true_weights():
    sweep = images.mse_vs_size(_pools(), sizes=[100, 1000], alpha=1.0, n_seeds=5)
    assert sweep.kind == "size" and list(sweep.values) == [100.0, 1000.0]
    assert sweep.mse_mean.shape == (2, len(images.METHODS))
    r = sweep.results[0]
    # true weights: target label frequencies over the (uniform) source prior, so they average to 1 over classes
    np.testing.assert_allclose(r.true_weights.mean(axis=1), 1.0)
    # the mean over seeds of MLLS's MSE shrinks with m: 10x the data, MSE ~ 1/m; a factor 2 leaves room for noise
    j = sweep.methods.index("MLLS")
    assert sweep.mse_mean[1, j] < sweep.mse_mean[0, j] / 2


def test_calibrated_mlls_beats_uncalibrated_on_overconfident_outputs():
    # the "raw" outputs are the exact posterior flattened (its cube root, renormalised): MLLS on them is biased,
    # while MLLS on the exact posterior is consistent (Section 4). With m = 2000 and 20 seeds the bias dominates.
    sweep = images.mse_vs_alpha(_pools(n=2000), alphas=[1.0], m=2000, n_seeds=20, methods=["MLLS", "MLLS-uncal"])
    assert sweep.mse_mean[0, 0] < sweep.mse_mean[0, 1]


def test_bad_inputs():
    with pytest.raises(InputError):
        images.settings_grid("shift", [0.1])
    with pytest.raises(InputError):
        images.run_setting(images.settings_grid("alpha", [1.0])[0], 2, _pools(), ["MLLS-binned"])
    with pytest.raises(InputError):
        images.Setting("alpha", 0.0, 10, 0.0)


def _rows(values, mse):
    return [dict(experiment="alpha", value=v, method=m, mse_mean=mse[m][i], mse_se=0.0)
            for i, v in enumerate(values) for m in mse]


def test_claims_are_computed_from_numbers():
    good = _rows([0.1, 10.0], {"BBSE-hard": [1.0, 0.1], "RLLS": [1.1, 0.1], "MLLS-CM": [1.05, 0.1],
                               "MLLS": [0.2, 0.08]})
    verdicts = [c["verdict"] for c in claims(good)]
    assert verdicts == ["holds", "holds", "holds"]
    bad = _rows([0.1, 10.0], {"BBSE-hard": [1.0, 0.1], "RLLS": [1.1, 0.1], "MLLS-CM": [3.0, 0.1],
                              "MLLS": [2.0, 0.05]})
    verdicts = [c["verdict"] for c in claims(bad)]
    assert verdicts == ["partly", "partly", "fails"]


# ------------------------------------------------------------------ estimators on a named calibration (m@calibration)
def _with_calibrations(pools, **temperatures):
    """The pools plus calibrations named like calibrators: the exact posterior's log sharpened by a factor."""
    cal = {name: (softmax(t * np.log(pools.valid_raw)), softmax(t * np.log(pools.test_raw)))
           for name, t in temperatures.items()}
    return images.Pools(pools.valid_raw, pools.valid_cal, pools.valid_y, pools.test_raw, pools.test_cal,
                        pools.test_y, fingerprint=pools.fingerprint, calibrated=cal)


def test_estimator_at_a_calibration_runs_on_that_calibrations_outputs():
    pools = _with_calibrations(_pools(), TS=2.0, VS=3.0)
    s = images.settings_grid("alpha", [1.0], m=400)[0]
    methods = ["MLLS@TS", "MLLS@none", "MLLS-uncal", "BBSE-soft@none", "BBSE-soft", "BBSE-soft@VS", "MLLS@VS"]
    res = images.run_setting(s, 4, pools, methods)
    w = {m: res.weights[:, j] for j, m in enumerate(methods)}
    np.testing.assert_array_equal(w["MLLS@none"], w["MLLS-uncal"])          # "none" is the raw softmax
    np.testing.assert_array_equal(w["BBSE-soft@none"], w["BBSE-soft"])
    # MLLS@TS is MLLS on pools whose calibrated outputs are TS's (same fingerprint: the same target sets)
    as_ts = images.Pools(pools.valid_raw, pools.calibrated["TS"][0], pools.valid_y, pools.test_raw,
                         pools.calibrated["TS"][1], pools.test_y, fingerprint=pools.fingerprint)
    np.testing.assert_array_equal(w["MLLS@TS"], images.run_setting(s, 4, as_ts, ["MLLS"]).weights[:, 0])
    # VS's outputs here are pools.valid_cal/test_cal (the factor 3): MLLS@VS is the plain MLLS
    np.testing.assert_array_equal(w["MLLS@VS"], images.run_setting(s, 4, pools, ["MLLS"]).weights[:, 0])
    assert not np.array_equal(w["BBSE-soft@VS"], w["BBSE-soft"])


def test_calibrated_method_names_and_their_errors():
    assert images.split_method("BBSE-soft@NBVS") == ("BBSE-soft", "NBVS")
    assert images.method_calibration("MLLS", "TS") == ("MLLS", "TS")
    assert images.method_calibration("RLLS") == ("RLLS", "none")
    assert images.method_calibration("MLLS-uncal") == ("MLLS", "none")
    grid = images.calibration_grid(("BBSE-hard", "MLLS"), ("none", "BCTS", "VS"))
    assert grid == ["BBSE-hard", "MLLS-uncal", "BBSE-hard@BCTS", "MLLS", "BBSE-hard@VS", "MLLS@VS"]
    s = images.settings_grid("alpha", [1.0], m=50)[0]
    with pytest.raises(InputError, match=r"'MLLS@VS' needs the VS calibration.*hold TS.*add VS to the calibrators"):
        images.run_setting(s, 2, _with_calibrations(_pools(), TS=2.0), ["MLLS@VS"])
    for bad in ("MLLS@XX", "MLLS-binned@TS", "MLLS-uncal@TS"):
        with pytest.raises(InputError, match=r"<estimator>@<calibration>.*calibration of none, TS, BCTS, VS, NBVS"):
            images.check_image_methods([bad])
    with pytest.raises(InputError, match="duplicates"):
        images.check_image_methods(["MLLS@TS", "MLLS@TS"])
    p = _pools()
    with pytest.raises(InputError, match=r"calibrated\['TS'\] must hold"):
        images.Pools(p.valid_raw, p.valid_cal, p.valid_y, p.test_raw, p.test_cal, p.test_y,
                     calibrated={"TS": (p.valid_raw[:10], p.test_raw)})
    with pytest.raises(InputError, match="unknown calibration 'none'"):
        images.Pools(p.valid_raw, p.valid_cal, p.valid_y, p.test_raw, p.test_cal, p.test_y,
                     calibrated={"none": (p.valid_raw, p.test_raw)})


def test_report_tables_mse_by_calibration_and_estimator():
    from tasks.sweep.results_page import calibration_table

    rows = [dict(experiment="size", value=v, method=m, mse_mean=mse, mse_se=0.01)
            for v in (100.0, 1000.0)
            for m, mse in (("BBSE-hard", 1.0), ("MLLS-uncal", 0.5), ("BBSE-hard@TS", 1.0), ("MLLS@TS", 0.3),
                           ("MLLS", 0.2 if v == 1000 else 9.0), ("MLLS-CM", 1.1))]
    lines = calibration_table(rows, first_calibrator="BCTS")
    assert lines[0] == "### MSE by calibration and estimator at m = 1000"
    assert lines[2] == "| calibration | BBSE-hard | MLLS | MLLS-CM |"
    assert lines[4:7] == ["| none | 1 ± 0.01 | 0.5 ± 0.01 | 1.1 ± 0.01 |", "| TS | 1 ± 0.01 | 0.3 ± 0.01 | - |",
                          "| BCTS | - | 0.2 ± 0.01 | - |"]
    assert calibration_table([r for r in rows if "@" not in r["method"]]) == []     # no grid, no table
