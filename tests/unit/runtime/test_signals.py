"""runtime.signals: a stop (SIGTERM here) handled outside the database driver, or held to the end of a block.

The signals are real (sent to this process by a timer thread), the handlers the test's own; the last test runs
MLflow's SQLite store, the one whose connection a stop landing inside SQLAlchemy left locked."""
import os
import random
import signal
import sqlite3
import threading
import time

import pytest

from runtime.signals import stops_held, stops_outside


class Stop(BaseException):
    pass


@pytest.fixture
def handled():
    """SIGTERM's handler for the test: records the time it ran and raises Stop (as Prefect's raises)."""
    seen: list[float] = []

    def handler(sig, frame):
        seen.append(time.perf_counter())
        raise Stop()

    previous = signal.signal(signal.SIGTERM, handler)
    yield seen
    signal.signal(signal.SIGTERM, previous)


def _sigterm_after(seconds: float, into: list | None = None) -> threading.Thread:
    """A thread that sends this process SIGTERM ``seconds`` after this call is about to return (counted from then: a
    Timer's clock starts in its thread, so on a busy machine the stop could come while ``start()`` still waits);
    appended to ``into`` first, for a caller that may be stopped before this returns."""
    go = threading.Event()

    def fire():
        go.wait()
        time.sleep(seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    if into is not None:
        into.append(thread)
    go.set()
    return thread


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


#: a stand-in for the driver: a function whose module is named ``fakedriver.engine``
_driver: dict = {"__name__": "fakedriver.engine", "_busy": _busy}
exec("def commit(seconds):\n    _busy(seconds)\n", _driver)


def test_a_stop_inside_the_driver_is_handled_as_the_block_ends(handled):
    with pytest.raises(Stop):
        with stops_outside(modules=("fakedriver",)):
            _sigterm_after(0.05)
            _driver["commit"](0.3)                  # the stop lands in here: noted, not handled
            _busy(0.3)                              # nor here, once noted
            ended = time.perf_counter()
    assert len(handled) == 1 and handled[0] >= ended
    assert signal.getsignal(signal.SIGTERM).__name__ == "handler"      # the handler the block found, back


def test_a_stop_outside_the_driver_is_handled_at_once(handled):
    t0 = time.perf_counter()
    with pytest.raises(Stop):
        with stops_outside(modules=("fakedriver",)):
            _sigterm_after(0.05)
            _busy(2.0)
    assert len(handled) == 1 and handled[0] - t0 < 1.0


def test_as_a_decorator_each_call_is_a_block_of_its_own(handled):
    @stops_outside(modules=("fakedriver",))
    def step(seconds):
        _driver["commit"](seconds)

    step(0.0)
    assert handled == [] and signal.getsignal(signal.SIGTERM).__name__ == "handler"
    timer = _sigterm_after(0.05)
    with pytest.raises(Stop):
        step(0.3)
    timer.join()
    assert len(handled) == 1


def test_a_held_stop_is_handled_once_as_the_block_ends(handled):
    with pytest.raises(Stop):
        with stops_held():
            _sigterm_after(0.02).join()
            _sigterm_after(0.02).join()
            _busy(0.1)
            ended = time.perf_counter()
    assert len(handled) == 1 and handled[0] >= ended
    with stops_held():                              # nothing noted: nothing handled
        pass
    assert len(handled) == 1


def test_a_stop_held_inside_stops_outside_reaches_the_handler_as_the_inner_block_ends(handled):
    with pytest.raises(Stop):
        with stops_outside(modules=("fakedriver",)):
            with stops_held():
                _sigterm_after(0.02).join()
                _busy(0.05)
                inner = time.perf_counter()
            _busy(1.0)                              # not reached: the stop is handled before
    assert len(handled) == 1 and inner <= handled[0] < inner + 0.5


def test_ctrl_c_is_held_too_and_an_ignored_signal_is_left_alone():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            with stops_held():
                assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)   # ignored, as before the block
                _busy(0.1)
                reached = True
        assert reached
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_off_the_main_thread_the_blocks_change_nothing(handled):
    seen = []

    def other():
        with stops_outside(), stops_held():
            seen.append(signal.getsignal(signal.SIGTERM).__name__)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == ["handler"]


def test_stops_at_random_moments_of_mlflow_writes_never_leave_sqlite_locked(handled, tmp_path):
    """Without stops_outside a stop landing in SQLAlchemy left the file locked within the first 5 of such trials
    (3 runs of this loop); with it, none may: after each stop, a second connection takes the exclusive lock. Most
    stops land inside the driver (then handled as the block ends, the writes done); the test asserts some did."""
    from mlflow import MlflowClient

    db = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.create_experiment("e")
    rng = random.Random(0)
    stopped = deferred = 0
    for _ in range(25):
        done, timers = False, []
        try:
            _sigterm_after(rng.uniform(0.0, 0.02), timers)     # inside the try: the stop may come as it returns
            with stops_outside():
                for i in range(10):
                    run = client.create_run(experiment, run_name=f"r{i}")
                    client.log_param(run.info.run_id, "p", "v")
                    client.search_runs([experiment], max_results=5)
                done = True
            _busy(0.5)
        except Stop:
            stopped += 1
            deferred += done
        timers[0].join()
        with sqlite3.connect(db, timeout=2.0) as other:
            other.execute("BEGIN EXCLUSIVE")        # raises "database is locked" if a connection kept its lock
            other.execute("ROLLBACK")
    assert stopped == 25 and deferred >= 5
