"""Shift simulation (Section 6): Dirichlet and binary target priors, class-by-class sampling from a pool."""
import numpy as np
import pytest

from labelshift.errors import InputError, LabelShiftError
from labelshift.experiments.shift import binary_prior, class_indices, dirichlet_prior, sample_target, sample_targets


def test_binary_prior():
    np.testing.assert_allclose(binary_prior(0.01), [0.99, 0.01])
    np.testing.assert_allclose(binary_prior(1), [0.0, 1.0])
    for bad in (-0.1, 1.5, "x"):
        with pytest.raises(InputError, match="p1"):
            binary_prior(bad)


def test_dirichlet_prior_shapes_and_reproducibility():
    p = dirichlet_prior(0.1, 10, np.random.default_rng(0))
    assert p.shape == (10,) and np.all(p >= 0) and abs(p.sum() - 1) < 1e-12
    P = dirichlet_prior(1.0, 4, np.random.default_rng(1), size=5)
    assert P.shape == (5, 4)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(P, dirichlet_prior(1.0, 4, np.random.default_rng(1), size=5))
    # vector alpha is accepted
    assert dirichlet_prior([1.0, 2.0, 3.0], 3, np.random.default_rng(2)).shape == (3,)


def test_dirichlet_prior_mean_and_severity():
    # E[p_y] = alpha_y / sum(alpha): with alpha = (1, 3) the mean of p_1 is 3/4; Var = a0 a1 / (A^2 (A+1)) = 3/80,
    # so over 20000 draws the mean has std sqrt(3/80/20000) = 0.0014; allow 5 std.
    P = dirichlet_prior([1.0, 3.0], 2, np.random.default_rng(3), size=20000)
    assert abs(P[:, 1].mean() - 0.75) < 5 * np.sqrt(3 / 80 / 20000)
    # smaller alpha is more severe shift: the largest class share is bigger on average
    mild = dirichlet_prior(10.0, 10, np.random.default_rng(4), size=2000).max(axis=1).mean()
    severe = dirichlet_prior(0.1, 10, np.random.default_rng(4), size=2000).max(axis=1).mean()
    assert severe > 0.5 > 0.25 > mild


@pytest.mark.parametrize("alpha", [0.0, -1.0, np.nan, [1.0, 2.0]])
def test_dirichlet_prior_bad_alpha(alpha):
    with pytest.raises(InputError, match="alpha"):
        dirichlet_prior(alpha, 3, np.random.default_rng(0))


def test_dirichlet_prior_needs_generator():
    with pytest.raises(InputError, match="Generator"):
        dirichlet_prior(1.0, 3, 0)


def test_class_indices():
    y = np.array([2, 0, 2, 1, 0, 2])
    idx = class_indices(y, 4)
    assert [ix.tolist() for ix in idx] == [[1, 4], [3], [0, 2, 5], []]


def test_sample_target_class_frequencies():
    rng = np.random.default_rng(123)
    # pool with very unequal class sizes: the target frequencies must follow the prior, not the pool
    pool = np.repeat([0, 1, 2], [50, 500, 5])
    prior = np.array([0.6, 0.3, 0.1])
    m = 100_000
    idx = sample_target(pool, prior, m, rng)
    assert idx.shape == (m,) and idx.dtype == np.int64
    assert idx.min() >= 0 and idx.max() < pool.size
    freq = np.bincount(pool[idx], minlength=3) / m
    # each class count is Binomial(m, p_y): its frequency has std sqrt(p(1-p)/m) (<= 0.0016); allow 5 std
    assert np.all(np.abs(freq - prior) <= 5 * np.sqrt(prior * (1 - prior) / m))
    # within a class, every pool member is drawn uniformly: class 2 has 5 members and ~10000 draws, so each
    # member's share is 1/5 with std sqrt(0.2*0.8/10000) = 0.004; allow 5 std
    members = idx[pool[idx] == 2]
    share = np.bincount(members - 550, minlength=5) / members.size
    assert np.all(np.abs(share - 0.2) <= 5 * np.sqrt(0.2 * 0.8 / members.size))


def test_sample_target_is_seeded_and_batched():
    pool = np.random.default_rng(0).integers(0, 4, size=200)
    prior = np.array([0.1, 0.2, 0.3, 0.4])
    a = sample_target(pool, prior, 50, np.random.default_rng(7))
    b = sample_target(pool, prior, 50, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    P = np.stack([prior, prior[::-1]])
    batch = sample_targets(pool, P, 30, np.random.default_rng(8))
    assert batch.shape == (2, 30)
    rng = np.random.default_rng(8)
    np.testing.assert_array_equal(batch[0], sample_target(pool, P[0], 30, rng))
    np.testing.assert_array_equal(batch[1], sample_target(pool, P[1], 30, rng))


def test_sample_target_zero_mass_class_may_be_absent():
    pool = np.array([0, 0, 1, 1])                     # class 2 absent from the pool
    idx = sample_target(pool, [0.5, 0.5, 0.0], 20, np.random.default_rng(0))
    assert set(pool[idx]) <= {0, 1}


@pytest.mark.parametrize("prior, m, match", [
    ([0.5, 0.3, 0.2], 10, "no examples of class"),       # class 2 has mass but is absent
    ([0.5, 0.6, 0.0], 10, "sum to 1"),
    ([1.2, -0.2, 0.0], 10, "non-negative"),
    ([0.5, 0.5, 0.0], 0, "m must be"),
    ([[0.5, 0.5]], 10, "1-D"),
])
def test_sample_target_bad_input(prior, m, match):
    pool = np.array([0, 0, 1, 1])
    with pytest.raises(InputError, match=match):
        sample_target(pool, prior, m, np.random.default_rng(0))


def test_sample_target_labels_out_of_range():
    with pytest.raises(LabelShiftError, match="pool_labels"):
        sample_target(np.array([0, 1, 5]), [0.5, 0.5], 10, np.random.default_rng(0))


def test_simulated_target_batches_draw_without_replacement_while_the_pool_allows():
    """Rows of a class come from distinct pool members across all batches while the pool holds enough of them (a
    random subset of an i.i.d. pool is i.i.d.); only a class that needs more repeats, and repeated_classes names
    it."""
    from labelshift.experiments.datasets.simulate import repeated_classes, simulate_target_batches

    pool_y = np.repeat(np.arange(3), 100)
    pool_x = np.arange(300, dtype=np.float32).reshape(300, 1, 1, 1)     # each image is its own pool index
    xs, ys, _ = simulate_target_batches(pool_x, pool_y, 3, rows=60, n_batches=3, target_prior=[0.4, 0.3, 0.3],
                                        seed=5)
    ids = np.concatenate([x.ravel() for x in xs]).astype(int)
    assert len(ids) == 180 and len(np.unique(ids)) == 180                 # no image twice, across batches
    assert all(np.array_equal(pool_y[x.ravel().astype(int)], y) for x, y in zip(xs, ys))
    assert repeated_classes(pool_y, ys) == []
    xs, ys, _ = simulate_target_batches(pool_x, pool_y, 3, rows=300, n_batches=1, target_prior=[0.8, 0.1, 0.1],
                                        seed=5)
    assert repeated_classes(pool_y, ys) == [0]
    ids = xs[0].ravel().astype(int)
    assert len(np.unique(ids[pool_y[ids] == 1])) == int(np.sum(pool_y[ids] == 1))   # the others still distinct
