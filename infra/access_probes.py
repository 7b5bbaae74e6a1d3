"""Knocking on every door of the stack with no credentials, wrong ones and each role's: what each server answers.

Used by ``make stack-e2e`` (infra/stack_e2e.py, against the containers) and by tests/integration/test_access.py
(against the same servers started here with the same settings). Each probe returns a dict "what was tried" ->
"what the server did" (an HTTP status, a websocket outcome, an S3 error code or "ok"), which the callers compare
with what the roles of runtime/access.py allow.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

__all__ = ["http_status", "prefect_answers", "prefect_websocket", "mlflow_answers", "s3_answers", "tls_answers",
           "PREFECT_WEBSOCKETS"]

#: the Prefect server's websocket endpoints (events in and out, logs, task-run and worker subscriptions)
PREFECT_WEBSOCKETS = ("/events/in", "/events/out", "/logs/out", "/task_runs/subscriptions/scheduled")


def http_status(url: str, *, user: tuple[str, str] | None = None, auth: str | None = None, method: str = "GET",
                body: dict | None = None, timeout: float = 15) -> int:
    """The HTTP status of one request, with basic auth from ``user`` (name, password) or a raw ``auth`` string
    (Prefect's auth string is sent as the basic-auth token)."""
    headers = {"Content-Type": "application/json"}
    token = auth if auth is not None else (f"{user[0]}:{user[1]}" if user else None)
    if token is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(token.encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def prefect_answers(api_url: str, auth_string: str) -> dict[str, object]:
    """REST (a flow filter and the health probe) and every websocket of :data:`PREFECT_WEBSOCKETS`, without the
    auth string, with a wrong one and with the right one."""
    api = api_url.rstrip("/")
    found: dict[str, object] = {}
    for who, auth in (("none", None), ("wrong", auth_string + "x"), ("right", auth_string)):
        found[f"REST {who}"] = http_status(f"{api}/flows/filter", auth=auth, method="POST", body={})
        found[f"health {who}"] = http_status(f"{api}/health", auth=auth)
        for path in PREFECT_WEBSOCKETS:
            found[f"ws {path} {who}"] = prefect_websocket(api + path, auth)
    found["ws /events/in without the prefect subprotocol"] = prefect_websocket(api + "/events/in", auth_string,
                                                                                subprotocol=False)
    return found


def prefect_websocket(url: str, auth: str | None, *, subprotocol: bool = True, timeout: float = 15) -> str:
    """What a Prefect websocket does with an auth message carrying ``auth`` (none: an auth message without a
    token): "accepted" (auth_success), or "closed <code>"."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    ws_url = "ws" + url.removeprefix("http")
    try:
        with connect(ws_url, subprotocols=["prefect"] if subprotocol else None, open_timeout=timeout,
                     close_timeout=2) as socket:
            socket.send(json.dumps({"type": "auth", "token": auth}))
            answer = json.loads(socket.recv(timeout=timeout))
            return "accepted" if answer.get("type") == "auth_success" else f"answered {answer}"
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else 'without a code'}"
    except InvalidStatus as exc:
        return f"refused {exc.response.status_code}"


def mlflow_answers(url: str, users: dict[str, tuple[str, str]]) -> dict[str, int]:
    """The REST API (search experiments), the UI's page, user creation and an experiment's deletion, without
    credentials, with a wrong password and as each of ``users`` (role -> (name, password))."""
    base = url.rstrip("/")
    search = f"{base}/api/2.0/mlflow/experiments/search?max_results=1"
    tries = {"none": None, "wrong": (next(iter(users.values()))[0], "wrong-password-123"), **users}
    found = {}
    for who, user in tries.items():
        found[f"REST {who}"] = http_status(search, user=user)
        found[f"UI {who}"] = http_status(f"{base}/", user=user)
        found[f"health {who}"] = http_status(f"{base}/health", user=user)
    for who, user in users.items():
        found[f"create a user as {who}"] = http_status(f"{base}/api/2.0/mlflow/users/create", user=user,
                                                       method="POST", body={"username": f"probe-{who}",
                                                                            "password": "probe-password-123"})
        found[f"delete experiment 0 as {who}"] = http_status(f"{base}/api/2.0/mlflow/experiments/delete",
                                                             user=user, method="POST", body={"experiment_id": "0"})
    return found


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
