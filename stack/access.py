"""Who may do what in the container stack (infra/compose.yaml): the roles, the variables of infra/.env that hold
each role's credentials, and what the servers are given from them.

- **Prefect**: the proxy (``infra/proxy/``: nginx) checks each role's user and password on every request and on
  every websocket's upgrade (clients send ``PREFECT_API_AUTH_STRING`` = ``user:password``; the UI's browser asks)
  and refuses, by method and path, what the role may not do (``infra/proxy/roles.conf``). The server has no auth
  string of its own: Prefect's one string could not tell roles apart, and its websockets check the token of their
  first message against that one string, which no proxy can rewrite. Only the proxy reaches the server.
- **MLflow**: the ``basic-auth`` app (``infra/mlflow/basic_auth.ini``): the operator is MLflow's admin; the
  workers' and readers' users are created at start by ``python -m stack.access mlflow-users``. MLflow's default
  permission is EDIT (a worker writes to experiments it did not create); the proxy checks the same passwords and
  keeps readers to reads and workers off the model registry.
- **S3** (SeaweedFS): one identity per role (``python -m stack.access s3-config FILE``, the ``-s3.config`` file):
  the operator's has every right (buckets included; the MLflow server proxies artifacts with it), the workers' reads,
  lists, tags and writes objects of the stack's bucket only, the reader's reads and lists them.

:data:`ROLES` is the table infra/README.md shows (a test keeps them equal). Standard library only (and, in
:func:`main`, :mod:`runtime.environment`, which is too): it runs in the containers before anything else.
"""
from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Role", "ROLES", "S3_KEYS", "PASSWORDS", "s3_identities", "write_s3_config", "ensure_mlflow_user",
           "SECRETS", "secret_values", "MIN_PASSWORD_LENGTH", "basic_token", "prefect_client_environment",
           "with_prefect_websocket_auth"]

#: the MLflow auth app refuses shorter passwords
MIN_PASSWORD_LENGTH = 12


@dataclass(frozen=True)
class Role:
    """One role: who holds it and what it may do on each server."""

    name: str
    held_by: str
    prefect: str
    mlflow: str
    s3: str


ROLES = (
    Role("operator", "the person running the stack (their machine's client environment)",
         "everything", "admin: everything, the model registry, users and permissions included",
         "every bucket and object (creates the bucket; the MLflow server's artifact proxy)"),
    Role("worker", "the workers' containers (and a worker on another machine)",
         "run the flow runs it is handed (their states and pid, task runs, logs, artifacts, concurrency slots, "
         "events; its heartbeat, its pool's scheduled runs), read; not create flow runs (start a run), nor change "
         "deployments, automations, blocks, variables or work pools, nor read blocks' secrets",
         "write its runs (create, update, metrics, params, tags, inputs, outputs), create experiments, log models "
         "and upload artifacts, read; not the model registry (register, version, alias, tag), webhooks, users, "
         "permissions or passwords, nor delete",
         "read, list, tag and write objects of the stack's bucket; no bucket operations, no other bucket"),
    Role("reader", "whoever only looks at results",
         "read: the UI, the REST API's reads and filters, the events and logs it may follow; not start a run, "
         "change anything, emit events nor read blocks' secrets",
         "read: the UI, runs, metrics, artifacts (the results page), the registry",
         "read and list objects of the stack's bucket"),
)

#: role -> (access key variable, secret key variable) in infra/.env
S3_KEYS = {"operator": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
           "worker": ("LABELSHIFT_S3_WORKER_ACCESS_KEY_ID", "LABELSHIFT_S3_WORKER_SECRET_ACCESS_KEY"),
           "reader": ("LABELSHIFT_S3_READER_ACCESS_KEY_ID", "LABELSHIFT_S3_READER_SECRET_ACCESS_KEY")}
_S3_ACTIONS = {"operator": ("Admin", "Read", "List", "Tagging", "Write"),
               "worker": ("Read", "List", "Tagging", "Write"),
               "reader": ("Read", "List")}

#: service -> role -> the variable of infra/.env holding that role's password (the proxy's password files; MLflow's
#: users too)
PASSWORDS = {service: {role: f"LABELSHIFT_{service.upper()}_{role.upper()}_PASSWORD"
                       for role in ("operator", "worker", "reader")} for service in ("prefect", "mlflow")}

#: every secret of infra/.env (checked for in logs, parameters and params by make stack-e2e)
SECRETS = ("AWS_SECRET_ACCESS_KEY", "LABELSHIFT_S3_WORKER_SECRET_ACCESS_KEY", "LABELSHIFT_S3_READER_SECRET_ACCESS_KEY",
           "POSTGRES_PASSWORD", *PASSWORDS["prefect"].values(), *PASSWORDS["mlflow"].values(),
           "LABELSHIFT_MLFLOW_SECRET_KEY")


def basic_token(auth: str) -> str:
    """The basic-auth token of ``auth`` (``user:password``): what follows ``Basic`` in an Authorization header."""
    return base64.b64encode(auth.encode()).decode()


def secret_values(values: Mapping[str, str]) -> dict[str, str]:
    """name -> value of every secret of :data:`SECRETS` in ``values`` (an env file's), and of each role password's
    :func:`basic_token` (the form an Authorization header would leak it in): what must appear nowhere."""
    found = {name: values[name] for name in SECRETS}
    found.update({f"{name} (as a header)": basic_token(f"{role}:{values[name]}")
                  for roles in PASSWORDS.values() for role, name in roles.items()})
    return found


def s3_identities(environ: Mapping[str, str], bucket: str) -> dict:
    """SeaweedFS's identity file: one identity per role of :data:`S3_KEYS`, its actions as the module says (the
    non-operator ones limited to ``bucket``). Raises KeyError naming a missing variable."""
    identities = []
    for role, (key_var, secret_var) in S3_KEYS.items():
        scoped = role != "operator"
        identities.append({"name": role,
                           "credentials": [{"accessKey": _required(environ, key_var),
                                            "secretKey": _required(environ, secret_var)}],
                           "actions": [f"{a}:{bucket}" if scoped else a for a in _S3_ACTIONS[role]]})
    return {"identities": identities}


def write_s3_config(path: str | os.PathLike, environ: Mapping[str, str], bucket: str) -> None:
    """Write :func:`s3_identities` to ``path``, readable by its owner only."""
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(s3_identities(environ, bucket), out)


def ensure_mlflow_user(url: str, admin: tuple[str, str], user: str, password: str, timeout: float = 15) -> str:
    """Create MLflow user ``user`` with ``password`` through the auth app's REST API as ``admin`` (name,
    password), or set that password when the user exists. Returns "created" or "updated"."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValueError(f"the MLflow password of {user!r} must be at least {MIN_PASSWORD_LENGTH} characters")
    body = {"username": user, "password": password}
    try:
        _mlflow_call(url, admin, "POST", "users/create", body, timeout)
        return "created"
    except urllib.error.HTTPError as exc:
        if exc.code != 400 or b"RESOURCE_ALREADY_EXISTS" not in exc.read():
            raise
    _mlflow_call(url, admin, "PATCH", "users/update-password", body, timeout)
    return "updated"


def _mlflow_call(url: str, admin: tuple[str, str], method: str, path: str, body: dict, timeout: float) -> None:
    token = basic_token(f"{admin[0]}:{admin[1]}")
    request = urllib.request.Request(f"{url.rstrip('/')}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                     method=method, headers={"Content-Type": "application/json",
                                                             "Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=timeout):
        pass


def prefect_client_environment(user: str, password: str) -> dict[str, str]:
    """What a Prefect client sets to come in through the proxy as ``user``: ``PREFECT_API_AUTH_STRING`` (sent on
    every request and by the events client on its websocket's upgrade) and the same ``Authorization`` header for
    Prefect's other websockets (events and logs followed, cancellations observed), which send none of their own."""
    auth = f"{user}:{password}"
    return {"PREFECT_API_AUTH_STRING": auth,
            "PREFECT_CLIENT_CUSTOM_HEADERS": json.dumps({"Authorization": f"Basic {basic_token(auth)}"})}


def with_prefect_websocket_auth(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with :func:`prefect_client_environment`'s header added where ``PREFECT_API_AUTH_STRING`` is set
    and no custom headers are (what ``labelshift worker`` hands its Prefect worker and so its flow runs)."""
    env = dict(environ)
    auth = env.get("PREFECT_API_AUTH_STRING", "")
    if ":" in auth and not env.get("PREFECT_CLIENT_CUSTOM_HEADERS"):
        user, password = auth.split(":", 1)
        env.update(prefect_client_environment(user, password))
    return env


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not value:
        raise KeyError(f"{name} is not set (infra/.env)")
    return value


def main(argv: list[str]) -> int:
    """``python -m stack.access s3-config FILE`` | ``mlflow-users``: what the containers run at start, reading
    infra/.env's variables (as compose hands them to the container) through :mod:`runtime.environment`."""
    # here, not at import: infra/compose_stack.py imports this module for its tables alone, with the system Python
    from runtime import environment

    if argv[:1] == ["s3-config"] and len(argv) == 2:
        env = environment.values([name for pair in S3_KEYS.values() for name in pair] + ["LABELSHIFT_BUCKET"])
        write_s3_config(argv[1], env, env.get("LABELSHIFT_BUCKET") or "labelshift")
        return 0
    if argv == ["mlflow-users"]:
        env = environment.values(["MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI",
                                  *PASSWORDS["mlflow"].values()])
        admin = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
        for role in ("worker", "reader"):
            done = ensure_mlflow_user(env["MLFLOW_TRACKING_URI"], admin, role,
                                      _required(env, PASSWORDS["mlflow"][role]))
            print(f"MLflow user {role!r} {done}")
        return 0
    print("usage: python -m stack.access s3-config FILE | mlflow-users", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
