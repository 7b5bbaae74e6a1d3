"""``labelshift serve``: the reproduce and reestimate flows as deployments served by this process."""
from __future__ import annotations

import argparse
import textwrap

from runtime import environment as settings_mod
from flows.cli._common import UsageError, add_common, setup

__all__ = ["register"]


def register(sub) -> None:
    cron_var, zone_var = settings_mod.ENV_CRON, settings_mod.ENV_TIMEZONE
    p = sub.add_parser(
        "serve", help="serve the reproduce and reestimate flows as deployments (UI launches, cron schedule)",
        description=textwrap.fill(
            "Register two Prefect deployments and run the flow runs they are asked for, until stopped (Ctrl-C or "
            "SIGTERM): 'reproduce/reproduce', the paper's sweeps, whose parameters appear as a form in the Prefect "
            "UI (Deployments > reproduce/reproduce > Run > Custom run); and 'reestimate/reestimate', the "
            "re-estimation of the target label distribution on new batches, on the cron schedule of --cron (or "
            f"${cron_var}) if given, else unscheduled (Run > Quick run in the UI, or `prefect deployment run "
            "reestimate/reestimate`), one run at a time. With "
            f"{settings_mod.ENV_PREFECT_API_URL} set the deployments go to that "
            "server; without it a Prefect server with its UI is started for as long as this command runs (state "
            "under --home). Stopping pauses the schedule; the next serve resumes it.", 79),
        epilog="examples:\n"
               "  labelshift serve                              # both deployments, reestimate unscheduled\n"
               "  labelshift serve --cron '0 6 * * *'           # reestimate daily at 06:00 UTC\n"
               "  labelshift serve --cron '30 5 * * mon-fri' --timezone Europe/Paris \\\n"
               "      --model models:/labelshift-mnist-5k@latest-good --target s3://labelshift/store/target\n"
               "A flag wins over its environment variable. Exit status: 0 stopped, 1 a server or the deployments "
               "failed,\n2 bad options (e.g. a malformed cron string: nothing is registered).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, top=False)
    d = p.add_argument_group("the deployments")
    d.add_argument("--name", default="reproduce", help="name of the reproduce deployment (default: reproduce)")
    d.add_argument("--reestimate-name", default="reestimate", metavar="NAME",
                   help="name of the reestimate deployment (default: reestimate)")
    d.add_argument("--limit", type=int, default=1, metavar="N",
                   help="flow runs this process executes at the same time, both deployments together (default: 1)")
    d.add_argument("--port", type=int, default=4200,
                   help=f"port of the Prefect server started when {settings_mod.ENV_PREFECT_API_URL} is not set "
                        "(default: 4200)")
    r = p.add_argument_group("re-estimation schedule and defaults")
    r.add_argument("--cron", metavar="'M H DOM MON DOW'",
                   help="cron schedule of reestimate: five fields minute hour day-of-month month day-of-week, e.g. "
                        f"'0 6 * * *' for daily at 06:00 (default: ${cron_var}; neither: no schedule). Checked "
                        "before anything is registered")
    r.add_argument("--timezone", metavar="ZONE",
                   help=f"IANA time zone the cron hours are read in, e.g. Europe/Paris (default: ${zone_var} "
                        f"or {settings_mod.DEFAULT_TIMEZONE})")
    r.add_argument("--model", metavar="URI",
                   help="default model of reestimate runs, models:/NAME@ALIAS in the MLflow registry (its "
                        f"calibrator is logged beside it) (default: ${settings_mod.ENV_MODEL} or the flow's own "
                        "default, models:/labelshift-mnist-5k@latest-good)")
    r.add_argument("--target", metavar="URI",
                   help="default target location of reestimate runs, where new batches arrive: s3://bucket/prefix "
                        f"or a folder (default: ${settings_mod.ENV_TARGET} or the flow's own default, "
                        "<store>/target)")
    o = p.add_argument_group("where runs put results (inherited by every run)")
    o.add_argument("--store", metavar="URI", help=f"object store of the runs (default: ${settings_mod.ENV_STORE} "
                                                  "or <home>/store)")
    o.add_argument("--tracking-uri", metavar="URI", help="MLflow tracking URI of the runs (default: "
                                                         f"${settings_mod.ENV_TRACKING_URI} or "
                                                         "sqlite:///<home>/mlflow.db)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from flows import serve as serve_mod

    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    # flags and variables resolved before anything starts; the schedule itself is checked by Prefect's own
    # validator in serve_deployments, before a server is started or a deployment registered
    options = serve_mod.reestimate_options(cron=args.cron, timezone=args.timezone, model=args.model,
                                           target=args.target)
    env = setup(args, store_uri=args.store, tracking_uri=args.tracking_uri)
    try:
        return serve_mod.serve_deployments(env, name=args.name, reestimate_name=args.reestimate_name,
                                           port=args.port, limit=args.limit, reestimate=options)
    except serve_mod.ScheduleError as exc:
        raise UsageError(str(exc)) from None
