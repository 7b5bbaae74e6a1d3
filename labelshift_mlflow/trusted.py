"""A trusted registry: the digest of a model version, recorded when the project registers it (or when the operator
trusts it after review) and checked when ``labelshift estimate`` and the ``reestimate`` flow load it.

A version's files are its model artifacts (``MLmodel``, the model's data and environment files: named ``model/...``)
and what labelshift logs beside it in the version's source run under :data:`RUN_FOLDERS` (the calibrators and the
labelled holdout of :mod:`labelshift_mlflow.artifacts`, a reference's class names: ``run/calibration/...``,
``run/reference/...``). Their digest (:func:`labelshift.storage.digest.digest_files`) is recorded as the version tag
:data:`DIGEST_TAG`, with the per-file digests in :data:`FILES_TAG` to name a changed file. :func:`trusted_files`
downloads a version's files once, checks them, and hands the loader the very files it checked. A version without a
digest is loaded with a warning, or refused when ``LABELSHIFT_REQUIRE_TRUSTED_MODELS=1``
(:func:`runtime.environment.require_trusted_models`). Who may set the tag is a matter of MLflow's permissions.
"""
from __future__ import annotations

import json
import logging
import posixpath
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient

from labelshift.errors import InputError, ServiceUnavailableError
from labelshift.storage.digest import DIGEST_PREFIX, FileDigest, changes, digest_files, digest_folder
from runtime.environment import ENV_REQUIRE_TRUSTED, require_trusted_models

__all__ = ["DIGEST_TAG", "FILES_TAG", "RUN_FOLDERS", "VersionFiles", "download_version", "version_digest",
           "record_digest", "check_digest", "trusted_files", "trust_version"]

#: model version tag: the digest of the version's files (``sha256:<hex>``)
DIGEST_TAG = "labelshift.digest"
#: model version tag: the per-file digests (JSON, name -> first 16 hex digits), to name the file that changed
FILES_TAG = "labelshift.digest_files"
#: the folders of a version's source run that belong to it
RUN_FOLDERS = ("calibration", "reference")
#: what MLflow adds at the top of a model version downloaded as ``models:/NAME/VERSION`` (its name and version), not
#: a file of the store
_LOCAL_NOTE = "model/registered_model_meta"

_log = logging.getLogger(__name__)


@dataclass
class VersionFiles:
    """A model version's files downloaded into ``folder``: the model (``model_dir``), its run's
    :data:`RUN_FOLDERS` (``run_dir``) and their digest. ``keep``: leave the folder when done (a loaded pyfunc may
    read its files later)."""

    folder: Path
    model_dir: Path
    run_dir: Path
    digest: FileDigest
    keep: bool = field(default=False)

    def run_file(self, path: str) -> Path | None:
        """The local copy of the run artifact ``path`` (``calibration/BCTS.json``), None when the run has none."""
        local = self.run_dir / path
        return local if local.is_file() else None


def _run_files(client: MlflowClient, run_id: str, dest: Path) -> None:
    """The run's :data:`RUN_FOLDERS`, file by file, listed and read from the run's own artifact root: MLflow 3's
    run listing also shows the files of a logged model named as the folder (a reference's ``reference``), and a
    missing file asked of an MLflow server proxying S3 is an HTTP 500 its client retries for minutes."""
    import mlflow.artifacts

    root, tracking = client.get_run(run_id).info.artifact_uri, client.tracking_uri
    pending = list(RUN_FOLDERS)
    while pending:
        folder = pending.pop()
        for entry in mlflow.artifacts.list_artifacts(artifact_uri=f"{root}/{folder}", tracking_uri=tracking):
            path = f"{folder}/{posixpath.basename(entry.path)}"
            if entry.is_dir:
                pending.append(path)
                continue
            (dest / folder).mkdir(parents=True, exist_ok=True)
            mlflow.artifacts.download_artifacts(artifact_uri=f"{root}/{path}", dst_path=str(dest / folder),
                                                tracking_uri=tracking)


def _model_source(client: MlflowClient, name: str, mv) -> str:
    """Where the version's model files are: its logged model's artifact location (MLflow 3, source
    ``models:/m-<id>``), read directly -- ``models:/...`` URIs may resolve to the source run's folder of the model's
    name, which a reference also uses for its class names -- else the registry's own resolution of the version."""
    source = str(getattr(mv, "source", "") or "")
    if re.fullmatch(r"models:/m-[0-9a-f]+", source):
        return client.get_logged_model(source.removeprefix("models:/")).artifact_location
    return f"models:/{name}/{mv.version}"


def download_version(client: MlflowClient, name: str, mv, dest: Path) -> VersionFiles:
    """Download version ``mv`` of ``name`` (its model artifacts, and its run's :data:`RUN_FOLDERS`) into ``dest``
    and digest what was downloaded. Raises ServiceUnavailableError when the artifact store does not answer."""
    import mlflow.artifacts

    model_dir, run_dir = dest / "model", dest / "run"
    model_dir.mkdir(parents=True)
    run_dir.mkdir()
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=_model_source(client, name, mv),
                                                    dst_path=str(model_dir), tracking_uri=client.tracking_uri)
        model_dir = Path(local)         # a folder URI lands in a subfolder of its own name
        if mv.run_id:
            _run_files(client, mv.run_id, run_dir)
    except Exception as exc:
        raise ServiceUnavailableError(
            f"could not download the artifacts of models:/{name}/{mv.version} from the artifact store of "
            f"{client.tracking_uri}: {type(exc).__name__}: {exc}. Check that the artifact store (S3) answers and "
            "that its files are there.") from None
    files = {n: p for n, p in digest_folder(model_dir, "model/").items() if n != _LOCAL_NOTE}
    files.update(digest_folder(run_dir, "run/"))
    return VersionFiles(dest, model_dir, run_dir, digest_files(files))


def version_digest(client: MlflowClient, name: str, version: str) -> FileDigest:
    """The digest of version ``version`` of ``name`` as its files are now in the artifact store."""
    mv = client.get_model_version(name, str(version))
    with tempfile.TemporaryDirectory(prefix="labelshift-digest-") as tmp:
        return download_version(client, name, mv, Path(tmp)).digest


def record_digest(client: MlflowClient, name: str, version: str, digest: FileDigest | None = None) -> str:
    """Record ``digest`` (default: :func:`version_digest`, the files as they are now) on the version as
    :data:`DIGEST_TAG` and :data:`FILES_TAG`; returns the digest. Called by the project right after it registers a
    version and logs what belongs to it, before an alias points at it."""
    digest = digest or version_digest(client, name, version)
    client.set_model_version_tag(name, str(version), DIGEST_TAG, digest.value)
    manifest = digest.manifest()
    if manifest is not None:
        client.set_model_version_tag(name, str(version), FILES_TAG, manifest)
    elif FILES_TAG in (client.get_model_version(name, str(version)).tags or {}):
        client.delete_model_version_tag(name, str(version), FILES_TAG)      # an older manifest would mislead
    return digest.value


def _changed_files(recorded_manifest: str | None, found: FileDigest) -> str:
    try:
        expected = json.loads(recorded_manifest) if recorded_manifest else None
    except ValueError:
        expected = None
    if not isinstance(expected, dict):
        return ""
    diff = changes(expected, found.files)
    return ", ".join(diff[:8]) + (f" and {len(diff) - 8} more" if len(diff) > 8 else "")


def check_digest(model_uri: str, name: str, mv, found: FileDigest | None, *, require: bool | None = None,
                 logger=None) -> None:
    """Check the files ``found`` of version ``mv`` against its recorded digest. A mismatch (or nothing ``found``)
    raises InputError naming the changed file (or the expected digest); no digest raises InputError when ``require`` (default:
    ``LABELSHIFT_REQUIRE_TRUSTED_MODELS``), else logs a warning to ``logger``."""
    tags = dict(getattr(mv, "tags", None) or {})
    recorded, version_uri = tags.get(DIGEST_TAG), f"models:/{name}/{mv.version}"
    trust_cmd = f"`labelshift reference trust {version_uri}`"
    if recorded is None:
        if require_trusted_models() if require is None else require:
            raise InputError(
                f"{model_uri} (version {mv.version}) is not trusted: it has no recorded digest (tag {DIGEST_TAG}), and "
                f"{ENV_REQUIRE_TRUSTED}=1 refuses such versions. Nothing was loaded. Review the version, then run "
                f"{trust_cmd}; or register it with labelshift (`labelshift reference register`, `labelshift "
                "reproduce`), which records the digest.")
        (logger or _log).warning(
            "%s (version %s) has no recorded digest (tag %s): loading it unchecked. A model is code: review it and "
            "run %s to have later loads check it; set %s=1 to refuse untrusted versions.", model_uri, mv.version,
            DIGEST_TAG, trust_cmd, ENV_REQUIRE_TRUSTED)
        return
    now = found.value if found is not None else "unknown (not checked when it was loaded)"
    if recorded == now:
        return
    changed = _changed_files(tags.get(FILES_TAG), found) if found is not None and recorded.startswith(
        DIGEST_PREFIX) else ""
    what = f"{changed} (recorded digest {recorded}, now {now})" if changed else \
        f"its files now digest to {now}, the recorded digest is {recorded}"
    raise InputError(
        f"{model_uri} (version {mv.version}) was altered after it was trusted: {what}. It was not loaded. If the "
        f"change is intended, register a new version (labelshift records its digest), or review this one and run "
        f"{trust_cmd}; otherwise find out who changed the artifact store.")


@contextmanager
def trusted_files(client: MlflowClient, model_uri: str, name: str, mv, *, require: bool | None = None,
                  logger=None):
    """Download version ``mv`` of ``name`` once, check it (:func:`check_digest`) and yield its
    :class:`VersionFiles`, the files the caller then loads; the folder is removed afterwards unless the caller
    sets ``keep``."""
    recorded = DIGEST_TAG in (getattr(mv, "tags", None) or {})
    if not recorded:                    # refused (or warned about) before anything is downloaded
        check_digest(model_uri, name, mv, None, require=require, logger=logger)
    folder = Path(tempfile.mkdtemp(prefix="labelshift-model-"))
    files = None
    try:
        files = download_version(client, name, mv, folder)
        if recorded:
            check_digest(model_uri, name, mv, files.digest, require=require, logger=logger)
        yield files
    finally:
        if files is None or not files.keep:
            shutil.rmtree(folder, ignore_errors=True)


def trust_version(client: MlflowClient, name: str, mv) -> dict:
    """Record the digest of the registered model ``name``'s version ``mv`` (as
    :func:`labelshift_mlflow.registry.resolve_version` returns it), as its files are now (the operator's command after
    a review: ``labelshift reference trust``). Returns {"name", "version", "digest", "previous"} (``previous``: the
    digest recorded before, or None)."""
    previous = dict(mv.tags or {}).get(DIGEST_TAG)
    digest = record_digest(client, name, str(mv.version))
    return {"name": name, "version": str(mv.version), "digest": digest, "previous": previous}
