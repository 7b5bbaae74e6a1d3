"""The server watch and the time limits: a server that stops answering (closed, or frozen: it accepts connections
and never answers) is reported once within its bound; one that answers never is; the limits are set only where
the user has not set them, and a bad LABELSHIFT_SERVER_LOST_S is named."""
from __future__ import annotations

import socket
import time

import pytest

from labelshift.errors import InputError
from runtime.server_watch import ServerWatch
from runtime.environment import server_lost_s
from runtime.timeouts import ENV_SERVER_LOST_S, SERVER_LOST_S, limits, apply_timeouts

#: seconds without an answer before the watch reports; its questions come every INTERVAL_S and each may take
#: 2 * INTERVAL_S, so a report is due within LOST_S + 3 * INTERVAL_S of the last answer (plus scheduling slack)
LOST_S, INTERVAL_S = 1.0, 0.2


@pytest.fixture
def server(health_server):
    return health_server


def _watch(url: str):
    reports: list[tuple[float, str]] = []
    watch = ServerWatch(url, LOST_S, lambda reason: reports.append((time.monotonic(), reason)),
                        interval_s=INTERVAL_S)
    return watch, reports


def test_a_server_that_answers_is_never_reported(server):
    watch, reports = _watch(f"http://127.0.0.1:{server.server_port}/api/health")
    with watch:
        time.sleep(LOST_S * 3)
    assert reports == [] and watch.lost is None


def test_a_server_that_goes_away_is_reported_once_within_the_bound(server):
    watch, reports = _watch(f"http://127.0.0.1:{server.server_port}/api/health")
    with watch:
        time.sleep(INTERVAL_S * 3)                 # answered a few times
        server.shutdown()
        server.server_close()
        gone = time.monotonic()
        time.sleep(LOST_S + INTERVAL_S * 3 + 2.0)
    assert len(reports) == 1, reports
    assert LOST_S - INTERVAL_S <= reports[0][0] - gone <= LOST_S + INTERVAL_S * 3 + 1.0
    assert "stopped answering" in reports[0][1] and f":{server.server_port}/api" in reports[0][1]
    assert watch.lost == reports[0][1]


def test_a_frozen_server_that_accepts_and_never_answers_is_reported():
    with socket.socket() as frozen:                 # listening, never accepting: the kernel completes connections
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        watch, reports = _watch(f"http://127.0.0.1:{frozen.getsockname()[1]}/api/health")
        started = time.monotonic()
        with watch:
            time.sleep(LOST_S + INTERVAL_S * 3 + 2.0)
    assert len(reports) == 1, reports
    assert reports[0][0] - started <= LOST_S + INTERVAL_S * 3 + 1.5


def test_limits_are_set_where_the_user_has_not_set_them():
    env = {"PREFECT_API_REQUEST_TIMEOUT": "7"}
    apply_timeouts(env)
    assert env["PREFECT_API_REQUEST_TIMEOUT"] == "7"
    assert env["MLFLOW_HTTP_REQUEST_TIMEOUT"] == next(x.value for x in limits() if x.variable == "MLFLOW_HTTP_REQUEST_TIMEOUT")
    assert ENV_SERVER_LOST_S not in env              # read by the command itself, not exported


@pytest.mark.parametrize("text", ["soon", "1", "-5", "nan"])
def test_a_bad_server_lost_setting_is_named(text):
    with pytest.raises(InputError, match=ENV_SERVER_LOST_S):
        server_lost_s({ENV_SERVER_LOST_S: text})


def test_the_server_lost_setting_reads_seconds():
    assert server_lost_s({}) == SERVER_LOST_S
    assert server_lost_s({ENV_SERVER_LOST_S: " 4.5 "}) == 4.5
