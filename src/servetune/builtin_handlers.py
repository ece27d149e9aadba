"""The built-in handlers' names, as a manifest writes them, and the module of each.

A module of its own, outside ``servetune.handlers`` (whose package imports the handler contract): the frontend reads
it before anything else, to start a start-up model's parent early (``servetune.server.early``).
"""

from __future__ import annotations

#: built-in handler name (as written in a manifest) -> module holding the handler class
BUILTIN_HANDLERS: dict[str, str] = {
    "base_handler": "servetune.handlers.base",
    "vision_handler": "servetune.handlers.vision",
    "image_classifier": "servetune.handlers.image_classifier",
    "object_detector": "servetune.handlers.object_detector",
    "image_segmenter": "servetune.handlers.image_segmenter",
    "text_handler": "servetune.handlers.text",
    "text_classifier": "servetune.handlers.text_classifier",
}

__all__ = ["BUILTIN_HANDLERS"]
