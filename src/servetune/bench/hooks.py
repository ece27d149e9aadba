"""How one stage's answer becomes the next stage's request in a pipeline (``servetune bench --pipeline``, a study's
``pipeline:``).

A hook is a function ``hook(answer: bytes, source: bytes) -> bytes | list[bytes] | None``: ``answer`` is the previous
stage's response body, ``source`` the pipeline's input file as read from disk. It returns the next request's body,
several bodies (the stage is called once for each, at the same time, and the pipeline goes on when all have
answered), or None (the pipeline ends there: an answer with nothing to follow up, e.g. no box found). A hook may
set ``hook.content_type``: the body's content type when the stage does not give one.

Built-in hooks, by name (``HOOKS``, name -> ``"module:attr"``); any other is ``FILE.py:FUNCTION`` in the folder of
the file that names it (a study, a pipeline file):

- ``answer``: the previous answer as it came (JSON in, JSON out);
- ``same_input``: the pipeline's input again (a second model called on the same request);
- ``crop_top_box``: the input image cropped to the top-scored box of a detector's answer, as PNG. The answer is a
  list of detections, each with a ``score`` and its box either under ``bbox`` (the Animated Drawings detector) or
  under its class name (TorchServe's object detector): ``[x1, y1, x2, y2]`` in the input's pixels. What the
  Animated Drawings app does between its detector and its pose estimator.

Hooks run on a thread of the load generator (not on its event loop), and their results are remembered per
(input, answer), so a pipeline driven at a steady rate does not spend the client's CPU on the same crop twice.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servetune._exceptions import ConfigError
from servetune.registry import load_target

Made = bytes | list[bytes] | None
Hook = Callable[[bytes, bytes], Made]

HOOKS: dict[str, str] = {
    "answer": "servetune.bench.hooks:answer",
    "same_input": "servetune.bench.hooks:same_input",
    "crop_top_box": "servetune.bench.hooks:crop_top_box",
}


def answer(answer: bytes, source: bytes) -> bytes:
    return answer


answer.content_type = "application/json"  # type: ignore[attr-defined]


def same_input(answer: bytes, source: bytes) -> bytes:
    return source


def crop_top_box(answer: bytes, source: bytes) -> bytes | None:
    """The input cropped to the best detection's box (PNG); None when there is no detection or the box is empty."""
    box = top_box(json.loads(answer))
    if box is None:
        return None
    from PIL import Image

    with Image.open(io.BytesIO(source)) as image:
        width, height = image.size
        x1, y1, x2, y2 = (round(v) for v in box)
        x1, x2 = max(0, min(x1, width)), max(0, min(x2, width))
        y1, y2 = max(0, min(y1, height)), max(0, min(y2, height))
        if x2 <= x1 or y2 <= y1:
            return None
        crop = image.convert("RGB").crop((x1, y1, x2, y2))
    out = io.BytesIO()
    crop.save(out, format="PNG", compress_level=1)
    return out.getvalue()


crop_top_box.content_type = "image/png"  # type: ignore[attr-defined]


def top_box(detections: Any) -> list[float] | None:
    """The box of the highest-scored detection of a detector's answer, or None."""
    best: tuple[float, list[float]] | None = None
    for item in detections if isinstance(detections, list) else []:
        if not isinstance(item, dict):
            continue
        score = item.get("score")
        box = item.get("bbox")
        if box is None:  # TorchServe's object detector: {"<class name>": [x1, y1, x2, y2], "score": s}
            box = next((v for k, v in item.items() if k != "score" and _is_box(v)), None)
        if isinstance(score, (int, float)) and isinstance(box, list) and _is_box(box):
            if best is None or score > best[0]:
                best = (float(score), [float(v) for v in box])
    return None if best is None else best[1]


def _is_box(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 4
        and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value)
    )


def load_hook(where: str, name: str, folder: Path | None) -> Hook:
    """The hook ``name`` (built-in, or ``FILE.py:FUNCTION`` relative to ``folder``); ConfigError naming ``where``."""
    if name in HOOKS:
        hook: Hook = load_target(HOOKS[name])
        return hook
    file, sep, function = name.partition(":")
    if not sep or not file.endswith(".py") or not function.isidentifier():
        raise ConfigError(f"{where}={name!r}: expected one of {', '.join(HOOKS)}, or FILE.py:FUNCTION")
    path = hook_path(name, folder)
    if not path.is_file():
        raise ConfigError(f"{where}={name!r}: no such file ({path})")
    spec = importlib.util.spec_from_file_location(f"servetune_hook_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: say which and why
        raise ConfigError(f"{where}={name!r}: {path.name} failed to load: {type(exc).__name__}: {exc}") from None
    found = getattr(module, function, None)
    if not callable(found):
        raise ConfigError(f"{where}={name!r}: {path.name} has no function {function!r}")
    custom: Hook = found
    return custom


def hook_path(name: str, folder: Path | None) -> Path:
    """The file of a ``FILE.py:FUNCTION`` hook."""
    file = name.partition(":")[0]
    return ((folder or Path.cwd()) / file).resolve()


def content_type(hook: Hook) -> str | None:
    return getattr(hook, "content_type", None)
