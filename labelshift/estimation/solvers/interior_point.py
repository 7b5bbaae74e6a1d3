"""MLLS by a primal-dual interior-point method on W (a monotone barrier schedule, the IPOPT defaults): what
:func:`~labelshift.estimation.solvers.mlls_newton` runs for the problems its Newton polish cannot certify, or alone
with ``method="ipm"`` (``docs/solvers.md``)."""
from __future__ import annotations

import numpy as np

from .layout import hessianT, Outcome, Work
from .mlls_objective import batched_fw, batched_gradient, batched_hessian

# monotone barrier schedule of the MLLS interior-point method (the IPOPT defaults): initial mu; the barrier problem
# counts as solved at error <= KAPPA_EPS mu; then mu <- max(mu_min, min(KAPPA_MU mu, mu^THETA_MU))
_IPM_MU0, _IPM_KAPPA_EPS, _IPM_KAPPA_MU, _IPM_THETA_MU = 1e-2, 10.0, 0.2, 1.5


def _frac_to_boundary(x, dx, frac):
    """The step length in (0, 1] that keeps x + t dx > 0: ``frac`` of the way to the boundary, at most 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(dx < 0, -x / dx, np.inf)
    return np.minimum(1.0, frac * r.min(axis=1))


def _ipm_shrunk_mu(r_stat, ww, zw, muw, live, comp_tol):
    """The barrier parameter mu, shrunk (possibly several times in a row) where the barrier problem is solved to
    KAPPA_EPS mu."""
    for _ in range(8):
        err = np.maximum(np.abs(r_stat).max(axis=1), np.abs(ww * zw - muw[:, None]).max(axis=1))
        shrink = live & (err <= _IPM_KAPPA_EPS * muw) & (muw > 0.1 * comp_tol)
        if not shrink.any():
            break
        muw = np.where(shrink, np.maximum(0.1 * comp_tol,
                                          np.minimum(_IPM_KAPPA_MU * muw, muw ** _IPM_THETA_MU)), muw)
    return muw


def _ipm_direction(PT32, Pw, cw, fw, psw, ww, zw, muw, r_stat):
    """The primal-dual Newton direction (dw, dnu, dz): [H + Z/W, a; a^T, 0] [dw; dnu] = [r_stat + (mu - w z) / w;
    1 - a^T w], Jacobi-equilibrated."""
    A, k = ww.shape
    idx = np.arange(k)
    K = np.zeros((A, k + 1, k + 1))
    H = hessianT(PT32, cw, fw)
    if not np.all(np.isfinite(H)):                      # row scales beyond float32: use float64
        H = batched_hessian(Pw, cw, fw)
    K[:, :k, :k] = H
    K[:, idx, idx] += zw / ww
    K[:, :k, k] = psw
    K[:, k, :k] = psw
    dsc = np.ones((A, k + 1))
    dsc[:, :k] = 1.0 / np.sqrt(np.einsum("sii->si", K[:, :k, :k]))
    rc = muw[:, None] - ww * zw
    rhs = np.empty((A, k + 1))
    rhs[:, :k] = r_stat + rc / ww
    rhs[:, k] = 1.0 - np.einsum("sk,sk->s", psw, ww)
    sol = dsc * np.linalg.solve(K * dsc[:, :, None] * dsc[:, None, :], (rhs * dsc)[..., None])[..., 0]
    dw, dnu = sol[:, :k], sol[:, k]
    return dw, dnu, (rc - zw * dw) / ww


def _ipm_step_lengths(Pw, cw, fw, ww, zw, muw, grad, dw, dz, live):
    """The primal and dual step lengths: fraction to the boundary for w, z and the domain f_i^T w > 0, the primal
    one halved until Armijo holds on the barrier objective L_m(w) + mu sum log w. Returns (ap, ad, f_i^T dw)."""
    # step lengths: fraction to the boundary for w, z and the domain f_i^T w > 0 (linear in w)
    frac = np.maximum(0.99, 1.0 - muw)
    ap = _frac_to_boundary(ww, dw, frac)
    ad = _frac_to_boundary(zw, dz, frac)
    dfw = batched_fw(Pw, dw)
    with np.errstate(divide="ignore", invalid="ignore"):
        rr = np.where((dfw < 0) & (cw > 0), -fw / dfw, np.inf)
    ap = np.minimum(ap, frac * rr.min(axis=1))
    # Armijo on the barrier objective L_m(w) + mu sum log w (dw is an ascent direction of it)
    merit0 = np.einsum("sm,sm->s", cw, np.log(np.where(cw > 0, fw, 1.0))) + muw * np.log(ww).sum(axis=1)
    slope = np.einsum("sk,sk->s", grad + muw[:, None] / ww, dw)
    check = live & (slope > 1e-14 * np.abs(merit0).clip(1.0))
    for _ in range(50):
        if not check.any():
            break
        rows = np.flatnonzero(check)
        ft = fw[rows] + ap[rows, None] * dfw[rows]
        wt = ww[rows] + ap[rows, None] * dw[rows]
        with np.errstate(divide="ignore", invalid="ignore"):
            lt = np.where(cw[rows] > 0, np.log(np.where(ft > 0, ft, 1.0)), 0.0)
        mt = np.einsum("sm,sm->s", cw[rows], lt) + muw[rows] * np.log(wt).sum(axis=1)
        ok = mt >= merit0[rows] + 1e-4 * ap[rows] * slope[rows]
        check[rows[ok]] = False
        ap[rows[~ok]] *= 0.5
    return ap, ad, dfw


def ipm_chunk(P, cn, ps, PT32, w, tol, max_iter):
    """The primal-dual interior-point method of :func:`mlls_newton` (``method="ipm"``) on one chunk."""
    A, M, k = P.shape
    comp_tol = 1e-4 * tol * ps.min(axis=1)
    mu = np.full(A, _IPM_MU0)
    out = Outcome(w)
    work = Work(np.arange(A), P=P, cn=cn, ps=ps, w=w.copy(), z=mu[:, None] / w, nu=np.ones(A), mu=mu,
                 comp_tol=comp_tol, fw=batched_fw(P, w), PT32=PT32)
    for it in range(1, max_iter + 1):
        Pw, cw, psw, ww, zw, nuw, muw, fw = work.P, work.cn, work.ps, work.w, work.z, work.nu, work.mu, work.fw
        live = work.live
        grad = batched_gradient(Pw, cw, fw)
        gap = (grad / psw).max(axis=1) - 1.0
        r_stat = grad - nuw[:, None] * psw + zw             # dual residual, 0 at the optimum
        # solve the barrier problem to KAPPA_EPS mu before shrinking mu (possibly several times in a row)
        muw = _ipm_shrunk_mu(r_stat, ww, zw, muw, live, work.comp_tol)
        dw, dnu, dz = _ipm_direction(work.PT32, Pw, cw, fw, psw, ww, zw, muw, r_stat)
        ap, ad, dfw = _ipm_step_lengths(Pw, cw, fw, ww, zw, muw, grad, dw, dz, live)
        wn = ww + ap[:, None] * dw
        norm = np.einsum("sk,sk->s", wn, psw)
        wn /= norm[:, None]
        fwn = (fw + ap[:, None] * dfw) / norm[:, None]
        zn = np.clip(zw + ad[:, None] * dz, muw[:, None] / (1e10 * wn), 1e10 * muw[:, None] / wn)
        nun = nuw + ap * dnu
        step = np.max(np.abs(wn - ww), axis=1)
        comp = np.max(wn * zn, axis=1)
        kkt = (gap <= tol) & (comp <= work.comp_tol)
        finished = live & kkt & ((step <= tol) | (np.abs(r_stat).max(axis=1) <= 1e-3 * tol))
        work.set("w", np.where(live[:, None], wn, ww))
        work.set("fw", np.where(live[:, None], fwn, fw))
        work.set("z", np.where(live[:, None], zn, zw))
        work.set("nu", np.where(live, nun, nuw))
        work.set("mu", muw)
        if out.record(work, it, wn, gap, finished):
            break
        work.maybe_compact()
    return out.result()
