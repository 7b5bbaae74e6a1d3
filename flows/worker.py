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

__all__ = ["settle_flow_run"]


def settle_flow_run(flow_run_id: str, killed: bool, environ: Mapping[str, str], *, why: str,
                    echo: Callable[[str], None] = print) -> None:
    """Mark ``flow_run_id`` Crashed if it is not in a final state yet, and end its RUNNING MLflow runs KILLED on
    the tracking server its process used (``environ``: that process's environment). ``why`` says who stopped it."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    from tasks.tracking import end_runs_of_flow_run

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        if not run.state.is_final():
            how = "was killed after it did not end in time" if killed else "ended before it could report"
            client.set_flow_run_state(run.id, Crashed(message=f"{why}; the flow run's process {how}"), force=True)
            echo(f"labelshift worker: flow run {run.name} ({flow_run_id}) marked Crashed (was {run.state.name})")
    tracking_uri = settings_mod.resolve(environ=environ).tracking_uri
    ended = end_runs_of_flow_run(tracking_uri, flow_run_id)
    if ended:
        echo(f"labelshift worker: {len(ended)} MLflow run(s) of flow run {flow_run_id} ended KILLED "
             f"({', '.join(ended)})")
