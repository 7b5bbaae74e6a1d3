"""The regions of the output simplex the label-shift test compares: predicted class x confidence bin, the bins at
the holdout's quantiles, rarely predicted classes pooled (the degenerate-bin rule), and every row's region."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import rows as _rows
from ...partitions import is_partitioned

@dataclass(frozen=True)
class Regions:
    group: np.ndarray          # (k,) group index of each predicted class (classes pooled share one)
    group_offset: np.ndarray   # (G,) first region index of each group
    inner_edges: np.ndarray    # (G, B-1) inner confidence edges per group, padded with +inf
    n_regions: int
    members: list              # per group: tuple of predicted classes
    bounds: list               # per region: (group, low, high)

    def assign(self, probs: np.ndarray) -> np.ndarray:
        pred = probs.argmax(axis=1)
        conf = probs[np.arange(probs.shape[0]), pred]
        g = self.group[pred]
        if self.inner_edges.shape[1] == 0:
            return self.group_offset[g]
        return self.group_offset[g] + (conf[:, None] >= self.inner_edges[g]).sum(axis=1)


def make_regions(probs: np.ndarray, min_rows: int, max_bins: int) -> Regions:
    """Regions from the holdout outputs: per predicted class c with n_c holdout rows, B_c = min(max_bins,
    n_c // min_rows) confidence bins at the holdout's quantiles of max_y f_y (duplicate edges merged), so every
    bin holds at least ``min_rows`` holdout rows up to ties. Classes predicted fewer than ``min_rows`` times are
    pooled into one region (with one bin)."""
    k = probs.shape[1]
    pred = probs.argmax(axis=1)
    conf = probs[np.arange(probs.shape[0]), pred]
    counts = np.bincount(pred, minlength=k)
    rare = tuple(int(c) for c in np.flatnonzero(counts < min_rows))
    members = [(int(c),) for c in range(k) if counts[c] >= min_rows]
    if rare:
        members.append(rare)
    group = np.empty(k, dtype=np.int64)
    edges_per_group = []
    for gi, mem in enumerate(members):
        group[list(mem)] = gi
        sel = np.isin(pred, mem)
        nb = max(1, min(max_bins, int(sel.sum()) // min_rows)) if len(mem) == 1 else 1
        if nb > 1:
            e = np.quantile(conf[sel], np.arange(1, nb) / nb)
            e = np.unique(e[(e > conf[sel].min()) & (e <= conf[sel].max())])
        else:
            e = np.empty(0)
        edges_per_group.append(e)
    width = max((len(e) for e in edges_per_group), default=0)
    inner = np.full((len(members), width), np.inf)
    offsets = np.zeros(len(members), dtype=np.int64)
    bounds = []
    r = 0
    for gi, e in enumerate(edges_per_group):
        inner[gi, :len(e)] = e
        offsets[gi] = r
        full = np.concatenate([[0.0], e, [1.0]])
        for b in range(len(e) + 1):
            bounds.append((gi, float(full[b]), float(full[b + 1])))
        r += len(e) + 1
    return Regions(group=group, group_offset=offsets, inner_edges=inner, n_regions=r, members=members,
                    bounds=bounds)


def region_name(members: tuple, low: float, high: float, class_names) -> str:
    name = (lambda c: str(class_names[c])) if class_names is not None else str
    if len(members) == 1:
        what = f"predicted class {name(members[0])}"
    else:
        what = "predicted class in {" + ", ".join(name(c) for c in members) + "} (rarely predicted on the holdout)"
    if low <= 0.0 and high >= 1.0:
        return what
    return f"{what}, confidence {low:.2f}-{high:.2f}"


def assign_rows(regions: Regions, P: np.ndarray) -> np.ndarray:
    """The region of every row: a large set in row blocks (the same assignments, memory of one block)."""
    if not _rows.is_large(P):
        return regions.assign(P)
    out = np.empty(P.shape[0], dtype=np.int64)
    for sl in _rows.blocks(P.shape[0], width=P.shape[1]):
        out[sl] = regions.assign(P[sl])
    return out


def partition_region_counts(B: np.ndarray, regions: Regions) -> np.ndarray:
    """The rows of one partition B (m_p, k) in each region, int64 (J,): the per-partition function of
    :func:`region_counts_of`."""
    return np.bincount(assign_rows(regions, B), minlength=regions.n_regions)


def region_counts_of(regions: Regions, P) -> np.ndarray:
    """The target rows in each region, float64 (J,): an array's rows assigned (:func:`assign_rows`) and counted, or
    rows in partitions counted where they live and the integer counts added here -- the same counts either way,
    with no row's region leaving its partition."""
    if is_partitioned(P):
        total = np.zeros(regions.n_regions, dtype=np.int64)
        for counts in P.single().run(partition_region_counts, regions):
            total += counts
        return total.astype(np.float64)
    return np.bincount(assign_rows(regions, P), minlength=regions.n_regions).astype(np.float64)
