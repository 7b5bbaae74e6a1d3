"""``labelshift worker``: a Prefect process worker whose flow runs end cleanly when it is stopped."""
from __future__ import annotations

import argparse
import sys
import textwrap

from runtime import environment as settings_mod
from runtime import timeouts
from stack.supervisor import DEFAULT_POOL
from flows.cli._common import UsageError

__all__ = ["register"]


def register(sub) -> None:
    stop_var = timeouts.ENV_WORKER_STOP_S
    p = sub.add_parser(
        "worker", help="a Prefect process worker whose flow runs end cleanly on SIGTERM (instead of staying Running)",
        description=textwrap.fill(
            "Run `prefect worker start --type process` on a work pool, so that deployments (prefect.yaml's, or "
            "those a sweep registers) run on this machine. Unlike Prefect's own process worker, which kills the "
            "flow runs it executes when it is stopped and leaves them Running in Prefect and RUNNING in MLflow "
            "for good, this one, on SIGTERM (systemctl stop, docker stop, Kubernetes) or Ctrl-C, first stops "
            "taking runs, sends SIGTERM to each flow run and waits for them to end (Crashed in Prefect, their "
            "MLflow runs KILLED) for --stop-grace seconds; a run still going then is killed, marked Crashed and "
            "its MLflow runs ended KILLED by the worker itself. The same happens to the runs in flight when the "
            f"Prefect server stops answering for ${timeouts.ENV_SERVER_LOST_S} seconds "
            f"({timeouts.SERVER_LOST_S:g}); the worker then goes on and marks them Crashed once the server is "
            "back. Needs PREFECT_API_URL (the server of the deployments).", 79),
        epilog="examples:\n"
               "  labelshift worker                                  # pool 'labelshift', this host's name\n"
               "  labelshift worker --pool gpu --limit 2 --name gpu-0\n"
               "  labelshift worker -- --prefetch-seconds 30         # more options for `prefect worker start`\n"
               "Exit status: the worker's own, 143 after SIGTERM, 130 after Ctrl-C, 2 bad options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"work pool to poll (default: {DEFAULT_POOL})")
    p.add_argument("--name", help="worker name shown in the Prefect UI (default: Prefect's, from the host name)")
    p.add_argument("--limit", type=int, metavar="N", help="flow runs executed at the same time (default: no limit)")
    p.add_argument("--stop-grace", type=float, metavar="S",
                   help=f"seconds the flow runs have to end once the worker is stopped (default: ${stop_var} or "
                        f"{timeouts.WORKER_STOP_S:g}); keep it under the stopper's own grace (Kubernetes 30 s, "
                        "systemd 90 s)")
    p.add_argument("prefect_args", nargs=argparse.REMAINDER, metavar="-- OPTION ...",
                   help="further options of `prefect worker start`, after --")
    p.set_defaults(handler=run)


def prefect_command(args) -> list[str]:
    """The `prefect worker start` command line of ``args``."""
    extra = list(args.prefect_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.name:
        command += ["--name", args.name]
    if args.limit is not None:
        if args.limit < 1:
            raise UsageError(f"--limit must be at least 1, got {args.limit}")
        command += ["--limit", str(args.limit)]
    return command + extra


def run(args) -> int:
    from labelshift.errors import InputError
    from stack.access import with_prefect_websocket_auth
    from runtime.worker_guard import run_worker

    command = prefect_command(args)
    if not settings_mod.read(settings_mod.ENV_PREFECT_API_URL):
        raise UsageError(f"{settings_mod.ENV_PREFECT_API_URL} is not set: a worker polls the Prefect server the "
                         "deployments are on; export it (the local stack's: source <home>/stack/env.sh)")
    try:
        grace = args.stop_grace if args.stop_grace is not None else settings_mod.worker_stop_s()
    except InputError as exc:
        raise UsageError(str(exc)) from None
    if not 1 <= grace < 1e6:
        raise UsageError(f"--stop-grace must be a number of seconds, 1 or more; got {grace:g}")
    settings_mod.apply_time_limits()     # this process's own calls (settling runs) and the flow runs inherit them
    # Prefect's websockets carry the credentials a proxy checks
    env = with_prefect_websocket_auth(settings_mod.child_environment())
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        lost_after = settings_mod.server_lost_s()
    except InputError as exc:
        raise UsageError(str(exc)) from None
    return run_worker(command, env=env, grace_s=grace, settle=_settle, echo=_echo,
                      api_url=settings_mod.read(settings_mod.ENV_PREFECT_API_URL), lost_after_s=lost_after)


def _settle(flow_run_id: str, killed: bool, environ: dict, why: str, server_answers: bool) -> None:
    from flows.worker import settle_flow_run

    settle_flow_run(flow_run_id, killed, environ, why=why, server_answers=server_answers, echo=_echo)


def _echo(text: str) -> None:
    print(text, flush=True)
