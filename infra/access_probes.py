"""Knocking on every door of the stack with no credentials, wrong ones and each role's: what each server answers.

Used by ``make stack-e2e`` (infra/stack_e2e.py, against the containers) and by tests/integration/test_access.py
(against the same servers started here with the same settings). Each probe returns a dict "what was tried" ->
"what the server did" (an HTTP status, a websocket outcome, an S3 error code or "ok"), which the callers compare
with what the roles of stack/access.py allow.
"""
from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request

__all__ = ["role_users", "http_status", "prefect_answers", "prefect_rights", "prefect_websocket", "prefect_problems",
           "mlflow_problems", "PREFECT_MAY", "MLFLOW_MAY", "mlflow_answers", "s3_answers", "tls_answers",
           "PREFECT_WEBSOCKETS"]

#: the Prefect server's websocket endpoints (events in and out, logs, task-run and worker subscriptions)
PREFECT_WEBSOCKETS = ("/events/in", "/events/out", "/logs/out", "/task_runs/subscriptions/scheduled")


def role_users(values: dict[str, str], service: str) -> dict[str, tuple[str, str]]:
    """role -> (user, password) of ``service`` (prefect, mlflow) from an env file's ``values``."""
    from stack.access import PASSWORDS

    return {role: (role, values[name]) for role, name in PASSWORDS[service].items()}


def http_status(url: str, *, user: tuple[str, str] | None = None, auth: str | None = None, method: str = "GET",
                body: dict | None = None, timeout: float = 15) -> int:
    """The HTTP status of one request, with basic auth from ``user`` (name, password) or a raw ``auth`` string
    (Prefect's auth string is sent as the basic-auth token)."""
    from stack.access import basic_token

    headers = {"Content-Type": "application/json"}
    token = auth if auth is not None else (f"{user[0]}:{user[1]}" if user else None)
    if token is not None:
        headers["Authorization"] = f"Basic {basic_token(token)}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


#: a UUID no object has: a request naming it that gets past the proxy is answered 404 by the server
_NOBODY = "00000000-0000-0000-0000-000000000000"


def prefect_answers(api_url: str, users: dict[str, tuple[str, str]]) -> dict[str, object]:
    """Through the proxy: REST (a flow filter and the health probe), the UI's page and every websocket of
    :data:`PREFECT_WEBSOCKETS`, without credentials, with a wrong password and as each of ``users`` (role ->
    (name, password)); then what each role may do (:func:`prefect_rights`)."""
    api = api_url.rstrip("/")
    tries = {"none": None, "wrong": f"{next(iter(users.values()))[0]}:wrong-password-123",
             **{role: f"{name}:{password}" for role, (name, password) in users.items()}}
    found: dict[str, object] = {}
    for who, auth in tries.items():
        found[f"REST {who}"] = http_status(f"{api}/flows/filter", auth=auth, method="POST", body={})
        found[f"UI {who}"] = http_status(f"{api.removesuffix('/api')}/", auth=auth)
        found[f"health {who}"] = http_status(f"{api}/health", auth=auth)
        for path in PREFECT_WEBSOCKETS:
            found[f"ws {path} {who}"] = prefect_websocket(api + path, auth)
    for who, auth in tries.items():
        if who not in ("none", "wrong"):
            found.update(prefect_rights(api, who, auth))
    return found


def prefect_rights(api: str, who: str, auth: str) -> dict[str, int]:
    """What ``auth`` may do: each request names nothing that exists, so 403 is the proxy's refusal and 404 or
    422 (no such object, an empty body) a request the server was allowed to see."""
    tries = {"read flow runs": ("POST", "/flow_runs/filter", {}),
             "start a deployment's run": ("POST", f"/deployments/{_NOBODY}/create_flow_run", {}),
             "create a deployment": ("POST", "/deployments/", {}),
             "change an automation": ("PATCH", f"/automations/{_NOBODY}", {}),
             "create an automation": ("POST", "/automations/", {}),
             "set a variable": ("POST", "/variables/", {}),
             "create a block": ("POST", "/block_documents/", {}),
             "delete a flow": ("DELETE", f"/flows/{_NOBODY}", None),
             "create a flow run": ("POST", "/flow_runs/", {}),
             "delete flow runs in bulk": ("POST", "/flow_runs/bulk_delete", {}),
             "set a flow run's state": ("POST", f"/flow_runs/{_NOBODY}/set_state", {}),
             "read a block's secrets": ("GET", f"/block_documents/{_NOBODY}?include_secrets=true", None),
             "filter blocks": ("POST", "/block_documents/filter", {}),
             "open a worker channel": ("GET", "/work_pools/labelshift/workers/connect", None),
             "an encoded path": ("POST", "/automations/%2e%2e/flows/filter", {})}
    return {f"{what} as {who}": http_status(api + path, auth=auth, method=method, body=body)
            for what, (method, path, body) in tries.items()}


def prefect_websocket(url: str, auth: str | None, *, subprotocol: bool = True, timeout: float = 15,
                      tries: int = 3) -> str:
    """What a Prefect websocket does with ``auth`` sent as Prefect's clients send it (the basic-auth header on the
    upgrade, the token of the first message; none: neither): "accepted" (auth_success), "refused <status>" (the
    upgrade), "closed <code>", or "timed out" when ``tries`` attempts got no answer. (The websockets library's sync
    client, opening one socket right after closing another, now and then waits for an answer the server has sent:
    measured about 1 in 20 against the container stack, never with a plain socket; a timeout is no answer, so the
    probe asks again.)"""
    for _ in range(tries):
        try:
            return _prefect_websocket(url, auth, subprotocol=subprotocol, timeout=timeout)
        except TimeoutError:
            pass
    return "timed out"


def _prefect_websocket(url: str, auth: str | None, *, subprotocol: bool, timeout: float) -> str:
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    from stack.access import basic_token

    ws_url = "ws" + url.removeprefix("http")
    headers = {"Authorization": f"Basic {basic_token(auth)}"} if auth else None
    try:
        with connect(ws_url, subprotocols=["prefect"] if subprotocol else None, open_timeout=timeout,
                     close_timeout=2, additional_headers=headers) as socket:
            socket.send(json.dumps({"type": "auth", "token": auth}))
            answer = json.loads(socket.recv(timeout=timeout))
            return "accepted" if answer.get("type") == "auth_success" else f"answered {answer}"
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else 'without a code'}"
    except InvalidStatus as exc:
        return f"refused {exc.response.status_code}"


def mlflow_answers(url: str, users: dict[str, tuple[str, str]]) -> dict[str, int]:
    """The REST API (search experiments), the UI's page and the health probe without credentials, with a wrong
    password and as each of ``users`` (role -> (name, password)); then what each may do: manage users, delete an
    experiment, create one, search runs, register a model, move an alias, tag a model version."""
    base = url.rstrip("/")
    api = f"{base}/api/2.0/mlflow"
    tries = {"none": None, "wrong": (next(iter(users.values()))[0], "wrong-password-123"), **users}
    found = {}
    for who, user in tries.items():
        found[f"REST {who}"] = http_status(f"{api}/experiments/search?max_results=1", user=user)
        found[f"UI {who}"] = http_status(f"{base}/", user=user)
        found[f"health {who}"] = http_status(f"{base}/health", user=user)
    token = secrets.token_hex(4)
    for who, user in users.items():
        rights = {"create a user": ("users/create", {"username": f"probe-{who}-{token}",
                                                       "password": "probe-password-123"}),
                  "delete experiment 0": ("experiments/delete", {"experiment_id": "0"}),
                  "create an experiment": ("experiments/create", {"name": f"probe-{who}-{token}"}),
                  "search runs": ("runs/search", {"experiment_ids": ["0"], "max_results": 1}),
                  "register a model": ("registered-models/create", {"name": f"probe-{who}-{token}"}),
                  "move an alias": ("registered-models/alias", {"name": f"probe-operator-{token}",
                                                                "alias": "production", "version": "1"}),
                  "tag a model version": ("model-versions/set-tag", {"name": f"probe-operator-{token}",
                                                                     "version": "1", "key": "labelshift.digest",
                                                                     "value": "sha256:0"}),
                  "delete a run": ("runs/delete", {"run_id": "0" * 32})}
        for what, (path, body) in rights.items():
            found[f"{what} as {who}"] = http_status(f"{api}/{path}", user=user, method="POST", body=body)
        found[f"change a password as {who}"] = http_status(
            f"{api}/users/update-password", user=user, method="PATCH",
            body={"username": f"probe-{who}-{token}", "password": "probe-password-456"})
        found[f"upload an artifact as {who}"] = http_status(
            f"{base}/api/2.0/mlflow-artifacts/artifacts/_probes/{who}-{token}.json", user=user, method="PUT", body={})
    return found


#: what each role may do of :func:`prefect_rights` and :func:`mlflow_answers`' tries (stack/access.py's ROLES)
PREFECT_MAY = {"operator": {"read flow runs", "start a deployment's run", "create a deployment", "change an automation",
                            "create an automation", "set a variable", "create a block", "delete a flow",
                            "create a flow run", "delete flow runs in bulk", "set a flow run's state",
                            "read a block's secrets", "filter blocks", "open a worker channel"},
               "worker": {"read flow runs", "set a flow run's state"},
               "reader": {"read flow runs"}}
#: the websockets a role may not open (besides every one without the right password)
PREFECT_WEBSOCKETS_REFUSED = {"reader": {"/events/in", "/task_runs/subscriptions/scheduled"},
                              "worker": {"/task_runs/subscriptions/scheduled"}}
MLFLOW_MAY = {"operator": {"create a user", "create an experiment", "search runs", "register a model", "move an alias",
                           "tag a model version", "delete a run", "change a password", "upload an artifact"},
              "worker": {"create an experiment", "search runs", "upload an artifact"}, "reader": {"search runs"}}


def prefect_problems(found: dict[str, object]) -> list[str]:
    """What in :func:`prefect_answers`' ``found`` is not as the roles say: no or a wrong password refused (401,
    the websockets' upgrade too), each role's REST and websockets let in (a reader emits no events), each right of
    :data:`PREFECT_MAY` let through (anything but 401/403) and every other refused (403), an encoded path 400."""
    problems = _door_problems(found)
    for key, outcome in found.items():
        if key.startswith("ws "):
            path, _, who = key[3:].rpartition(" ")
            expected = ("refused 401" if who in ("none", "wrong") else
                        "refused 403" if path in PREFECT_WEBSOCKETS_REFUSED.get(who, ()) else "accepted")
            if outcome != expected:
                problems.append(f"{key}: {outcome}, expected {expected}")
    return problems + _rights_problems(found, PREFECT_MAY)


def mlflow_problems(found: dict[str, int]) -> list[str]:
    """What in :func:`mlflow_answers`' ``found`` is not as the roles say (as :func:`prefect_problems`; deleting
    experiment 0 is refused to all but the operator, whose try is not judged)."""
    return _door_problems(found) + _rights_problems(
        {k: v for k, v in found.items() if k != "delete experiment 0 as operator"}, MLFLOW_MAY)


def _door_problems(found: dict) -> list[str]:
    """REST and UI: 401 without or with a wrong password, 200 for every role; the health probe 200 for all."""
    problems = [f"{k}: {v}" for k, v in found.items() if k.startswith(("REST ", "UI "))
                and v != (401 if k.endswith((" none", " wrong")) else 200)]
    return problems + [f"{k}: {v}" for k, v in found.items() if k.startswith("health ") and v != 200]


def _rights_problems(found: dict, may: dict[str, set[str]]) -> list[str]:
    problems = []
    for key, status in found.items():
        what, _, who = key.rpartition(" as ")
        if who not in may:
            continue
        if what == "an encoded path":
            ok = status == 400
        else:
            ok = (status not in (401, 403)) == (what in may[who])
        if not ok:
            problems.append(f"{key}: {status} ({'may' if what in may[who] else 'may not'})")
    return problems


def s3_answers(endpoint: str, bucket: str, keys: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Anonymous and wrong-secret requests, and what each role of ``keys`` (role -> (key id, secret)) may do:
    list, read, write and delete an object of ``bucket``, create a bucket."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    def client(key=None, secret=None):
        config = Config(signature_version=UNSIGNED) if key is None else Config(retries={"max_attempts": 1})
        return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                            region_name="us-east-1", config=config)

    def outcome(call, **arguments) -> str:
        try:
            call(**arguments)
            return "ok"
        except ClientError as exc:
            return exc.response["Error"]["Code"]

    found = {"list anonymous": outcome(client().list_objects_v2, Bucket=bucket)}
    key, _ = next(iter(keys.values()))
    found["list with a wrong secret"] = outcome(client(key, "wrong-secret").list_objects_v2, Bucket=bucket)
    shared = "_probes/shared.txt"
    for role, (key, secret) in keys.items():          # the first role (the operator's) writes what all read
        s3 = client(key, secret)
        name = f"_probes/{role}.txt"
        found[f"write as {role}"] = outcome(s3.put_object, Bucket=bucket, Key=name, Body=b"probe")
        if role == next(iter(keys)):
            s3.put_object(Bucket=bucket, Key=shared, Body=b"probe")
        found[f"list as {role}"] = outcome(s3.list_objects_v2, Bucket=bucket, Prefix="_probes/")
        found[f"read as {role}"] = outcome(s3.get_object, Bucket=bucket, Key=shared)
        found[f"delete as {role}"] = outcome(s3.delete_object, Bucket=bucket, Key=name)
        found[f"create a bucket as {role}"] = outcome(s3.create_bucket, Bucket=f"probe-{role}")
    client(*next(iter(keys.values()))).delete_object(Bucket=bucket, Key=shared)
    return found


def tls_answers(url: str, ca_file: str) -> dict[str, str]:
    """One published port (``url``: https://host:port) asked in plain HTTP, over TLS trusting only the public CAs
    (certifi's), over TLS for another host name, and over TLS trusting ``ca_file``: what each gave."""
    import socket
    import ssl
    from urllib.parse import urlsplit

    import certifi

    parts = urlsplit(url)
    host, port = parts.hostname, parts.port

    def handshake(context: ssl.SSLContext, name: str) -> str:
        try:
            with socket.create_connection((host, port), timeout=10) as raw, \
                    context.wrap_socket(raw, server_hostname=name):
                return "ok"
        except ssl.SSLCertVerificationError as exc:
            return f"refused: {exc.verify_message}"
        except (ssl.SSLError, OSError) as exc:
            return f"refused: {type(exc).__name__}"

    try:
        found = {"plain HTTP": str(http_status(f"http://{host}:{port}/"))}
    except OSError as exc:
        found = {"plain HTTP": f"failed: {type(exc).__name__}"}
    found["TLS, public CAs only"] = handshake(ssl.create_default_context(cafile=certifi.where()), host)
    found["TLS, another host name"] = handshake(ssl.create_default_context(cafile=ca_file), "not-the-stack.example")
    found["TLS, the stack's CA"] = handshake(ssl.create_default_context(cafile=ca_file), host)
    return found
