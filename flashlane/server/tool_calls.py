"""Qwen3-Coder XML tool calls -> OpenAI tool calls.

The model writes (between <tool_call> and </tool_call>, which the reply parser cuts out):

    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>

Values are text; they become JSON values by the tool's JSON schema for that parameter
(integer, number, boolean, null, object, array), else they stay strings. A Hermes-style JSON
body ({"name": ..., "arguments": {...}}) is accepted too.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


def parse_tool_call(body: str, schemas: dict[str, dict[str, Any]]) -> ParsedToolCall | None:
    """Parses the text between <tool_call> and </tool_call>; None if it is not a call.

    `schemas` maps a function name to its JSON schema `parameters`.
    """
    stripped = body.strip()
    if stripped.startswith("{"):
        return _parse_json_call(stripped)
    match = _FUNCTION.search(body)
    if match is None:
        return None
    name = match.group(1).strip()
    properties = (schemas.get(name) or {}).get("properties") or {}
    arguments: dict[str, Any] = {}
    for param in _PARAMETER.finditer(match.group(2)):
        key = param.group(1).strip()
        arguments[key] = convert_value(_trim_newlines(param.group(2)), properties.get(key))
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _parse_json_call(body: str) -> ParsedToolCall | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(call["name"], arguments)


def _trim_newlines(value: str) -> str:
    """The format puts the value on its own lines: drop one newline on each side."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def convert_value(value: str, schema: dict[str, Any] | None) -> Any:
    """Turns a parameter's text into the JSON value its schema asks for; text if none fits."""
    types = _schema_types(schema)
    if not types or types == ["string"]:
        return value
    text = value.strip()
    if "null" in types and text.lower() in ("null", "none"):
        return None
    for kind in types:
        converted = _convert(text, kind)
        if converted is not _NO:
            return converted
    return value


_NO = object()


def _convert(text: str, kind: str) -> Any:
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _NO
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return _NO
        return int(text) if re.fullmatch(r"-?\d+", text) else number
    if kind == "boolean":
        lowered = text.lower()
        return lowered == "true" if lowered in ("true", "false") else _NO
    if kind in ("object", "array"):
        return _parse_structure(text, dict if kind == "object" else list)
    return _NO


def _parse_structure(text: str, want: type) -> Any:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        try:
            # models sometimes write Python literals (single quotes, True/None)
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return _NO
    return parsed if isinstance(parsed, want) else _NO


def _schema_types(schema: dict[str, Any] | None) -> list[str]:
    """The JSON types a schema allows, non-string ones first so "5" for [string, integer] is 5."""
    if not isinstance(schema, dict):
        return []
    kinds = schema.get("type")
    found: list[str] = []
    if isinstance(kinds, str):
        found.append(kinds)
    elif isinstance(kinds, list):
        found.extend(k for k in kinds if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            found.extend(_schema_types(option))
    if not found and "enum" in schema:
        found.append("string")
    if not found and "properties" in schema:
        found.append("object")
    return sorted(set(found), key=lambda k: (k == "string", k))
