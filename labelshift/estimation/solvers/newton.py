"""MLLS by Newton's method on W, batched: a single-precision SQUAREM-EM warm start, an active-set Newton polish in
double precision on the face of W it points to, and the interior-point method (:mod:`.interior_point`) for the
problems the polish cannot certify (``docs/solvers.md``)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import rows as _rows
from .batch import SolverResult, chunk_slices, unbatch
from .em import WARM_CYCLES, WARM_STEP, squarem_chunk
from .face_newton import newton_on_face
from .interior_point import ipm_chunk
from .layout import hessianT, Outcome, prepare, transposed_rows, Work
from .row_blocks import mlls_newton_rows

# Newton polish of mlls_newton: iteration budget before a problem is handed to the interior-point method, and
# the relative move of w below which the last Hessian is kept (a chord step: linear convergence at about that rate)
_POLISH_ITER = 30
_CHORD_REL = 1e-3


def _segment_max(a, b, c):
    """argmax over t in (0, 1) of sum_i c_i log((1 - t) b_i + t a_i), for rows (R, M) whose slope at t = 0 is
    positive: bisection on log t (t from 1e-16 to 1, to a relative 1e-6) for the root of the decreasing slope.
    Newton from t = 0 is slow here (the function behaves like log(t + tiny)), which is why it is not used."""
    lo, hi = np.full(a.shape[0], -37.0), np.zeros(a.shape[0])
    diff = a - b
    for _ in range(26):
        mid = 0.5 * (lo + hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.einsum("rm,rm->r", c, diff / (b + np.exp(mid)[:, None] * diff))
        up = slope > 0
        lo, hi = np.where(up, mid, lo), np.where(up, hi, mid)
    return np.exp(lo)


def _polish_gradient(PTw, cw, ww):
    """The float64 gradient of L_m at ww on the (k, M) layout, f_i^T w (1 where it is not positive) and whether a
    weighted row leaves the domain. Returns (grad, fws, dead)."""
    fw = np.matmul(ww[:, None, :], PTw)                     # (n, 1, M), float64 on the (k, M) layout
    nonpos = fw <= 0
    if nonpos.any():                                        # outside the domain (padding rows aside)
        dead = np.any((cw > 0) & nonpos, axis=(1, 2))
        fws = np.where(nonpos, 1.0, fw)
    else:
        dead, fws = np.zeros(fw.shape[0], dtype=bool), fw
    grad = np.matmul(PTw, (cw / fws).transpose(0, 2, 1))[:, :, 0]
    return grad, fws, dead


def _refreshed_hessian(a_, cw, fws):
    """The float32 Hessian of the problems whose w moved (``a_["moved"]``); the last one kept for the others."""
    H = a_["H"]
    moved = a_["moved"]
    if moved.all():
        H = hessianT(a_["PT32"], cw[:, 0], fws[:, 0])
    elif moved.any():
        rows = np.flatnonzero(moved)
        H[rows] = hessianT(a_["PT32"][rows], cw[rows, 0], fws[rows, 0])
    a_["H"] = H
    return H


def _pin_at_start(H, grad, g, psw, ww, face, d, tol):
    """The first iteration's face: coordinates the step would take below 0 while their gradient pushes down are
    pinned (up to three rounds). Returns (face, step d, whether zeroing them moved w by more than tol, w)."""
    for _ in range(3):
        drop = face & (ww + d <= 0.0) & (g < 1.0 - 1e-3)
        if not drop.any():
            break
        face &= ~drop
        rows = np.flatnonzero(drop.any(axis=1))
        d[rows] = newton_on_face(H[rows], grad[rows], psw[rows], ww[rows], face[rows])
    # zero what is pinned; the gradient and step stay valid (to tol) unless that moves w by more than tol
    zeroed = np.where(face, 0.0, ww)
    changed = (np.einsum("ak,ak->a", zeroed, psw) > 0.1 * tol) | (zeroed.max(axis=1) > tol)
    return face, d, changed, np.where(face, ww, 0.0)


def _free_largest_gain(a_, add, ww, face, d, changed, g, fws, cw):
    """Frees, in each problem with a pinned coordinate in ``add``, the one with the largest gain: at its warm value
    the first time, else at the best point on the segment to the vertex e_y / p_s(y). Updates face, d, changed
    and ``a_["revived"]`` in place; returns the new w."""
    PTw, psw = a_["PT"], a_["ps"]
    rows = np.flatnonzero(add.any(axis=1))
    y = np.argmax(np.where(add[rows], g[rows], -np.inf), axis=1)
    wr = ww[rows].copy()
    warm = a_["w0"][rows, y]
    first = (warm > 0) & ~a_["revived"][rows, y]
    wr[first, y[first]] = warm[first]
    line = np.flatnonzero(~first)
    if line.size:           # no usable warm value: the best point on the segment to the vertex e_y / p_s(y)
        r = rows[line]
        vy = PTw[r, y[line], :] / psw[r, y[line], None]
        t = _segment_max(vy, fws[r, 0, :], cw[r, 0, :])
        wr[line] *= (1.0 - t)[:, None]
        wr[line, y[line]] += t / psw[r, y[line]]
    wr /= np.einsum("ak,ak->a", wr, psw[rows])[:, None]
    ww = ww.copy()
    ww[rows] = wr
    face[rows, y] = True
    a_["revived"][rows, y] = True
    d[rows] = 0.0
    changed[rows] = True
    return ww


class _PolishStep(NamedTuple):
    """A damped Newton step of the polish: the new w, the free set after pinning, the step length and whether w
    moved enough (or the face changed) to refresh the Hessian."""
    w: np.ndarray
    free: np.ndarray
    step: np.ndarray
    moved: np.ndarray


def _polish_step(H, d, face, ww, psw, cmin, changed) -> _PolishStep:
    """Damped Newton (by the decrement), capped at the boundary w_y = 0, where the coordinates it reaches are
    pinned; w renormalised onto p_s^T w = 1."""
    dHd = np.einsum("ak,ak->a", d, np.matmul(H, d[:, :, None])[:, :, 0])
    dec = np.sqrt(np.maximum(dHd, 0.0) / cmin)
    step = np.where(dec < 0.25, 1.0, 1.0 / (1.0 + dec))
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = np.where(face & (d < 0), -ww / d, np.inf)
    step = np.minimum(step, to_zero.min(axis=1))
    move = step[:, None] * d
    wn = ww + move
    pin = face & ((to_zero <= step[:, None] * (1.0 + 1e-12)) | (wn <= 0.0))
    wn[pin] = 0.0
    free = face & ~pin
    wn /= np.einsum("ak,ak->a", wn, psw)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(free & (ww > 0), np.abs(move) / ww, 0.0).max(axis=1)
    return _PolishStep(w=wn, free=free, step=step, moved=(rel > _CHORD_REL) | pin.any(axis=1) | changed)


def _polish_chunk(PT, cn, ps, PT32, w, tol, max_iter):
    """Active-set Newton method on the faces of W for one chunk, from a point ``w`` close to the optimum of eq.
    (mlls-sample): float64 gradient, float32 Hessian, damped by the Newton decrement.

    Converged when the Frank-Wolfe gap is at most ``tol`` with no pinned coordinate to free and either the Newton
    step is at most ``tol`` or the face is stationary to 1e-3 ``tol``. Returns (w, converged, iterations, gap,
    failed); failed problems are for the interior-point method. The pinning and freeing rules and the step length
    are described in ``docs/solvers.md``.
    """
    A, k, M = PT.shape
    out = Outcome(w.copy())
    cmin = np.where(cn > 0, cn, np.inf).min(axis=1)
    work = Work(np.arange(A), PT=PT, c3=cn[:, None, :], ps=ps, PT32=PT32, w=w.copy(), w0=w.copy(), free=w > 0,
                 cmin=cmin, stuck=np.zeros(A, dtype=np.int64), H=np.zeros((A, k, k)), moved=np.ones(A, dtype=bool),
                 revived=np.zeros((A, k), dtype=bool))
    failed = np.zeros(A, dtype=bool)
    for it in range(1, max_iter + 1):
        a_ = work.arrays
        cw, psw, ww = a_["c3"], a_["ps"], a_["w"]
        live = work.live
        grad, fws, dead = _polish_gradient(a_["PT"], cw, ww)
        g = grad / psw
        gap = g.max(axis=1) - 1.0
        H = _refreshed_hessian(a_, cw, fws)
        diag = np.einsum("aii->ai", H)      # no curvature (f_y(x) ~ 0 on every row, to float32): pinned
        usable = diag > 1e-30 * diag.max(axis=1, keepdims=True)
        face = a_["free"] & usable
        d = newton_on_face(H, grad, psw, ww, face)
        changed = np.zeros(ww.shape[0], dtype=bool)
        if it == 1:
            face, d, changed, ww = _pin_at_start(H, grad, g, psw, ww, face, d, tol)
        resid = np.where(face, np.abs(g - 1.0), 0.0).max(axis=1)
        solved = (np.abs(d).max(axis=1) <= 1e-6 * ww.max(axis=1)) | (resid <= 1e-3 * tol)
        gain = g - 1.0
        add = ~face & usable & (gain > tol) & (solved[:, None] | (gain > 10.0 * resid[:, None]))
        if add.any():   # free the pinned coordinate with the largest gain; the Newton step waits for the new gradient
            ww = _free_largest_gain(a_, add, ww, face, d, changed, g, fws, cw)
        bad = dead | ~np.all(np.isfinite(d), axis=1)
        d[bad] = 0.0
        dmax = np.abs(d).max(axis=1)
        done = live & ~bad & ~changed & (gap <= tol) & solved & ((dmax <= tol) | (resid <= 1e-3 * tol))
        st = _polish_step(H, d, face, ww, psw, a_["cmin"], changed)
        a_["moved"] = st.moved
        stuck = np.where((st.step <= 0.0) & ~changed, a_["stuck"] + 1, 0)
        fail = live & ~done & (bad | (stuck >= 3))
        failed[work.ids[fail]] = True
        a_["w"], a_["free"], a_["stuck"] = st.w, st.free, stuck
        if out.record(work, it, st.w, gap, done | fail, converged=done):
            break
        work.maybe_compact(0.5)
    failed |= ~out.conv
    return (*out.result(), failed)


_NEWTON_METHODS = ("auto", "ipm")


def mlls_newton(probs, source_prior, mask=None, *, tol: float = 1e-10, max_iter: int = 200,
                init=None, method: str = "auto", chunk_size: int | None = None) -> SolverResult:
    """MLLS, eq. (mlls-sample), by Newton's method on W, batched; exact to ``tol`` and certified by the
    Frank-Wolfe duality gap (see :func:`mlls_optimality`).

    ``method="auto"`` (default), per problem: a SQUAREM-EM warm start in single precision, an active-set Newton
    polish in double precision on the face of W it points to, and, for the problems the polish cannot certify
    within min(30, ``max_iter``) iterations, the primal-dual interior-point method from scratch; ``method="ipm"``:
    the interior-point method alone. A single set of more than ``labelshift.rows.LARGE_ROWS`` rows is solved by
    :func:`mlls_newton_rows`. The stages, their stopping rules and the interior-point method: ``docs/solvers.md``.

    Args:
        probs, source_prior, mask: as in :func:`mlls_em` (module conventions).
        tol: the certified duality gap and the max-norm Newton step at convergence.
        max_iter: caps the polish and the interior-point method (the warm start stops after at most 100 cycles).
        init: starting weights (default w = 1), rescaled onto W.
        method: ``"auto"`` or ``"ipm"``.
        chunk_size: problems solved together per chunk, as in :func:`mlls_em`; results do not depend on it.

    Returns:
        :class:`SolverResult`: ``iterations`` counts all iterations of a problem (warm-start cycles, polish and
        interior-point steps); ``optimality`` is the Frank-Wolfe duality gap at the last iterate.

    Raises:
        ValueError: an unknown ``method``.
    """
    if method not in _NEWTON_METHODS:
        raise ValueError(f"method must be one of {_NEWTON_METHODS}, got {method!r}")
    if method == "auto" and _rows.is_large(probs, mask):
        res = mlls_newton_rows(_rows.single_set(probs, mask), source_prior, tol=tol, max_iter=max_iter, init=init)
        if np.ndim(probs) == 2:
            return res
        return SolverResult(res.weights[None], np.array([res.converged]), np.array([res.iterations]),
                            np.array([res.optimality]), None if res.hessian is None else res.hessian[None])
    P, cn, ps, w, single = prepare(probs, source_prior, mask, init)
    S, M, k = P.shape
    w_ipm = np.maximum(w, 1e-3)                 # the interior-point method starts strictly inside W
    w_ipm /= np.einsum("sk,sk->s", w_ipm, ps)[:, None]
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap = np.full(S, np.inf)
    for sl in chunk_slices(S, M, k, chunk_size):
        Pc, cc, pc = P[sl], cn[sl], ps[sl]
        if method == "ipm":
            PT32 = transposed_rows(Pc, np.float32)
            w[sl], conv[sl], iters[sl], gap[sl] = ipm_chunk(Pc, cc, pc, PT32, w_ipm[sl], tol, max_iter)
            continue
        PT = transposed_rows(Pc, np.float64)
        PT32 = PT.astype(np.float32)
        wc, _, it1, _ = squarem_chunk(PT32, cc, pc, w[sl], tol=WARM_STEP, max_iter=WARM_CYCLES, loose=True)
        wc, cv, it2, gp, failed = _polish_chunk(PT, cc, pc, PT32, wc, tol, min(_POLISH_ITER, max_iter))
        it = it1 + it2
        if failed.any():
            rows = np.flatnonzero(failed)
            out = ipm_chunk(Pc[rows], cc[rows], pc[rows], PT32[rows], w_ipm[sl][rows], tol, max_iter)
            wc[rows], cv[rows], gp[rows] = out[0], out[1], out[3]
            it[rows] += out[2]
        w[sl], conv[sl], iters[sl], gap[sl] = wc, cv, it, gp
    return unbatch(SolverResult(w, conv, iters, gap), single)
