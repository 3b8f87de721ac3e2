"""Gemma 3n text decoder: config parsing, the model split into self-/cross-decoder, its layers."""

from yoco_rs.models.gemma3n.config import (
    ConfigError, Gemma3nTextArgs, KvGroup, ModelConfig, kv_groups, kv_slices, load_config, parse_config,
)
from yoco_rs.models.gemma3n.model import Gemma3nModel

__all__ = ["ConfigError", "Gemma3nModel", "Gemma3nTextArgs", "KvGroup", "ModelConfig", "kv_groups", "kv_slices",
           "load_config", "parse_config"]
