"""Object storage by URI: one interface over S3-compatible buckets and a local folder.

``open_store(uri)`` takes ``s3://bucket/prefix``, ``file:///abs/path`` or a plain local path and returns a
:class:`Store`. Keys are ``/``-separated paths relative to the store's root and mean the same on both backends.
Every write is atomic and records the content's SHA-256, which reads verify; :meth:`Store.list_info` fingerprints
objects from the listing alone; unsafe keys are refused; failures raise :mod:`labelshift.errors` that say what to
fix. ``docs/storage.md`` spells out these guarantees.
"""
from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import InputError
from .base import ObjectInfo, Store, encode_json, json_default, validate_key
from .local import LocalStore
from .s3 import RetryPolicy, S3Store

__all__ = ["Store", "LocalStore", "S3Store", "ObjectInfo", "RetryPolicy", "open_store", "validate_key", "json_default",
           "encode_json"]

_S3_URI = re.compile(r"^s3://(?P<bucket>[^/]*)/?(?P<prefix>.*)$", re.IGNORECASE)


def open_store(uri: str | os.PathLike, **options: Any) -> Store:
    """Open the store named by ``uri``.

    - ``s3://bucket`` or ``s3://bucket/prefix``: an :class:`S3Store` (``options`` go to its constructor:
      ``endpoint_url``, ``retry``, ``multipart_threshold``...);
    - ``file:///absolute/path`` or a plain path (relative paths are taken from the current folder): a
      :class:`LocalStore`.
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise InputError(f"store URI must be a non-empty string like 's3://bucket/prefix' or a folder, got {uri!r}.")
    if uri[:5].lower() == "s3://":
        match = _S3_URI.match(uri)
        if not match["bucket"]:
            raise InputError(f"store URI {uri!r} names no bucket; write it as 's3://bucket/optional/prefix'.")
        return S3Store(match["bucket"], match["prefix"], **options)
    parts = urlsplit(uri) if "://" in uri else None
    if parts and parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InputError(f"store URI {uri!r} names host {parts.netloc!r}; file URIs must be local (file:///path).")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise InputError(f"store URI {uri!r} must hold an absolute path (file:///abs/path).")
    elif parts and parts.scheme:
        raise InputError(
            f"store URI {uri!r} has unsupported scheme {parts.scheme!r}; use s3://bucket/prefix, file:///path or a "
            "folder."
        )
    else:
        path = os.path.expanduser(uri)
    if options:
        raise InputError(f"options {sorted(options)} apply to S3 stores only, not to {uri!r}.")
    return LocalStore(path)
