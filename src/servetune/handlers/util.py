"""Helpers shared by handlers; the module that ``ts.utils.util`` resolves to.

Torch-free on purpose: the frontend may import the exceptions without pulling torch in.
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

logger = logging.getLogger(__name__)

__all__ = [
    "BadInputError",
    "PredictionException",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
    "request_input",
]


class PredictionException(Exception):
    """Raise from a handler to answer the request(s) with ``error_code`` and ``message``.

    Same signature as TorchServe's ``ts.utils.util.PredictionException``.
    """

    #: the ``type`` field of the JSON error body (TorchServe's frontend reports worker errors this way)
    error_type = "InternalServerException"

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


class BadInputError(PredictionException):
    """One request's input cannot be used (corrupt image, empty body, wrong type): answered 400.

    Raise it from ``BaseHandler.preprocess_item`` (or inside ``BaseHandler.preprocess_each``) and only that
    request fails; the model still runs on the rest of the batch. Raised from anywhere else in ``handle``,
    the worker re-runs each request of the batch alone, so again only the offending one gets the 400.
    """

    error_type = "BadRequestException"

    def __init__(self, message: str, error_code: int = 400) -> None:
        super().__init__(message, error_code)


def request_input(row: Any) -> Any:
    """A request's payload: its ``data`` field, else its ``body`` (TorchServe's ``row.get("data") or row.get("body")``).

    Unlike a plain ``or``, an empty ``data`` with no ``body`` stays empty rather than becoming None.
    """
    if not isinstance(row, dict):
        return row
    value = row.get("data")
    return value if value else row.get("body", value)


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """The classes defined in ``module`` itself (not imported into it), optionally only ``parent_class`` ones."""
    classes = [
        member for _, member in inspect.getmembers(module, inspect.isclass) if member.__module__ == module.__name__
    ]
    if parent_class is not None:
        return [cls for cls in classes if issubclass(cls, parent_class)]
    return classes


def load_label_mapping(mapping_file_path: str | os.PathLike[str]) -> dict[str, str] | None:
    """Read ``index_to_name.json`` (``{"0": "cat"}`` or ``{"0": ["n0212", "cat"]}``); None when the file is absent."""
    path = Path(mapping_file_path)
    if not path.is_file():
        logger.warning("%r is missing. Inference output will not include class name.", str(path))
        return None
    mapping = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(mapping, dict):
        raise ValueError(f'{path}: index->name JSON mapping should be in "class": "label" format')
    # An older TorchServe example format: {"object_type_names": ["a", "b", ...]}.
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(i): str(name) for i, name in enumerate(names)}
    result: dict[str, str] = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ValueError(f"{path}: label of class {key!r} must be a str or a list of str, got {value!r}")
        result[str(key)] = label
    return result


def map_class_to_label(
    probs: list[list[Any]],
    mapping: dict[str, str] | None = None,
    lbl_classes: Iterable[Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """Turn per-row probabilities (and their class ids) into ``[{label: prob, ...}, ...]``.

    Without ``lbl_classes`` the class id of a value is its position in the row. A class id missing from
    ``mapping`` keeps its number as label (TorchServe raises ``KeyError``).
    """
    if not isinstance(probs, list):
        raise TypeError("Convert classes to list before doing mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise TypeError("Mapping must be a dict")
    if lbl_classes is None:
        width = len(probs[0]) if probs else 0
        lbl_classes = itertools.repeat(range(width), len(probs))

    def label(cls: Any) -> str:
        return mapping.get(str(cls), str(cls)) if mapping is not None else str(cls)

    return [
        {label(cls): prob for cls, prob in zip(classes, row, strict=False)}
        for classes, row in zip(lbl_classes, probs, strict=False)
    ]


def get_yaml_config(yaml_file_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a model-config.yaml with the safe loader (an empty file is an empty dict)."""
    with open(yaml_file_path, encoding="utf-8") as file:
        config = yaml.safe_load(file)
    return config if isinstance(config, dict) else {}
