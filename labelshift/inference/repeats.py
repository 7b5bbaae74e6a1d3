"""Target rows that repeat: how many, and what the tests and intervals count them as.

Section 6 of Garg et al. (NeurIPS 2020) builds each target by drawing a label from p_t and then an example of that
class *with replacement* from the test set, and production prediction logs repeat requests (the same item scored
twice). Such a target is still label-shifted source data, but its rows are not independent: m rows drawn from a
pool of d items carry about the information of d rows, not m. Every statistic that assumes independent target rows
must count what the repeats take away:

* **the label-shift test** runs on the *distinct* rows. Given which pool items were drawn, the distinct items of
  class y are a uniformly chosen subset of that class's pool, itself i.i.d. from p_s(x | y); so the distinct rows
  are a label-shifted sample again (of another prior, which the test estimates), and the test's null holds for them
  exactly. The repeated copies add no evidence about p(x | y).
* **the intervals and the no-shift test** keep every row in the estimate (the target prior is that of the rows as
  drawn) and take the variance of a mean over rows as that of a sum of independent *clusters* -- each distinct row
  with its multiplicity c_g: Var((1/m) sum_i s_i) = (1/m^2) sum_g c_g^2 (s_g - s_bar)(s_g - s_bar)^T (the
  cluster-robust "sandwich" meat, :func:`clustered_covariance`). Without repeats it is the usual (1/m^2) sum_i
  (s_i - s_bar)(s_i - s_bar)^T. The effective sample size m^2 / sum_g c_g^2 (Kish's) is what the report shows.

Rows are "the same" when the model's calibrated outputs are bit for bit equal. A model whose outputs take the same
value for different inputs (a random forest's vote shares, outputs rounded to float16, probabilities saturated at
0 and 1) ties rows that are different items; repeats and such ties cannot be told apart from the outputs alone. The
holdout says which case holds, value by value: a group of equal target rows whose output also occurs in the
holdout is the model's own tie, and its rows count as independent; and when more than :data:`ATOM_SHARE` of the
holdout's rows share their output with another holdout row, every tie is taken as the model's own (the behaviour
before repeats were counted; the report says so). Derivation and measured effect: ``docs/label_shift_test.md`` ("Rows that repeat").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import rows as _rows
from ..errors import InputError
from ..partitions import is_partitioned

__all__ = ["ATOM_SHARE", "Repeats", "distinct_rows", "find_repeats", "clustered_covariance", "hash_counts",
           "holdout_hits"]

#: share of holdout rows tied with another holdout row above which ties are taken as the model's own (its outputs
#: have atoms), not as repeated items
ATOM_SHARE = 0.01
# odd 64-bit multipliers of the row hash (fixed: the same rows give the same groups on every machine)
_HASH_SEED = 20_201_206


def _row_words(P: np.ndarray) -> np.ndarray:
    """(m, w) uint64 words holding each row's bytes (zero-padded to a multiple of 8 bytes)."""
    P = np.ascontiguousarray(P)
    m = P.shape[0]
    raw = P.view(np.uint8).reshape(m, -1)
    pad = (-raw.shape[1]) % 8
    if pad:
        raw = np.concatenate([raw, np.zeros((m, pad), np.uint8)], axis=1)
    return np.ascontiguousarray(raw).view(np.uint64)


def _row_hash(words: np.ndarray) -> np.ndarray:
    """(m,) uint64 hash of each row's words (multiply-xor with fixed odd constants and a finalising mix), made in
    place: two (m,) arrays at a time, whatever the row width."""
    mult = np.random.default_rng(_HASH_SEED).integers(1, 2 ** 63, size=words.shape[1], dtype=np.uint64) * 2 + 1
    h = np.zeros(words.shape[0], np.uint64)
    tmp = np.empty_like(h)
    golden, shift = np.uint64(0x9E3779B97F4A7C15), np.uint64(29)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            np.multiply(words[:, j], mult[j], out=tmp)
            h ^= tmp
            h *= golden
            np.right_shift(h, shift, out=tmp)
            h ^= tmp
    return h


def _groups_equal(words: np.ndarray, order: np.ndarray, starts: np.ndarray) -> bool:
    """Every row of a group of two or more (adjacent positions of ``order`` beginning at ``starts``) has the words
    of the group's row at its start -- a single row is its own group -- checked a block of such positions at a
    time, however large the groups: about 2^19 words of temporaries a block, a few MiB whatever the row width."""
    sizes = np.diff(starts, append=order.size)
    multi = np.flatnonzero(sizes > 1)
    if multi.size == 0:
        return True
    ends = np.cumsum(sizes[multi])                                  # positions of the multi-row groups, numbered
    block = max(1, (1 << 19) // (5 + 2 * words.shape[1]))
    for lo in range(0, int(ends[-1]), block):
        offset = np.arange(lo, min(lo + block, int(ends[-1])))
        g = np.searchsorted(ends, offset, side="right")             # which multi-row group each one is in
        own = starts[multi[g]]
        positions = own + offset - (ends[g] - sizes[multi[g]])
        if not np.array_equal(words[order[positions]], words[order[own]]):
            return False
    return True


def _all_distinct(h: np.ndarray) -> bool:
    """Whether no two of the row hashes ``h`` are equal -- then no two rows are (equal rows hash alike); a sorted
    copy, cheaper than the argsort that grouping needs."""
    s = np.sort(h)
    return not bool(np.any(s[1:] == s[:-1]))


def _surely_repeated(h: np.ndarray) -> bool:
    """Whether 2^16 of the row hashes ``h``, taken at a fixed stride, already hold two equal ones: then the rows are
    grouped without :func:`_all_distinct`'s sort of them all (a target with many repeats shows them in any sample;
    equal hashes of unequal rows, about 2^-33 here, only cost that grouping, which checks the rows exactly)."""
    s = np.sort(h[::max(1, h.size >> 16)])
    return bool(np.any(s[1:] == s[:-1]))


def _sorted_groups(P: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(order, starts): the rows in an order where equal rows are adjacent (a sort of a 64-bit hash of each row's
    bytes, checked exactly; a collision falls back to sorting the bytes), and where each group starts in it; None
    when every row is distinct (:func:`_all_distinct`). Lean: a few (m,) integer arrays, never a copy of ``P``."""
    words = _row_words(P)
    h = _row_hash(words)
    if not _surely_repeated(h) and _all_distinct(h):
        return None
    order = np.argsort(h)
    h = h[order]                                                 # the hashes sorted (the unsorted ones freed)
    new = np.empty(h.size, bool)
    new[0] = True
    np.not_equal(h[1:], h[:-1], out=new[1:])
    del h
    starts = np.flatnonzero(new)
    del new
    if not _groups_equal(words, order, starts):                     # a hash collision (never seen): exact grouping
        _, inverse = np.unique(words, axis=0, return_inverse=True)
        order = np.argsort(inverse.reshape(-1))
        keys = inverse.reshape(-1)[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return order, starts


def distinct_rows(P: np.ndarray, *, with_inverse: bool = True) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The rows of ``P`` that are bit for bit equal, grouped.

    Returns:
        (first, inverse, counts): ``first`` (d,) the index of each distinct row's first occurrence, in increasing
        order; ``inverse`` (m,) the group of each row (``P[first[inverse]]`` equals ``P``), None with
        ``with_inverse=False`` (one (m,) array less); ``counts`` (d,) each group's size.
    """
    P = np.asarray(P)
    m = P.shape[0]
    if m == 0:
        empty = np.zeros(0, np.int64)
        return empty, (empty if with_inverse else None), empty
    grouped = _sorted_groups(P)
    if grouped is None:                                          # every row distinct: nothing to group
        first = np.arange(m, dtype=np.int64)
        return first, (first.copy() if with_inverse else None), np.ones(m, np.int64)
    order, starts = grouped
    firsts = np.minimum.reduceat(order, starts)                  # each group's earliest row
    if not with_inverse:
        del order                                                # (m,) arrays freed as soon as they are used
    sizes = np.diff(starts, append=m)
    del starts
    by_first = np.argsort(firsts, kind="stable")                 # groups in order of first occurrence
    first = firsts[by_first]
    del firsts
    counts = sizes[by_first]
    inverse = None
    if with_inverse:
        rank = np.empty(by_first.size, np.int64)
        rank[by_first] = np.arange(by_first.size)
        inverse = np.empty(m, np.int64)
        inverse[order] = np.repeat(rank, sizes)
    return first.astype(np.int64, copy=False), inverse, counts.astype(np.int64, copy=False)


def _tied_share(P: np.ndarray) -> float:
    """Share of the rows of ``P`` whose values equal another row's."""
    if len(P) == 0:
        return 0.0
    _, inverse, counts = distinct_rows(P)
    return float(np.sum(counts[inverse] > 1)) / len(P)


def _in_holdout(target: np.ndarray, rows: np.ndarray, holdout: np.ndarray) -> np.ndarray:
    """(len(rows),) bool: target row ``rows[i]`` equals some holdout row bit for bit (both at the target's dtype)."""
    if rows.size == 0 or holdout.shape[0] == 0:
        return np.zeros(rows.size, bool)
    hw = _row_words(holdout)
    hh = _row_hash(hw)
    order = np.argsort(hh)
    hh = hh[order]
    tw = _row_words(target[rows])
    th = _row_hash(tw)
    lo, hi = np.searchsorted(hh, th, side="left"), np.searchsorted(hh, th, side="right")
    hit = np.zeros(rows.size, bool)
    for i in np.flatnonzero(hi > lo):                              # hash matches, checked bytewise (all of them)
        hit[i] = bool(np.any(np.all(hw[order[lo[i]:hi[i]]] == tw[i], axis=1)))
    return hit


@dataclass(frozen=True)
class Repeats:
    """How the rows of one target repeat, and which copies the tests and intervals count as one draw.

    A group of equal target rows is *collapsed* (its copies are one draw of one item) unless its output also occurs
    in the holdout (then the model gives that output to different inputs: an atom, such as a saturated row, whose
    copies count as independent rows) or the holdout ties more than :data:`ATOM_SHARE` of its rows (then every tie
    is taken as the model's own).

    Attributes:
        n_rows: m, the target's rows.
        n_distinct: d, its distinct rows (bit for bit equal calibrated outputs count once).
        holdout_tied: share of the holdout's rows whose outputs equal another holdout row's.
        handled: False when the holdout ties more than :data:`ATOM_SHARE` of its rows: every row counts as
            independent.
        collapsed_rows: rows counted as copies of an earlier one (0 when nothing changes).
        shared_rows: rows in groups of equal rows whose output also occurs in the holdout (counted as independent).
        effective_rows: Kish's effective sample size m^2 / sum_g w_g (w_g = c_g^2 for a collapsed group of c_g
            rows, c_g otherwise), m when nothing is collapsed.
        largest_count: the most copies of one row.
        counts, first, collapsed: (d,) each distinct row's multiplicity, first index (in order of first
            occurrence) and whether its group is collapsed; None when nothing is collapsed, and in a report read
            back from JSON (only the numbers above are stored).
    """

    n_rows: int
    n_distinct: int
    holdout_tied: float
    handled: bool
    effective_rows: float
    largest_count: int
    collapsed_rows: int = 0
    shared_rows: int = 0
    counts: np.ndarray | None = None
    first: np.ndarray | None = None
    collapsed: np.ndarray | None = None

    @property
    def repeated_rows(self) -> int:
        """Rows that repeat an earlier row: m - d."""
        return self.n_rows - self.n_distinct

    @property
    def adjusts(self) -> bool:
        """Some rows are counted as copies of an earlier one (the statistics change)."""
        return self.collapsed_rows > 0

    @property
    def kept_rows(self) -> int:
        """Rows the label-shift test sees: m less the collapsed copies."""
        return self.n_rows - self.collapsed_rows

    @property
    def weights(self) -> np.ndarray:
        """(d,) each distinct row's weight in a clustered covariance: c_g^2 (one draw with its copies) or c_g."""
        c = self.counts.astype(np.float64)
        return np.where(self.collapsed, c * c, c)

    @property
    def test_rows(self) -> np.ndarray:
        """The target rows the label-shift test sees: one of each collapsed group, every row of the others."""
        return np.repeat(self.first, np.where(self.collapsed, 1, self.counts))

    def check(self, m: int, argument: str = "repeats") -> None:
        """InputError unless these are the repeats of m target rows with their groups (not a stored report's)."""
        if self.n_rows != m:
            raise InputError(f"{argument} describes {self.n_rows} target rows, not these {m}; pass find_repeats of "
                             "these rows' calibrated outputs, or None.")
        if self.adjusts and self.first is None:
            raise InputError(f"{argument} holds the counts of {m} target rows without its groups (read back from a "
                             "report); pass find_repeats of these rows' calibrated outputs, or None.")

    def summary(self, test: bool = True, interval: bool = True) -> str | None:
        """One sentence for the operator: how many rows repeat and what that changed (None without repeats).
        ``test`` / ``interval``: whether the label-shift test ran and the interval counted the copies."""
        if self.repeated_rows == 0:
            return None
        head = (f"{self.repeated_rows:,} of {self.n_rows:,} target rows repeat an earlier row "
                f"({self.n_distinct:,} distinct)")
        if not self.handled:
            return (f"{head}, but {100 * self.holdout_tied:.1f}% of the holdout's rows share their outputs with "
                    "another holdout row, so ties may be different inputs the model scores alike: every row was "
                    "counted as independent (if the target repeats items, its tests and interval are too confident)")
        shared = (f"; {self.shared_rows:,} rows have outputs that also occur in the holdout (the model's own ties) "
                  "and count as independent" if self.shared_rows else "")
        if not self.adjusts:
            return head + shared
        size = f"{self.effective_rows:,.{1 if self.effective_rows < 10 else 0}f}"
        parts = ([f"the label-shift test used {self.kept_rows:,} of them, each copied row once"] if test else []) + \
            [f"the no-shift test{' and the interval' if interval else ''} an effective sample of {size} rows"]
        return f"{head}: {', '.join(parts)}{shared}" + ("" if interval else "; the bootstrap interval resampled "
                                                        "the rows as they are")

    def to_dict(self) -> dict:
        """The numbers the report stores (not the per-row groups)."""
        return {"n_rows": int(self.n_rows), "n_distinct": int(self.n_distinct),
                "repeated_rows": int(self.repeated_rows), "collapsed_rows": int(self.collapsed_rows),
                "shared_rows": int(self.shared_rows), "effective_rows": float(self.effective_rows),
                "largest_count": int(self.largest_count), "holdout_tied": float(self.holdout_tied),
                "handled": bool(self.handled)}

    @classmethod
    def from_dict(cls, d: dict) -> "Repeats":
        """The :class:`Repeats` that :meth:`to_dict` wrote (without the per-row groups)."""
        return cls(n_rows=int(d["n_rows"]), n_distinct=int(d["n_distinct"]), holdout_tied=float(d["holdout_tied"]),
                   handled=bool(d["handled"]), effective_rows=float(d["effective_rows"]),
                   largest_count=int(d["largest_count"]), collapsed_rows=int(d.get("collapsed_rows", 0)),
                   shared_rows=int(d.get("shared_rows", 0)))


def find_repeats(target_probs: np.ndarray, holdout_probs: np.ndarray | None = None) -> Repeats:
    """The :class:`Repeats` of a target's calibrated outputs (m, k), judged against the holdout's (n, k) at the
    target's dtype (pass the holdout at the precision the target was given in: a float32 target against the
    holdout rounded to float32)."""
    if is_partitioned(target_probs):
        return _partitioned_repeats(target_probs.single(), holdout_probs)
    target = np.asarray(target_probs)
    first, _, counts = distinct_rows(target, with_inverse=False)
    m, d = int(target.shape[0]), int(first.size)
    holdout = None if holdout_probs is None else np.asarray(holdout_probs).astype(target.dtype)
    tied = 0.0 if holdout is None else _tied_share(holdout)
    handled = tied <= ATOM_SHARE
    collapsed = np.full(d, handled)
    groups = np.flatnonzero(counts > 1)
    if holdout is not None and handled:
        collapsed[groups[_in_holdout(target, first[groups], holdout)]] = False
    shared = int(counts[groups][~collapsed[groups]].sum()) if handled else 0
    collapsed_rows = int((counts[collapsed] - 1).sum()) if handled else 0
    effective = float(m)
    if collapsed_rows:
        c = counts.astype(np.float64)
        effective = float(m) ** 2 / float(np.where(collapsed, c * c, c).sum())
    keep = collapsed_rows > 0                     # the (d,) groups are kept only when the statistics use them
    return Repeats(n_rows=m, n_distinct=d, holdout_tied=tied, handled=handled, effective_rows=effective,
                   largest_count=int(counts.max()) if counts.size else 0, collapsed_rows=collapsed_rows,
                   shared_rows=shared, counts=counts if keep else None, first=first if keep else None,
                   collapsed=collapsed if keep else None)


def clustered_covariance(scores_of: Callable[[np.ndarray], np.ndarray], repeats: Repeats, k: int,
                         center: np.ndarray | None = None) -> np.ndarray:
    """(k, k) the per-row covariance of scores over target rows that repeat, so that the variance of their mean
    over the m rows is this / m: V = (1/m) sum_g w_g (s_g - center)(s_g - center)^T over the distinct rows, w_g =
    c_g^2 for a collapsed group (its c_g copies are one draw: the cluster-robust "sandwich" meat) and c_g for the
    others (:attr:`Repeats.weights`). With every c_g = 1 it is the usual (1/m) sum_i (s_i - center)(s_i -
    center)^T. ``scores_of(rows)`` gives the (len(rows), k) float64 scores of target rows ``rows``; they are asked
    for a block of distinct rows at a time (never a (d, k) array). Why the whole row is one cluster, not only its
    part within a class: ``docs/intervals.md`` ("Rows that repeat").
    """
    total = np.zeros((k, k))
    first, weights = repeats.first, repeats.weights
    for sl in _rows.blocks(first.size, width=k):
        S = np.asarray(scores_of(first[sl]), dtype=np.float64)
        if center is not None:
            S = S - center
        total += (S * weights[sl, None]).T @ S
    return total / float(repeats.n_rows)


def hash_counts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, counts): the sorted distinct 64-bit row hashes of one partition's rows (:func:`_row_hash` of their
    bytes) and how many rows have each; rows with equal hashes are checked bytewise to be equal (ValueError on a
    collision, never seen). The per-partition function of :func:`find_repeats` on rows in partitions."""
    B = np.asarray(B)
    if B.shape[0] == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    words = _row_words(B)
    h = _row_hash(words)
    order = np.argsort(h)
    sorted_h = h[order]
    starts = np.flatnonzero(np.r_[True, sorted_h[1:] != sorted_h[:-1]])
    if not _groups_equal(words, order, starts):
        raise ValueError("two different target rows of one partition have the same 64-bit hash; repeated rows "
                         "cannot be counted over partitions for this target (pass it as one array)")
    return sorted_h[starts], np.diff(starts, append=h.size).astype(np.int64)


def holdout_hits(B: np.ndarray, wanted: np.ndarray, holdout: np.ndarray) -> np.ndarray:
    """(len(wanted),) int8 for the sorted row hashes ``wanted``: -1 when no row of this partition has the hash, else
    1 when its row equals some holdout row bit for bit and 0 when not. The per-partition function that tells a
    repeated row from the model's own tie (:func:`find_repeats` on rows in partitions)."""
    out = np.full(wanted.size, -1, np.int8)
    B = np.asarray(B)
    if B.shape[0] == 0 or wanted.size == 0:
        return out
    h = _row_hash(_row_words(B))
    pos = np.searchsorted(wanted, h)
    here = np.flatnonzero((pos < wanted.size) & (wanted[np.minimum(pos, wanted.size - 1)] == h))
    if here.size == 0:
        return out
    slots, first = np.unique(pos[here], return_index=True)
    out[slots] = _in_holdout(B, here[first], holdout.astype(B.dtype))
    return out


def _merged_counts(parts) -> tuple[np.ndarray, np.ndarray]:
    """The partitions' (hashes, counts) merged: each distinct hash once (sorted) with its counts added."""
    h = np.concatenate([p[0] for p in parts])
    c = np.concatenate([p[1] for p in parts])
    order = np.argsort(h, kind="stable")
    h, c = h[order], c[order]
    if h.size == 0:
        return h, c
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    return h[starts], np.add.reduceat(c, starts)


def _partitioned_repeats(R, holdout_probs) -> Repeats:
    """:func:`find_repeats` of rows held in partitions, as two map-reduce passes: the partitions' distinct row
    hashes with their counts (:func:`hash_counts`), merged here, and, when some hash occurs more than once and ties
    are judged, whether each repeated row occurs in the holdout (:func:`holdout_hits`, asked only for the repeated
    hashes). Rows of different partitions are the same row when their 64-bit hashes are equal (rows within a
    partition are compared bytewise). The numbers equal one process's exactly (integer counts; the effective
    size's float sum is of integers); the (d,) groups are not made: when rows are collapsed the statistics that
    use them do not run over partitions yet."""
    m = int(R.shape[0])
    hashes, counts = _merged_counts(R.run(hash_counts))
    holdout = None if holdout_probs is None else np.asarray(holdout_probs).astype(R.dtype)
    tied = 0.0 if holdout is None else _tied_share(holdout)
    handled = tied <= ATOM_SHARE
    repeated = np.flatnonzero(counts > 1)
    own_tie = np.zeros(repeated.size, bool)
    if handled and holdout is not None and repeated.size:
        hits = np.stack(R.run(holdout_hits, hashes[repeated], holdout))
        found = np.where(hits >= 0, hits, np.int8(-1)).max(axis=0)
        own_tie = found == 1
    c = counts[repeated]
    shared = int(c[own_tie].sum()) if handled else 0
    collapsed_rows = int((c[~own_tie] - 1).sum()) if handled else 0
    effective = float(m)
    if collapsed_rows:
        weights = float(m - int(c.sum())) + float((c[~own_tie].astype(np.float64) ** 2).sum()) + float(shared)
        effective = float(m) ** 2 / weights
    return Repeats(n_rows=m, n_distinct=int(hashes.size), holdout_tied=tied, handled=handled,
                   effective_rows=effective, largest_count=int(counts.max()) if counts.size else 0,
                   collapsed_rows=collapsed_rows, shared_rows=shared)
