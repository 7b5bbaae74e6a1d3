"""What ``labelshift worker`` does for a flow run it stopped: make sure the run does not stay Running.

A flow run's process that ends on SIGTERM reports itself (Prefect: Crashed, "aborted by a termination signal"; the
flows end their MLflow runs KILLED). One that had to be killed, or that ended before it could report (SIGTERM while
it was still starting), cannot: :func:`settle_flow_run` then marks the flow run Crashed with a message saying why,
and ends its MLflow runs still RUNNING as KILLED (they carry the flow run's id as a tag).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from uuid import UUID

from runtime import environment as settings_mod

__all__ = ["settle_flow_run", "PrefectNotAnswering"]


class PrefectNotAnswering(RuntimeError):
    """The flow run could not be marked Crashed yet: its Prefect server does not answer (tried again later)."""


def settle_flow_run(flow_run_id: str, killed: bool, environ: Mapping[str, str], *, why: str,
                    server_answers: bool = True, echo: Callable[[str], None] = print) -> None:
    """End the RUNNING MLflow runs of ``flow_run_id`` KILLED on the tracking server its process used (``environ``:
    that process's environment), then mark the flow run Crashed if it is not in a final state yet. ``why`` says who
    stopped it. Each half is tried even when the other fails (a lost Prefect server must not keep the MLflow runs
    RUNNING); the first failure is raised after both were tried. While the Prefect server does not answer
    (``server_answers`` False) the second half is not tried: :class:`PrefectNotAnswering` says so."""
    failures = []
    for step in (_end_mlflow_runs, _mark_crashed):
        try:
            if step is _mark_crashed and not server_answers:
                raise PrefectNotAnswering("the Prefect server does not answer; the run is marked Crashed once it "
                                          "does")
            step(flow_run_id, killed, environ, why, echo)
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


def _end_mlflow_runs(flow_run_id: str, killed: bool, environ: Mapping[str, str], why: str,
                     echo: Callable[[str], None]) -> None:
    from tasks.tracking import end_runs_of_flow_run

    tracking_uri = settings_mod.resolve(environ=environ).tracking_uri
    if not tracking_uri.startswith(("http://", "https://")):
        # a local store is a path on the run's side (relative to its folder): not guessed from here
        echo(f"labelshift worker: MLflow runs of flow run {flow_run_id} not checked: it tracked to {tracking_uri}")
        return
    ended = end_runs_of_flow_run(tracking_uri, flow_run_id)
    if ended:
        echo(f"labelshift worker: {len(ended)} MLflow run(s) of flow run {flow_run_id} ended KILLED "
             f"({', '.join(ended)})")


def _mark_crashed(flow_run_id: str, killed: bool, environ: Mapping[str, str], why: str,
                  echo: Callable[[str], None]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        if not run.state.is_final():
            how = "was killed before it ended" if killed else "ended before it could report"
            client.set_flow_run_state(run.id, Crashed(message=f"{why}; the flow run's process {how}"), force=True)
            echo(f"labelshift worker: flow run {run.name} ({flow_run_id}) marked Crashed (was {run.state.name})")
