"""The regions part of the label-shift test: the region counts, the likelihood-ratio form (null fit, p-value from the
parametric bootstrap or chi^2) and the Wald form (D^T Sigma^+ D at the MLLS weights, with the delta-method
covariance), and the evidence per region and per predicted class (``docs/label_shift_test.md``, "The statistic
and its null distribution")."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.linalg import null_space
from scipy.stats import chi2

from ... import rows as _rows
from ...errors import InputError
from ...estimation.solvers import PIN_TOL, mlls_newton
from .holdout import PreparedHoldout
from .holdout_noise import class_inflation
from .inputs import TestInputs
from .null_fit import DENSE_MAX_CLASSES, bootstrap_null, fit_under_null
from ...partitions import is_partitioned
from .regions import assign_rows, make_regions, region_counts_of, region_name, Regions
from .result import Region
from .sequential import DRAW_BATCH, sequential_p_value
from .sparse_null import CLASS_Z_BLOCK_CLASSES, class_block_z, own_regions, sparse_bootstrap_null, sparse_null_fit
# eigenvalues of the (sum-zero) covariance below this fraction of the largest are treated as zero
_EIG_REL = 1e-10
# q_y at or below this counts as pinned at 0 in the null fit (one more degree of freedom)
_Q_TOL = 1e-6

# pseudo-count (spread over the regions by their pooled holdout frequency) in the holdout variance of each class
_SMOOTH = 1.0


def _tangent_inverse(H: np.ndarray, p: np.ndarray, free: np.ndarray) -> np.ndarray:
    """K = Z (Z^T H_FF Z)^{-1} Z^T on the free coordinates F (0 elsewhere), Z an orthonormal basis of
    {d_F : p_F^T d_F = 0}: the linearisation of the MLLS estimating equations (see docs/label_shift_test.md)."""
    k = H.shape[0]
    K = np.zeros((k, k))
    idx = np.flatnonzero(free)
    if idx.size < 2:
        return K
    Z = null_space(p[idx][None, :])
    A = Z.T @ H[np.ix_(idx, idx)] @ Z
    lam, V = np.linalg.eigh(0.5 * (A + A.T))
    lam = np.maximum(lam, max(1e-14 * float(lam.max()), 1e-300))
    B = Z @ V
    K[np.ix_(idx, idx)] = (B / lam) @ B.T
    return K


def _holdout_cov(N: np.ndarray, pi, q: np.ndarray) -> np.ndarray:
    """Covariance of sum_y q_y pi_hat_y from the holdout's class-conditional region frequencies: sum_y q_y^2
    (diag(pi_y) - pi_y pi_y^T) / n_y, with pi the given (null-fitted) frequencies, or when None the holdout's own
    with a pseudo-count _SMOOTH spread by the pooled frequencies (a region where class y was never seen still gets
    a variance)."""
    k, J = N.shape
    n_y = N.sum(axis=1)
    if pi is None:
        pooled = N.sum(axis=0) / n_y.sum()
        pi = (N + _SMOOTH * pooled[None, :]) / (n_y[:, None] + _SMOOTH)
    if k > DENSE_MAX_CLASSES:            # the same sum as one product: k J^2 work instead of k passes over J x J
        a = q ** 2 / n_y
        return np.diag(a @ pi) - (pi.T * a) @ pi
    out = np.zeros((J, J))
    for c in range(k):
        out += (q[c] ** 2 / n_y[c]) * (np.diag(pi[c]) - np.outer(pi[c], pi[c]))
    return out


class WaldRowSums(NamedTuple):
    """Unnormalised row sums of the Wald form's target covariance over some rows, psi_i = f_i / f_i^T w: H = sum_i
    psi_i psi_i^T (k, k), psi = sum_i psi_i (k,), R (J, k): sum of psi_i over the rows of each region."""
    H: np.ndarray
    psi: np.ndarray
    R: np.ndarray


def wald_row_sums(P: np.ndarray, w: np.ndarray, bt: np.ndarray, J: int) -> WaldRowSums:
    """:class:`WaldRowSums` of the (m, k) rows P whose regions are bt (m,), in row blocks with float64 sums."""
    m, k = P.shape
    H, psi_sum, R = np.zeros((k, k)), np.zeros(k), np.zeros((J, k))
    with _rows.pass_threads(k):
        for sl in _rows.blocks(m, width=k):
            B = P[sl].astype(np.float64)
            psi = B / (B @ w)[:, None]
            H += psi.T @ psi
            psi_sum += psi.sum(axis=0)
            for c in range(k):
                R[:, c] += np.bincount(bt[sl], weights=psi[:, c], minlength=J)
    return WaldRowSums(H, psi_sum, R)


def partition_wald_sums(B: np.ndarray, regions: Regions, w: np.ndarray) -> WaldRowSums:
    """:func:`wald_row_sums` of one partition B, its rows' regions assigned where it lives (the per-partition
    function of the Wald form on rows in partitions)."""
    return wald_row_sums(B, w, assign_rows(regions, B), regions.n_regions)


def wald_target_sums(P, w, bt, regions: Regions) -> WaldRowSums:
    """The Wald form's row sums over the target: a large array's in row blocks, or each partition's added in
    partition order (``bt`` is then None: the regions are assigned in the partitions)."""
    if not is_partitioned(P):
        return wald_row_sums(P, w, bt, regions.n_regions)
    parts = P.single().run(partition_wald_sums, regions, w)
    H, psi, R = np.zeros_like(parts[0].H), np.zeros_like(parts[0].psi), np.zeros_like(parts[0].R)
    for part in parts:
        H += part.H
        psi += part.psi
        R += part.R
    return WaldRowSums(H, psi, R)


def _wald_target_cov(P, w, p, bt, pi, observed, regions: Regions) -> np.ndarray:
    """Per-row covariance of the target part of D for the Wald form: IF_i = e_{r_i} - A K psi_i, A = G diag(p_s),
    psi_i = f_i / f_i^T w, K the tangent inverse of the MLLS information (docs/label_shift_test.md). ``bt``: the
    target rows' regions (None for rows in partitions, which assign their own)."""
    m, k = P.shape
    J = regions.n_regions
    if _rows.is_large(P):                    # in row blocks (or partitions), float64 sums
        sums = wald_target_sums(P, w, bt, regions)
        H, psi_bar, R = sums.H / m, sums.psi / m, sums.R
    else:
        psi = P / (P @ w)[:, None]
        H = psi.T @ psi / m
        psi_bar = psi.mean(axis=0)
        R = np.zeros((J, k))
        for c in range(k):
            R[:, c] = np.bincount(bt, weights=psi[:, c], minlength=J)
    K = _tangent_inverse(H, p, w > PIN_TOL)
    R /= m
    cov_e = np.diag(observed) - np.outer(observed, observed)
    cross = (R - np.outer(observed, psi_bar)) @ ((pi.T * p[None, :]) @ K).T
    AK = (pi.T * p[None, :]) @ K
    return cov_e - cross - cross.T + AK @ (H - np.outer(psi_bar, psi_bar)) @ AK.T


def _wald(D: np.ndarray, sigma: np.ndarray) -> tuple[float, int]:
    """D^T Sigma^+ D in the sum-zero subspace (the regions partition the simplex) and the rank."""
    J = D.shape[0]
    U = null_space(np.ones((1, J)))
    C = U.T @ sigma @ U
    lam, V = np.linalg.eigh(0.5 * (C + C.T))
    keep = lam > max(float(lam.max()), 0.0) * _EIG_REL
    proj = V[:, keep].T @ (U.T @ D)
    return float(np.sum(proj ** 2 / lam[keep])), int(keep.sum())


class RegionCounts(NamedTuple):
    """The regions of the output simplex and the rows in each: holdout N (k, J) by class, target T (J,)."""
    regions: Regions
    N: np.ndarray
    T: np.ndarray
    observed: np.ndarray        # (J,) target fraction per region
    target_regions: np.ndarray | None  # (m,) each target row's region; None for rows in partitions


class RegionsFit(NamedTuple):
    """The regions part of the test: statistic, dof, p-value, the weights and prior q under H0, the histograms pi,
    the expected fractions, observed - expected (D) and its covariance."""
    stat: float
    dof: int
    p_value: float
    w: np.ndarray
    q: np.ndarray
    pi: np.ndarray
    expected: np.ndarray
    D: np.ndarray
    sigma: np.ndarray
    extra: dict


def region_counts(inp: TestInputs, prepared: PreparedHoldout | None = None) -> RegionCounts:
    """The regions made from the holdout (or ``prepared``'s) and the holdout (by class) and target rows in each;
    InputError when they leave the test no degrees of freedom."""
    n, k = inp.Ph.shape
    regions = (make_regions(inp.Ph, inp.min_region_rows, inp.max_confidence_bins) if prepared is None
               else prepared.regions)
    J = regions.n_regions
    if J < k + 2:
        raise InputError(f"the holdout gives only {J} regions of the output simplex (at least {inp.min_region_rows} "
                         f"holdout rows per region), fewer than k + 2 = {k + 2}: the test has no degrees of freedom "
                         f"left after estimating the {k} class weights. Collect a larger labelled holdout (n = {n} "
                         "now; the size is measured from n = 500 at k = 10), or lower min_region_rows.")
    partitioned = is_partitioned(inp.Pt)                # their regions are counted where they live
    target_regions = None if partitioned else assign_rows(regions, inp.Pt)
    if prepared is None:
        N = np.zeros((k, J))
        np.add.at(N, (inp.y, regions.assign(inp.Ph)), 1.0)
    else:
        N = prepared.N.copy()
    T = (region_counts_of(regions, inp.Pt) if partitioned
         else np.bincount(target_regions, minlength=J).astype(np.float64))
    return RegionCounts(regions=regions, N=N, T=T, observed=T / inp.Pt.shape[0], target_regions=target_regions)


def likelihood_ratio_fit(inp: TestInputs, rc: RegionCounts, calibration: str) -> RegionsFit:
    """The likelihood-ratio form: the null fit by EM (dense, or on a restricted support above DENSE_MAX_CLASSES),
    its p-value from the parametric bootstrap or chi^2, and the evidence per region."""
    k, J = rc.N.shape
    m, p, n_y, N = inp.Pt.shape[0], inp.p, inp.n_y, rc.N
    q0 = p if inp.w_given is None else p * inp.w_given
    dense = k <= DENSE_MAX_CLASSES
    region_group = np.array([b[0] for b in rc.regions.bounds])
    own = None if dense else own_regions(rc.regions.group, region_group)
    pi, q, stat, iters = fit_under_null(N, rc.T, q0) if dense else sparse_null_fit(N, rc.T, q0, own, region_group)
    free = q > _Q_TOL
    dof = J - int(free.sum())
    # evidence: the holdout's own histograms reweighted by the null fit's q (what "the holdout reweighted by
    # w" predicts), against the target; sd from both samples' multinomial variances
    expected = q @ (N / n_y[:, None])
    sigma = (np.diag(expected) - np.outer(expected, expected)) / m + _holdout_cov(N, None, q)
    p_chi2 = float(chi2.sf(stat, dof))
    extra = {"em_iterations": iters, "calibration": calibration, "p_value_chi2": p_chi2}
    if calibration == "bootstrap":
        draws, seed = inp.bootstrap_draws, inp.seed
        kappa = class_inflation(inp.holdout_inflation, n_y, m, q)
        batches = (bootstrap_null(pi, q, n_y, m, draws, seed, DRAW_BATCH, kappa) if dense
                   else sparse_bootstrap_null(pi, q, n_y, m, draws, seed, own, region_group, DRAW_BATCH,
                                              inflation=kappa))
        p_value, exceed, used = sequential_p_value(stat, batches, draws)
        if exceed == 0:
            # beyond every draw: the bootstrap resolves no p-value below 1/(B+1), so a level below that could
            # never reject; there the chi^2 tail (conservative under the null, as measured) says how far out
            p_value = min(p_value, p_chi2)
        extra.update(bootstrap_draws=draws, seed=seed, bootstrap_draws_used=used,
                     holdout_inflation=kappa.tolist())
    else:
        p_value = p_chi2
    return RegionsFit(stat=stat, dof=dof, p_value=p_value, w=q / p, q=q, pi=pi, expected=expected,
                       D=rc.observed - expected, sigma=sigma, extra=extra)


def wald_fit(inp: TestInputs, rc: RegionCounts) -> RegionsFit:
    """The Wald form: D = observed - expected at the MLLS weights, D^T Sigma^+ D against chi^2."""
    Pt, p, m = inp.Pt, inp.p, inp.Pt.shape[0]
    w = inp.w_given if inp.w_given is not None else np.maximum(mlls_newton(Pt, p).weights, 0.0)
    q = p * w
    pi = rc.N / inp.n_y[:, None]
    expected = q @ pi
    D = rc.observed - expected
    target_cov = _wald_target_cov(Pt, w, p, rc.target_regions, pi, rc.observed, rc.regions)
    sigma = target_cov / m + _holdout_cov(rc.N, None, q)
    stat, dof = _wald(D, sigma)
    p_value = float(chi2.sf(stat, dof)) if dof > 0 else 1.0
    return RegionsFit(stat=stat, dof=dof, p_value=p_value, w=w, q=q, pi=pi, expected=expected, D=D, sigma=sigma,
                       extra={})


def region_evidence(rc: RegionCounts, fit: RegionsFit, class_names) -> tuple:
    """The regions as :class:`Region` items with their z_R = D_R / sd_R, largest |z| first."""
    z = fit.D / np.sqrt(np.maximum(np.diag(fit.sigma), 1e-300))
    holdout_rows = rc.N.sum(axis=0).astype(int)
    items = []
    for r, (g, lo, hi) in enumerate(rc.regions.bounds):
        mem = tuple(rc.regions.members[g])
        items.append(Region(name=region_name(mem, lo, hi, class_names), predicted_classes=mem,
                            confidence_low=lo, confidence_high=hi, observed=float(rc.observed[r]),
                            expected=float(fit.expected[r]), z=float(z[r]), holdout_rows=int(holdout_rows[r])))
    items.sort(key=lambda it: -abs(it.z))
    return tuple(items)


def class_z_scores(regions: Regions, fit: RegionsFit, k: int) -> np.ndarray:
    """(k,) z of each predicted class's regions together (nan for a pooled class)."""
    if k > CLASS_Z_BLOCK_CLASSES:        # from sigma's diagonal blocks (sparse_null.class_block_z)
        owner = np.array([b[0] for b in regions.bounds])
        return class_block_z(owner, regions.members, fit.D, fit.sigma, k)
    class_z = np.full(k, np.nan)
    for g, mem in enumerate(regions.members):
        if len(mem) != 1:
            continue
        a = np.zeros(regions.n_regions)
        a[[r for r, b in enumerate(regions.bounds) if b[0] == g]] = 1.0
        v = float(a @ fit.sigma @ a)
        class_z[mem[0]] = float(a @ fit.D) / math.sqrt(v) if v > 0 else np.nan
    return class_z
