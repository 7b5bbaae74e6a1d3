"""The paper-style figures: axes scales, twin axis of the bins figure, PNG output."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from labelshift.experiments.plots import plot_sweep
from labelshift.figures import figure_png


def _sweep(kind, values, methods, eig=None):
    V, M = len(values), len(methods)
    mse = np.linspace(0.5, 0.01, V)[:, None] * np.arange(1, M + 1)[None, :]
    return SimpleNamespace(kind=kind, values=np.asarray(values, float), methods=list(methods), mse_mean=mse,
                           mse_se=mse / 10, min_eigenvalue_mean=np.full((V, M), np.nan) if eig is None else eig)


def test_shift_figure_linear_axes_one_line_per_method():
    fig = plot_sweep(_sweep("shift", [0.1, 0.3, 0.5], ["BBSE-hard", "MLLS"]))
    (ax,) = fig.axes
    assert ax.get_xscale() == "linear" and ax.get_yscale() == "linear"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["BBSE-hard", "MLLS"]


def test_size_figure_is_log_log():
    fig = plot_sweep(_sweep("size", [100, 1000, 10000], ["MLLS"]))
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


def test_bins_figure_has_eigenvalue_on_a_twin_axis_only_for_mlls_methods():
    eig = np.array([[0.1, np.nan], [0.2, np.nan]])
    fig = plot_sweep(_sweep("bins", [2, 4], ["MLLS-binned", "BBSE-hard"], eig=eig))
    left, right = fig.axes
    assert len(left.get_lines()) == 2                # MSE of both methods
    assert len(right.get_lines()) == 1               # eigenvalue of MLLS-binned only (BBSE has none)
    assert np.allclose(right.get_lines()[0].get_ydata(), [0.1, 0.2])


def test_png_bytes_and_unknown_kind():
    png = figure_png(plot_sweep(_sweep("shift", [0.2, 0.4], ["MLLS"])))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no figure for sweeps of kind 'gamma'"):
        plot_sweep(_sweep("gamma", [1.0], ["MLLS"]))
    # the Dirichlet alpha of the image experiments is drawn on a log axis, as in the paper
    assert plot_sweep(_sweep("alpha", [0.1, 1.0], ["MLLS"]), "mnist-5k").axes[0].get_xscale() == "log"
