"""The input checks at the public boundary: the fast blockwise path for large batches and its error messages."""
import numpy as np
import pytest

from labelshift import _validation as V
from labelshift.errors import InputError


@pytest.fixture(scope="module")
def batch():
    # large enough for several blocks of the fast check (a block is ~1 MB: 13107 rows at k = 10)
    return np.random.default_rng(0).dirichlet(np.ones(10), size=(7, 5000))


def test_valid_batch_is_returned_without_a_copy(batch):
    probs, mask, is_batch = V.check_target_batch(batch, "target_probs", 10)
    assert probs is batch and is_batch
    np.testing.assert_array_equal(mask, np.ones((7, 5000)))
    one, mask1, is_batch1 = V.check_target_batch(batch[3], "target_probs", 10)
    assert one.shape == (1, 5000, 10) and np.shares_memory(one, batch) and not is_batch1
    converted, _, _ = V.check_target_batch(batch.astype(np.float32), "target_probs", 10)
    assert converted.dtype == np.float64
    np.testing.assert_allclose(converted, batch, rtol=1e-7)


def test_list_of_sets_is_padded(batch):
    probs, mask, is_batch = V.check_target_batch([batch[0, :30], batch[1, :50]], "target_probs", 10)
    assert probs.shape == (2, 50, 10) and is_batch
    np.testing.assert_array_equal(probs[0, :30], batch[0, :30])
    np.testing.assert_allclose(probs[0, 30:], 0.1)
    np.testing.assert_array_equal(mask.sum(axis=1), [30, 50])


@pytest.mark.parametrize("where", [(0, 0, 0), (3, 2500, 4), (6, 4999, 9)])   # first, middle and last block
@pytest.mark.parametrize("bad, match", [
    (np.nan, "1 NaN or infinite"), (np.inf, "1 NaN or infinite"), (-np.inf, "1 NaN or infinite"),
    (-0.5, "negative entries.*logits"), (0.5, "must sum to 1"),
])
def test_every_bad_entry_is_found_with_its_message(batch, where, bad, match):
    x = batch.copy()
    x[where] = bad if bad != 0.5 else x[where] + 0.5
    with pytest.raises(InputError, match=match):
        V.check_target_batch(x, "target_probs", 10)


def test_row_sum_tolerance_is_kept(batch):
    x = batch.copy()
    x[2, 7] *= 1 + 0.5 * V.ROW_SUM_TOL        # within the tolerance (float32 softmax outputs drift ~1e-6)
    V.check_target_batch(x, "target_probs", 10)
    x[2, 7] = batch[2, 7] * (1 + 3 * V.ROW_SUM_TOL)
    with pytest.raises(InputError, match="must sum to 1"):
        V.check_target_batch(x, "target_probs", 10)


def test_shape_errors_keep_their_order_and_messages():
    with pytest.raises(InputError, match=r"target_probs has 4 classes.*fit on 3"):
        V.check_target_batch(np.full((5, 4), 0.25), "target_probs", 3)
    with pytest.raises(InputError, match=r"target_probs\[0\] has 4 classes"):
        V.check_target_batch(np.full((2, 5, 4), 0.25), "target_probs", 3)
    with pytest.raises(InputError, match="1 class column"):
        V.check_probabilities(np.ones((4, 1)), "probs")
    with pytest.raises(InputError, match="NaN"):          # non-finite is reported before the column count
        V.check_probabilities(np.full((4, 1), np.nan), "probs")
    with pytest.raises(InputError, match="empty"):
        V.check_probabilities(np.empty((0, 3)), "probs")
    with pytest.raises(InputError, match="2-D or 3-D"):
        V.check_probabilities(np.ones(3) / 3, "probs", (2, 3))
