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

Contents, by module
-------------------
The batch conventions, :class:`SolverResult` and the chunking (:mod:`.batch`); the data layout of the iterative
MLLS solvers (:mod:`.layout`).
Confusion matrices and BBSE (Lipton et al., ICML 2018), :mod:`.bbse`:
    :func:`one_hot_argmax`, :func:`confusion_matrix`, :func:`mean_prediction`, :func:`bbse_solve`.
RLLS (Azizzadenesheli et al., ICLR 2019), :mod:`.rlls`:
    :func:`rlls_rho`, :func:`rlls_solve` (a batched log-barrier interior-point method for the SOCP).
MLLS, eq. (mlls-sample) of Garg et al. (NeurIPS 2020):
    :mod:`.mlls_objective` -- :func:`mlls_objective`, :func:`mlls_gradient`, :func:`mlls_hessian`,
    :func:`hessian_min_eigenvalue`, :func:`restricted_min_eigenvalue`, :func:`mlls_optimality`, :data:`PIN_TOL`;
    :mod:`.em` -- :func:`mlls_em` (Saerens et al. 2002, optionally SQUAREM-accelerated);
    :mod:`.newton` -- :func:`mlls_newton` (an active-set Newton method from a SQUAREM-EM warm start, its step on a
    face of W in :mod:`.face_newton`; or a primal-dual interior-point method on W, :mod:`.interior_point`);
    :mod:`.row_blocks` -- :func:`mlls_newton_rows`, the same for one large set in passes over row blocks.
"""
from __future__ import annotations

from .batch import CHUNK_BYTES, SolverResult
from .bbse import bbse_solve, confusion_matrix, mean_prediction, one_hot_argmax
from .em import mlls_em
from .mlls_objective import (PIN_TOL, hessian_min_eigenvalue, mlls_gradient, mlls_hessian, mlls_objective,
                             mlls_optimality, restricted_min_eigenvalue)
from .newton import mlls_newton
from .rlls import rlls_objective, rlls_rho, rlls_solve
from .row_blocks import mlls_newton_rows

__all__ = [
    "SolverResult",
    "one_hot_argmax", "confusion_matrix", "mean_prediction", "bbse_solve",
    "rlls_rho", "rlls_objective", "rlls_solve",
    "mlls_objective", "mlls_gradient", "mlls_hessian", "hessian_min_eigenvalue", "restricted_min_eigenvalue",
    "mlls_optimality", "mlls_em", "mlls_newton", "mlls_newton_rows",
    "PIN_TOL", "CHUNK_BYTES",
]
