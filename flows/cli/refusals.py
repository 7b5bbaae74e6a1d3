"""A server that refuses the client's credentials, said as the setting to fix instead of a traceback.

Prefect's client raises ``httpx.HTTPStatusError`` on a 401/403 (from the server's auth string, or from the container
stack's proxy, which checks each role: infra/README.md, "Who may do what"); MLflow's raises ``MlflowException``
with error code UNAUTHENTICATED or PERMISSION_DENIED. (S3's refusals are worded by :mod:`labelshift.storage.s3`.)
"""
from __future__ import annotations

from runtime import environment as settings_mod

ROLES_DOC = "infra/README.md, 'Who may do what'"


def refusal_message(exc: BaseException) -> str | None:
    """The sentence for ``exc`` when it is the Prefect server (``PREFECT_API_URL``) or an MLflow tracking server
    refusing the client's credentials or a right; None for anything else."""
    import httpx

    from tasks.tracking import one_line

    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403):
        api = settings_mod.read(settings_mod.ENV_PREFECT_API_URL) or ""
        url = str(exc.request.url)
        if not api or not url.startswith(api.rstrip("/")):
            return None
        what = f"{exc.request.method} {exc.request.url.path}"
        if exc.response.status_code == 401:
            return (f"the Prefect server at {api} refuses these credentials ({what}: HTTP 401): set "
                    f"PREFECT_API_AUTH_STRING to the right user:password ({ROLES_DOC}).")
        return (f"the Prefect server at {api} refuses this user {what} (HTTP 403: {_body(exc.response)}): that "
                f"role may not do it; run it as a user who may ({ROLES_DOC}).")
    code = getattr(exc, "error_code", None)
    if code == "UNAUTHENTICATED":
        return (f"the MLflow tracking server refuses these credentials ({one_line(exc)}): set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD ({ROLES_DOC}).")
    if code == "PERMISSION_DENIED":
        return (f"the MLflow tracking server refuses this user what it asked ({one_line(exc)}): that role may not "
                f"do it; run it as a user who may ({ROLES_DOC}).")
    return None


def _body(response) -> str:
    from tasks.tracking import one_line

    try:
        return one_line(response.text)
    except Exception:              # a streamed response not read
        return "no reason given"


def failure_text(state) -> str:
    """What a failed flow run's ``state`` says: :func:`refusal_message` of its exception when that is a refusal
    (the setting to fix), else the state's own message."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:                  # the result is not at hand (not persisted): the message is all there is
        exc = None
    refused = refusal_message(exc) if isinstance(exc, BaseException) else None
    return refused or state.message or ""
