"""Figures of the paper's Section 6 from a sweep's summaries (matplotlib, drawn off-screen).

* :func:`plot_mse_vs_shift` -- weight MSE against p_t(y=1), one line per method (Figure 1, top row; linear axes);
* :func:`plot_mse_vs_size` -- weight MSE against the target size m, log-log (Figure 1, bottom row);
* :func:`plot_mse_vs_alpha` -- weight MSE against the Dirichlet alpha of the image experiments, log x axis
  (Figure 1 b, c);
* :func:`plot_mse_vs_bins` -- MSE (left axis) and minimum eigenvalue of the negated MLLS Hessian (right axis)
  against the number of bins (Figure 2; linear axes).
* :func:`plot_prior_estimate` -- the re-estimated target prior per class with its confidence interval, beside the
  source prior; with a history, a second panel draws each class's estimate over the successive re-estimations.

Shaded bands are +-1 standard error of the mean over seeds.

Each function takes a :class:`~labelshift.experiments.sweep.SweepResult` (anything with ``kind``, ``values``,
``methods``, ``mse_mean``, ``mse_se`` and ``min_eigenvalue_mean``) and returns a ``matplotlib.figure.Figure``
built without pyplot, so drawing is thread-safe and never needs a display. :func:`figure_png` renders it to
PNG bytes.
"""
from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["METHOD_STYLE", "plot_sweep", "plot_mse_vs_shift", "plot_mse_vs_size", "plot_mse_vs_bins",
           "plot_mse_vs_alpha", "plot_prior_estimate",
           "figure_png", "FIGURE_NAMES"]

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

_FIGSIZE = (5.0, 3.8)
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
    fig = Figure(figsize=_FIGSIZE, dpi=120)
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


def figure_png(fig: Figure, dpi: int = 120) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def plot_prior_estimate(source_prior, target_prior, lower, upper, *, class_names=None, level: float = 0.95,
                        title: str = "Estimated target prior", history: list[dict] | None = None,
                        interval_label: str | None = None) -> Figure:
    """Bars of the source prior p_s(y) and the estimated target prior p_t(y) with its ``level`` interval, per class;
    ``interval_label`` names the interval in the legend (e.g. "source-aware (target + holdout error)").

    ``history`` (optional): earlier re-estimations as dicts with ``sequence`` and ``target_prior`` (a list of k
    floats) and optionally ``lower`` / ``upper``; the figure then gets a second panel with p_t(y) per class against
    the run sequence (the drift over time), bands for the intervals where present.
    """
    ps, pt = np.asarray(source_prior, float), np.asarray(target_prior, float)
    lo, hi = np.asarray(lower, float), np.asarray(upper, float)
    k = len(ps)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    panels = 2 if history else 1
    fig = Figure(figsize=(_FIGSIZE[0] * panels + 0.4 * (panels - 1), _FIGSIZE[1]), dpi=120)
    fig.subplots_adjust(left=0.16 / panels, right=0.98, bottom=0.14, top=0.9, wspace=0.3)
    ax = fig.add_subplot(1, panels, 1)
    x = np.arange(k)
    ax.bar(x - 0.2, ps, width=0.4, color="tab:gray", alpha=0.6, label="source p_s(y)")
    err = np.vstack([np.clip(pt - lo, 0, None), np.clip(hi - pt, 0, None)])
    ax.bar(x + 0.2, pt, width=0.4, color="tab:red", alpha=0.8, yerr=err, capsize=3,
           label=f"target p_t(y), {level:.0%} " + (f"{interval_label} interval" if interval_label else "CI"))
    ax.set_xticks(x, names, fontsize=8, rotation=0 if k <= 10 else 90)
    ax.set_xlabel("class")
    ax.set_ylabel("prior")
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="best")
    if history:
        hx = fig.add_subplot(1, panels, 2)
        seq = np.array([h["sequence"] for h in history])
        prior = np.array([h["target_prior"] for h in history], float)
        for c in range(k):
            color = f"C{c % 10}"
            hx.plot(seq, prior[:, c], marker="o", ms=3, color=color, label=names[c])
            if all("lower" in h and "upper" in h for h in history):
                hx.fill_between(seq, [h["lower"][c] for h in history], [h["upper"][c] for h in history],
                                color=color, alpha=0.15, linewidth=0)
            hx.axhline(ps[c], color=color, linestyle=":", linewidth=0.8)
        hx.set_xlabel("re-estimation (run sequence)")
        hx.set_ylabel("estimated p_t(y)")
        hx.set_title("Drift over time (dotted: source prior)", fontsize=11)
        hx.xaxis.set_major_locator(MaxNLocator(integer=True))
        hx.grid(True, alpha=0.3)
        hx.legend(fontsize=7, frameon=False, loc="best", ncol=2 if k > 5 else 1)
    return fig


def plot_segment_priors(source_prior, segments: list[dict], *, class_names=None, level: float = 0.95,
                        title: str = "Estimated target prior per segment") -> Figure:
    """The segments' estimated priors side by side: per class, the source prior p_s(y) as a gray bar and each
    segment's p_t(y) as a marker with its ``level`` interval, offset within the class's slot (one colour per
    segment). ``segments``: dicts with ``name``, ``target_prior``, ``lower`` and ``upper`` (lists of k floats), as
    :meth:`labelshift.inference.segments.SegmentEstimate.to_dict` gives them for the assessed segments."""
    ps = np.asarray(source_prior, float)
    k = len(ps)
    names = list(class_names) if class_names is not None else [str(i) for i in range(k)]
    fig = Figure(figsize=(max(_FIGSIZE[0], 0.9 * k + 1.5), _FIGSIZE[1] + 0.4), dpi=120)
    fig.subplots_adjust(left=0.12, right=0.78 if segments else 0.97, bottom=0.14, top=0.9)
    ax = fig.add_subplot()
    x = np.arange(k)
    ax.bar(x, ps, width=0.8, color="tab:gray", alpha=0.35, label="source p_s(y)")
    span = 0.7
    for i, seg in enumerate(segments):
        pt = np.asarray(seg["target_prior"], float)
        lo, hi = np.asarray(seg["lower"], float), np.asarray(seg["upper"], float)
        dx = -span / 2 + span * (i + 0.5) / len(segments)
        err = np.vstack([np.clip(pt - lo, 0, None), np.clip(hi - pt, 0, None)])
        ax.errorbar(x + dx, pt, yerr=err, fmt="o", ms=3, capsize=2, linewidth=0.8, color=f"C{i % 10}",
                    label=str(seg["name"]) if len(segments) <= 20 else None)
    ax.set_xticks(x, names, fontsize=8, rotation=0 if k <= 10 else 90)
    ax.set_xlabel("class")
    ax.set_ylabel(f"prior (bars: source; markers: segments, {level:.0%} interval)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    if segments and len(segments) <= 20:
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="segment",
                  title_fontsize=7)
    return fig
