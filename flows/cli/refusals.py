"""A server that refuses the client's credentials, said as the setting to fix instead of a traceback.

Prefect's client raises ``httpx.HTTPStatusError`` on a 401/403 (from the server's auth string, or from the container
stack's proxy, which checks each role: infra/README.md, "Who may do what"); MLflow's raises ``MlflowException``
with error code UNAUTHENTICATED or PERMISSION_DENIED. (S3's refusals are worded by :mod:`labelshift.storage.s3`.)
"""
from __future__ import annotations

ROLES_DOC = "infra/README.md, 'Who may do what'"


def refusal_message(exc: BaseException) -> str | None:
    """The sentence for ``exc`` when it is a Prefect or MLflow server refusing the client's credentials or a
    right; None for anything else."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    request = getattr(exc, "request", None)
    if status in (401, 403) and request is not None:            # httpx: Prefect's client
        url = str(request.url)
        what = f"{request.method} {url}"
        if status == 401:
            return (f"the Prefect server refuses these credentials ({what}: HTTP 401): set PREFECT_API_AUTH_STRING "
                    f"to the right user:password for PREFECT_API_URL ({ROLES_DOC}).")
        return (f"the Prefect server refuses this user {what} (HTTP 403: {_body(response)}): that role may not do "
                f"it; run it with a user that may ({ROLES_DOC}).")
    code = getattr(exc, "error_code", None)
    if code == "UNAUTHENTICATED":
        return (f"the MLflow tracking server refuses these credentials ({_first_line(exc)}): set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD ({ROLES_DOC}).")
    if code == "PERMISSION_DENIED":
        return (f"the MLflow tracking server refuses this user what it asked ({_first_line(exc)}): that role may not "
                f"do it; run it with a user that may ({ROLES_DOC}).")
    return None


def _body(response) -> str:
    try:
        return " ".join(response.text.split())[:300]
    except Exception:
        return "no reason given"


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def failure_text(state) -> str:
    """What a failed flow run's ``state`` says: :func:`refusal_message` of its exception when that is a refusal
    (the setting to fix), else the state's own message."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:                  # the result is not at hand (not persisted): the message is all there is
        exc = None
    refused = refusal_message(exc) if isinstance(exc, BaseException) else None
    return refused or state.message or ""
