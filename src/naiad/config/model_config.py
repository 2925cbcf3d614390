"""config.pbtxt <-> tritonclient's ModelConfig protobuf: parsing with located errors, JSON view, validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from naiad.protocol.datatypes import CONFIG_TO_PROTOCOL

ModelConfig = mc.ModelConfig


class ConfigError(Exception):
    """A model configuration problem, naming the file, line and field where known."""


class ConfigReadError(ConfigError):
    """The config cannot be read at all (syntax, name, backend): Triton's repository poll fails.

    Such a model gets no version state, so it neither shows in the index nor affects readiness.
    """


def parse_config_text(text: str, source: str) -> mc.ModelConfig:
    """Parse protobuf text format; errors carry `<file>:<line>:<col>` and the offending field."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        detail = str(exc)
        if line is not None and detail.startswith(f"{line}:"):
            detail = detail.split(" : ", 1)[-1]
        where = f"{source}:{line}:{col}" if line is not None else source
        raise ConfigError(f"{where}: {detail}") from None
    return config


def load_config_file(path: Path) -> mc.ModelConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config_text(text, str(path))


def parse_config_json(text: str, source: str = "config override") -> mc.ModelConfig:
    """Parse the JSON form (as given to the load API's `config` parameter)."""
    config = mc.ModelConfig()
    try:
        doc = orjson.loads(text)  # depth-bounded, no Python recursion
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{source}: Failed to load JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the configuration must be a JSON object")
    if _depth_exceeds(doc, MAX_CONFIG_JSON_DEPTH):
        # protobuf's parser recurses and quotes whole values in its errors: refuse before it
        raise ConfigError(f"{source}: the configuration is nested deeper than {MAX_CONFIG_JSON_DEPTH} levels")
    try:
        json_format.ParseDict(doc, config, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


MAX_CONFIG_JSON_DEPTH = 32  # ModelConfig's deepest fields (warm-up inputs, accelerator parameters) need < 10


def _depth_exceeds(doc: Any, limit: int) -> bool:
    """True when JSON lists/objects nest deeper than `limit` (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


_INT64_TYPES = {
    FieldDescriptor.CPPTYPE_INT64,
    FieldDescriptor.CPPTYPE_UINT64,
}


def _fix_int64(message_descriptor: Any, value: dict[str, Any]) -> None:
    """protobuf's JSON mapping renders 64-bit ints as strings; Triton's config JSON has numbers."""
    for field in message_descriptor.fields:
        key = field.name
        if key not in value:
            continue
        item = value[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            val_field = field.message_type.fields_by_name["value"]
            if val_field.message_type is not None:
                for sub in item.values():
                    _fix_int64(val_field.message_type, sub)
            elif val_field.cpp_type in _INT64_TYPES:
                value[key] = {k: int(v) for k, v in item.items()}
        elif field.message_type is not None:
            if field.is_repeated:
                for sub in item:
                    _fix_int64(field.message_type, sub)
            else:
                _fix_int64(field.message_type, item)
        elif field.cpp_type in _INT64_TYPES:
            value[key] = [int(v) for v in item] if field.is_repeated else int(item)


def config_to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """The JSON view Triton serves at /config: field names kept, defaults printed, int64 as numbers."""
    value = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _fix_int64(mc.ModelConfig.DESCRIPTOR, value)
    return value


def config_to_json(config: mc.ModelConfig) -> str:
    return json.dumps(config_to_dict(config))


def datatype_name(data_type: int) -> str:
    """Protocol datatype name ("FP32", "BYTES", ...) of a config TYPE_* enum value."""
    return CONFIG_TO_PROTOCOL.get(mc.DataType.Name(data_type), "INVALID")


def scheduler_kind(config: mc.ModelConfig) -> str | None:
    """'dynamic_batching', 'sequence_batching', 'ensemble_scheduling' or None (default scheduler)."""
    kind: str | None = config.WhichOneof("scheduling_choice")
    return kind


def parameter(config: mc.ModelConfig, key: str, default: str | None = None) -> str | None:
    """A string parameter from the config's `parameters` map."""
    if key in config.parameters:
        value: str = config.parameters[key].string_value
        return value
    return default


def parse_bool(text: str | None, default: bool = False) -> bool:
    if text is None or text == "":
        return default
    return text.strip().lower() in ("1", "true", "yes", "on")
