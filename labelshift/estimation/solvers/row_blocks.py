"""MLLS for one large set, in passes over row blocks (:mod:`labelshift.rows`): the stages of
:func:`~labelshift.estimation.solvers.mlls_newton` without a copy of the whole set."""
from __future__ import annotations

import numpy as np

from ... import rows as _rows
from ...partitions import is_partitioned
from .batch import SolverResult
from .em import WARM_CYCLES, WARM_STEP
from .face_newton import newton_on_face


def _em_rows(P, ps, x, precision):
    """One EM step from x by one pass over the rows: (x', L_m(x), g = grad / p_s at x)."""
    obj, grad, _, _ = _rows.mlls_pass(P, x, precision=precision)
    g = grad / ps
    xn = x * g
    return xn / float(xn @ ps), obj, g


def _squarem_rows(P, ps, w, *, step_tol, max_cycles):
    """The float32 SQUAREM warm start of :func:`mlls_newton` (scheme S3 with the monotone safeguard), one pass over
    the rows per EM step. Stops once the EM step is below ``step_tol`` or stalls. Returns (w, passes)."""
    x0 = w
    x1, L0, _ = _em_rows(P, ps, x0, np.float32)
    passes, best, stall = 1, np.inf, 0
    for _ in range(max_cycles):
        x2, _, _ = _em_rows(P, ps, x1, np.float32)
        passes += 1
        d1 = float(np.max(np.abs(x2 - x1)))
        if not np.isfinite(d1):
            return x1, passes
        stall = 0 if d1 < 0.5 * best else stall + 1
        best = min(best, d1)
        if d1 <= step_tol or stall >= 3:
            return x2, passes
        r = x1 - x0
        v = x2 - x1 - r
        vv = float(v @ v)
        a = max(1.0, np.sqrt(float(r @ r) / vv)) if vv > 0 else 1.0
        for _ in range(40):
            xp = x0 + 2.0 * a * r + a * a * v
            if not (np.any((xp <= 0.0) & (x2 > 0.0)) and a > 1.0):
                break
            a = 0.5 * (a + 1.0)
        xp = np.maximum(xp, 0.0) if a > 1.0 else x2
        xp = xp / float(xp @ ps)
        xq, Lq, _ = _em_rows(P, ps, xp, np.float32)
        passes += 1
        if not Lq >= L0 - 1e-5 * (1.0 + abs(L0)):
            xp = x2
            xq, Lq, _ = _em_rows(P, ps, xp, np.float32)
            passes += 1
        x0, x1, L0 = xp, xq, Lq
    return x1, passes


def mlls_newton_rows(probs, source_prior, *, tol: float = 1e-10, max_iter: int = 200, init=None) -> SolverResult:
    """MLLS, eq. (mlls-sample), for one large (m, k) set -- float32 or float64, never copied whole -- in passes
    over row blocks (:mod:`labelshift.rows`); what :func:`mlls_newton` runs for such a set. The set may be rows held
in partitions (:class:`labelshift.partitions.PartitionedRows`): each pass is then a map of
:func:`labelshift.rows.mlls_sums` over the partitions and a sum of the results.

    The stages of :func:`mlls_newton`: a SQUAREM warm start whose passes run in float32 (one pass per EM step);
    then an active-set Newton method on the faces of W with the gradient and the Hessian summed in float64 (one
    pass per iteration), damped by the Newton decrement; coordinates the step would take below 0 are pinned at 0,
    a pinned coordinate whose gradient shows a gain above ``tol`` is freed (above CHORD_NEWTON_CLASSES classes the
    Hessian is kept across steps while the residual keeps falling tenfold a step). Converged when the Frank-Wolfe
    duality gap is at most ``tol`` and the Newton step at most ``tol`` (max-norm), or the face is stationary to 1e-3
    tol.
    Problems the Newton method cannot certify within ``max_iter`` iterations continue with float64 EM steps until
    the gap is at most ``tol`` (or ``max_iter`` more passes, reported as not converged). Reaches the optimum of
    :func:`mlls_newton` to ``tol``. ``iterations`` counts passes over the data.
    """
    with _rows.one_blas_thread():
        return _newton_rows(probs, source_prior, tol=tol, max_iter=max_iter, init=init)


#: classes above which :func:`mlls_newton_rows` keeps its Hessian (a k^2 m product, most of a pass there) across
#: Newton steps while the face residual keeps falling by _CHORD_CONTRACTION a step (a chord Newton method; each
#: step still takes a fresh float64 gradient, which alone certifies convergence), refreshing it otherwise
CHORD_NEWTON_CLASSES = 100
_CHORD_CONTRACTION = 0.1


def _newton_rows(probs, source_prior, *, tol, max_iter, init):
    P = probs if is_partitioned(probs) else np.asarray(probs)
    if P.dtype not in (np.float32, np.float64):
        P = P.astype(np.float64)
    m, k = P.shape
    ps = np.asarray(source_prior, dtype=np.float64).reshape(k)
    w = np.ones(k) if init is None else np.asarray(init, dtype=np.float64).reshape(k).copy()
    w = w / float(w @ ps)
    w, passes = _squarem_rows(P, ps, w, step_tol=WARM_STEP, max_cycles=WARM_CYCLES)
    w0 = w.copy()
    free = w > 0
    revived = np.zeros(k, dtype=bool)
    gap, converged = np.inf, False
    stuck = 0
    chord = k > CHORD_NEWTON_CLASSES
    H, refresh, last_resid = None, True, np.inf
    for it in range(1, max_iter + 1):
        _, grad, H_new, dead = _rows.mlls_pass(P, w, hessian=refresh or not chord)
        if H_new is not None:
            H, w_of_H = H_new, w
        passes += 1
        g = grad / ps
        gap = float(g.max() - 1.0)
        diag = np.diag(H)
        usable = diag > 1e-30 * diag.max()
        face = free & usable
        d = newton_on_face(H[None], grad[None], ps[None], w[None], face[None])[0]
        changed = False
        if it == 1:
            for _ in range(3):
                drop = face & (w + d <= 0.0) & (g < 1.0 - 1e-3)
                if not drop.any():
                    break
                face &= ~drop
                d = newton_on_face(H[None], grad[None], ps[None], w[None], face[None])[0]
            zeroed = np.where(face, 0.0, w)
            changed = bool(zeroed @ ps > 0.1 * tol or zeroed.max() > tol)
            w = np.where(face, w, 0.0)
        resid = float(np.where(face, np.abs(g - 1.0), 0.0).max())
        refresh = not resid <= _CHORD_CONTRACTION * last_resid     # the kept Hessian stopped contracting: refresh it
        last_resid = resid
        solved = bool(np.abs(d).max() <= 1e-6 * w.max() or resid <= 1e-3 * tol)
        gain = g - 1.0
        add = ~face & usable & (gain > tol) & (solved | (gain > 10.0 * resid))
        if add.any():
            y = int(np.argmax(np.where(add, g, -np.inf)))
            w = w.copy()
            w[y] = w0[y] if w0[y] > 0 and not revived[y] else 1e-3 / ps[y]
            revived[y] = True
            w = w / float(w @ ps)
            face[y] = True
            d = np.zeros(k)
            changed = True
        free = face
        bad = dead or not np.all(np.isfinite(d))
        if bad:
            d = np.zeros(k)
        dmax = float(np.abs(d).max())
        if not bad and not changed and gap <= tol and solved and (dmax <= tol or resid <= 1e-3 * tol):
            converged = True
            break
        dec = np.sqrt(max(float(d @ H @ d), 0.0) * m)
        step = 1.0 if dec < 0.25 else 1.0 / (1.0 + dec)
        with np.errstate(divide="ignore", invalid="ignore"):
            to_zero = np.where(face & (d < 0), -w / d, np.inf)
        step = min(step, float(to_zero.min()))
        wn = w + step * d
        pin = face & ((to_zero <= step * (1.0 + 1e-12)) | (wn <= 0.0))
        wn[pin] = 0.0
        free = free & ~pin
        w = wn / float(wn @ ps)
        stuck = stuck + 1 if step <= 0.0 and not changed else 0
        if bad or stuck >= 3:
            break
    if converged:           # the last pass's Hessian, when it was taken at the returned weights
        return SolverResult(w, converged, passes, gap, H if np.array_equal(w, w_of_H) else None)
    return _em_finish_rows(P, ps, w, passes, tol=tol, max_iter=max_iter)


def _em_finish_rows(P, ps, w, passes: int, *, tol: float, max_iter: int) -> SolverResult:
    """Float64 EM steps from ``w`` (a Newton iterate it could not certify) until the gap is at most ``tol``, or
    ``max_iter`` more passes (not converged); ``passes`` counts the passes made before."""
    w = np.maximum(w, 1e-12 / ps.max())
    w = w / float(w @ ps)
    converged, gap = False, np.inf
    for _ in range(max_iter):
        xn, _, g = _em_rows(P, ps, w, np.float64)
        passes += 1
        gap = float(g.max() - 1.0)
        if gap <= tol:
            converged = True
            break
        w = xn
    return SolverResult(w, converged, passes, gap)
