"""What every calibrator shares: input checks, the logits/probabilities switch, and JSON persistence.

A calibrator maps the outputs of a fixed classifier (logits or probabilities, an (n, k) array) to calibrated
probabilities p_s(y | x). It is fit on held-out *labelled source* outputs and then applied, unchanged, to source
and target outputs alike (Section 4.2 and Appendix A of Garg et al., NeurIPS 2020).

Persistence is plain JSON, never pickle::

    {"kind": "BCTS", "format_version": 1, "n_classes": k, "input_kind": "logits",
     "settings": {...constructor arguments...}, "params": {...fitted state...}}

Floats are written with ``repr`` precision (Python's ``json`` does so), so a saved and reloaded calibrator gives
bit-identical ``predict_proba`` outputs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .._validation import ROW_SUM_TOL, require_finite, as_float_array, check_all_classes_present, check_labels, \
    check_probabilities
from ..errors import FormatError, InputError, NotFittedError, ObjectNotFoundError, StorageError

#: version of the JSON layout written by :meth:`Calibrator.save`; files with a larger number are refused
FORMAT_VERSION = 1

#: probabilities are clipped to at least this value before taking logs (log(1e-12) = -27.6), so that a class the
#: classifier gives probability 0 (float32 softmax underflow) still has a finite log-probability
PROB_FLOOR = 1e-12

INPUT_KINDS = ("auto", "logits", "probs")

#: entries of an outputs array above which the scaling calibrators' predict_proba reads it a row block at a time
#: (a float32 array is then not copied to float64 whole; labelshift.calibration.scaling)
PREDICT_BLOCK_ENTRIES = 1 << 22

_REGISTRY: dict[str, type["Calibrator"]] = {}


# -- small numerical helpers ---------------------------------------------------------------------------------
def log_softmax(s: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, stable for large |s| (subtracts the row maximum before exponentiating)."""
    m = np.max(s, axis=-1, keepdims=True)
    shifted = s - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def softmax(s: np.ndarray) -> np.ndarray:
    """Row-wise softmax computed through :func:`log_softmax`; rows sum to 1 up to rounding."""
    return np.exp(log_softmax(s))


def looks_like_probabilities(x: np.ndarray) -> bool:
    """True when every entry is non-negative and every row sums to 1 within ``ROW_SUM_TOL``."""
    return bool(np.all(x >= 0) and np.max(np.abs(x.sum(axis=-1) - 1.0)) <= ROW_SUM_TOL)


def log_probabilities(p: np.ndarray) -> np.ndarray:
    """log(max(p, PROB_FLOOR)): the scaling calibrators' view of probability inputs."""
    return np.log(np.maximum(p, PROB_FLOOR))


# -- the base class ------------------------------------------------------------------------------------------
class Calibrator:
    """Base class of the calibrators. Subclasses set ``kind`` and implement ``_fit``, ``_predict_proba``,
    ``_params_to_dict`` and ``_params_from_dict``.

    Parameters:
        input_kind: ``"logits"``, ``"probs"`` or ``"auto"`` (default). ``"auto"`` decides at ``fit``: outputs whose
            entries are all non-negative and whose rows sum to 1 (within 1e-4) are probabilities, anything else
            logits. The decision is stored in ``input_kind_``; with ``"auto"``, ``predict_proba`` refuses outputs
            of the other kind (a common mix-up), while an explicit kind skips that guess.

    Fitted attributes common to all: ``n_classes_``, ``input_kind_`` (``"logits"`` or ``"probs"``),
    ``source_prior_`` (label frequencies of the fit data).
    """

    kind: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    _settings: ClassVar[tuple[str, ...]] = ("input_kind",)
    #: settings a saved dict written before they existed lacks, with the value its calibrator was fit with
    _legacy_settings: ClassVar[dict[str, Any]] = {}
    #: predict_proba reads float32 outputs of more than PREDICT_BLOCK_ENTRIES entries as they are (in row blocks)
    _reads_float32_blocks: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            for name in (cls.kind, cls.__name__, *cls.aliases):
                _REGISTRY[name] = cls

    def __init__(self, input_kind: str = "auto"):
        self.input_kind = input_kind

    # -- scikit-learn style conveniences ---------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Constructor arguments, as a dict (what ``to_dict`` stores under ``"settings"``)."""
        return {name: getattr(self, name) for name in self._settings}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "n_classes_")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet; call .fit(outputs, labels) on held-out labelled "
                f"source outputs first (or load a saved one with {type(self).__name__}.load(path)).")

    # -- public API ------------------------------------------------------------------------------------------
    def fit(self, outputs, labels) -> "Calibrator":
        """Fit on held-out labelled source outputs ((n, k) logits or probabilities) and labels 0..k-1.

        Every class must occur in ``labels``. Returns ``self``.
        """
        self._check_settings()
        x = _check_outputs(outputs, "outputs")
        k = x.shape[1]
        kind = self._resolve_input_kind(x, "outputs")
        y = check_labels(labels, "labels", k, n_rows=x.shape[0])
        counts = check_all_classes_present(y, k, "labels")
        prior = counts / counts.sum()
        self._fit(x, y, k, kind, prior)
        self.source_prior_ = prior
        self.input_kind_ = kind
        self.n_classes_ = k
        return self

    def predict_proba(self, outputs) -> np.ndarray:
        """Calibrated probabilities, an (n, k) array whose rows sum to 1, for outputs of the same kind as at fit."""
        x = self._check_predict_outputs(outputs, "outputs")
        return self._predict_proba(x)

    def fit_predict_proba(self, outputs, labels) -> np.ndarray:
        """``fit(outputs, labels)`` then ``predict_proba(outputs)``."""
        return self.fit(outputs, labels).predict_proba(outputs)

    # -- input handling --------------------------------------------------------------------------------------
    def _check_settings(self) -> None:
        if self.input_kind not in INPUT_KINDS:
            raise InputError(f"input_kind must be one of {INPUT_KINDS}, got {self.input_kind!r}.")

    def _resolve_input_kind(self, x: np.ndarray, name: str) -> str:
        if self.input_kind == "probs":
            check_probabilities(x, name, 2)
            return "probs"
        if self.input_kind == "logits":
            return "logits"
        return "probs" if looks_like_probabilities(x) else "logits"

    def _check_predict_outputs(self, outputs, name: str) -> np.ndarray:
        self._check_fitted()
        x = _check_outputs(outputs, name, keep_float32=self._reads_float32_blocks)
        if x.shape[1] != self.n_classes_:
            raise InputError(
                f"{name} has {x.shape[1]} class columns but this {type(self).__name__} was fit on "
                f"{self.n_classes_} classes; pass outputs of the same classifier it was fit on.")
        if self.input_kind_ == "probs":
            check_probabilities(x, name, 2)
        elif self.input_kind == "auto" and x.shape[0] > 1 and looks_like_probabilities(x):
            raise InputError(
                f"{name} look like probabilities (non-negative rows summing to 1) but this "
                f"{type(self).__name__} was fit on logits; pass logits, as at fit (or construct it with "
                "input_kind='logits' to skip this check).")
        return x

    def _as_probabilities(self, x: np.ndarray) -> np.ndarray:
        """The outputs as probability vectors (softmax of logits)."""
        return x if self.input_kind_ == "probs" else softmax(x)

    def _as_log_scores(self, x: np.ndarray) -> np.ndarray:
        """The outputs as log-scores: logits unchanged, probabilities as log(max(p, PROB_FLOOR))."""
        return log_probabilities(x) if self.input_kind_ == "probs" else x

    # -- persistence -----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The fitted calibrator as a JSON-ready dict (see the module docstring for the layout)."""
        self._check_fitted()
        params = self._params_to_dict()
        params["source_prior"] = float_lists(self.source_prior_)
        return {
            "kind": self.kind,
            "format_version": FORMAT_VERSION,
            "n_classes": int(self.n_classes_),
            "input_kind": self.input_kind_,
            "settings": _jsonable(self.get_params()),
            "params": params,
        }

    def save(self, path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path`` (a local file) and return the path."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        path = Path(path)
        try:
            path.write_text(text + "\n", encoding="utf-8")
        except OSError as exc:
            raise StorageError(f"could not write calibrator file {path} ({exc}); check that the folder exists "
                               "and is writable.") from None
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Calibrator":
        """Rebuild a fitted calibrator from :meth:`to_dict` output. On the base class, dispatches on ``kind``."""
        return cls._from_dict(d, "the calibrator dict")

    @classmethod
    def load(cls, path) -> "Calibrator":
        """Read a calibrator saved with :meth:`save`. On the base class, any kind is accepted."""
        return cls._from_dict(_read_json(path), f"calibrator file {path}")

    @classmethod
    def _from_dict(cls, d, source: str) -> "Calibrator":
        if not isinstance(d, dict):
            raise FormatError(f"{source} does not hold a JSON object but a {type(d).__name__}; it is not a saved "
                              "labelshift calibrator. Re-save the calibrator with .save(path).")
        for key in ("kind", "format_version", "n_classes", "input_kind", "params"):
            if key not in d:
                raise FormatError(f"{source} has no {key!r} field; it is incomplete or not a labelshift "
                                  "calibrator. Re-save the calibrator with .save(path).")
        kind = d["kind"]
        target = _REGISTRY.get(kind) if isinstance(kind, str) else None
        if target is None:
            raise FormatError(f"{source} holds an unknown calibrator kind {kind!r}; known kinds are "
                              f"{sorted({c.kind for c in _REGISTRY.values()})}.")
        if cls is not Calibrator and not issubclass(target, cls):
            raise FormatError(f"{source} holds a {target.kind} calibrator, not {cls.kind}; load it with "
                              f"load_calibrator(...) or {target.__name__}.load(...).")
        for key, least in (("format_version", 1), ("n_classes", 2)):
            value = d[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise FormatError(f"{source} has an invalid {key} {value!r} (expected an integer >= {least}); the "
                                  "file is corrupt. Re-save the calibrator with .save(path).")
        version, k = d["format_version"], d["n_classes"]
        if version > FORMAT_VERSION:
            raise FormatError(f"{source} was written in format_version {version}, newer than this labelshift "
                              f"reads ({FORMAT_VERSION}); upgrade labelshift to load it.")
        if d["input_kind"] not in ("logits", "probs"):
            raise FormatError(f"{source} has an invalid input_kind {d['input_kind']!r} (expected 'logits' or "
                              "'probs'); the file is corrupt. Re-save the calibrator with .save(path).")
        settings = d.get("settings", {})
        if not isinstance(settings, dict) or set(settings) - set(target._settings):
            raise FormatError(f"{source} has settings {settings!r} that {target.__name__} does not accept "
                              f"(it takes {list(target._settings)}); the file is corrupt or from another version.")
        obj = target(**{**target._legacy_settings, **settings})
        params = d["params"]
        if not isinstance(params, dict):
            raise FormatError(f"{source}: 'params' must be a JSON object; the file is corrupt. Re-save the "
                              "calibrator with .save(path).")
        reader = _ParamReader(params, source)
        obj.source_prior_ = reader.array("source_prior", (k,))
        obj._params_from_dict(reader, k)
        obj.input_kind_ = d["input_kind"]
        obj.n_classes_ = k
        return obj

    # -- for subclasses --------------------------------------------------------------------------------------
    def _fit(self, x: np.ndarray, y: np.ndarray, k: int, kind: str,
             prior: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_proba(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _params_to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _params_from_dict(self, reader: "_ParamReader", k: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def load_calibrator(path_or_dict) -> Calibrator:
    """Load any saved calibrator: a path to a JSON file written by ``save``, or a dict from ``to_dict``.

    The ``kind`` field picks the class. Raises :class:`~labelshift.errors.FormatError` for a wrong or unknown
    kind, a newer or invalid format version, a missing field or corrupt JSON, and
    :class:`~labelshift.errors.ObjectNotFoundError` for a missing file.
    """
    if isinstance(path_or_dict, dict):
        return Calibrator.from_dict(path_or_dict)
    if isinstance(path_or_dict, (str, os.PathLike)):
        return Calibrator.load(path_or_dict)
    raise InputError(f"path_or_dict must be a file path or a dict from Calibrator.to_dict(), got "
                     f"{type(path_or_dict).__name__}.")


# -- helpers -------------------------------------------------------------------------------------------------
def _check_outputs(outputs, name: str, keep_float32: bool = False) -> np.ndarray:
    if keep_float32 and isinstance(outputs, np.ndarray) and outputs.dtype == np.float32 and outputs.ndim == 2 \
            and outputs.size > PREDICT_BLOCK_ENTRIES:
        require_finite(outputs, name)
        x = outputs
    else:
        x = as_float_array(outputs, name, 2)
    if x.shape[1] < 2:
        raise InputError(f"{name} has {x.shape[1]} class column(s); a calibrator needs at least 2 classes "
                         "(pass one column per class, e.g. [1 - p, p] for a binary classifier).")
    return x


def float_lists(a) -> list:
    """A float array as nested lists of Python floats (json writes them with repr precision)."""
    return np.asarray(a, dtype=np.float64).tolist()


def _jsonable(settings: dict) -> dict:
    out = {}
    for key, v in settings.items():
        out[key] = v.item() if isinstance(v, np.generic) else v
    return out


def _read_json(path):
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ObjectNotFoundError(f"calibrator file {p} does not exist; check the path or save a fitted "
                                  "calibrator there with .save(path).") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise FormatError(f"calibrator file {p} could not be read as UTF-8 JSON text ({exc}); pass the path of a "
                          "file written by Calibrator.save.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"calibrator file {p} is not valid JSON ({exc}); it is corrupt or truncated. Re-save "
                          "the calibrator with .save(path).") from None


class _ParamReader:
    """Reads fields of a ``params`` dict, turning every problem into a FormatError that names the file."""

    def __init__(self, params: dict, source: str):
        self.params = params
        self.source = source

    def _get(self, key: str):
        if key not in self.params:
            raise FormatError(f"{self.source} has no params.{key} field; it is incomplete. Re-save the calibrator "
                              "with .save(path).")
        return self.params[key]

    def array(self, key: str, shape: tuple[int, ...], dtype=np.float64, positive: bool = False) -> np.ndarray:
        raw = self._get(key)
        try:
            arr = np.asarray(raw, dtype=dtype)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.shape != shape or (arr.dtype.kind == "f" and not np.all(np.isfinite(arr))) or \
                (positive and np.any(arr <= 0)):
            raise FormatError(f"{self.source}: params.{key} must be a finite{' positive' if positive else ''} "
                              f"array of shape {shape}; the file is corrupt. Re-save the calibrator with .save(path).")
        return arr

    def indices(self, key: str, n_cols: int, upper: int) -> np.ndarray:
        """An integer array of shape (n, n_cols) (or (n,) when n_cols == 0) with entries in 0..upper-1."""
        raw = self._get(key)
        try:
            arr = np.asarray(raw, dtype=np.int64).reshape((-1, n_cols) if n_cols else (-1,))
            ok = bool(np.all(np.asarray(raw, dtype=np.float64).ravel() == arr.ravel()))
        except (TypeError, ValueError):
            ok = False
        if not ok or (arr.size and (arr.min() < 0 or arr.max() >= upper)):
            raise FormatError(f"{self.source}: params.{key} must hold integer indices in 0..{upper - 1}; the file "
                              "is corrupt. Re-save the calibrator with .save(path).")
        return arr

    def scalar(self, key: str, positive: bool = False) -> float:
        return float(self.array(key, (), positive=positive))

    def optional(self, key: str, default=None):
        return self.params.get(key, default)
