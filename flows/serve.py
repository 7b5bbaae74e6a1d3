"""``labelshift serve``: the ``reproduce`` and ``reestimate`` flows as Prefect deployments served by one process
(docs/operations.md).

``reproduce/reproduce`` runs the paper's sweeps, launched from the Prefect UI's form; ``reestimate/reestimate``
re-estimates the target label distribution (:mod:`flows.reestimate`) on a cron schedule when one is given, one run
at a time (concurrency limit 1). A malformed cron string or time zone stops the command before anything is
registered; on Ctrl-C (or SIGTERM) the schedule is paused, and the next ``labelshift serve`` resumes it. Runs
execute here (``--limit`` at a time) in subprocesses that inherit this process's environment. For work pools and
many workers use the ``prefect.yaml`` at the repository root instead (infra/README.md).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from runtime.processes import ServiceProcess, http_ok
from stack.supervisor import prefect_server_command
from runtime import environment as settings_mod
from runtime.environment import DEFAULT_TIMEZONE, ENV_CRON, ENV_MODEL, ENV_TARGET, ENV_TIMEZONE, Settings
from labelshift.errors import InputError, ServiceUnavailableError

__all__ = ["serve_deployments", "build_deployments", "reestimate_options", "check_schedule", "next_runs",
           "ReestimateOptions", "ScheduleError", "start_prefect_server", "DEPLOYMENT_DESCRIPTION",
           "REESTIMATE_DESCRIPTION", "ENV_CRON", "ENV_TIMEZONE", "ENV_MODEL", "ENV_TARGET"]

#: seconds the Prefect server started here gets to shut down before it is killed
_SERVER_STOP_GRACE_S = 15.0

DEPLOYMENT_DESCRIPTION = (
    "Reproduce the label-shift experiments of Garg et al. (NeurIPS 2020), Section 6: weight MSE of BBSE, RLLS, "
    "MLLS-CM and MLLS against the shift, the target size and the number of calibration bins, on two Gaussians. "
    "Results: an MLflow parent run (figures, per-seed tables) with one child run per method, tables and figures in "
    "the object store, and a markdown artifact here.")

REESTIMATE_DESCRIPTION = (
    "Re-estimate the target label distribution from the unlabelled batches that arrived in the target location "
    "since the last successful run (MLLS with a BBSE cross-check, Garg et al. 2020): per-class confidence "
    "intervals, a test of 'no shift', identifiability diagnostics, corrected predictions written next to each "
    "batch, one MLflow run per re-estimation, and a markdown artifact here. One run at a time.")


class ScheduleError(InputError):
    """The cron string or the time zone of the re-estimation schedule is malformed."""


@dataclass(frozen=True)
class ReestimateOptions:
    """How ``reestimate`` is served: its cron (None: unscheduled) and IANA zone, the deployment's default
    parameters given (``model``, ``target``), and where the cron came from (for error messages)."""

    cron: str | None = None
    timezone: str = DEFAULT_TIMEZONE
    parameters: dict[str, str] = field(default_factory=dict)
    cron_from: str = "--cron"


def reestimate_options(cron: str | None = None, timezone: str | None = None, model: str | None = None,
                       target: str | None = None, environ: Mapping[str, str] | None = None) -> ReestimateOptions:
    """Resolve the re-estimation options: each argument wins over its environment variable (without importing
    Prefect; :func:`check_schedule` validates the result)."""
    env = settings_mod.resolve(environ=environ)

    def pick(value, from_env, variable):
        if value is not None and str(value).strip():
            return str(value).strip(), None
        return (from_env, variable) if from_env else (None, None)

    cron_value, cron_var = pick(cron, env.reestimate_cron, ENV_CRON)
    zone, _ = pick(timezone, env.reestimate_timezone, ENV_TIMEZONE)
    parameters = {}
    for name, value, from_env, variable in (("model", model, env.model, ENV_MODEL),
                                            ("target", target, env.target, ENV_TARGET)):
        chosen, _ = pick(value, from_env, variable)
        if chosen is not None:
            parameters[name] = chosen
    return ReestimateOptions(cron=cron_value, timezone=zone or DEFAULT_TIMEZONE, parameters=parameters,
                             cron_from=f"${cron_var}" if cron_var else "--cron")


def check_schedule(cron: str, timezone: str = DEFAULT_TIMEZONE, *, source: str = "--cron"):
    """Validate a cron string and time zone as the Prefect server will (ScheduleError); Prefect's ``CronSchedule``."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as exc:
        problems = "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.errors())
        raise ScheduleError(
            f"{source} {cron!r} with time zone {timezone!r} is not a valid schedule: {problems}. A cron string has "
            f"five fields, minute hour day-of-month month day-of-week, e.g. '0 6 * * *' (daily at 06:00) or "
            f"'30 5 * * mon-fri'; the zone is an IANA name such as UTC or Europe/Paris.") from None


def next_runs(cron: str, timezone: str, count: int = 2) -> list[datetime]:
    """The next ``count`` times the schedule fires, in its zone (for the operator's confirmation message)."""
    from zoneinfo import ZoneInfo

    from prefect._vendor.croniter import croniter

    it = croniter(cron, datetime.now(ZoneInfo(timezone)))
    return [it.get_next(datetime) for _ in range(count)]


def build_deployments(*, name: str = "reproduce", reestimate_name: str = "reestimate",
                      reestimate: ReestimateOptions | None = None) -> list:
    """The runner deployments, validated (ScheduleError, InputError); nothing is registered yet. Imports Prefect
    and the flows: call it once PREFECT_API_URL is final."""
    reestimate = reestimate or ReestimateOptions()
    schedules = None
    if reestimate.cron:
        schedules = [check_schedule(reestimate.cron, reestimate.timezone, source=reestimate.cron_from)]

    from prefect.deployments.runner import EntrypointType
    from prefect.exceptions import ParameterTypeError

    from flows.reestimate import reestimate as reestimate_flow
    from flows.reproduce import reproduce

    try:
        reestimate_flow.validate_parameters(dict(reestimate.parameters))
    except ParameterTypeError as exc:
        raise InputError(f"--model/--target (or ${ENV_MODEL}/${ENV_TARGET}): {exc}") from None
    # by module path: served runs import the installed package, whatever the working directory
    by_module = EntrypointType.MODULE_PATH
    from flows.forms import reproduce_deployments

    return [
        *reproduce_deployments(reproduce, name=name, description=DEPLOYMENT_DESCRIPTION,
                               tags=["labelshift", "paper-reproduction"], entrypoint_type=by_module),
        reestimate_flow.to_deployment(name=reestimate_name, description=REESTIMATE_DESCRIPTION,
                                      tags=["labelshift", "operations"], schedules=schedules,
                                      parameters=dict(reestimate.parameters), concurrency_limit=1,
                                      entrypoint_type=by_module),
    ]


def start_prefect_server(prefect_home: Path, port: int, *, timeout_s: float = 120.0,
                         log_path: Path | None = None) -> tuple[ServiceProcess, str]:
    """Start ``prefect server start`` on 127.0.0.1:port with its state under ``prefect_home``; wait until healthy.
    Returns the process and the API URL; ServiceUnavailableError (the server stopped again) if it does not answer."""
    prefect_home.mkdir(parents=True, exist_ok=True)
    log_path = log_path or prefect_home / "server.log"
    env = settings_mod.child_environment(
        {"PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
         "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
        drop=(settings_mod.ENV_PREFECT_API_URL,))
    api_url = f"http://127.0.0.1:{port}/api"
    # a session of its own: a terminal's Ctrl-C reaches only this process, which first lets Prefect pause the
    # served schedules on the server, then stops the server (see serve_deployments)
    # it ends with this process even when this one is killed outright (runtime.lifetime)
    server = ServiceProcess(prefect_server_command(port, "127.0.0.1"), log=log_path, env=env,
                            name="the Prefect server", die_with_parent=True).start()
    try:
        server.wait_ready(lambda: http_ok(f"{api_url}/health"), timeout_s, what=f"on {api_url}",
                          if_exited=f" (is port {port} taken? try --port)", step=0.5, error=ServiceUnavailableError)
    except BaseException:
        server.stop(_SERVER_STOP_GRACE_S)
        raise
    return server, api_url


def _describe(ui: str, name: str, reestimate_name: str, options: ReestimateOptions, env: Settings) -> str:
    lines = [f"Deployment 'reproduce/{name}' (two Gaussians) and 'reproduce/{name}-images' (image datasets): open "
             f"{ui}/deployments, pick one, then Run > Custom run to edit the parameters and launch a sweep."]
    if options.cron:
        when = ", ".join(f"{t:%Y-%m-%d %H:%M %Z}" for t in next_runs(options.cron, options.timezone))
        lines.append(f"Deployment 'reestimate/{reestimate_name}': scheduled '{options.cron}' ({options.timezone}), "
                     f"next runs {when}; one run at a time.")
    else:
        lines.append(f"Deployment 'reestimate/{reestimate_name}': no schedule (give --cron or ${ENV_CRON}); run it "
                     f"from the UI or with `prefect deployment run reestimate/{reestimate_name}`.")
    if options.parameters:
        lines.append("  its defaults: " + ", ".join(f"{k}={v}" for k, v in options.parameters.items()))
    lines.append(f"Runs log to MLflow at {env.tracking_uri} and store results in {env.store_uri}. "
                 f"Stop with Ctrl-C.")
    return "\n".join(lines)


def serve_deployments(env: Settings, *, name: str = "reproduce", reestimate_name: str = "reestimate",
                      port: int = 4200, limit: int = 1, reestimate: ReestimateOptions | None = None) -> int:
    """Serve the deployments until interrupted; they are validated before any server is started or anything
    registered. Returns an exit status."""
    reestimate = reestimate or ReestimateOptions()
    server = None
    if env.prefect_api_url is None:
        # Prefect reads PREFECT_API_URL once, at import: point it at the server started below before importing it
        settings_mod.export(settings_mod.ENV_PREFECT_API_URL, f"http://127.0.0.1:{port}/api")
    deployments = build_deployments(name=name, reestimate_name=reestimate_name, reestimate=reestimate)
    if env.prefect_api_url is None:
        print(f"Starting a Prefect server with its UI on http://127.0.0.1:{port} (state in {env.prefect_home}) ...")
        server, _ = start_prefect_server(env.prefect_home, port)
    status = 0
    try:
        from prefect import serve

        ui = settings_mod.read(settings_mod.ENV_PREFECT_API_URL).removesuffix("/api")
        print(_describe(ui, name, reestimate_name, reestimate, env), flush=True)
        serve(*deployments, limit=limit)
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:             # SIGTERM handled as a clean stop (exit 0), or an explicit exit status
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if server is None:
            raise
    except BaseException as exc:
        status = 1
        if server is None:
            raise
        # the process ends in the finally below, so say here what went wrong
        print(f"labelshift serve: error: serving failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        if server is not None:
            server.stop(_SERVER_STOP_GRACE_S)
            print("Stopped the Prefect server.")
            sys.stdout.flush()
            sys.stderr.flush()
            # Prefect's background services would now retry delivering their last events to the server just
            # stopped, keeping the process alive for minutes: end it here (everything of ours is closed).
            os._exit(status)
    return status
