"""RLLS (Azizzadenesheli et al., ICLR 2019): the regulariser rho and a batched log-barrier interior-point method
for its second-order cone program."""
from __future__ import annotations

import numpy as np

from .batch import SolverResult, unbatch


def rlls_rho(n_classes: int, n_source: int, delta: float = 0.05) -> float:
    """The RLLS regularisation strength rho = 3 * Delta_C (Azizzadenesheli et al., ICLR 2019).

    Delta_C = 2 log(2k/delta) / (3n) + sqrt(2 log(2k/delta) / n) is their high-probability (1 - delta) bound on the
    estimation error of the confusion matrix from n source examples (a matrix Bernstein bound), and the theory
    sets rho = 3 Delta_C. This is the formula of the authors' public code (``compute_3deltaC`` in
    github.com/Angie-Liu/labelshift, ``label_shift.py``), which also scales it by a tuned factor (0.01 there;
    see ``RLLS(rho_scale=...)``).
    """
    L = np.log(2.0 * n_classes / delta)
    return float(3.0 * (2.0 * L / (3.0 * n_source) + np.sqrt(2.0 * L / n_source)))


def rlls_objective(confusion, mu, weights, rho: float) -> np.ndarray:
    """||C theta - b||_2 + rho ||theta||_2 with theta = w - 1 and b = mu_t - C 1 (unsquared norms). Batched."""
    C = np.asarray(confusion, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    theta = np.asarray(weights, dtype=np.float64) - 1.0
    b = mu - C.sum(axis=1)
    return np.linalg.norm(theta @ C.T - b, axis=-1) + rho * np.linalg.norm(theta, axis=-1)


class _RllsBarrier:
    """The log-barrier centring objective of :func:`rlls_solve` for a confusion matrix C, strength rho and right-hand
    sides b: its gradient and Hessian in (theta, t[, s]) and the strictly feasible points."""

    def __init__(self, C: np.ndarray, rho: float, k: int):
        self.C, self.rho, self.k = C, rho, k
        self.use_s = rho > 0.0
        self.n = k + 1 + int(self.use_s)
        self.CtC = C.T @ C
        self.eye = np.eye(k)

    def terms(self, xa, ta, b_a):
        """Gradient and Hessian of the centring objective at the rows xa (all strictly feasible)."""
        C, CtC, k, n, rho = self.C, self.CtC, self.k, self.n, self.rho
        A = xa.shape[0]
        th, t = xa[:, :k], xa[:, k]
        r = th @ C.T - b_a
        D1 = t * t - np.einsum("ai,ai->a", r, r)
        Ctr = r @ C
        g = np.zeros((A, n))
        H = np.zeros((A, n, n))
        g[:, :k] = 2.0 * Ctr / D1[:, None]
        g[:, k] = ta - 2.0 * t / D1
        H[:, :k, :k] = 2.0 * CtC[None] / D1[:, None, None] + 4.0 * Ctr[:, :, None] * Ctr[:, None, :] / (
            D1 * D1)[:, None, None]
        H[:, :k, k] = H[:, k, :k] = -4.0 * t[:, None] * Ctr / (D1 * D1)[:, None]
        H[:, k, k] = 2.0 * (t * t + (t * t - D1)) / (D1 * D1)
        if self.use_s:
            s = xa[:, k + 1]
            D2 = s * s - np.einsum("ai,ai->a", th, th)
            g[:, :k] += 2.0 * th / D2[:, None]
            g[:, k + 1] = ta * rho - 2.0 * s / D2
            H[:, :k, :k] += 2.0 * self.eye[None] / D2[:, None, None] + 4.0 * th[:, :, None] * th[:, None, :] / (
                D2 * D2)[:, None, None]
            H[:, :k, k + 1] = H[:, k + 1, :k] = -4.0 * s[:, None] * th / (D2 * D2)[:, None]
            H[:, k + 1, k + 1] = 2.0 * (s * s + (s * s - D2)) / (D2 * D2)
        u = 1.0 + th
        g[:, :k] -= 1.0 / u
        idx = np.arange(k)
        H[:, idx, idx] += 1.0 / (u * u)
        return g, H

    def feasible(self, xa, b_a):
        """Whether each row of xa is strictly inside the cones and theta > -1."""
        k = self.k
        th, t = xa[:, :k], xa[:, k]
        r = th @ self.C.T - b_a
        ok = (t > 0) & (t * t - np.einsum("ai,ai->a", r, r) > 0) & np.all(th > -1.0, axis=1)
        if self.use_s:
            s = xa[:, k + 1]
            ok &= (s > 0) & (s * s - np.einsum("ai,ai->a", th, th) > 0)
        return ok


def _rlls_damped_step(barrier: _RllsBarrier, xa, ta, b_a):
    """One damped Newton step of the centring objective from the rows xa, halved until strictly feasible.
    Returns (the new rows, the Newton decrement lambda)."""
    g, H = barrier.terms(xa, ta, b_a)
    # Jacobi-equilibrate the Newton system: its entries span many orders of magnitude near the optimum
    d = 1.0 / np.sqrt(np.einsum("aii->ai", H))
    step = -d * np.linalg.solve(H * d[:, :, None] * d[:, None, :], (g * d)[..., None])[..., 0]
    lam = np.sqrt(np.maximum(-np.einsum("ai,ai->a", g, step), 0.0))
    alpha = np.where(lam > 0.25, 1.0 / (1.0 + lam), 1.0)
    xn = xa + alpha[:, None] * step
    # self-concordance keeps these steps feasible in exact arithmetic; guard against rounding at the end
    for _ in range(60):
        bad = ~barrier.feasible(xn, b_a)
        if not bad.any():
            break
        alpha[bad] *= 0.5
        xn[bad] = xa[bad] + alpha[bad, None] * step[bad]
    return xn, lam


def rlls_solve(confusion, mu, rho: float, *, tol: float = 1e-10, max_iter: int = 500) -> SolverResult:
    """Solve RLLS (Azizzadenesheli et al., ICLR 2019, eq. (6)): theta = argmin ||C theta - b||_2 + rho ||theta||_2
    subject to theta >= -1, where b = mu_t - C 1; return w = 1 + theta.

    The norms are *unsquared*, so the problem is a second-order cone program. It is solved here, for all (S, k)
    right-hand sides at once, by a log-barrier interior-point method: minimise
        tau (t + rho s) - log(t^2 - ||C theta - b||^2) - log(s^2 - ||theta||^2) - sum_y log(1 + theta_y)
    over (theta, t, s) by damped Newton steps (step 1/(1 + lambda) while the Newton decrement lambda > 1/4, full
    steps after; the barrier is self-concordant, so every step stays strictly feasible and decreases the
    barrier objective) and multiply tau by 10 after each centring. A centred point has duality gap at most
    (nu + O(lambda))/tau with barrier parameter nu = k + 4, so the solver stops when nu / tau <= tol (an absolute
    bound on the objective's sub-optimality) and the last centring has lambda <= 1e-3 (tighter centring is not
    attainable at the end: t and ||C theta - b|| are then ~1e-12 and rounding dominates). With rho = 0 the s-cone is
    dropped (nu = k + 2); then, whenever the BBSE solution C^{-1} mu_t satisfies w >= 0 strictly, it is the unique
    minimiser (objective 0) and is recovered to ~1e-12.

    Returns a :class:`SolverResult`; ``optimality`` is the duality-gap bound nu / tau at exit.
    """
    C = np.asarray(confusion, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    single = mu.ndim == 1
    mu2 = mu[None] if single else mu
    S, k = mu2.shape
    barrier = _RllsBarrier(C, float(rho), k)
    nu = k + 2.0 + 2.0 * barrier.use_s
    b = mu2 - C.sum(axis=1)

    x = np.zeros((S, barrier.n))
    x[:, k] = np.linalg.norm(b, axis=1) + 1.0          # t > ||C 0 - b||
    if barrier.use_s:
        x[:, k + 1] = 1.0                                # s > ||0||
    tau = np.full(S, 1.0)
    done = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    tau_final = nu / tol
    mu_factor = 10.0
    for _ in range(max_iter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        xa, ta = x[act], tau[act]
        x[act], lam = _rlls_damped_step(barrier, xa, ta, b[act])
        iters[act] += 1
        centred = lam <= 1e-3
        finished = centred & (ta >= tau_final)
        done[act[finished]] = True
        grow = centred & ~finished
        tau[act[grow]] = np.minimum(ta[grow] * mu_factor, tau_final)
    w = 1.0 + x[:, :k]
    return unbatch(SolverResult(w, done.copy(), iters, nu / tau), single)
