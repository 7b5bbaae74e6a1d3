"""Figures of the paper's Section 6 from a sweep's summaries (matplotlib, drawn off-screen).

* :func:`plot_mse_vs_shift` -- weight MSE against p_t(y=1), one line per method (Figure 1, top row; linear axes);
* :func:`plot_mse_vs_size` -- weight MSE against the target size m, log-log (Figure 1, bottom row);
* :func:`plot_mse_vs_alpha` -- weight MSE against the Dirichlet alpha of the image experiments, log x axis
  (Figure 1 b, c);
* :func:`plot_mse_vs_bins` -- MSE (left axis) and minimum eigenvalue of the negated MLLS Hessian (right axis)
  against the number of bins (Figure 2; linear axes).

Shaded bands are +-1 standard error of the mean over seeds.

Each function takes a :class:`~labelshift.experiments.sweep.SweepResult` (anything with ``kind``, ``values``,
``methods``, ``mse_mean``, ``mse_se`` and ``min_eigenvalue_mean``) and returns a ``matplotlib.figure.Figure``
built without pyplot, so drawing is thread-safe and never needs a display. :func:`labelshift.figures.figure_png`
renders it to PNG bytes; the re-estimation's figures are in :mod:`labelshift.figures`.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..figures import FIGSIZE

__all__ = ["METHOD_STYLE", "plot_sweep", "plot_mse_vs_shift", "plot_mse_vs_size", "plot_mse_vs_bins",
           "plot_mse_vs_alpha", "FIGURE_NAMES"]

#: one colour and marker per method, the same in every figure
METHOD_STYLE: dict[str, dict] = {
    "BBSE-hard": dict(color="tab:blue", marker="o"),
    "BBSE-soft": dict(color="tab:cyan", marker="v"),
    "RLLS": dict(color="tab:green", marker="s"),
    "RLLS-soft": dict(color="tab:olive", marker="P"),
    "MLLS-CM": dict(color="tab:orange", marker="^"),
    "MLLS": dict(color="tab:red", marker="D"),
    "MLLS-binned": dict(color="tab:purple", marker="D"),
    "PCC": dict(color="tab:gray", marker="x"),
    "MLLS-uncal": dict(color="tab:brown", marker="d", linestyle=":"),
}

#: file name of each sweep's figure
FIGURE_NAMES = {"shift": "mse_vs_shift.png", "size": "mse_vs_size.png", "bins": "mse_vs_bins.png",
                "alpha": "mse_vs_alpha.png"}

#: fixed margins (fractions of the figure) sized for these labels: a layout engine would cost an extra draw
_MARGINS = dict(left=0.16, right=0.97, bottom=0.13, top=0.92)
#: right margin when a second y axis carries its own label (the bins figure)
_TWIN_RIGHT = 0.84


#: line style per calibration of an ``<estimator>@<calibration>`` method (its colour and marker are the estimator's)
CALIBRATION_LINESTYLE = {"none": ":", "TS": (0, (5, 2)), "BCTS": "-", "VS": "-.", "NBVS": (0, (1, 1))}


#: methods that run on the raw softmax under their plain name (drawn as calibration "none" beside a grid)
_RAW_PLAIN = frozenset({"BBSE-hard", "BBSE-soft", "RLLS", "RLLS-soft", "MLLS-CM", "PCC"})


def _style(method: str, i: int, grid: bool = False) -> dict:
    """Colour, marker and line style of a method; ``<estimator>@<calibration>`` takes the estimator's colour and
    marker and its calibration's line style, and with ``grid`` (such methods in the figure) the plain names of
    methods on the raw softmax get the line style of "none"."""
    fallback = dict(color=f"C{i % 10}", marker="o")
    estimator, _, calibration = method.partition("@")
    if calibration and estimator in METHOD_STYLE:
        return dict(METHOD_STYLE[estimator], linestyle=CALIBRATION_LINESTYLE.get(calibration, "-"))
    style = dict(METHOD_STYLE.get(method, fallback))
    if grid and method in _RAW_PLAIN:
        style["linestyle"] = CALIBRATION_LINESTYLE["none"]
    return style


#: methods in a figure above which the legend moves to the right of the axes (a calibration x estimator grid)
LEGEND_OUTSIDE = 8
_LEGEND_WIDTH = 1.7     # inches added to the figure for a legend on the right


def _legend(ax, n_methods: int) -> None:
    """The legend: inside the axes, or for more than :data:`LEGEND_OUTSIDE` methods on the right of them (the
    figure widened so the axes keep their size)."""
    if n_methods <= LEGEND_OUTSIDE:
        ax.legend(fontsize=8, frameon=False)
        return
    fig = ax.figure
    width, height = fig.get_size_inches()
    scale = width / (width + _LEGEND_WIDTH)
    fig.set_size_inches(width + _LEGEND_WIDTH, height)
    fig.subplots_adjust(left=_MARGINS["left"] * scale, right=_MARGINS["right"] * scale)
    ax.legend(fontsize=6.5, frameon=False, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _new_axes(title: str):
    fig = Figure(figsize=FIGSIZE, dpi=120)
    fig.subplots_adjust(**_MARGINS)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _mse_lines(ax, sweep, *, log_y: bool) -> None:
    """One line per method with a band of +-1 standard error over seeds."""
    x = np.asarray(sweep.values, dtype=float)
    grid = any("@" in m for m in sweep.methods)
    for j, method in enumerate(sweep.methods):
        mean = np.asarray(sweep.mse_mean)[:, j]
        se = np.nan_to_num(np.asarray(sweep.mse_se)[:, j], nan=0.0)
        st = _style(method, j, grid)
        ax.plot(x, mean, label=method, markersize=4, linewidth=1.5, **st)
        lo = mean - se
        if log_y:   # a band reaching 0 or below cannot be drawn on a log axis; clip it to a tenth of the mean
            lo = np.maximum(lo, mean / 10)
        ax.fill_between(x, lo, mean + se, color=st["color"], alpha=0.15, linewidth=0)


def _title(dataset: str | None) -> str:
    return "Two Gaussians" if dataset in (None, "gaussian") else dataset


def plot_mse_vs_shift(sweep, dataset: str | None = None) -> Figure:
    """Weight MSE against the target proportion p_t(y=1) (source balanced), as in Figure 1 (top) of the paper."""
    fig, ax = _new_axes(f"{_title(dataset)}: MSE vs shift")
    _mse_lines(ax, sweep, log_y=False)
    ax.set_xlabel(r"target label marginal $p_t(y=1)$")
    ax.set_ylabel("MSE of estimated weights")
    _legend(ax, len(sweep.methods))
    return fig


def plot_mse_vs_alpha(sweep, dataset: str | None = None) -> Figure:
    """Weight MSE against the Dirichlet concentration alpha (log x axis; small alpha = severe shift), as in
    Figure 1 (top, MNIST and CIFAR-10) of the paper."""
    fig, ax = _new_axes(f"{_title(dataset)}: MSE vs Dirichlet shift")
    _mse_lines(ax, sweep, log_y=False)
    ax.set_xscale("log")
    ax.set_xlabel(r"Dirichlet shift parameter $\alpha$ (log)")
    ax.set_ylabel("MSE of estimated weights")
    _legend(ax, len(sweep.methods))
    return fig


def plot_mse_vs_size(sweep, dataset: str | None = None) -> Figure:
    """Weight MSE against the target sample size m on log-log axes, as in Figure 1 (bottom) of the paper."""
    fig, ax = _new_axes(f"{_title(dataset)}: MSE vs target size")
    _mse_lines(ax, sweep, log_y=True)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("target sample size $m$")
    ax.set_ylabel("MSE of estimated weights (log)")
    _legend(ax, len(sweep.methods))
    return fig


def plot_mse_vs_bins(sweep, dataset: str | None = None) -> Figure:
    """MSE (left axis, solid) and the minimum eigenvalue of the negated MLLS Hessian (right axis, dashed) against
    the number of bins the predictor is aggregated over, as in Figure 2 of the paper. Methods whose
    eigenvalue is undefined (not MLLS) get no dashed line."""
    fig, ax = _new_axes(f"{_title(dataset)}: MSE and curvature vs bins")
    _mse_lines(ax, sweep, log_y=False)
    ax.set_xlabel("number of bins")
    ax.set_ylabel("MSE of estimated weights (solid)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.subplots_adjust(right=_TWIN_RIGHT)
    right = ax.twinx()
    x = np.asarray(sweep.values, dtype=float)
    eig = np.asarray(sweep.min_eigenvalue_mean, dtype=float)
    for j, method in enumerate(sweep.methods):
        if np.all(np.isnan(eig[:, j])):
            continue
        st = _style(method, j)
        right.plot(x, eig[:, j], linestyle="--", linewidth=1.2, markersize=3, label=f"{method} min eig.",
                   **st)
    right.set_ylabel(r"min. eigenvalue of $-\nabla^2 L$ (dashed)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, frameon=False, loc="best")
    return fig


def plot_sweep(sweep, dataset: str | None = None) -> Figure:
    """The paper's figure for a sweep of kind "shift", "size", "bins" or "alpha" (titled by ``dataset``)."""
    draw = {"shift": plot_mse_vs_shift, "size": plot_mse_vs_size, "bins": plot_mse_vs_bins,
            "alpha": plot_mse_vs_alpha}.get(sweep.kind)
    if draw is None:
        raise ValueError(f"no figure for sweeps of kind {sweep.kind!r}; known: shift, size, bins, alpha")
    return draw(sweep, dataset)
