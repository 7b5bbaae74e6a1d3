"""The flow's commit (flows/reestimate.py): when the conditional write fails, the watermark is read back once --
through the store's single-attempt form -- to see whether the write landed before the error."""
import pytest

import numpy as np

from labelshift.errors import ServiceUnavailableError
from labelshift.monitoring.listing import find_new_batches
from labelshift.storage import LocalStore


class _Unanswering(LocalStore):
    """A store whose writes fail as an unanswering S3 does; ``tried_once`` hands out a store that records its use."""

    def __init__(self, root, read_back_fails: bool):
        super().__init__(root)
        self.read_back_fails, self.read_back = read_back_fails, []

    def compare_and_swap(self, key, data, expected, *, content_type=None):
        if not self.read_back_fails:          # the write lands, then the answer is lost
            LocalStore.compare_and_swap(self, key, data, expected, content_type=content_type)
        raise ServiceUnavailableError(f"cannot write {key}: the endpoint did not answer")

    def tried_once(self):
        outer = self

        class _Once(LocalStore):
            def read_versioned(self, key):
                outer.read_back.append(key)
                if outer.read_back_fails:
                    raise ServiceUnavailableError(f"cannot read {key}: the endpoint did not answer")
                return LocalStore.read_versioned(self, key)
        return _Once(self.root)


@pytest.mark.parametrize("landed", [False, True], ids=["not-landed", "landed"])
def test_a_failed_commit_is_read_back_once_without_retries(tmp_path, landed):
    """The write did not land: the commit's own error is raised, after one read through ``tried_once``. It landed
    (its answer lost): the run goes on as committed, with the watermark as read back."""
    from flows import reestimate as flow

    store = _Unanswering(tmp_path / "t", read_back_fails=not landed)
    store.put_array("a.npy", np.zeros((2, 3), dtype=np.float32))
    batches, before = find_new_batches(store)
    record = {"model": None, "mlflow_run_id": "run-1"}
    if not landed:
        with pytest.raises(ServiceUnavailableError, match="cannot write"):
            flow._commit(store, before, batches, record, "run-1")
    else:
        committed = flow._commit(store, before, batches, record, "run-1")
        assert committed.sequence == before.sequence + 1 and committed.history[-1]["mlflow_run_id"] == "run-1"
    assert store.read_back == ["_labelshift/watermark.json"]
