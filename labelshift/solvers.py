"""Functional core of the label-shift estimators: small, pure, batched numpy functions.

The estimator classes in :mod:`labelshift.estimators` compose these; the functions here do no input validation
beyond shapes (the classes validate at the public boundary) and never mutate their arguments.

Conventions
-----------
* ``probs`` is one set of probability vectors, shape (m, k), or a padded batch, shape (S, M, k).
* ``mask`` holds non-negative row weights of shape (m,) or (S, M): 1 for a real row, 0 for padding. Integer
  counts are allowed too (a row standing for several identical examples), which is how MLLS-CM and binned MLLS
  solve on the k (or k * n_bins) distinct calibrated rows instead of all m rows. ``None`` means all ones.
* Weights w(y) = p_t(y) / p_s(y); the source prior p_s is a (k,) vector (or (S, k)).
* Functions given a single set return unbatched arrays; given a batch they return arrays with a leading S axis.
  Every batched solver runs each problem to its *own* convergence criterion (problems that are done are frozen),
  so a batch gives the same answer as one-at-a-time calls up to floating-point summation order.

Contents
--------
Confusion matrices and BBSE (Lipton et al., ICML 2018):
    :func:`confusion_matrix`, :func:`mean_prediction`, :func:`bbse_solve`.
RLLS (Azizzadenesheli et al., ICLR 2019):
    :func:`rlls_rho`, :func:`rlls_solve` (a batched log-barrier interior-point method for the SOCP).
MLLS, eq. (mlls-sample) of Garg et al. (NeurIPS 2020):
    :func:`mlls_objective`, :func:`mlls_gradient`, :func:`mlls_hessian`, :func:`hessian_min_eigenvalue`,
    :func:`restricted_min_eigenvalue`, :func:`mlls_optimality`, :func:`mlls_em` (Saerens et al. 2002) and
    :func:`mlls_newton` (a primal-dual interior-point Newton method on W).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "SolverResult",
    "one_hot_argmax", "confusion_matrix", "mean_prediction", "bbse_solve",
    "rlls_rho", "rlls_objective", "rlls_solve",
    "mlls_objective", "mlls_gradient", "mlls_hessian", "hessian_min_eigenvalue", "restricted_min_eigenvalue",
    "mlls_optimality", "mlls_em", "mlls_newton",
    "PIN_TOL",
]

#: MLLS weights at or below this value count as "at the boundary" w_y = 0 when diagnostics need to know which
#: coordinates are pinned by the constraint w >= 0 (EM approaches 0 geometrically, the interior-point Newton method to
#: ~1e-15; neither returns exact zeros).
PIN_TOL = 1e-8

# monotone barrier schedule of the MLLS interior-point method (the IPOPT defaults): initial mu; the barrier problem
# counts as solved at error <= KAPPA_EPS mu; then mu <- max(mu_min, min(KAPPA_MU mu, mu^THETA_MU))
_IPM_MU0, _IPM_KAPPA_EPS, _IPM_KAPPA_MU, _IPM_THETA_MU = 1e-2, 10.0, 0.2, 1.5


class SolverResult(NamedTuple):
    """What the iterative solvers return (leading axis S for a batch, none for a single set).

    weights: the solution w, (k,) or (S, k).
    converged: whether each problem met its tolerance within ``max_iter``.
    iterations: iterations used by each problem.
    optimality: the final value of the solver's optimality measure (see each solver; for MLLS the Frank-Wolfe
        duality gap, for RLLS the duality-gap bound).
    """

    weights: np.ndarray
    converged: np.ndarray
    iterations: np.ndarray
    optimality: np.ndarray


def _unbatch(res: SolverResult, single: bool) -> SolverResult:
    if not single:
        return res
    return SolverResult(res.weights[0], bool(res.converged[0]), int(res.iterations[0]), float(res.optimality[0]))


# ---------------------------------------------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------------------------------------------
def _as_batch(probs, mask=None):
    """(S, M, k) float array, (S, M) row weights, and whether the input was a single (m, k) set."""
    P = np.asarray(probs, dtype=np.float64)
    single = P.ndim == 2
    if single:
        P = P[None]
    if P.ndim != 3:
        raise ValueError(f"probs must be (m, k) or (S, M, k), got shape {np.shape(probs)}")
    S, M, _ = P.shape
    if mask is None:
        c = np.ones((S, M))
    else:
        c = np.asarray(mask, dtype=np.float64)
        c = np.broadcast_to(c[None] if c.ndim == 1 else c, (S, M))
    tot = c.sum(axis=1)
    if np.any(tot <= 0):
        raise ValueError("every set needs at least one row with positive weight")
    return P, c, single


def _prior_batch(prior, S: int, k: int) -> np.ndarray:
    p = np.asarray(prior, dtype=np.float64)
    return np.broadcast_to(p, (S, k)).copy()


def _weights_batch(weights, S: int, k: int) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    return np.broadcast_to(w if w.ndim == 2 else w[None], (S, k)).copy()


def one_hot_argmax(probs) -> np.ndarray:
    """One-hot encoding of the argmax along the last axis (ties go to the lowest index, as ``numpy.argmax``)."""
    P = np.asarray(probs, dtype=np.float64)
    k = P.shape[-1]
    return (np.argmax(P, axis=-1)[..., None] == np.arange(k)).astype(np.float64)


# ---------------------------------------------------------------------------------------------------------------
# confusion matrices and BBSE
# ---------------------------------------------------------------------------------------------------------------
def confusion_matrix(probs, labels, n_classes: int | None = None, soft: bool = False) -> np.ndarray:
    """Joint confusion matrix C[predicted, true] on labelled source outputs; its entries sum to 1.

    Hard (Lipton et al. 2018): C[i, j] = (1/n) #{x : argmax f(x) = i, y = j}. Soft: the one-hot prediction is
    replaced by the probability vector, C[i, j] = (1/n) sum_{x: y = j} f_i(x). Column j sums to the label frequency
    of class j and row i to the mean prediction for class i, so C 1 is the source mean prediction.
    """
    P = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    k = P.shape[1] if n_classes is None else int(n_classes)
    n = y.shape[0]
    if soft:
        C = np.zeros((k, k))
        for j in range(k):  # column j: sum of the probability vectors of the examples of class j
            C[:, j] = P[y == j].sum(axis=0)
    else:
        pred = np.argmax(P, axis=1)
        C = np.bincount(pred * k + y, minlength=k * k).reshape(k, k).astype(np.float64)
    return C / n


def mean_prediction(probs, mask=None, soft: bool = False) -> np.ndarray:
    """Mean prediction on target outputs: mu_t = (1/m) sum_x onehot(argmax f(x)) (hard) or (1/m) sum_x f(x) (soft).

    Batched: ``probs`` (S, M, k) with ``mask`` (S, M) returns (S, k). Hard counts are exact integers divided by m.
    """
    P, c, single = _as_batch(probs, mask)
    X = P if soft else one_hot_argmax(P)
    mu = np.matmul(c[:, None, :], X)[:, 0, :] / c.sum(axis=1)[:, None]
    return mu[0] if single else mu


def bbse_solve(confusion, mu) -> np.ndarray:
    """Solve C w = mu_t (BBSE, Lipton et al. 2018) for one (k,) or many (S, k) right-hand sides.

    Each right-hand side is solved with its own (identical) LU factorisation, so a batch gives bit-identical answers
    to one-at-a-time calls. The answer is unconstrained: w may have negative entries when mu_t is noisy.
    """
    C = np.asarray(confusion, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    single = mu.ndim == 1
    mu2 = mu[None] if single else mu
    Cb = np.broadcast_to(C, (mu2.shape[0],) + C.shape)
    w = np.linalg.solve(Cb, mu2[..., None])[..., 0]
    return w[0] if single else w


# ---------------------------------------------------------------------------------------------------------------
# RLLS
# ---------------------------------------------------------------------------------------------------------------
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
    rho = float(rho)
    use_s = rho > 0.0
    n = k + 1 + int(use_s)
    nu = k + 2.0 + 2.0 * use_s
    b = mu2 - C.sum(axis=1)
    CtC = C.T @ C
    eye = np.eye(k)

    x = np.zeros((S, n))
    x[:, k] = np.linalg.norm(b, axis=1) + 1.0          # t > ||C 0 - b||
    if use_s:
        x[:, k + 1] = 1.0                                # s > ||0||
    tau = np.full(S, 1.0)
    done = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    tau_final = nu / tol
    mu_factor = 10.0

    def barrier_terms(xa, ta):
        """Gradient and Hessian of the centring objective at the rows xa (all strictly feasible)."""
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
        if use_s:
            s = xa[:, k + 1]
            D2 = s * s - np.einsum("ai,ai->a", th, th)
            g[:, :k] += 2.0 * th / D2[:, None]
            g[:, k + 1] = ta * rho - 2.0 * s / D2
            H[:, :k, :k] += 2.0 * eye[None] / D2[:, None, None] + 4.0 * th[:, :, None] * th[:, None, :] / (
                D2 * D2)[:, None, None]
            H[:, :k, k + 1] = H[:, k + 1, :k] = -4.0 * s[:, None] * th / (D2 * D2)[:, None]
            H[:, k + 1, k + 1] = 2.0 * (s * s + (s * s - D2)) / (D2 * D2)
        u = 1.0 + th
        g[:, :k] -= 1.0 / u
        idx = np.arange(k)
        H[:, idx, idx] += 1.0 / (u * u)
        return g, H

    def feasible(xa):
        th, t = xa[:, :k], xa[:, k]
        r = th @ C.T - b_a
        ok = (t > 0) & (t * t - np.einsum("ai,ai->a", r, r) > 0) & np.all(th > -1.0, axis=1)
        if use_s:
            s = xa[:, k + 1]
            ok &= (s > 0) & (s * s - np.einsum("ai,ai->a", th, th) > 0)
        return ok

    for _ in range(max_iter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        xa, ta, b_a = x[act], tau[act], b[act]
        g, H = barrier_terms(xa, ta)
        # Jacobi-equilibrate the Newton system: its entries span many orders of magnitude near the optimum
        d = 1.0 / np.sqrt(np.einsum("aii->ai", H))
        step = -d * np.linalg.solve(H * d[:, :, None] * d[:, None, :], (g * d)[..., None])[..., 0]
        lam = np.sqrt(np.maximum(-np.einsum("ai,ai->a", g, step), 0.0))
        alpha = np.where(lam > 0.25, 1.0 / (1.0 + lam), 1.0)
        xn = xa + alpha[:, None] * step
        # self-concordance keeps these steps feasible in exact arithmetic; guard against rounding at the end
        for _ in range(60):
            bad = ~feasible(xn)
            if not bad.any():
                break
            alpha[bad] *= 0.5
            xn[bad] = xa[bad] + alpha[bad, None] * step[bad]
        x[act] = xn
        iters[act] += 1
        centred = lam <= 1e-3
        finished = centred & (ta >= tau_final)
        done[act[finished]] = True
        grow = centred & ~finished
        tau[act[grow]] = np.minimum(ta[grow] * mu_factor, tau_final)
    w = 1.0 + x[:, :k]
    return _unbatch(SolverResult(w, done.copy(), iters, nu / tau), single)


# ---------------------------------------------------------------------------------------------------------------
# MLLS: objective, derivatives, optimality
# ---------------------------------------------------------------------------------------------------------------
def _fw(P, w):
    return np.matmul(P, w[:, :, None])[:, :, 0]


def _objective(P, cn, w):
    fw = _fw(P, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(cn > 0, np.log(np.where(fw > 0, fw, 1.0)), 0.0)
    val = np.einsum("sm,sm->s", cn, logs)
    dead = np.any((cn > 0) & (fw <= 0), axis=1)
    return np.where(dead, -np.inf, val)


def _gradient(P, cn, fw):
    return np.matmul((cn / fw)[:, None, :], P)[:, 0, :]


def _hessian(P, cn, fw, P32=None):
    """(1/m) sum_i f_i f_i^T / (f_i^T w)^2, batched. With ``P32`` (a float32 copy of P) the products are formed in
    single precision, about 1.3x faster; the Newton solver uses that, since its Hessian only steers the steps (the
    solution is fixed by the float64 gradient). Falls back to float64 when the row scales would overflow float32."""
    v = np.sqrt(cn) / fw
    if P32 is not None and P32.shape == P.shape and np.max(v) < 1e30:
        Q = P32 * v.astype(np.float32)[:, :, None]
        return np.matmul(Q.transpose(0, 2, 1), Q).astype(np.float64)
    Q = P * v[:, :, None]
    return np.matmul(Q.transpose(0, 2, 1), Q)


def _normalised_mask(P, c):
    return c / c.sum(axis=1, keepdims=True)


def mlls_objective(probs, weights, mask=None) -> np.ndarray:
    """The MLLS log-likelihood L_m(w) = (1/m) sum_i log f(x_i)^T w, eq. (mlls-sample); -inf outside its domain."""
    P, c, single = _as_batch(probs, mask)
    w = _weights_batch(weights, P.shape[0], P.shape[2])
    val = _objective(P, _normalised_mask(P, c), w)
    return val[0] if single else val


def mlls_gradient(probs, weights, mask=None) -> np.ndarray:
    """Gradient of L_m: (1/m) sum_i f_i / (f_i^T w), eq. (proof-gradient) of Garg et al. Batched."""
    P, c, single = _as_batch(probs, mask)
    w = _weights_batch(weights, P.shape[0], P.shape[2])
    g = _gradient(P, _normalised_mask(P, c), _fw(P, w))
    return g[0] if single else g


def mlls_hessian(probs, weights, mask=None) -> np.ndarray:
    """The negated Hessian of the MLLS objective, (1/m) sum_i f_i f_i^T / (f_i^T w)^2 (eq. proof-hessian of Garg
    et al., NeurIPS 2020, Appendix B): positive semi-definite, shape (k, k) or (S, k, k) for a batch.

    Args:
        probs: (m, k) calibrated predictions f(x_i) on the target set, or an (S, M, k) padded batch.
        weights: w, shape (k,) or (S, k).
        mask: optional (m,) or (S, M) row weights (0 for padding; counts for repeated rows).
    """
    P, c, single = _as_batch(probs, mask)
    w = _weights_batch(weights, P.shape[0], P.shape[2])
    H = _hessian(P, _normalised_mask(P, c), _fw(P, w))
    return H[0] if single else H


def hessian_min_eigenvalue(probs, weights, mask=None):
    """sigma_{f, w}: the minimum eigenvalue of :func:`mlls_hessian` (Section 5 of Garg et al., the sigma of
    eq. (bound-main)); the error of MLLS scales like sigma^{-1} m^{-1/2}. A float, or (S,) for a batch."""
    H = mlls_hessian(probs, weights, mask)
    ev = np.linalg.eigvalsh(H)[..., 0]
    return float(ev) if np.ndim(ev) == 0 else ev


def restricted_min_eigenvalue(hessian, free) -> np.ndarray:
    """Minimum eigenvalue of the principal sub-matrix of ``hessian`` (k, k) / (S, k, k) on the coordinates where
    ``free`` is True; nan where no coordinate is free. Batched."""
    H = np.asarray(hessian, dtype=np.float64)
    F = np.asarray(free, dtype=bool)
    single = H.ndim == 2
    if single:
        H, F = H[None], F[None]
    big = np.einsum("sii->s", H) + 1.0  # exceeds every eigenvalue of H: pinned coordinates never attain the min
    ff = F[:, :, None] & F[:, None, :]
    Hr = np.where(ff, H, 0.0) + (~F)[:, :, None] * np.eye(H.shape[-1])[None] * big[:, None, None]
    ev = np.linalg.eigvalsh(Hr)[:, 0]
    ev = np.where(F.any(axis=1), ev, np.nan)
    return float(ev[0]) if single else ev


def mlls_optimality(probs, weights, source_prior, mask=None) -> np.ndarray:
    """Frank-Wolfe duality gap of MLLS at w: max_y grad_y / p_s(y) - 1 = max_{v in W} grad^T (v - w) >= 0.

    W = {w >= 0, sum_y w_y p_s(y) = 1} has vertices e_y / p_s(y) and grad^T w = 1 for any w, so this is the
    largest first-order gain available in W; by concavity it bounds L_m(w*) - L_m(w) from above and is 0 exactly
    at the optimum (it combines stationarity on the support of w and dual feasibility off it).
    """
    g = mlls_gradient(probs, weights, mask)
    return np.max(g / np.asarray(source_prior, dtype=np.float64), axis=-1) - 1.0


# ---------------------------------------------------------------------------------------------------------------
# MLLS: EM (Saerens et al. 2002)
# ---------------------------------------------------------------------------------------------------------------
class _Work:
    """Working copies of the per-problem arrays of a batched iterative solver, compacted as problems finish.

    Computing on finished problems wastes work but copying the (S, M, k) array every time one finishes costs more;
    the arrays are compacted when fewer than 3/4 of their rows are still live.
    """

    def __init__(self, ids, **arrays):
        self.ids = ids
        self.live = np.ones(ids.shape[0], dtype=bool)
        self.arrays = arrays

    def __getattr__(self, name):
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def set(self, name, value):
        self.arrays[name] = value

    def maybe_compact(self):
        n_live = int(self.live.sum())
        if n_live == 0 or n_live >= 0.75 * self.live.shape[0]:
            return
        keep = self.live
        self.ids = self.ids[keep]
        self.arrays = {k: v[keep] for k, v in self.arrays.items()}
        self.live = np.ones(self.ids.shape[0], dtype=bool)


def mlls_em(probs, source_prior, mask=None, *, tol: float = 1e-10, max_iter: int = 100_000,
            init=None) -> SolverResult:
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
    """
    P, c, single = _as_batch(probs, mask)
    S, M, k = P.shape
    ps = _prior_batch(source_prior, S, k)
    w = np.ones((S, k)) if init is None else _weights_batch(init, S, k)
    w = w / np.einsum("sk,sk->s", w, ps)[:, None]
    cn = _normalised_mask(P, c)
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap_out = np.full(S, np.inf)
    work = _Work(np.arange(S), P=P, cn=cn, ps=ps, w=w.copy(), d1=np.full(S, np.inf), d2=np.full(S, np.inf))
    for it in range(1, max_iter + 1):
        Pw, cw, psw, ww = work.P, work.cn, work.ps, work.w
        grad = _gradient(Pw, cw, _fw(Pw, ww))
        g = grad / psw
        gap = g.max(axis=1) - 1.0
        wn = ww * g
        wn /= np.einsum("sk,sk->s", wn, psw)[:, None]
        d = np.max(np.abs(wn - ww), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r1 = np.where(work.d1 > 0, d / work.d1, np.inf)
            r2 = np.where(work.d2 > 0, work.d1 / work.d2, np.inf)
        rate = np.maximum(r1, r2)
        with np.errstate(invalid="ignore", divide="ignore"):
            tail = np.where(rate < 1.0, d * rate / (1.0 - rate), np.inf)
        finished = work.live & ((d == 0.0) | ((tail <= tol) & (gap <= tol)))
        live = work.live
        wn = np.where(live[:, None], wn, ww)
        work.set("w", wn)
        work.set("d2", work.d1)
        work.set("d1", d)
        ids = work.ids[live]
        w[ids] = wn[live]
        iters[ids] = it
        gap_out[ids] = gap[live]
        conv[work.ids[finished]] = True
        work.live = live & ~finished
        if not work.live.any():
            break
        work.maybe_compact()
    return _unbatch(SolverResult(w, conv, iters, gap_out), single)


# ---------------------------------------------------------------------------------------------------------------
# MLLS: primal-dual interior-point Newton on W
# ---------------------------------------------------------------------------------------------------------------
def mlls_newton(probs, source_prior, mask=None, *, tol: float = 1e-10, max_iter: int = 200,
                init=None) -> SolverResult:
    """MLLS, eq. (mlls-sample), by a primal-dual interior-point Newton method on W, batched.

    Maximise L_m(w) subject to w >= 0 and a^T w = 1 with a = p_s. The KKT conditions are
        grad L_m(w) - nu a + z = 0,   w_y z_y = 0,   w, z >= 0,   a^T w = 1,
    and at the optimum nu = 1 (because w^T grad L_m(w) = 1 for every w), so z_y = p_s(y) (1 - g_y) with
    g_y = grad_y / p_s(y): z_y is the first-order loss of moving mass to y, zero on the support of w.

    The method follows the barrier problems max L_m(w) + mu sum_y log w_y (a^T w = 1) for a decreasing mu, in the
    monotone manner of IPOPT (Waechter & Biegler, Math. Programming 2006):
      * each iteration is a Newton step on the perturbed KKT conditions (w_y z_y = mu), with z eliminated and the
        equality kept by a bordered (k+1) x (k+1) system whose block is the negated Hessian
        (1/m) sum_i f_i f_i^T / (f_i^T w)^2 plus Z / W;
      * step lengths keep w > 0, z > 0 and every f_i^T w > 0 (fraction to the boundary max(0.99, 1 - mu)), and
        the primal step is halved until the barrier objective rises (Armijo; the step is an ascent direction of
        it, so this terminates);
      * z is kept within a factor 1e10 of mu / w (so the primal-dual Hessian stays close to the primal one);
      * once the barrier problem is solved to 10 mu, mu <- min(mu / 5, mu^1.5) (superlinear at the end).
    All problems of a batch iterate together, each with its own mu, steps and stopping test.

    A problem has converged when the Frank-Wolfe duality gap (see :func:`mlls_optimality`; it bounds
    L_m(w*) - L_m(w)) is at most ``tol``, every w_y z_y is at most 1e-4 tol min p_s (a coordinate whose multiplier
    z_y exceeds 1e-4 p_s(y) is then within tol of 0), and either the last step moved w by at most ``tol``
    (max-norm) or the KKT residual grad - nu a + z is below 1e-3 tol (which ends problems whose likelihood is flat
    in some direction: there w is not unique, the estimators flag it, and steps along the flat direction are
    rounding noise).
    ``optimality`` in the result is the Frank-Wolfe duality gap at the last iterate.
    """
    P, c, single = _as_batch(probs, mask)
    S, M, k = P.shape
    ps = _prior_batch(source_prior, S, k)
    w = np.ones((S, k)) if init is None else np.maximum(_weights_batch(init, S, k), 1e-3)
    w = w / np.einsum("sk,sk->s", w, ps)[:, None]
    cn = _normalised_mask(P, c)
    comp_tol = 1e-4 * tol * ps.min(axis=1)
    mu = np.full(S, _IPM_MU0)
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap_out = np.full(S, np.inf)
    work = _Work(np.arange(S), P=P, cn=cn, ps=ps, w=w.copy(), z=mu[:, None] / w, nu=np.ones(S), mu=mu,
                 comp_tol=comp_tol, fw=_fw(P, w), P32=P.astype(np.float32))
    idx = np.arange(k)

    def frac_to_boundary(x, dx, frac):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(dx < 0, -x / dx, np.inf)
        return np.minimum(1.0, frac * r.min(axis=1))

    for it in range(1, max_iter + 1):
        Pw, cw, psw, ww, zw, nuw, muw, fw = work.P, work.cn, work.ps, work.w, work.z, work.nu, work.mu, work.fw
        live = work.live
        A = ww.shape[0]
        grad = _gradient(Pw, cw, fw)
        gap = (grad / psw).max(axis=1) - 1.0
        r_stat = grad - nuw[:, None] * psw + zw             # dual residual, 0 at the optimum
        # solve the barrier problem to KAPPA_EPS mu before shrinking mu (possibly several times in a row)
        for _ in range(8):
            err = np.maximum(np.abs(r_stat).max(axis=1), np.abs(ww * zw - muw[:, None]).max(axis=1))
            shrink = live & (err <= _IPM_KAPPA_EPS * muw) & (muw > 0.1 * work.comp_tol)
            if not shrink.any():
                break
            muw = np.where(shrink, np.maximum(0.1 * work.comp_tol,
                                              np.minimum(_IPM_KAPPA_MU * muw, muw ** _IPM_THETA_MU)), muw)
        # Newton step: [H + Z/W, a; a^T, 0] [dw; dnu] = [r_stat + (mu - w z) / w; 1 - a^T w], Jacobi-equilibrated
        K = np.zeros((A, k + 1, k + 1))
        K[:, :k, :k] = _hessian(Pw, cw, fw, work.P32)
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
        dz = (rc - zw * dw) / ww
        # step lengths: fraction to the boundary for w, z and the domain f_i^T w > 0 (linear in w)
        frac = np.maximum(0.99, 1.0 - muw)
        ap = frac_to_boundary(ww, dw, frac)
        ad = frac_to_boundary(zw, dz, frac)
        dfw = _fw(Pw, dw)
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
        ids = work.ids[live]
        w[ids] = wn[live]
        iters[ids] = it
        gap_out[ids] = gap[live]
        conv[work.ids[finished]] = True
        work.live = live & ~finished
        if not work.live.any():
            break
        work.maybe_compact()
    return _unbatch(SolverResult(w, conv, iters, gap_out), single)
