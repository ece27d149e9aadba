"""The model registry: the served versions of each model and each model's default version."""

from __future__ import annotations

from servetune._exceptions import ApiError
from servetune.server.model import ServedModel


class ModelRegistry:
    def __init__(self) -> None:
        self.models: dict[str, dict[str, ServedModel]] = {}
        self.defaults: dict[str, str] = {}

    def all(self) -> list[ServedModel]:
        return [m for name in sorted(self.models) for _, m in sorted(self.models[name].items())]

    def get(self, name: str, version: str | None = None) -> ServedModel:
        versions = self.models.get(name)
        if not versions:
            raise ApiError.model_not_found(name)
        if version is None:
            return versions[self.defaults[name]]
        found = versions.get(version)
        if found is None:
            raise ApiError.version_not_found(name, version)
        return found

    def is_default(self, model: ServedModel) -> bool:
        return self.defaults.get(model.name) == model.version

    def add(self, model: ServedModel) -> None:
        """Register a version; a new model takes it as its default. ApiError 409 if it is registered already."""
        versions = self.models.setdefault(model.name, {})
        if model.version in versions:
            raise ApiError.conflict(f"Model version {model.version} is already registered for model {model.name}")
        versions[model.version] = model
        self.defaults.setdefault(model.name, model.version)

    def remove(self, model: ServedModel) -> None:
        versions = self.models.get(model.name, {})
        if versions.get(model.version) is not model:
            return
        del versions[model.version]
        if not versions:
            self.models.pop(model.name, None)
            self.defaults.pop(model.name, None)
        elif self.defaults.get(model.name) == model.version:
            self.defaults[model.name] = sorted(versions)[0]

    def set_default(self, name: str, version: str) -> None:
        self.get(name, version)
        self.defaults[name] = version


__all__ = ["ModelRegistry"]
