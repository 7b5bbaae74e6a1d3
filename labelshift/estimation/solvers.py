"""Functional core of the label-shift estimators: small, pure, batched numpy functions.

The estimator classes in :mod:`labelshift.estimation.estimators` compose these; the functions here do no input
validation beyond shapes (the classes validate at the public boundary) and never mutate their arguments.

Conventions
-----------
* ``probs`` is one set of probability vectors, shape (m, k), or a padded batch, shape (S, M, k).
* ``mask`` holds non-negative row weights of shape (m,) or (S, M): 1 for a real row, 0 for padding. Integer
  counts are allowed too (a row standing for several identical examples), which is how MLLS-CM and binned MLLS
  solve on the k (or k * n_bins) distinct calibrated rows instead of all m rows. ``None`` means all ones.
* Weights w(y) = p_t(y) / p_s(y); the source prior p_s is a (k,) vector (or (S, k)).
* Functions given a single set return unbatched arrays; given a batch they return arrays with a leading S axis.
  Every batched solver runs each problem to its *own* convergence criterion (problems that are done are frozen),
  so a batch gives the same answer as one-at-a-time calls up to floating-point summation order (the MLLS
  solvers: bit for bit, whatever the batch, its order or ``chunk_size``, when the sets have equal sizes).

Speed (MLLS). The iterative MLLS solvers are memory-bound: an EM step reads the data twice. They solve a batch in
cache-sized chunks of problems (:data:`CHUNK_BYTES`), each chunk to convergence, on a (k, M) copy of each set
(long contiguous BLAS operations instead of M dot products of length k). :func:`mlls_newton` reaches the
optimum in a few double-precision Newton iterations from a single-precision SQUAREM-EM warm start.

Contents
--------
Confusion matrices and BBSE (Lipton et al., ICML 2018):
    :func:`confusion_matrix`, :func:`mean_prediction`, :func:`bbse_solve`.
RLLS (Azizzadenesheli et al., ICLR 2019):
    :func:`rlls_rho`, :func:`rlls_solve` (a batched log-barrier interior-point method for the SOCP).
MLLS, eq. (mlls-sample) of Garg et al. (NeurIPS 2020):
    :func:`mlls_objective`, :func:`mlls_gradient`, :func:`mlls_hessian`, :func:`hessian_min_eigenvalue`,
    :func:`restricted_min_eigenvalue`, :func:`mlls_optimality`, :func:`mlls_em` (Saerens et al. 2002, optionally
    SQUAREM-accelerated) and :func:`mlls_newton` (an active-set Newton method from a SQUAREM-EM warm start,
    or a primal-dual interior-point method on W).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import rows as _rows

__all__ = [
    "SolverResult",
    "one_hot_argmax", "confusion_matrix", "mean_prediction", "bbse_solve",
    "rlls_rho", "rlls_objective", "rlls_solve",
    "mlls_objective", "mlls_gradient", "mlls_hessian", "hessian_min_eigenvalue", "restricted_min_eigenvalue",
    "mlls_optimality", "mlls_em", "mlls_newton", "mlls_newton_rows",
    "PIN_TOL", "CHUNK_BYTES",
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
    hessian: :func:`mlls_newton_rows` only (and :func:`mlls_newton` on such a set): :func:`mlls_hessian` at
        ``weights``, which its last pass computed there, when it converged by Newton steps; else None.
    """

    weights: np.ndarray
    converged: np.ndarray
    iterations: np.ndarray
    optimality: np.ndarray
    hessian: np.ndarray | None = None


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
    if _rows.is_large(probs, mask):
        R = _rows.single_set(probs, mask)
        mu = (_rows.column_sums(R) if soft else _rows.argmax_counts(R)) / R.shape[0]
        return mu if np.ndim(probs) == 2 else mu[None]
    P, c, single = _as_batch(probs, mask)
    S, M, k = P.shape
    if soft:
        mu = np.matmul(c[:, None, :], P)[:, 0, :]
    else:   # weighted counts of the argmax predictions (the sums of one-hot rows, without forming them)
        cells = (np.arange(S)[:, None] * k + np.argmax(P, axis=-1)).ravel()
        mu = np.bincount(cells, weights=c.ravel(), minlength=S * k).reshape(S, k)
    mu = mu / c.sum(axis=1)[:, None]
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


def _weighted_inverse(c, fw, power: int = 1):
    """c / fw**power, with 0 where the row weight c is 0. Rows of zero weight (padding, or confusion-matrix rows of
    a class never predicted on the target) may have f_i^T w = 0 once some w_y reach 0; they contribute nothing to
    the objective, so they must contribute 0 (not 0/0 = NaN) to its gradient and Hessian."""
    den = fw if power == 1 else fw ** power
    return np.divide(c, den, out=np.zeros(np.broadcast_shapes(np.shape(c), np.shape(den)), dtype=den.dtype),
                     where=np.broadcast_to(c, np.broadcast_shapes(np.shape(c), np.shape(den))) != 0)


def _gradient(P, cn, fw):
    return np.matmul(_weighted_inverse(cn, fw)[:, None, :], P)[:, 0, :]


def _hessian(P, cn, fw):
    """(1/m) sum_i f_i f_i^T / (f_i^T w)^2 = P^T diag(c / fw^2) P, batched, in float64."""
    return np.matmul((P * _weighted_inverse(cn, fw, 2)[:, :, None]).transpose(0, 2, 1), P)


def _normalised_mask(P, c):
    return c / c.sum(axis=1, keepdims=True)


def mlls_objective(probs, weights, mask=None) -> np.ndarray:
    """The MLLS log-likelihood L_m(w) = (1/m) sum_i log f(x_i)^T w, eq. (mlls-sample); -inf outside its domain."""
    if _rows.is_large(probs, mask):
        val = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1))[0]
        return val if np.ndim(probs) == 2 else np.array([val])
    P, c, single = _as_batch(probs, mask)
    w = _weights_batch(weights, P.shape[0], P.shape[2])
    val = _objective(P, _normalised_mask(P, c), w)
    return val[0] if single else val


def mlls_gradient(probs, weights, mask=None) -> np.ndarray:
    """Gradient of L_m: (1/m) sum_i f_i / (f_i^T w), eq. (proof-gradient) of Garg et al. Batched. One large set
    (:func:`labelshift.rows.is_large`) is summed in row blocks."""
    if _rows.is_large(probs, mask):
        g = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1))[1]
        return g if np.ndim(probs) == 2 else g[None]
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

    One large set (:func:`labelshift.rows.is_large`: over a million rows) is summed in row blocks
    in float64, without a whole-array temporary.
    """
    if _rows.is_large(probs, mask):
        H = _rows.mlls_pass(_rows.single_set(probs, mask), np.asarray(weights, np.float64).reshape(-1),
                            hessian=True)[2]
        return H if np.ndim(probs) == 2 else H[None]
    P, c, single = _as_batch(probs, mask)
    S, M, k = P.shape
    w = _weights_batch(weights, S, k)
    cn = _normalised_mask(P, c)
    H = np.empty((S, k, k))
    for sl in _chunks(S, M, k, None):     # in cache-sized chunks (see CHUNK_BYTES)
        H[sl] = _hessian(P[sl], cn[sl], _fw(P[sl], w[sl]))
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
# MLLS: data layout of the iterative solvers
# ---------------------------------------------------------------------------------------------------------------
#: The iterative MLLS solvers walk a batch in chunks of problems and run each chunk to convergence before starting
#: the next, so that a chunk's data stays in the CPU caches for all its iterations instead of streaming the whole
#: (S, M, k) array from memory every iteration (S = 100 sets of 5000 x 10 float64 rows are 40 MB; one iteration
#: of the whole batch then costs about 3x more per set than one on cached data). This is the target size of a
#: chunk's float64 data, in bytes. Problems are independent, so chunking changes no result.
CHUNK_BYTES = 4 * 2**20

# SQUAREM warm start of mlls_newton: stop refining in single precision once the EM step (max-norm; w has
# p_s-weighted mean 1) is below _WARM_STEP or stalls (float32 gradients carry relative errors of ~1e-6; the
# Newton polish converges from 1e-5 about as fast as from 1e-7, so cycles beyond that are wasted), or after
# _WARM_CYCLES cycles
_WARM_STEP, _WARM_CYCLES = 3e-5, 100
# Newton polish of mlls_newton: iteration budget before a problem is handed to the interior-point method, and
# the relative move of w below which the last Hessian is kept (a chord step: linear convergence at about that rate)
_POLISH_ITER = 30
_CHORD_REL = 1e-3


def _chunks(S: int, M: int, k: int, chunk_size) -> list[slice]:
    if chunk_size is None:
        size = max(1, CHUNK_BYTES // (8 * M * k))
    else:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        size = int(chunk_size)
    return [slice(a, min(a + size, S)) for a in range(0, S, size)]


def _transposed(P, dtype):
    """A contiguous (C, k, M) copy of (C, M, k) rows. The two EM passes, f_i^T w for all i and sum_i r_i f_i, are
    then a length-M axpy per class and k dot products of length M (BLAS-friendly, ~2x faster than M dot products
    of length k on the row layout); in float32 they move half the bytes again."""
    return P.transpose(0, 2, 1).astype(dtype, order="C")


def _hessianT(PT, cn, fw):
    """(1/m) sum_i f_i f_i^T / (f_i^T w)^2 from the transposed layout, formed in PT's precision (float32 for the
    Newton solvers: the Hessian only steers their steps, the solution is fixed by the float64 gradient)."""
    v2 = _weighted_inverse(cn, fw, 2).astype(PT.dtype)
    return np.matmul(PT * v2[:, None, :], PT.transpose(0, 2, 1)).astype(np.float64)


class _Work:
    """Working copies of the per-problem arrays of a batched iterative solver, compacted as problems finish.

    Computing on finished problems wastes work but copying the arrays every time one finishes costs more;
    the arrays are compacted when fewer than ``fraction`` (default 3/4) of their rows are still live.
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

    def maybe_compact(self, fraction: float = 0.75):
        n_live = int(self.live.sum())
        if n_live == 0 or n_live >= fraction * self.live.shape[0]:
            return
        keep = self.live
        self.ids = self.ids[keep]
        self.arrays = {k: v[keep] for k, v in self.arrays.items()}
        self.live = np.ones(self.ids.shape[0], dtype=bool)


class _Outcome:
    """The per-problem results of a chunk solver -- w, converged, iterations, gap -- filled in as its problems run."""

    def __init__(self, w: np.ndarray):
        A = w.shape[0]
        self.w = w
        self.conv = np.zeros(A, dtype=bool)
        self.iters = np.zeros(A, dtype=np.int64)
        self.gap = np.full(A, np.inf)

    def record(self, work: _Work, it: int, w_new, gap, finished, converged=None) -> bool:
        """Store the live problems' iterate ``w_new``, iteration ``it`` and ``gap``; mark ``converged`` (default:
        ``finished``) as converged and retire ``finished``. Returns whether no problem is left live."""
        live = work.live
        ids = work.ids[live]
        self.w[ids] = w_new[live]
        self.iters[ids] = it
        self.gap[ids] = gap[live]
        self.conv[work.ids[finished if converged is None else converged]] = True
        work.live = live & ~finished
        return not work.live.any()

    def result(self):
        return self.w, self.conv, self.iters, self.gap


def _prepare(probs, source_prior, mask, init):
    """Batch arrays of the MLLS solvers: P (S, M, k), normalised row weights (S, M), p_s (S, k), the starting
    point in W (S, k) and whether the input was a single set."""
    P, c, single = _as_batch(probs, mask)
    S, M, k = P.shape
    ps = _prior_batch(source_prior, S, k)
    w = np.ones((S, k)) if init is None else _weights_batch(init, S, k)
    w = w / np.einsum("sk,sk->s", w, ps)[:, None]
    return P, _normalised_mask(P, c), ps, w, single


# ---------------------------------------------------------------------------------------------------------------
# MLLS: EM (Saerens et al. 2002) and its SQUAREM acceleration (Varadhan & Roland 2008)
# ---------------------------------------------------------------------------------------------------------------
def _em_step(PT, c3, ips, ps, x):
    """One EM step for a batch on the transposed layout: PT (A, k, M), row weights c3 (A, 1, M) in PT's precision,
    1 / p_s and p_s (A, k), iterate x (A, k) float64. Returns (x', g, fw): g_y = grad_y / p_s(y) at x (float64),
    x' = x g renormalised onto p_s^T x' = 1 (exact arithmetic keeps it there: x^T grad = 1), and the (A, 1, M)
    values f_i^T x. Two passes over the data: f_i^T x, then sum_i (c_i / f_i^T x) f_i."""
    fw = np.matmul(x.astype(PT.dtype)[:, None, :], PT)
    g = np.matmul(PT, _weighted_inverse(c3, fw).transpose(0, 2, 1))[:, :, 0] * ips
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
    out = _Outcome(w.copy())
    work = _Work(np.arange(A), PT=PT, c3=cn[:, None, :], ips=1.0 / ps, ps=ps, w=w.copy(), d1=np.full(A, np.inf),
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
    """Which live problems of a SQUAREM cycle stop (:func:`_squarem_chunk`'s rules), and whether their EM step is
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


def _squarem_chunk(PT, cn, ps, w, *, tol, max_iter, loose=False):
    """SQUAREM-accelerated EM (Varadhan & Roland 2008, scheme S3, monotone safeguard) on one chunk, from ``w``.

    Passes over the data in PT's precision, iterates in float64. Stops per problem on the EM step (``loose``) or as
    :func:`mlls_em` (Frank-Wolfe gap and geometric tail, per coordinate). Returns (x2, converged, cycles, gap at
    x1). The scheme and the stopping rules are described in ``docs/solvers.md``.
    """
    A = PT.shape[0]
    dt = PT.dtype
    out = _Outcome(w.copy())
    slack = 1e-5 if dt == np.float32 else 1e-13        # rounding of L in the monotonicity test
    c3 = cn.astype(dt)[:, None, :]
    x1, _, fw0 = _em_step(PT, c3, 1.0 / ps, ps, w)
    work = _Work(np.arange(A), PT=PT, c3=c3, ps=ps, ips=1.0 / ps, x0=w.copy(), x1=x1, L0=_chunk_objective(c3, fw0),
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
    P, cn, ps, w, single = _prepare(probs, source_prior, mask, init)
    S, M, k = P.shape
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap = np.full(S, np.inf)
    for sl in _chunks(S, M, k, chunk_size):
        PT = _transposed(P[sl], np.float64)
        if accelerate:
            out = _squarem_chunk(PT, cn[sl], ps[sl], w[sl], tol=tol, max_iter=max_iter)
        else:
            out = _em_chunk(PT, cn[sl], ps[sl], w[sl], tol, max_iter)
        w[sl], conv[sl], iters[sl], gap[sl] = out
    return _unbatch(SolverResult(w, conv, iters, gap), single)


# ---------------------------------------------------------------------------------------------------------------
# MLLS: Newton -- active-set Newton polish of a SQUAREM warm start, and a primal-dual interior-point method
# ---------------------------------------------------------------------------------------------------------------
def _face_newton(H, grad, ps, w, usable):
    """Newton step on the face {w_y = 0 off ``usable``} of W: solves [H_FF, a_F; a_F^T, 0] [d_F; lambda] =
    [grad_F; 1 - a^T w] (a = p_s), Jacobi-equilibrated, for a batch; d = 0 off the face, nan rows if singular."""
    n, k = w.shape
    idx = np.arange(k)
    diag = np.einsum("aii->ai", H)
    dsc = np.where(usable, 1.0 / np.sqrt(np.where(usable, diag, 1.0)), 1.0)
    K = np.zeros((n, k + 1, k + 1))
    ff = usable[:, :, None] & usable[:, None, :]
    K[:, :k, :k] = np.where(ff, H, 0.0) * (dsc[:, :, None] * dsc[:, None, :])
    K[:, idx, idx] = np.where(usable, 1.0 + 1e-13, 1.0)     # 1e-13 keeps a face flat in some direction solvable
    K[:, :k, k] = K[:, k, :k] = np.where(usable, ps * dsc, 0.0)
    rhs = np.empty((n, k + 1))
    rhs[:, :k] = np.where(usable, grad, 0.0) * dsc
    rhs[:, k] = 1.0 - np.einsum("ak,ak->a", ps, w)
    with np.errstate(all="ignore"):
        try:
            sol = np.linalg.solve(K, rhs[..., None])[..., 0]
        except np.linalg.LinAlgError:
            return np.full((n, k), np.nan)
    return np.where(usable, sol[:, :k] * dsc, 0.0)


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
        H = _hessianT(a_["PT32"], cw[:, 0], fws[:, 0])
    elif moved.any():
        rows = np.flatnonzero(moved)
        H[rows] = _hessianT(a_["PT32"][rows], cw[rows, 0], fws[rows, 0])
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
        d[rows] = _face_newton(H[rows], grad[rows], psw[rows], ww[rows], face[rows])
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
    out = _Outcome(w.copy())
    cmin = np.where(cn > 0, cn, np.inf).min(axis=1)
    work = _Work(np.arange(A), PT=PT, c3=cn[:, None, :], ps=ps, PT32=PT32, w=w.copy(), w0=w.copy(), free=w > 0,
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
        d = _face_newton(H, grad, psw, ww, face)
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
    H = _hessianT(PT32, cw, fw)
    if not np.all(np.isfinite(H)):                      # row scales beyond float32: use float64
        H = _hessian(Pw, cw, fw)
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
    return ap, ad, dfw


def _ipm_chunk(P, cn, ps, PT32, w, tol, max_iter):
    """The primal-dual interior-point method of :func:`mlls_newton` (``method="ipm"``) on one chunk."""
    A, M, k = P.shape
    comp_tol = 1e-4 * tol * ps.min(axis=1)
    mu = np.full(A, _IPM_MU0)
    out = _Outcome(w)
    work = _Work(np.arange(A), P=P, cn=cn, ps=ps, w=w.copy(), z=mu[:, None] / w, nu=np.ones(A), mu=mu,
                 comp_tol=comp_tol, fw=_fw(P, w), PT32=PT32)
    for it in range(1, max_iter + 1):
        Pw, cw, psw, ww, zw, nuw, muw, fw = work.P, work.cn, work.ps, work.w, work.z, work.nu, work.mu, work.fw
        live = work.live
        grad = _gradient(Pw, cw, fw)
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
    P, cn, ps, w, single = _prepare(probs, source_prior, mask, init)
    S, M, k = P.shape
    w_ipm = np.maximum(w, 1e-3)                 # the interior-point method starts strictly inside W
    w_ipm /= np.einsum("sk,sk->s", w_ipm, ps)[:, None]
    conv = np.zeros(S, dtype=bool)
    iters = np.zeros(S, dtype=np.int64)
    gap = np.full(S, np.inf)
    for sl in _chunks(S, M, k, chunk_size):
        Pc, cc, pc = P[sl], cn[sl], ps[sl]
        if method == "ipm":
            PT32 = _transposed(Pc, np.float32)
            w[sl], conv[sl], iters[sl], gap[sl] = _ipm_chunk(Pc, cc, pc, PT32, w_ipm[sl], tol, max_iter)
            continue
        PT = _transposed(Pc, np.float64)
        PT32 = PT.astype(np.float32)
        wc, _, it1, _ = _squarem_chunk(PT32, cc, pc, w[sl], tol=_WARM_STEP, max_iter=_WARM_CYCLES, loose=True)
        wc, cv, it2, gp, failed = _polish_chunk(PT, cc, pc, PT32, wc, tol, min(_POLISH_ITER, max_iter))
        it = it1 + it2
        if failed.any():
            rows = np.flatnonzero(failed)
            out = _ipm_chunk(Pc[rows], cc[rows], pc[rows], PT32[rows], w_ipm[sl][rows], tol, max_iter)
            wc[rows], cv[rows], gp[rows] = out[0], out[1], out[3]
            it[rows] += out[2]
        w[sl], conv[sl], iters[sl], gap[sl] = wc, cv, it, gp
    return _unbatch(SolverResult(w, conv, iters, gap), single)


# ---------------------------------------------------------------------------------------------------------------
# MLLS for one large set, in passes over row blocks
# ---------------------------------------------------------------------------------------------------------------
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
    over row blocks (:mod:`labelshift.rows`); what :func:`mlls_newton` runs for such a set.

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
    P = np.asarray(probs)
    if P.dtype not in (np.float32, np.float64):
        P = P.astype(np.float64)
    m, k = P.shape
    ps = np.asarray(source_prior, dtype=np.float64).reshape(k)
    w = np.ones(k) if init is None else np.asarray(init, dtype=np.float64).reshape(k).copy()
    w = w / float(w @ ps)
    w, passes = _squarem_rows(P, ps, w, step_tol=_WARM_STEP, max_cycles=_WARM_CYCLES)
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
        d = _face_newton(H[None], grad[None], ps[None], w[None], face[None])[0]
        changed = False
        if it == 1:
            for _ in range(3):
                drop = face & (w + d <= 0.0) & (g < 1.0 - 1e-3)
                if not drop.any():
                    break
                face &= ~drop
                d = _face_newton(H[None], grad[None], ps[None], w[None], face[None])[0]
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
