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
  cluster-robust "sandwich" meat; the no-shift test multiplies only the part within a class, see
  :func:`clustered_covariance`). Without repeats it is the usual (1/m^2) sum_i (s_i - s_bar)(s_i - s_bar)^T.
  The effective sample size m^2 / sum_g c_g^2 (Kish's) is what the report shows.

Rows are "the same" when the model's calibrated outputs are bit for bit equal. A model whose outputs take the same
value for different inputs (a random forest's vote shares, outputs rounded to float16, probabilities saturated at
0 and 1) ties rows that are different items; repeats and such ties cannot be told apart from the outputs. The
holdout says which case holds: when more than :data:`ATOM_SHARE` of its rows share their output with another
holdout row, ties are taken as the model's own and every row counts as independent (today's behaviour; the report
says so). Derivation and measured effect: ``docs/label_shift_test.md`` ("Rows that repeat").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ATOM_SHARE", "Repeats", "distinct_rows", "find_repeats", "clustered_covariance"]

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


def _groups_equal(words: np.ndarray, order: np.ndarray, starts: np.ndarray, block: int = 1 << 18) -> bool:
    """Every row ``order[i]`` has the words of its group's first row ``order[starts[g]]`` (groups of adjacent
    positions beginning at ``starts``), checked a block of positions at a time."""
    for start in range(0, order.size, block):
        positions = np.arange(start, min(start + block, order.size))
        group = np.searchsorted(starts, positions, side="right") - 1
        if not np.array_equal(words[order[positions]], words[order[starts[group]]]):
            return False
    return True


def _sorted_groups(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): the rows in an order where equal rows are adjacent, earliest first within a group (a
    stable sort of a 64-bit hash of each row's bytes, checked exactly; a collision falls back to sorting the
    bytes), and where each group starts in it. Lean: a few (m,) integer arrays, never a copy of ``P``."""
    words = _row_words(P)
    h = _row_hash(words)
    order = np.argsort(h, kind="stable")
    h = h[order]                                                 # the hashes sorted (the unsorted ones freed)
    new = np.empty(h.size, bool)
    new[0] = True
    np.not_equal(h[1:], h[:-1], out=new[1:])
    del h
    starts = np.flatnonzero(new)
    del new
    if not _groups_equal(words, order, starts):                     # a hash collision (never seen): exact grouping
        _, first_idx, inverse = np.unique(words, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")
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
    order, starts = _sorted_groups(P)
    firsts = order[starts]
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


@dataclass(frozen=True)
class Repeats:
    """How the rows of one target repeat, and whether the tests and intervals count repeats as one item.

    Attributes:
        n_rows: m, the target's rows.
        n_distinct: d, its distinct rows (bit for bit equal calibrated outputs count once).
        holdout_tied: share of the holdout's rows whose outputs equal another holdout row's.
        handled: True when repeats are counted as repeated items (the holdout shows at most :data:`ATOM_SHARE`
            tied rows); False when ties are taken as the model's own and every row counts as independent.
        effective_rows: Kish's effective sample size m^2 / sum_g c_g^2 when repeats are counted as such, else m.
        largest_count: the most copies of one row.
        counts, first: (d,) the multiplicity and the first index of each distinct row, in order of first
            occurrence; None when no row repeats, and in a report read back from JSON (only the numbers above are
            stored).
    """

    n_rows: int
    n_distinct: int
    holdout_tied: float
    handled: bool
    effective_rows: float
    largest_count: int
    counts: np.ndarray | None = None
    first: np.ndarray | None = None

    @property
    def repeated_rows(self) -> int:
        """Rows that repeat an earlier row: m - d."""
        return self.n_rows - self.n_distinct

    @property
    def adjusts(self) -> bool:
        """Some rows repeat and they are counted as repeated items (the statistics change)."""
        return self.handled and self.repeated_rows > 0

    def summary(self) -> str | None:
        """One sentence for the operator: how many rows repeat and what that changed (None without repeats)."""
        if self.repeated_rows == 0:
            return None
        head = (f"{self.repeated_rows:,} of {self.n_rows:,} target rows repeat an earlier row "
                f"({self.n_distinct:,} distinct)")
        if self.handled:
            return (f"{head}: the label-shift test used the distinct rows, the no-shift test and the interval an "
                    f"effective sample of {self.effective_rows:,.0f} rows")
        return (f"{head}, but {100 * self.holdout_tied:.1f}% of the holdout's rows share their outputs with another "
                "holdout row, so ties may be different inputs the model scores alike: every row was counted as "
                "independent (if the target repeats items, its tests and interval are too confident)")

    def to_dict(self) -> dict:
        """The numbers the report stores (not the per-row groups)."""
        return {"n_rows": int(self.n_rows), "n_distinct": int(self.n_distinct),
                "repeated_rows": int(self.repeated_rows), "effective_rows": float(self.effective_rows),
                "largest_count": int(self.largest_count), "holdout_tied": float(self.holdout_tied),
                "handled": bool(self.handled)}

    @classmethod
    def from_dict(cls, d: dict) -> "Repeats":
        """The :class:`Repeats` that :meth:`to_dict` wrote (without the per-row groups)."""
        return cls(n_rows=int(d["n_rows"]), n_distinct=int(d["n_distinct"]), holdout_tied=float(d["holdout_tied"]),
                   handled=bool(d["handled"]), effective_rows=float(d["effective_rows"]),
                   largest_count=int(d["largest_count"]))


def find_repeats(target_probs: np.ndarray, holdout_probs: np.ndarray | None = None) -> Repeats:
    """The :class:`Repeats` of a target's calibrated outputs (m, k), judged against the holdout's (n, k) at the
    target's precision (a float32 target is compared with the holdout rounded to float32)."""
    target = np.asarray(target_probs)
    first, _, counts = distinct_rows(target, with_inverse=False)
    tied = 0.0 if holdout_probs is None else _tied_share(np.asarray(holdout_probs).astype(target.dtype))
    m, d = int(target.shape[0]), int(first.size)
    handled = tied <= ATOM_SHARE
    repeated = m > d
    effective = float(m) ** 2 / float(np.sum(counts.astype(np.float64) ** 2)) if handled and repeated else float(m)
    largest = int(counts.max()) if counts.size else 0
    if not repeated:                      # nothing to count: the (m,) groups are not kept
        first = counts = None
    return Repeats(n_rows=m, n_distinct=d, holdout_tied=tied, handled=handled, effective_rows=effective,
                   largest_count=largest, counts=counts, first=first)


def clustered_covariance(scores: np.ndarray, counts: np.ndarray, center: np.ndarray | None = None,
                         posterior: np.ndarray | None = None, class_means: np.ndarray | None = None) -> np.ndarray:
    """(k, k) the per-row covariance of scores over target rows that repeat: the variance of a mean over the m rows
    is this / m. ``scores`` (d, k) of the distinct rows, ``counts`` (d,) their multiplicities c_g, m = sum_g c_g,
    d_g = s_g - ``center``.

    Without ``posterior``: V_c = (1/m) sum_g c_g^2 d_g d_g^T, the cluster-robust meat (each distinct row and its
    copies one independent cluster; what the intervals use). In Section 6's sampling only the example repeats, not
    the label: each row's label is an independent draw, so V_c overstates the part between classes. With
    ``posterior`` (d, k), each distinct row's class probabilities on the target, that part is taken out of the
    copies (what the no-shift test uses):

        V = V_u + [(1/m) sum_g (c_g^2 - c_g) d_g d_g^T - (1/m) sum_y A_y (mu_y - center)(mu_y - center)^T]_+,

    V_u = (1/m) sum_g c_g d_g d_g^T the rows-independent covariance, A_y = sum_g (c_g^2 - c_g) posterior_gy the
    expected copies of class y, mu_y the class-y mean of the scores (``class_means`` (k, k); else the
    posterior-weighted means of the rows, pulled towards the centre, so that less is taken out: the wider side),
    and [.]_+ the positive semidefinite part (copies never make a mean less variable). With every c_g = 1 all forms
    are the usual (1/m) sum_i d_i d_i^T. Why the intervals keep V_c (the second form under-covered on real
    networks' outputs): ``docs/intervals.md`` ("Rows that repeat").
    """
    c = np.asarray(counts, dtype=np.float64)
    S = np.asarray(scores, dtype=np.float64)
    m = float(c.sum())
    D = S if center is None else S - center
    if posterior is None:
        Sc = D * c[:, None]
        return Sc.T @ Sc / m
    Q = np.asarray(posterior, dtype=np.float64)
    if class_means is None:
        mass = (Q * c[:, None]).sum(axis=0)
        class_means = ((Q * c[:, None]).T @ S) / np.where(mass > 0, mass, 1.0)[:, None]
    M = np.asarray(class_means, dtype=np.float64) - (0.0 if center is None else center)
    extra = c * (c - 1.0)
    A = Q.T @ extra                                                         # (k,) expected copies per class
    excess = ((D * extra[:, None]).T @ D - (M * A[:, None]).T @ M) / m
    lam, V = np.linalg.eigh(0.5 * (excess + excess.T))
    Dc = D * np.sqrt(c)[:, None]
    return Dc.T @ Dc / m + (V * np.maximum(lam, 0.0)) @ V.T
