"""``MAR-INF/MANIFEST.json``: the description of a model archive, as torch-model-archiver writes it.

The typed fields mirror what torch-model-archiver 0.12 writes and what TorchServe's Java reader knows;
keys neither knows are kept verbatim in ``extra`` so that a manifest survives a read/write round trip.
``Manifest.raw`` is the dict exactly as read: it is what a handler sees as ``context.manifest``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from servetune._exceptions import ArchiveError

__all__ = [
    "CREATED_ON_FORMAT",
    "MANIFEST_PATH",
    "RUNTIMES",
    "Manifest",
    "ManifestModel",
    "validate_model_name",
]

MANIFEST_PATH = "MAR-INF/MANIFEST.json"
CREATED_ON_FORMAT = "%d/%m/%Y %H:%M:%S"
RUNTIMES = ("python", "python3", "LSP")

# torch-model-archiver's check_model_name_regex_or_exit; a leading digit is allowed there too.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-.]*")

# JSON key -> attribute, in the order torch-model-archiver writes them, then the keys only the Java reader knows.
_MODEL_KEYS: dict[str, str] = {
    "modelName": "model_name",
    "serializedFile": "serialized_file",
    "handler": "handler",
    "modelFile": "model_file",
    "modelVersion": "model_version",
    "extensions": "extensions",
    "requirementsFile": "requirements_file",
    "configFile": "config_file",
    "description": "description",
    "version": "version",
    "envelope": "envelope",
}
_TOP_KEYS = ("createdOn", "runtime", "model", "archiverVersion", "description")


def validate_model_name(name: str) -> str:
    """Return ``name`` if torch-model-archiver would accept it as ``--model-name``, else raise ArchiveError."""
    if not isinstance(name, str) or _MODEL_NAME.fullmatch(name) is None:
        raise ArchiveError(
            f"invalid model name {name!r}: it must start with a letter or digit and contain only letters, "
            "digits, '_', '-' and '.' (regex ^[A-Za-z0-9][A-Za-z0-9_\\-.]*$)"
        )
    return name


def _text(where: str, value: Any) -> str | None:
    # TorchServe reads these with Gson into String fields: numbers become their text, objects are an error.
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ArchiveError(f"manifest key {where} must be a string, got {value!r}")


@dataclass(frozen=True)
class ManifestModel:
    """The ``model`` object of a manifest. Every field is optional: a directory model may have none."""

    model_name: str | None = None
    handler: str | None = None
    serialized_file: str | None = None
    model_file: str | None = None
    model_version: str | None = None
    extensions: Any = None
    requirements_file: str | None = None
    config_file: str | None = None
    description: str | None = None
    version: str | None = None
    envelope: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManifestModel:
        """Parse the ``model`` object; unknown keys go to ``extra``."""
        values: dict[str, Any] = {}
        for key, attr in _MODEL_KEYS.items():
            if key in data:
                values[attr] = data[key] if key == "extensions" else _text(f"model.{key}", data[key])
        extra = {k: copy.deepcopy(v) for k, v in data.items() if k not in _MODEL_KEYS}
        return cls(**values, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, keys in torch-model-archiver's order, unset fields left out."""
        out: dict[str, Any] = {}
        for key, attr in _MODEL_KEYS.items():
            value = getattr(self, attr)
            if value is not None:
                out[key] = copy.deepcopy(value)
        out.update(copy.deepcopy(self.extra))
        return out


@dataclass(frozen=True)
class Manifest:
    """A parsed ``MANIFEST.json``. ``Manifest()`` is the empty manifest TorchServe assumes when there is none."""

    created_on: str | None = None
    runtime: str = "python"
    archiver_version: str | None = None
    description: str | None = None
    model: ManifestModel = field(default_factory=ManifestModel)
    extra: dict[str, Any] = field(default_factory=dict)
    # The dict this manifest was read from; dataclasses.replace() drops it, so raw then follows the new values.
    _raw: dict[str, Any] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ArchiveError(f"manifest key runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """Parse a manifest dict. A missing ``runtime`` means ``python``, as in TorchServe."""
        if not isinstance(data, Mapping):
            raise ArchiveError(f"a manifest must be a JSON object, got {type(data).__name__}")
        model = data.get("model")
        if model is None:
            model = {}
        if not isinstance(model, Mapping):
            raise ArchiveError(f"manifest key model must be an object, got {model!r}")
        runtime = _text("runtime", data.get("runtime"))
        manifest = cls(
            created_on=_text("createdOn", data.get("createdOn")),
            runtime="python" if runtime is None else runtime,
            archiver_version=_text("archiverVersion", data.get("archiverVersion")),
            description=_text("description", data.get("description")),
            model=ManifestModel.from_dict(model),
            extra={k: copy.deepcopy(v) for k, v in data.items() if k not in _TOP_KEYS},
        )
        object.__setattr__(manifest, "_raw", copy.deepcopy(dict(data)))
        return manifest

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "MANIFEST.json") -> Manifest:
        """Parse manifest JSON text; ``where`` names the file in error messages."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ArchiveError(f"{where}: not valid JSON: {exc}") from exc
        try:
            return cls.from_dict(data)
        except ArchiveError as exc:
            raise ArchiveError(f"{where}: {exc}") from exc

    @classmethod
    def create(
        cls,
        model: ManifestModel,
        *,
        runtime: str = "python",
        archiver_version: str | None = None,
        created_on: datetime | None = None,
    ) -> Manifest:
        """A new manifest stamped with ``created_on`` (default: now, local time, as torch-model-archiver does)."""
        stamp = (created_on or datetime.now()).strftime(CREATED_ON_FORMAT)
        return cls(created_on=stamp, runtime=runtime, archiver_version=archiver_version, model=model)

    @property
    def raw(self) -> dict[str, Any]:
        """The manifest dict exactly as read (a copy); ``{}`` when the archive had no manifest."""
        return copy.deepcopy(self._raw) if self._raw is not None else self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The JSON object in torch-model-archiver's key order; unknown keys kept, unset fields left out."""
        out: dict[str, Any] = {}
        if self.created_on is not None:
            out["createdOn"] = self.created_on
        out["runtime"] = self.runtime
        if self.description is not None:
            out["description"] = self.description
        out["model"] = self.model.to_dict()
        if self.archiver_version is not None:
            out["archiverVersion"] = self.archiver_version
        out.update(copy.deepcopy(self.extra))
        return out

    def to_json(self) -> str:
        """The text torch-model-archiver writes: ``json.dumps(..., indent=2)``."""
        return json.dumps(self.to_dict(), indent=2)
