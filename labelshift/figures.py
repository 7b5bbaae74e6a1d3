"""Figures of a re-estimation (matplotlib, drawn off-screen), and the PNG rendering every figure shares.

* :func:`plot_prior_estimate` -- the re-estimated target prior per class with its confidence interval, beside the
  source prior; with a history, a second panel draws each class's estimate over the successive re-estimations;
* :func:`plot_segment_priors` -- the segments' estimated priors side by side, each with its interval;
* :func:`figure_png` -- a figure as PNG bytes (also for the sweep's figures, :mod:`labelshift.experiments.plots`).

Each figure is a ``matplotlib.figure.Figure`` built without pyplot, so drawing is thread-safe and never needs a
display.
"""
from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["FIGSIZE", "figure_png", "plot_prior_estimate", "plot_segment_priors"]

#: width and height (inches) of one panel
FIGSIZE = (5.0, 3.8)


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
    fig = Figure(figsize=(FIGSIZE[0] * panels + 0.4 * (panels - 1), FIGSIZE[1]), dpi=120)
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
    fig = Figure(figsize=(max(FIGSIZE[0], 0.9 * k + 1.5), FIGSIZE[1] + 0.4), dpi=120)
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
