"""The Newton step on a face of W = {w >= 0, p_s^T w = 1}, shared by the batched Newton polish (:mod:`.newton`)
and the row-block solver (:mod:`.row_blocks`)."""
from __future__ import annotations

import numpy as np


def newton_on_face(H, grad, ps, w, usable):
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
