"""A deployed model's raw scores on rows of its inputs, as the ``reestimate`` flow and the corrected model compute
them: a PyTorch model's logits (:func:`forward`), a scikit-learn or pyfunc model's scores (:func:`model_scores`)."""
from __future__ import annotations

import numpy as np

from labelshift.errors import InputError

__all__ = ["forward", "model_scores"]


def forward(model, x: np.ndarray, batch_size: int) -> np.ndarray:
    """A PyTorch model's raw outputs (logits) on the rows of ``x``, ``batch_size`` rows per forward pass without
    gradients, as one float64 (n, k) array."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            out.append(model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch_size]))).float().numpy())
    return np.concatenate(out).astype(np.float64)


def model_scores(bundle, x: np.ndarray) -> np.ndarray:
    """The raw scores, one per class, of a scikit-learn or pyfunc model on the rows of ``x``: ``bundle`` gives the
    ``mode`` ("sklearn" or "pyfunc"), the ``model``, its ``output_method`` (scikit-learn), its ``input_columns`` (rows
    passed as a DataFrame when set), its ``uri`` and ``n_classes``. Returns a float64 (n, k) array; raises
    InputError when the model does not return one score per class."""
    if bundle.mode == "sklearn":
        if bundle.input_columns:
            import pandas as pd

            x = pd.DataFrame(x, columns=list(bundle.input_columns))
        out = getattr(bundle.model, bundle.output_method)(x)
    else:
        import pandas as pd

        out = bundle.model.predict(pd.DataFrame(x, columns=list(bundle.input_columns)) if bundle.input_columns
                                   else x)
    out = np.asarray(out, dtype=np.float64)
    if out.ndim != 2 or out.shape[1] != bundle.n_classes:
        raise InputError(f"{bundle.uri} returned outputs of shape {out.shape}, not one score per class "
                         f"({bundle.n_classes}); a pyfunc model must return an (n, k) array of scores.")
    return out
