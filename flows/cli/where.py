"""``labelshift where``: the resolved locations of state, results and tracking."""
from __future__ import annotations

from runtime import environment as settings_mod
from flows.cli._common import add_common

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("where", help="print where state, results and tracking go (resolved settings)",
                       description="Print the resolved locations: state folder, object store, MLflow tracking URI "
                                   "and the command that opens its UI, and the Prefect API in use.")
    add_common(p, top=False)
    p.set_defaults(handler=run)


def run(args) -> int:
    env = settings_mod.resolve(getattr(args, "home", None))
    print(f"state folder:    {env.home}")
    print(f"object store:    {env.store_uri}")
    print(f"MLflow tracking: {env.tracking_uri}")
    print(f"MLflow UI:       {env.mlflow_ui_command()}")
    temporary = f"a temporary server per command (PREFECT_HOME={env.prefect_home})"
    print(f"Prefect API:     {env.prefect_api_url or temporary}")
    return 0
