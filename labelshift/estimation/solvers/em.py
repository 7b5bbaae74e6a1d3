"""MLLS by EM (Saerens, Latinne & Decaestecker 2002), optionally accelerated by SQUAREM (Varadhan & Roland 2008),
batched in chunks of problems (:mod:`.layout`); the float32 SQUAREM warm start of
:func:`~labelshift.estimation.solvers.mlls_newton` stops by the rule here too."""
from __future__ import annotations

import numpy as np

from .batch import SolverResult, chunk_slices, unbatch
from .layout import Outcome, prepare, transposed_rows, Work
from .mlls_objective import weighted_inverse

# SQUAREM warm start of mlls_newton: stop refining in single precision once the EM step (max-norm; w has
# p_s-weighted mean 1) is below WARM_STEP or stalls (float32 gradients carry relative errors of ~1e-6; the
# Newton polish converges from 1e-5 about as fast as from 1e-7, so cycles beyond that are wasted), or after
# WARM_CYCLES cycles
WARM_STEP, WARM_CYCLES = 3e-5, 100


def _em_step(PT, c3, ips, ps, x):
    """One EM step for a batch on the transposed layout: PT (A, k, M), row weights c3 (A, 1, M) in PT's precision,
    1 / p_s and p_s (A, k), iterate x (A, k) float64. Returns (x', g, fw): g_y = grad_y / p_s(y) at x (float64),
    x' = x g renormalised onto p_s^T x' = 1 (exact arithmetic keeps it there: x^T grad = 1), and the (A, 1, M)
    values f_i^T x. Two passes over the data: f_i^T x, then sum_i (c_i / f_i^T x) f_i."""
    fw = np.matmul(x.astype(PT.dtype)[:, None, :], PT)
    g = np.matmul(PT, weighted_inverse(c3, fw).transpose(0, 2, 1))[:, :, 0] * ips
    xn = x * g
    xn /= np.einsum("ak,ak->a", xn, ps)[:, None]
    return xn, g, fw


def _tail(d, d1, d2):
    """Estimated remaining error of a linearly convergent sequence from its last steps d (newest), d1, d2: the
    geometric tail d rho / (1 - rho) with rho the larger of the last two contraction ratios (inf while the steps
    do not shrink)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = np.where(d1 > 0, d / d1, np.inf)
        r2 = np.where(d2 > 0, d1 / d2, np.inf)
        rate = np.maximum(r1, r2)
        return np.where(rate < 1.0, d * rate / (1.0 - rate), np.inf)


def _em_chunk(PT, cn, ps, w, tol, max_iter):
    """Plain EM on one chunk (transposed float64 layout); see :func:`mlls_em` for the stopping rule."""
    A = PT.shape[0]
    out = Outcome(w.copy())
    work = Work(np.arange(A), PT=PT, c3=cn[:, None, :], ips=1.0 / ps, ps=ps, w=w.copy(), d1=np.full(A, np.inf),
                 d2=np.full(A, np.inf))
    for it in range(1, max_iter + 1):
        ww = work.w
        wn, g, _ = _em_step(work.PT, work.c3, work.ips, work.ps, ww)
        gap = g.max(axis=1) - 1.0
        d = np.max(np.abs(wn - ww), axis=1)
        tail = _tail(d, work.d1, work.d2)
        live = work.live
        finished = live & ((d == 0.0) | ((tail <= tol) & (gap <= tol)))
        work.set("w", np.where(live[:, None], wn, ww))
        work.set("d2", work.d1)
        work.set("d1", d)
        if out.record(work, it, wn, gap, finished):
            break
        work.maybe_compact()
    return out.result()


def _chunk_objective(ca, fw):
    """L_m per problem from the row weights ca (A, 1, M) and f_i^T w (A, 1, M); -inf outside the domain."""
    with np.errstate(divide="ignore", invalid="ignore"):
        val = np.matmul(ca, np.log(fw).transpose(0, 2, 1))[:, 0, 0].astype(np.float64)
    return np.where(np.isfinite(val), val, -np.inf)


def _squarem_finished(a_, x0, x1, x2, gap, live, tol, loose):
    """Which live problems of a SQUAREM cycle stop (:func:`squarem_chunk`'s rules), and whether their EM step is
    finite; updates the stall counters of the ``loose`` rule in ``a_``."""
    d1 = np.max(np.abs(x2 - x1), axis=1)
    ok = np.isfinite(d1)
    if loose:
        stall = np.where(d1 < 0.5 * a_["best"], 0, a_["stall"] + 1)
        a_["best"] = np.minimum(a_["best"], d1)
        a_["stall"] = stall
        return live & ((d1 <= tol) | (stall >= 3) | ~ok), ok
    # geometric tail per coordinate (after a jump the coordinates need not share one rate)
    s1 = np.abs(x2 - x1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = s1 / np.abs(x1 - x0)
        tail = np.where(rho < 1.0, s1 * rho / (1.0 - rho), np.inf)
    tail = np.where(s1 <= 1e-15 * x1.max(axis=1, keepdims=True), 0.0, tail).max(axis=1)
    return live & ok & ((d1 == 0.0) | ((tail <= tol) & (gap <= tol))), ok


def _squarem_extrapolate(a_, x0, x1, x2, live, slack):
    """The SQUAREM extrapolation from (x0, x1, x2) and one EM step from it, kept where it does not lower L (else the
    EM step from x2); adapts the step bound ``a_["amax"]``. Returns (the new x0, x1, L at x0)."""
    PTw, cw, psw, ipw = a_["PT"], a_["c3"], a_["ps"], a_["ips"]
    # the extrapolation, a halved towards 1 until x' > 0 where x2 > 0
    r = x1 - x0
    v = x2 - x1 - r
    vv = np.einsum("ak,ak->a", v, v)
    a = np.sqrt(np.divide(np.einsum("ak,ak->a", r, r), vv, out=np.ones_like(vv), where=vv > 0))
    a = np.minimum(np.maximum(a, 1.0), a_["amax"])
    for _ in range(40):
        xp = x0 + (2.0 * a)[:, None] * r + (a * a)[:, None] * v
        bad = np.any((xp <= 0.0) & (x2 > 0.0), axis=1) & (a > 1.0)
        if not bad.any():
            break
        a = np.where(bad, 0.5 * (a + 1.0), a)
    jump = (a > 1.0) & ~bad
    xp = np.where(jump[:, None], np.maximum(xp, 0.0), x2)
    xp /= np.einsum("ak,ak->a", xp, psw)[:, None]
    xq, _, fwq = _em_step(PTw, cw, ipw, psw, xp)
    Lq = _chunk_objective(cw, fwq)
    L0 = a_["L0"]
    reject = live & jump & ~(Lq >= L0 - slack * (1.0 + np.abs(L0)))
    amax = a_["amax"]
    a_["amax"] = np.where(reject, np.maximum(1.0, amax / 4.0), np.where(a >= amax, 4.0 * amax, amax))
    if reject.any():
        rows = np.flatnonzero(reject)
        xp[rows] = x2[rows]
        xq[rows], _, fw_r = _em_step(PTw[rows], cw[rows], ipw[rows], psw[rows], x2[rows])
        Lq[rows] = _chunk_objective(cw[rows], fw_r)
    return xp, xq, Lq


def squarem_chunk(PT, cn, ps, w, *, tol, max_iter, loose=False):
    """SQUAREM-accelerated EM (Varadhan & Roland 2008, scheme S3, monotone safeguard) on one chunk, from ``w``.

    Passes over the data in PT's precision, iterates in float64. Stops per problem on the EM step (``loose``) or as
    :func:`mlls_em` (Frank-Wolfe gap and geometric tail, per coordinate). Returns (x2, converged, cycles, gap at
    x1). The scheme and the stopping rules are described in ``docs/solvers.md``.
    """
    A = PT.shape[0]
    dt = PT.dtype
    out = Outcome(w.copy())
    slack = 1e-5 if dt == np.float32 else 1e-13        # rounding of L in the monotonicity test
    c3 = cn.astype(dt)[:, None, :]
    x1, _, fw0 = _em_step(PT, c3, 1.0 / ps, ps, w)
    work = Work(np.arange(A), PT=PT, c3=c3, ps=ps, ips=1.0 / ps, x0=w.copy(), x1=x1, L0=_chunk_objective(c3, fw0),
                 amax=np.ones(A), best=np.full(A, np.inf),
                 stall=np.zeros(A, dtype=np.int64))
    for it in range(1, max_iter + 1):
        a_ = work.arrays
        x0, x1 = a_["x0"], a_["x1"]
        live = work.live
        x2, g1, _ = _em_step(a_["PT"], a_["c3"], a_["ips"], a_["ps"], x1)
        gap = g1.max(axis=1) - 1.0
        finished, ok = _squarem_finished(a_, x0, x1, x2, gap, live, tol, loose)
        if out.record(work, it, np.where(ok[:, None], x2, x1), gap, finished, converged=finished & ok):
            break
        a_["x0"], a_["x1"], a_["L0"] = _squarem_extrapolate(a_, x0, x1, x2, work.live, slack)
        work.maybe_compact()
    return out.result()


def mlls_em(probs, source_prior, mask=None, *, tol: float = 1e-10, max_iter: int = 100_000,
            init=None, accelerate: bool = False, chunk_size: int | None = None) -> SolverResult:
    """MLLS by the EM algorithm of Saerens, Latinne & Decaestecker (Neural Computation, 2002), batched.

    E-step: posteriors p_t(y | x_i) proportional to f_y(x_i) w_y; M-step: p_t(y) = mean posterior, i.e.
    w_y <- w_y g_y with g_y = (1/m) sum_i f_y(x_i) / (f(x_i)^T w) / p_s(y). Each step keeps w in W and increases
    L_m; the fixed points with g_y <= 1 off the support are the maximisers of eq. (mlls-sample).

    EM converges linearly, slowly when the optimum sits on the boundary of W (severe shift, some w_y = 0: those
    coordinates decay like rho^t with rho = g_y* close to 1). So it stops on accuracy, not on an iteration cap:
    a problem is done when BOTH
      * the Frank-Wolfe duality gap max_y g_y - 1 <= tol (no coordinate, e.g. one that EM has pushed towards 0
        but that should grow, still has first-order gain), and
      * the estimated remaining error in w, |w^{t+1} - w^t|_inf * rho / (1 - rho), is <= tol, where rho is the
        larger of the last two contraction ratios |w^{t+1} - w^t| / |w^t - w^{t-1}| (the geometric tail of a
        linearly convergent sequence; infinite while the steps do not shrink).
    ``optimality`` in the result is the final duality gap. Problems that reach ``max_iter`` are reported as not
    converged.

    Args:
        accelerate: use SQUAREM (Varadhan & Roland, Scand. J. Statistics 2008; scheme S3 with the monotone
            safeguard): each iteration is two EM steps plus an extrapolation along them, which cuts the number of
            EM steps several-fold under severe shift. Same stopping rule, applied to the two EM steps of the last
            cycle with a contraction ratio per coordinate; ``iterations`` then counts cycles (2-3 EM steps each).
            For speed with certification prefer :func:`mlls_newton`, which uses SQUAREM as its warm start.
        chunk_size: problems solved together per chunk (default: as many as fit in :data:`CHUNK_BYTES`); each
            chunk runs to convergence before the next. Results do not depend on it.
    """
    P, cn, ps, w, single = prepare(probs, source_prior, mask, init)
    S, M, k = P.shape
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap = np.full(S, np.inf)
    for sl in chunk_slices(S, M, k, chunk_size):
        PT = transposed_rows(P[sl], np.float64)
        if accelerate:
            out = squarem_chunk(PT, cn[sl], ps[sl], w[sl], tol=tol, max_iter=max_iter)
        else:
            out = _em_chunk(PT, cn[sl], ps[sl], w[sl], tol, max_iter)
        w[sl], conv[sl], iters[sl], gap[sl] = out
    return unbatch(SolverResult(w, conv, iters, gap), single)
