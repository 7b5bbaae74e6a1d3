"""stack.access's client environment: what a Prefect client sets to come in through the stack's proxy."""
from __future__ import annotations

import base64
import json

from stack.access import PASSWORDS, SECRETS, prefect_client_environment, with_prefect_websocket_auth


def test_the_client_environment_carries_the_same_credentials_twice():
    env = prefect_client_environment("worker", "pass:word with spaces")
    assert env["PREFECT_API_AUTH_STRING"] == "worker:pass:word with spaces"
    header = json.loads(env["PREFECT_CLIENT_CUSTOM_HEADERS"])["Authorization"]
    scheme, token = header.split(" ")
    assert scheme == "Basic" and base64.b64decode(token).decode() == "worker:pass:word with spaces"


def test_the_websocket_header_is_added_only_where_an_auth_string_is_and_no_headers_are():
    assert "PREFECT_CLIENT_CUSTOM_HEADERS" not in with_prefect_websocket_auth({"PATH": "/bin"})
    assert "PREFECT_CLIENT_CUSTOM_HEADERS" not in with_prefect_websocket_auth({"PREFECT_API_AUTH_STRING": "nocolon"})
    own = {"PREFECT_API_AUTH_STRING": "reader:x" * 3, "PREFECT_CLIENT_CUSTOM_HEADERS": '{"X-Mine": "1"}'}
    assert with_prefect_websocket_auth(own) == own                      # the user's own headers win
    source = {"PREFECT_API_AUTH_STRING": "worker:secret-1234", "OTHER": "kept"}
    env = with_prefect_websocket_auth(source)
    assert env == {**source, **prefect_client_environment("worker", "secret-1234")}
    assert "PREFECT_CLIENT_CUSTOM_HEADERS" not in source                 # a copy; the caller's mapping unchanged


def test_every_role_password_is_a_secret_searched_for():
    names = [n for roles in PASSWORDS.values() for n in roles.values()]
    assert len(names) == 6 and set(names) <= set(SECRETS)
