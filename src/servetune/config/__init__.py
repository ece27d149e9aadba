"""Typed settings: server (config.properties), model (model-config.yaml), one precedence rule."""

from __future__ import annotations

from servetune.config.model import ModelConfig, models_json_entry
from servetune.config.properties import parse_properties, read_properties
from servetune.config.server import Address, ServerConfig

__all__ = ["Address", "ModelConfig", "ServerConfig", "models_json_entry", "parse_properties", "read_properties"]
