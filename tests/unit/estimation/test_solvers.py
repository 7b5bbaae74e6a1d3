"""Tests of the functional core, labelshift.estimation.solvers: derivatives, optimality measures, EM vs Newton, RLLS."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from labelshift.estimation import solvers as sv
from labelshift.estimation.solvers import layout, newton


def gaussian_posteriors(rng, k, m, target_prior, source_prior=None, sep=2.0):
    """Rows of the true source posterior p_s(y|x) for x from a k-class Gaussian mixture (identity covariance, class
    means sep * e_y in R^k) drawn under ``target_prior``. The true posterior is calibrated, so MLLS is consistent."""
    source_prior = np.full(k, 1.0 / k) if source_prior is None else np.asarray(source_prior)
    y = rng.choice(k, size=m, p=target_prior)
    x = sep * np.eye(k)[y] + rng.normal(size=(m, k))
    logits = sep * x + np.log(source_prior)      # log N(x; sep e_y, I) + log p_s(y), up to a constant per row
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True), y


# -- derivatives and optimality ---------------------------------------------------------------------------------
def test_gradient_and_hessian_match_finite_differences():
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(4), size=300)
    w = rng.uniform(0.3, 2.0, size=4)
    g = sv.mlls_gradient(P, w)
    H = sv.mlls_hessian(P, w)
    h = 1e-6
    for j in range(4):
        e = np.eye(4)[j] * h
        fd_g = (sv.mlls_objective(P, w + e) - sv.mlls_objective(P, w - e)) / (2 * h)
        fd_H = (sv.mlls_gradient(P, w + e) - sv.mlls_gradient(P, w - e)) / (2 * h)
        assert fd_g == pytest.approx(g[j], rel=1e-7)
        # the Hessian of the objective is -H (mlls_hessian is the negated Hessian)
        np.testing.assert_allclose(fd_H, -H[:, j], rtol=1e-6, atol=1e-9)
    # w^T grad = 1 for every w: the identity behind nu = 1 at the optimum
    assert w @ g == pytest.approx(1.0, abs=1e-12)
    assert sv.hessian_min_eigenvalue(P, w) == pytest.approx(np.linalg.eigvalsh(H)[0], rel=1e-12)


def test_batched_diagnostics_respect_the_mask():
    rng = np.random.default_rng(1)
    a, b = rng.dirichlet(np.ones(3), size=40), rng.dirichlet(np.ones(3), size=25)
    w = np.array([[0.5, 1.0, 1.5], [1.2, 0.9, 0.9]])
    Pb = np.full((2, 40, 3), 1 / 3)
    Pb[0], Pb[1, :25] = a, b
    mask = np.zeros((2, 40))
    mask[0], mask[1, :25] = 1, 1
    Hb = sv.mlls_hessian(Pb, w, mask)
    np.testing.assert_allclose(Hb[0], sv.mlls_hessian(a, w[0]), rtol=1e-13)
    np.testing.assert_allclose(Hb[1], sv.mlls_hessian(b, w[1]), rtol=1e-13)
    np.testing.assert_allclose(sv.hessian_min_eigenvalue(Pb, w, mask),
                               [sv.hessian_min_eigenvalue(a, w[0]), sv.hessian_min_eigenvalue(b, w[1])], rtol=1e-12)


def test_restricted_min_eigenvalue_ignores_pinned_coordinates():
    H = np.diag([1e-9, 0.5, 2.0])
    assert sv.restricted_min_eigenvalue(H, [True, True, True]) == pytest.approx(1e-9)
    assert sv.restricted_min_eigenvalue(H, [False, True, True]) == pytest.approx(0.5)
    assert np.isnan(sv.restricted_min_eigenvalue(H, [False, False, False]))


def test_optimality_gap_is_nonnegative_and_vanishes_at_the_optimum():
    rng = np.random.default_rng(2)
    P, _ = gaussian_posteriors(rng, 3, 500, [0.6, 0.3, 0.1])
    ps = np.full(3, 1 / 3)
    for w in rng.uniform(0.1, 2, size=(5, 3)):
        w = w / (w @ ps)
        assert sv.mlls_optimality(P, w, ps) >= -1e-15
    res = sv.mlls_newton(P, ps)
    assert res.converged
    assert 0 <= sv.mlls_optimality(P, res.weights, ps) <= 1e-10


# -- EM and Newton reach the same optimum ------------------------------------------------------------------------
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 5), m=st.sampled_from([60, 300, 1500]), alpha=st.sampled_from([0.1, 0.3, 1.0, 5.0]),
       sep=st.sampled_from([2.0, 3.0]), seed=st.integers(0, 2**31 - 1))
def test_em_and_newton_agree_to_1e_8(k, m, alpha, sep, seed):
    """Random problems, severe shift included (Dirichlet alpha = 0.1 puts several w_y on the boundary w_y = 0)."""
    rng = np.random.default_rng(seed)
    ps = rng.dirichlet(np.full(k, 10.0))
    q = rng.dirichlet(np.full(k, alpha))
    P, _ = gaussian_posteriors(rng, k, m, q, ps, sep)
    newton = sv.mlls_newton(P, ps, tol=1e-12)
    em = sv.mlls_em(P, ps, tol=1e-12, max_iter=500_000)
    assert newton.converged and em.converged
    np.testing.assert_allclose(em.weights, newton.weights, rtol=0, atol=1e-8)
    assert newton.weights @ ps == pytest.approx(1.0, abs=1e-12)
    assert np.all(newton.weights >= 0) and np.all(em.weights >= 0)


def test_em_and_newton_agree_on_the_boundary():
    """Severe shift: classes absent from the target; the optimum has w_y = 0 (Newton reaches it to ~1e-15)."""
    rng = np.random.default_rng(1)
    ps = np.array([0.3, 0.3, 0.2, 0.2])
    P, _ = gaussian_posteriors(rng, 4, 2000, [0.7, 0.3, 0.0, 0.0], ps, sep=2.0)
    newton = sv.mlls_newton(P, ps)
    em = sv.mlls_em(P, ps)
    assert newton.converged and em.converged
    assert np.all(newton.weights[2:] < 1e-12), newton.weights     # the case really is on the boundary
    assert em.iterations > 3 * newton.iterations   # and EM is slow there (linear convergence of w_y -> 0)
    np.testing.assert_allclose(em.weights, newton.weights, atol=1e-8)


def test_em_reports_non_convergence():
    rng = np.random.default_rng(4)
    ps = np.full(3, 1 / 3)
    P, _ = gaussian_posteriors(rng, 3, 1000, [0.9, 0.1, 0.0], ps, sep=1.0)
    res = sv.mlls_em(P, ps, max_iter=5)
    assert not res.converged and res.iterations == 5


def test_batched_solvers_equal_one_at_a_time():
    rng = np.random.default_rng(5)
    ps = np.array([0.5, 0.3, 0.2])
    sets = [gaussian_posteriors(rng, 3, m, q, ps)[0]
            for m, q in [(80, [0.2, 0.3, 0.5]), (500, [0.9, 0.1, 0.0]), (230, [1 / 3] * 3)]]
    M = max(len(s) for s in sets)
    P = np.full((3, M, 3), 1 / 3)
    mask = np.zeros((3, M))
    for i, s in enumerate(sets):
        P[i, : len(s)], mask[i, : len(s)] = s, 1
    for solver in (sv.mlls_newton, sv.mlls_em):
        batch = solver(P, ps, mask)
        for i, s in enumerate(sets):
            one = solver(s, ps)
            np.testing.assert_allclose(batch.weights[i], one.weights, rtol=0, atol=1e-10)
            assert batch.iterations[i] == one.iterations


def test_count_weights_equal_repeated_rows():
    """A row with weight n is n identical rows: the compression used by MLLS-CM and binned MLLS."""
    rng = np.random.default_rng(6)
    rows = rng.dirichlet(np.ones(3), size=4)
    counts = np.array([5, 0, 12, 3])
    expanded = np.repeat(rows, counts, axis=0)
    ps = np.array([0.2, 0.5, 0.3])
    a = sv.mlls_newton(rows, ps, counts)
    b = sv.mlls_newton(expanded, ps)
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-10)


# -- confusion matrices, BBSE and RLLS ---------------------------------------------------------------------------
def test_confusion_matrix_margins():
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.ones(4), size=200)
    y = rng.integers(0, 4, size=200)
    for soft in (False, True):
        C = sv.confusion_matrix(P, y, 4, soft=soft)
        assert C.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(C.sum(axis=0), np.bincount(y, minlength=4) / 200)   # columns: label freq
        np.testing.assert_allclose(C.sum(axis=1), sv.mean_prediction(P, soft=soft))      # rows: mean prediction
    hard = sv.confusion_matrix(P, y, 4)
    assert hard[P[0].argmax(), y[0]] > 0


def test_rlls_rho_is_three_delta_c():
    # Delta_C = 2 log(2k/delta) / (3n) + sqrt(2 log(2k/delta) / n), rho = 3 Delta_C (Azizzadenesheli et al. 2019)
    L = np.log(2 * 10 / 0.05)
    assert sv.rlls_rho(10, 1000, 0.05) == pytest.approx(3 * (2 * L / 3000 + np.sqrt(2 * L / 1000)), rel=1e-14)
    # by hand: L = ln 400 = 5.9915; 3 * (2L/3000 + sqrt(2L/1000)) = 3 * (0.003994 + 0.109468) = 0.34038
    assert sv.rlls_rho(10, 1000, 0.05) == pytest.approx(0.34038, abs=1e-5)


def _reference_rlls(C, mu, rho):
    """Independent RLLS solution: SLSQP on the smooth epigraph form min t + rho s, t^2 >= ||C th - b||^2, ..."""
    k = C.shape[0]
    b = mu - C.sum(axis=1)

    def obj(x):
        return np.linalg.norm(C @ x - b) + rho * np.linalg.norm(x)

    best = None
    for x0 in (np.zeros(k), np.linalg.lstsq(C, b, rcond=None)[0].clip(-0.99)):
        r = minimize(obj, x0, method="SLSQP", bounds=[(-1, None)] * k, options=dict(ftol=1e-14, maxiter=2000))
        if best is None or r.fun < best.fun:
            best = r
    return 1 + best.x, best.fun


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.3, 2.0])
def test_rlls_solves_its_cone_program(rho):
    rng = np.random.default_rng(8)
    k = 4
    C = rng.dirichlet(np.ones(k), size=k).T * 0.4 + np.eye(k) * 0.6
    C /= C.sum() / 1.0
    mu = rng.dirichlet(np.ones(k))           # a noisy target: BBSE's solution has negative entries here
    res = sv.rlls_solve(C, mu, rho)
    assert res.converged
    assert np.all(res.weights >= -1e-12)
    ours = sv.rlls_objective(C, mu, res.weights, rho)
    _, ref = _reference_rlls(C, mu, rho)
    assert ours <= ref + 1e-9           # at least as good as an independent solver (to the stated tolerance)
    # and no feasible perturbation improves it (a convex problem: local = global)
    for d in rng.normal(size=(50, k)) * 1e-3:
        wt = np.maximum(res.weights + d, 0)
        assert sv.rlls_objective(C, mu, wt, rho) >= ours - 1e-10


def test_rlls_with_zero_rho_is_bbse_when_feasible():
    rng = np.random.default_rng(9)
    C = np.diag([0.2, 0.25, 0.3]) + 0.05 / 3 * rng.dirichlet(np.ones(3), size=3)
    C /= C.sum()
    w = np.array([[0.5, 1.2, 1.1], [0.0 + 0.05, 2.0, 0.6], [1.0, 1.0, 1.0]])
    mu = w @ C.T
    res = sv.rlls_solve(C, mu, 0.0)
    assert res.converged.all()
    np.testing.assert_allclose(res.weights, sv.bbse_solve(C, mu), atol=1e-8)
    np.testing.assert_allclose(sv.bbse_solve(C, mu), w, atol=1e-13)


# -- the fast paths: chunking, SQUAREM, the warm-started Newton polish -------------------------------------------
def _shifted_batch(seed, alpha=0.1, S=6, k=6, m=800, sep=2.0):
    """S target sets under Dirichlet(alpha) shift (alpha = 0.1: several classes absent, optimum on the boundary)."""
    rng = np.random.default_rng(seed)
    ps = rng.dirichlet(np.full(k, 5.0))
    P = np.stack([gaussian_posteriors(rng, k, m, rng.dirichlet(np.full(k, alpha)), ps, sep)[0] for _ in range(S)])
    return P, ps


SOLVES = {
    "newton": sv.mlls_newton,
    "ipm": lambda *a, **kw: sv.mlls_newton(*a, method="ipm", **kw),
    "em": sv.mlls_em,
    "squarem": lambda *a, **kw: sv.mlls_em(*a, accelerate=True, **kw),
}


@pytest.mark.parametrize("name", SOLVES)
def test_results_do_not_depend_on_chunks_or_batch_composition(name):
    """Each problem is solved with its own arithmetic whatever else is in its chunk (bit for bit on our machines;
    1e-12 allows for BLAS kernels that round differently on differently aligned data)."""
    solve = SOLVES[name]
    P, ps = _shifted_batch(11)
    base = solve(P, ps)
    assert base.converged.all()
    for chunk in (1, 4):
        np.testing.assert_allclose(solve(P, ps, chunk_size=chunk).weights, base.weights, rtol=0, atol=1e-12)
    perm = [3, 0, 5, 1, 4, 2]
    np.testing.assert_allclose(solve(P[perm], ps).weights, base.weights[perm], rtol=0, atol=1e-12)
    np.testing.assert_allclose(solve(P[2], ps).weights, base.weights[2], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="chunk_size"):
        solve(P, ps, chunk_size=0)


@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 8), m=st.sampled_from([40, 400, 3000]), alpha=st.sampled_from([0.05, 0.1, 0.3, 1.0]),
       sep=st.sampled_from([1.0, 2.0, 4.0]), seed=st.integers(0, 2**31 - 1))
def test_squarem_polish_and_interior_point_agree_to_1e_8(k, m, alpha, sep, seed):
    """The default Newton path (float32 SQUAREM warm start + float64 active-set Newton polish), the interior-point
    method and SQUAREM-accelerated EM reach the same optimum; severe shift puts it on the boundary of W."""
    rng = np.random.default_rng(seed)
    ps = rng.dirichlet(np.full(k, 10.0))
    P, _ = gaussian_posteriors(rng, k, m, rng.dirichlet(np.full(k, alpha)), ps, sep)
    polish = sv.mlls_newton(P, ps, tol=1e-12)
    ipm = sv.mlls_newton(P, ps, tol=1e-12, method="ipm", max_iter=500)
    squarem = sv.mlls_em(P, ps, tol=1e-12, accelerate=True, max_iter=200_000)
    assert polish.converged and ipm.converged and squarem.converged
    np.testing.assert_allclose(polish.weights, ipm.weights, rtol=0, atol=1e-8)
    np.testing.assert_allclose(squarem.weights, ipm.weights, rtol=0, atol=1e-8)
    assert polish.weights @ ps == pytest.approx(1.0, abs=1e-12) and np.all(polish.weights >= 0)
    assert polish.optimality <= 1e-12


def test_squarem_on_the_boundary_needs_far_fewer_em_steps():
    rng = np.random.default_rng(1)
    ps = np.array([0.3, 0.3, 0.2, 0.2])
    P, _ = gaussian_posteriors(rng, 4, 2000, [0.7, 0.3, 0.0, 0.0], ps, sep=2.0)
    em = sv.mlls_em(P, ps)
    squarem = sv.mlls_em(P, ps, accelerate=True)
    assert em.converged and squarem.converged
    np.testing.assert_allclose(squarem.weights, em.weights, atol=1e-8)
    # a SQUAREM cycle costs 2 EM steps (3 after a rejected jump)
    assert 3 * squarem.iterations < em.iterations / 3, (squarem.iterations, em.iterations)


@pytest.mark.parametrize("case", ["interior coordinate pinned", "boundary coordinate raised", "far start"])
def test_newton_polish_repairs_a_wrong_face(case):
    """The active-set polish, started on the wrong face, frees the coordinate that belongs in the support (from 0:
    via the best point on the segment to its vertex) and pins the one that belongs on the boundary."""
    rng = np.random.default_rng(3)
    ps = np.array([0.3, 0.3, 0.2, 0.2])
    P, _ = gaussian_posteriors(rng, 4, 2000, [0.6, 0.4, 0.0, 0.0], ps, sep=2.0)
    best = sv.mlls_newton(P, ps, method="ipm", tol=1e-12).weights
    start = best.copy()
    j, value = {"interior coordinate pinned": (1, 0.0), "boundary coordinate raised": (int(np.argmin(best)), 0.5),
                "far start": (0, 3.0)}[case]
    start[j] = value
    start /= start @ ps
    Pb, cn, psb, _, _ = layout.prepare(P, ps, None, None)
    PT = layout.transposed_rows(Pb, np.float64)
    w, conv, _, gap, failed = newton._polish_chunk(PT, cn, psb, PT.astype(np.float32), start[None], 1e-12, 30)
    assert conv[0] and not failed[0] and gap[0] <= 1e-12
    np.testing.assert_allclose(w[0], best, rtol=0, atol=1e-9)


def test_newton_falls_back_to_the_interior_point_method(monkeypatch):
    P, ps = _shifted_batch(4, S=3)
    ipm = sv.mlls_newton(P, ps, method="ipm")
    monkeypatch.setattr(newton, "_POLISH_ITER", 1)          # no polish can certify in one iteration
    res = sv.mlls_newton(P, ps)
    assert res.converged.all()
    np.testing.assert_allclose(res.weights, ipm.weights, rtol=0, atol=1e-9)
    assert np.all(res.iterations > ipm.iterations)      # warm start + polish + interior point, all counted
    assert not sv.mlls_newton(P, ps, max_iter=1).converged.any()    # max_iter caps the Newton iterations


@pytest.mark.parametrize("name", ["newton", "ipm", "squarem"])
def test_fast_paths_on_degenerate_inputs(name):
    """Flat likelihoods (every row equal to p_s: any w in W is optimal), hard one-hot rows, probabilities that
    underflow float32, and count weights: converged, feasible, and as good as the interior-point optimum."""
    solve = SOLVES[name]
    rng = np.random.default_rng(12)
    ps = np.array([0.1, 0.2, 0.3, 0.4])
    extreme = np.exp(-rng.exponential(300.0, size=(300, 4)))
    cases = [
        (np.tile(ps, (50, 1)), None),
        (np.eye(4)[rng.integers(0, 2, 200)], None),
        (extreme / extreme.sum(axis=1, keepdims=True), None),
        (rng.dirichlet(np.ones(4), size=4), np.array([10.0, 0.0, 3.0, 1.0])),
    ]
    for P, mask in cases:
        res = solve(P, ps, mask, tol=1e-10)
        ref = sv.mlls_newton(P, ps, mask, tol=1e-10, method="ipm")
        assert res.converged
        assert res.weights @ ps == pytest.approx(1.0, abs=1e-12) and np.all(res.weights >= 0)
        assert sv.mlls_objective(P, res.weights, mask) >= sv.mlls_objective(P, ref.weights, mask) - 1e-10


def test_zero_weight_rows_on_a_dead_face_do_not_poison_the_solvers():
    """Regression (MLLS-CM under severe shift): the distinct confusion-matrix rows are solved with their target
    counts as row weights; a class never predicted on the target has count 0, and its row may be supported only on
    classes whose weight goes to 0, so f_i^T w = 0 there. Such rows add nothing to the objective and must add 0,
    not 0/0 = NaN, to the gradient and Hessian. The optimum here is known in closed form: with one-hot rows the
    MLE is w_y = (n_y / m) / p_s(y), i.e. (0.5, 0.5, 0) / (1/3)."""
    import warnings

    rows = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    counts = np.array([5.0, 5.0, 0.0])
    prior = np.full(3, 1.0 / 3.0)
    expected = np.array([1.5, 1.5, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        newton = sv.mlls_newton(rows, prior, counts)
        em = sv.mlls_em(rows, prior, counts)
        hess = sv.mlls_hessian(rows, newton.weights, counts)
    assert newton.converged and em.converged
    np.testing.assert_allclose(newton.weights, expected, atol=1e-8)
    np.testing.assert_allclose(em.weights, expected, atol=1e-8)
    assert np.all(np.isfinite(hess))
