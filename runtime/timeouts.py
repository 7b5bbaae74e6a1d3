"""Every network call's time limit, in one table: how long a command waits for Prefect, MLflow and S3 before it
treats a server that does not answer like one that is gone.

The libraries read most limits from environment variables at import; :func:`apply_timeouts` sets each one the user
has not set (before Prefect and MLflow are imported), so that a server that accepts connections and never answers
ends a call in tens of seconds instead of minutes (Prefect's defaults: about 6 minutes for one call; MLflow's: over
15). At 15 s each, a call to a frozen MLflow fails within 4 x 15 s + 12 s of back-off, one to a frozen S3 within
5 x 15 s (tests/integration/test_faults_stack.py); a healthy server answers in well under a second (these limits
are the wait for an answer's next bytes, not for a whole transfer). The table below is what ``docs/operations.md``
shows (a test keeps them equal). Raise ``MLFLOW_HTTP_REQUEST_TIMEOUT`` for large proxied artifacts over a slow link.

Two limits are the command's own: how long the Prefect server may stop answering during a run before the run is
stopped (:data:`ENV_SERVER_LOST_S`, watched by :mod:`runtime.server_watch`), and how long the command then gives
itself to end its MLflow run and leave (:data:`UNWIND_S`). This module only declares the limits and sets the
libraries' variables in the environment it is given; :mod:`runtime.environment` reads the command's own
(``server_lost_s``, ``worker_stop_s``) and applies the libraries' to this process.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass


__all__ = ["Limit", "limits", "ENV_SERVER_LOST_S", "SERVER_LOST_S", "UNWIND_S", "EXIT_DRAIN_S", "ENV_WORKER_STOP_S",
           "WORKER_STOP_S", "apply_timeouts"]

#: how long (seconds) the Prefect server may not answer during a run before the command stops the run
ENV_SERVER_LOST_S = "LABELSHIFT_SERVER_LOST_S"
SERVER_LOST_S = 15.0
#: seconds a command stopped for a lost server has to end its MLflow run before it exits regardless
UNWIND_S = 10.0
#: seconds the command waits at exit for Prefect's log and event queues to reach a server that still answers
EXIT_DRAIN_S = 15.0
#: how long (seconds) `labelshift worker`, stopped, gives its flow runs to end before it kills them. A whole stop
#: can take this + runtime.worker_guard's KILL_WAIT_S, SETTLE_BUDGET_S and WORKER_EXIT_S (50 s by default): give
#: the stopper as much (Kubernetes terminationGracePeriodSeconds, compose's stop_grace_period, systemd's 90 s)
ENV_WORKER_STOP_S = "LABELSHIFT_WORKER_STOP_S"
WORKER_STOP_S = 20.0


@dataclass(frozen=True)
class Limit:
    """One time limit: the variable that sets it (None: fixed in code), the value used when it is not set, and
    what it bounds."""

    variable: str | None
    value: str
    bounds: str


def limits() -> tuple[Limit, ...]:
    """Every time limit, in the order of docs/operations.md's table."""
    from labelshift.storage.s3 import S3Store     # here, not at import: the domain package loads scipy

    return (
        Limit("PREFECT_API_REQUEST_TIMEOUT", "30",
              "one request to the Prefect API, in seconds (Prefect's default 60)"),
        Limit("PREFECT_CLIENT_MAX_RETRIES", "3",
              "retries of a failed Prefect API request, 2, 4, 8 s apart (Prefect's default 5, up to 32 s apart)"),
        Limit("MLFLOW_HTTP_REQUEST_TIMEOUT", "15",
              "one request to an MLflow tracking server, in seconds (MLflow's default 120)"),
        Limit("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3",
              "retries of a failed MLflow request, 0, 4, 8 s apart (MLflow's default 7, up to 2 minutes apart)"),
        Limit(None, f"{S3Store.CONNECT_TIMEOUT_S:g} / {S3Store.READ_TIMEOUT_S:g}",
              "connecting to / reading from the S3 server, in seconds, with botocore's retries "
              "(`labelshift.storage.s3.S3Store`)"),
        Limit(ENV_SERVER_LOST_S, f"{SERVER_LOST_S:g}",
              "how long the Prefect server may not answer during a run (dead or frozen) before the command stops "
              "the run, in seconds"),
        Limit(None, f"{UNWIND_S:g}", "then, the time the command has to end its MLflow run and leave, in seconds"),
        Limit(None, f"{EXIT_DRAIN_S:g}",
              "at exit, the wait for Prefect's queued logs and events to reach the server, in seconds (Prefect "
              "waits forever)"),
        Limit(ENV_WORKER_STOP_S, f"{WORKER_STOP_S:g}",
              "`labelshift worker`, stopped (SIGTERM, Ctrl-C): the time its flow runs have to end (Crashed, their "
              "MLflow runs KILLED) before they are killed and marked so by the worker, in seconds"),
        Limit(None, "5 + 10 + 15",
              "then: the wait for killed flow runs to go, settling them (their MLflow runs KILLED, the flow run "
              "Crashed), the worker's own exit; give a stopper the sum with the grace (Kubernetes' "
              "terminationGracePeriodSeconds, compose's stop_grace_period: 60 s)"),
        Limit(None, "10",
              "an alert's webhook, per try: sent by the Prefect server's notification block (Prefect's own limit, "
              "not set here; `labelshift alerts --failures` lists what did not arrive)"),
    )



def apply_timeouts(environ: MutableMapping[str, str]) -> None:
    """Set in ``environ`` every limit of :func:`limits` that the libraries read from their own variables and that
    is not set already (:func:`runtime.environment.apply_time_limits` applies them to this process)."""
    for limit in limits():
        if limit.variable is not None and limit.variable not in (ENV_SERVER_LOST_S, ENV_WORKER_STOP_S):
            environ.setdefault(limit.variable, limit.value)
