"""Large target sets: the row-block passes of :mod:`labelshift.rows` equal the whole-array formulas, the row solver
reaches the optimum of the in-memory one, ``assess_shift`` on a float32 set equals the float64 in-memory path, and
the streamed reading and writing of prediction logs give what the in-memory code gave.

Tolerances: sums in row blocks differ from whole-array sums only by summation order (relative 1e-12); both MLLS
solvers are certified to a duality gap of 1e-10, so their weights agree to 1e-8; a float32 copy of the probabilities
moves the estimate, the intervals and the test statistic by about its rounding (relative 1e-6).
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from labelshift import rows, Holdout, Target, AssessmentSettings
from labelshift.estimation import solvers
from labelshift.estimation.solvers.mlls_objective import _objective
from labelshift._validation import check_probabilities
from labelshift.inference.accuracy import expected_accuracy
from labelshift.monitoring.batches import iter_ids, read_ids
from labelshift.monitoring.outputs import corrected_parquet, write_corrected_parquet
from labelshift.calibration.scaling import BCTS
from labelshift.estimation.diagnostics import correct_predictions
from labelshift.inference.source_aware import source_aware_interval
from labelshift.inference.label_shift_test import label_shift_test
from labelshift.inference.report import assess_shift
from tests.fixtures.draws import gaussian_logits, softmax_draw

K = 6




@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 1000 rows, and sets of more than 2000 rows count as large."""
    monkeypatch.setattr(rows, "ROW_BLOCK", 1000)
    monkeypatch.setattr(rows, "LARGE_ROWS", 2000)


def test_row_passes_equal_the_whole_array_formulas(small_blocks):
    rng = np.random.default_rng(0)
    P, _ = softmax_draw(rng, 5500, np.full(K, 1 / K))
    w = rng.uniform(0.2, 2.0, K)
    np.testing.assert_allclose(rows.row_dot(P, w), P @ w, rtol=1e-13)
    np.testing.assert_allclose(rows.column_sums(P), P.sum(axis=0), rtol=1e-12)
    mean, cov = rows.mean_cov(P)
    np.testing.assert_allclose(mean, P.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(cov, np.cov(P, rowvar=False), rtol=1e-10, atol=1e-15)
    np.testing.assert_array_equal(rows.argmax_counts(P), np.bincount(P.argmax(axis=1), minlength=K))
    obj, grad, H, dead = rows.mlls_pass(P, w, hessian=True)
    assert not dead
    Pb, wb = P[None], w[None]
    np.testing.assert_allclose(obj, _objective(Pb, np.full((1, len(P)), 1 / len(P)), wb)[0], rtol=1e-12)
    fw = P @ w
    np.testing.assert_allclose(grad, (P / fw[:, None]).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(H, (P / fw[:, None] ** 2).T @ P / len(P), rtol=1e-12)
    # the public functions route a large set to these passes
    np.testing.assert_allclose(solvers.mlls_hessian(P, w), H, rtol=1e-15)
    np.testing.assert_allclose(solvers.mlls_gradient(P, w), grad, rtol=1e-15)
    np.testing.assert_allclose(solvers.mean_prediction(P, soft=True), P.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(solvers.mean_prediction(P[None], np.ones((1, len(P))))[0],
                               np.bincount(P.argmax(axis=1), minlength=K) / len(P), rtol=1e-15)


@pytest.mark.parametrize("case", ["interior", "boundary"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_solver_reaches_the_in_memory_optimum(case, dtype):
    rng = np.random.default_rng(1 if case == "interior" else 2)
    ps = rng.dirichlet(np.full(K, 5.0))
    pt = rng.dirichlet(np.full(K, 2.0))
    if case == "boundary":
        pt[[0, 3]] = 0.0
        pt /= pt.sum()
    P, _ = softmax_draw(rng, 20_000, pt)
    P = P.astype(dtype)
    ref = solvers.mlls_newton(P.astype(np.float64), ps)
    got = solvers.mlls_newton_rows(P, ps)
    assert got.converged and ref.converged
    assert got.optimality <= 1e-10
    np.testing.assert_allclose(got.weights, ref.weights, rtol=0, atol=1e-8)
    if case == "boundary":
        assert (got.weights <= solvers.PIN_TOL).sum() >= 1


def _case(rng, m):
    S, ys = softmax_draw(rng, 3000, np.full(K, 1 / K))
    pt = rng.dirichlet(np.ones(K))
    pt[1] = 1e-4
    T, _ = softmax_draw(rng, m, pt / pt.sum())
    prior = S.mean(axis=0)
    return S, ys, T, prior / prior.sum()


def test_assess_shift_on_a_large_float32_set_equals_the_in_memory_float64_path(small_blocks):
    rng = np.random.default_rng(3)
    S, ys, T, prior = _case(rng, 30_000)
    T32 = T.astype(np.float32)
    assert check_probabilities(T32, "t") is T32          # large and float32: kept, not copied to float64
    fisher = dict(cross_check=["BBSE-soft", "BBSE-hard"], max_interval_width=5.0, interval="fisher")
    old = assess_shift(Holdout(S, ys, prior), T32.astype(np.float64), AssessmentSettings(**fisher))
    rows.LARGE_ROWS = 10**9                               # the same float32 rows through the whole-array code
    ref = assess_shift(Holdout(S, ys, prior), T32, AssessmentSettings(**fisher))
    rows.LARGE_ROWS = 2000
    new = assess_shift(Holdout(S, ys, prior), T32, AssessmentSettings(**fisher))
    for a in (old, ref):
        np.testing.assert_allclose(new.weights, a.weights, rtol=0, atol=1e-8)
        for key in ("lower", "upper", "weights_lower", "weights_upper"):
            np.testing.assert_allclose(getattr(new.interval, key), getattr(a.interval, key), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(new.no_shift_test.statistic, a.no_shift_test.statistic, rtol=1e-6)
        assert new.no_shift_test.dof == a.no_shift_test.dof
        ia, ib = a.identifiability, new.identifiability
        np.testing.assert_allclose(ib.min_hessian_eigenvalue, ia.min_hessian_eigenvalue, rtol=1e-6)
        np.testing.assert_allclose(ib.min_free_eigenvalue, ia.min_free_eigenvalue, rtol=1e-6)
        np.testing.assert_allclose([b if b is not None else np.nan for b in ib.pinned_bounds],
                                   [b if b is not None else np.nan for b in ia.pinned_bounds], rtol=1e-6, atol=1e-9)
        assert ib.reasons == ia.reasons and new.verdict == a.verdict
        for method in ("BBSE-soft", "BBSE-hard"):
            np.testing.assert_allclose(new.cross_check[method].weights, a.cross_check[method].weights, rtol=1e-6,
                                       atol=1e-9)


def _raw_case(rng, m, pinned=True):
    """Holdout logits (3000 rows) with labels and a BCTS fit on them, float32 target logits (m rows; one class absent,
    which MLLS pins at w = 0, when ``pinned``), the calibrated float32 target and p_s."""
    def logits(n, prior):
        return gaussian_logits(rng, n, prior, scale=1.3, offset=0.2 * np.arange(K))

    Xh, yh = logits(3000, np.full(K, 1 / K))
    cal = BCTS(tol=1e-9).fit(Xh, yh)
    pt = rng.dirichlet(np.ones(K) * 3)
    if pinned:
        pt[1] = 0.0
    Xt = logits(m, pt / pt.sum())[0].astype(np.float32)
    S = cal.predict_proba(Xh)
    prior = S.mean(axis=0)
    return Xh, yh, cal, Xt, cal.predict_proba(Xt).astype(np.float32), S, prior / prior.sum()


def _in_memory(fn):
    """fn() with every set counted small (the whole-array code)."""
    large = rows.LARGE_ROWS
    rows.LARGE_ROWS = 10**9
    try:
        return fn()
    finally:
        rows.LARGE_ROWS = large


@pytest.mark.parametrize("pinned", [False, True])
def test_source_aware_interval_and_expected_accuracy_in_row_blocks_equal_the_in_memory_path(small_blocks, pinned):
    """The target passes in row blocks: covariances, weights bounds and the accuracy estimate agree with the
    whole-array code to relative 1e-10 (summation order; the profile bound of a pinned class, a bisection on sums
    of logs, to 1e-9)."""
    rng = np.random.default_rng(6)
    Xh, yh, cal, Xt, _, _, _ = _raw_case(rng, 5500, pinned)
    ref = _in_memory(lambda: source_aware_interval(Xh, yh, Xt, cal))
    assert bool(ref.pinned.any()) == pinned
    w = ref.weights
    ref = _in_memory(lambda: source_aware_interval(Xh, yh, Xt, cal, weights=w))
    new = source_aware_interval(Xh, yh, Xt, cal, weights=w)
    for key in ("covariance", "covariance_target", "covariance_holdout", "weights_covariance", "holdout_influence"):
        a = getattr(ref, key)                       # entries cancelled to ~0: to 1e-10 of the largest
        np.testing.assert_allclose(getattr(new, key), a, rtol=1e-10, atol=1e-10 * np.abs(a).max(), err_msg=key)
    for key in ("lower", "upper", "weights_lower", "weights_upper", "std_error", "weights_std_error"):
        np.testing.assert_allclose(getattr(new, key), getattr(ref, key), rtol=1e-9, atol=1e-15, err_msg=key)
    assert new.reasons == ref.reasons and np.array_equal(new.pinned, ref.pinned)
    # without weights, MLLS is solved on float32 calibrated rows made in blocks: the weights agree to 1e-6
    solved = source_aware_interval(Xh, yh, Xt, cal)
    np.testing.assert_allclose(solved.weights, w, rtol=0, atol=1e-6)

    acc_ref = _in_memory(lambda: expected_accuracy(Xh, yh, Xt, cal, weights=w, interval=ref))
    acc = expected_accuracy(Xh, yh, Xt, cal, weights=w, interval=new)
    for key in ("expected", "std_error", "batch_std_error", "corrected", "corrected_std_error",
                "corrected_batch_std_error", "batch_lower", "batch_upper"):
        np.testing.assert_allclose(getattr(acc, key), getattr(acc_ref, key), rtol=1e-10, err_msg=key)


@pytest.mark.parametrize("method", ["likelihood-ratio", "wald"])
def test_label_shift_test_in_row_blocks_equals_the_in_memory_path(small_blocks, method):
    rng = np.random.default_rng(7)
    Xh, yh, cal, Xt, P32, S, prior = _raw_case(rng, 5500, pinned=False)
    w = _in_memory(lambda: solvers.mlls_newton(P32.astype(np.float64), prior).weights)
    ref = _in_memory(lambda: label_shift_test(S, yh, P32, weights=w, source_prior=prior, method=method))
    new = label_shift_test(S, yh, P32, weights=w, source_prior=prior, method=method)
    assert [(r.name, r.observed, r.holdout_rows) for r in new.regions] == \
        [(r.name, r.observed, r.holdout_rows) for r in ref.regions]          # identical region counts
    np.testing.assert_allclose(new.statistic, ref.statistic, rtol=1e-10)
    np.testing.assert_allclose([r.z for r in new.regions], [r.z for r in ref.regions], rtol=1e-9, atol=1e-12)
    assert new.dof == ref.dof


def test_assess_shift_on_a_large_float32_set_makes_no_float64_copy_of_it():
    rng = np.random.default_rng(4)
    S, ys, T, prior = _case(rng, rows.LARGE_ROWS + 50_000)
    T32 = T.astype(np.float32)
    del T
    tracemalloc.start()
    try:
        report = assess_shift(Holdout(S, ys, prior),
                              T32,
                              AssessmentSettings(cross_check=["BBSE-soft"], interval="fisher"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.label_shift is not None
    # a float64 copy alone would be 2 * T32.nbytes; what remains are a few (m,) float64 vectors (f_i^T w and the
    # like, each 1/3 of T32 at k = 6)
    assert peak < 2 * T32.nbytes, (peak, T32.nbytes)


def _source_aware_peak(Xh, yh, cal, Xt, P32, S, prior):
    """(report, peak bytes traced) of the default re-estimation (source-aware interval) on a float32 target."""
    tracemalloc.start()
    try:
        report = assess_shift(Holdout(S, yh, prior, outputs=Xh, calibrator=cal),
                              Target(P32, Xt),
                              AssessmentSettings(interval="source-aware"))
        return report, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("pinned", [False, True])
def test_source_aware_assess_shift_on_large_float32_sets_makes_no_float64_copy_of_them(pinned):
    """The default re-estimation: source-aware interval (raw float32 outputs, BCTS fit on the holdout), the
    label-shift test and the expected accuracy, on float32 target arrays of more than LARGE_ROWS rows."""
    rng = np.random.default_rng(9 if pinned else 8)          # seed 9: MLLS pins the absent class at w = 0
    Xh, yh, cal, Xt, P32, S, prior = _raw_case(rng, rows.LARGE_ROWS + 50_000, pinned)
    report, peak = _source_aware_peak(Xh, yh, cal, Xt, P32, S, prior)
    assert report.interval.method == "source-aware" and report.label_shift is not None
    assert report.accuracy is not None
    assert bool(report.interval.pinned.any()) == pinned
    assert peak < 2 * P32.nbytes, (peak, P32.nbytes)


def test_source_aware_assess_shift_on_a_large_float32_set_that_repeats_rows_makes_no_float64_copy_of_it():
    """Target rows that repeat (one in fifty copies its neighbour): the clustered covariances are made a block of
    distinct rows at a time and no float64 copy of the target is made; the label-shift test runs on the rows it
    keeps, one float32 copy of them (here still more than LARGE_ROWS: fewer would be tested as a set of their size
    is, in float64), so the bound is the no-copy test's plus that copy."""
    rng = np.random.default_rng(8)
    Xh, yh, cal, Xt, P32, S, prior = _raw_case(rng, rows.LARGE_ROWS + 50_000, False)
    Xt[::50], P32[::50] = Xt[1::50], P32[1::50]
    assert len(P32) - len(P32[::50]) > rows.LARGE_ROWS
    report, peak = _source_aware_peak(Xh, yh, cal, Xt, P32, S, prior)
    assert report.repeats.adjusts and report.repeats.collapsed_rows == len(P32[::50])
    assert report.label_shift is not None and report.accuracy is not None
    assert peak < 3 * P32.nbytes, (peak, P32.nbytes)


def test_joined_views_are_pooled_without_a_copy():
    base = np.arange(40, dtype=np.float32).reshape(10, 4)
    parts = [base[0:3], base[3:7], base[7:10]]
    assert np.shares_memory(rows.joined(parts), base)
    np.testing.assert_array_equal(rows.joined(parts), base)
    shuffled = [base[3:7], base[0:3]]
    out = rows.joined(shuffled)
    assert not np.shares_memory(out, base)
    np.testing.assert_array_equal(out, np.concatenate(shuffled))


@pytest.mark.parametrize("with_ids", [True, False, "kept"])
def test_streamed_corrected_parquet_holds_what_the_in_memory_writer_wrote(tmp_path, with_ids):
    """The corrected outputs written chunk by chunk equal the in-memory writer's, with the ids streamed from the
    batch, kept from scoring's read (``"kept"``), or none."""
    from tasks.reestimation.outputs import _corrected_chunks, _id_chunks

    rng = np.random.default_rng(5)
    P, _ = softmax_draw(rng, 2500, np.full(K, 1 / K))
    P = P.astype(np.float32)
    w = rng.uniform(0.0, 2.0, K)
    names = [f"c{j}" for j in range(K)]
    source = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"rid": [f"r{i}" for i in range(len(P))], "x": np.zeros(len(P))}), source,
                   row_group_size=700)                # id chunks that do not line up with the output chunks
    id_column = "rid" if with_ids else None
    before = corrected_parquet(correct_predictions(P, w).astype(np.float32), names,
                               read_ids(str(source), "batch", id_column), id_column)
    out = tmp_path / "out.parquet"
    ids = iter_ids(str(source), "batch", id_column, chunk_rows=300) if with_ids != "kept" else \
        _id_chunks(None, None, id_column, read_ids(str(source), "batch", id_column), tmp_path, 300)
    n = write_corrected_parquet(out, _corrected_chunks(P, w, ids, 1000), names, id_column)
    assert n == len(P)
    streamed = pq.read_table(out)
    assert pq.ParquetFile(out).metadata.num_row_groups == 3
    assert streamed.equals(pq.read_table(pa.BufferReader(before)))


def test_pass_threads_one_thread_for_narrow_rows_and_the_process_count_for_wide_ones():
    """Row passes up to THREADED_PASS_CLASSES classes run on one BLAS thread; wider ones get the process's own
    number back, also inside a one-thread context (the k x k decompositions' context around them)."""
    from threadpoolctl import threadpool_info

    def blas_threads():
        return max(d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas")

    ambient = rows._ambient_threads()
    with rows.pass_threads(rows.THREADED_PASS_CLASSES):
        assert blas_threads() == 1
    with rows.one_blas_thread():
        with rows.pass_threads(rows.THREADED_PASS_CLASSES + 1):
            assert blas_threads() == ambient
        assert blas_threads() == 1
    # a wide pass gives the same numbers on either count (GEMM splits the output, not the sums)
    P = np.random.default_rng(0).random((3000, rows.THREADED_PASS_CLASSES + 20))
    wide = rows.mean_cov(P)
    with rows.one_blas_thread():
        narrow = rows.mean_cov.__wrapped__(P)
    np.testing.assert_allclose(wide[1], narrow[1], rtol=1e-12, atol=1e-15)


def test_one_blas_thread_for_life_holds_in_wide_passes_too():
    """A segment worker (labelshift.inference.segments) runs BLAS on one thread, wide passes included: 16 workers
    of 16 BLAS threads each would oversubscribe the cores. In a subprocess, not to change this one's threads."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, {root!r})\n"
            "from threadpoolctl import threadpool_info\n"
            "from labelshift import rows\n"
            "rows.one_blas_thread_for_life()\n"
            "with rows.pass_threads(rows.THREADED_PASS_CLASSES + 1):\n"
            "    print(max(d['num_threads'] for d in threadpool_info() if d['user_api'] == 'blas'))\n")
    out = subprocess.run([sys.executable, "-c", code.format(root=str(Path(__file__).resolve().parents[2]))],
                         capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                           "OPENBLAS_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
