"""The set of tools a world knows, and validation of the arguments an LLM sends them."""
from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from ..vocab import LLM_NAME
from .base import Tool, ToolError

# How much of the model's own text we echo back in an error message: enough to see the mistake,
# never a megabyte of it (that would only burn the model's context).
_ECHO_LIMIT = 200
_MAX_ERRORS = 3


class ToolArgumentError(ToolError):
    """The model's arguments are not JSON, not an object, or do not match the tool's schema."""


class ToolRegistry:
    """Tools by name. Names are the ones the LLM sees, so they must satisfy OpenAI's rule."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> None:
        """Add a tool; ValueError for a name the LLM could not call, a duplicate, or a broken schema."""
        if not LLM_NAME.fullmatch(tool.name):
            raise ValueError(f"invalid tool name {tool.name!r}: must match {LLM_NAME.pattern}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        try:
            _validator(_schema_key(tool.parameters))
        except SchemaError as exc:
            raise ValueError(f"tool {tool.name!r} has an invalid parameter schema: {exc.message}") from None
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[Tool]:
        return [self._tools[name] for name in self.names()]

    def specs(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI `tools` entries, sorted by name so the prompt prefix stays cacheable.

        Unknown names are skipped: an agent may list tools of an MCP server that is down right now.
        """
        wanted = self.names() if names is None else sorted(set(names) & self._tools.keys())
        return [self._tools[name].spec() for name in wanted]

    def unregister(self, name: str) -> bool:
        return self._tools.pop(name, None) is not None

    def unregister_prefix(self, prefix: str) -> list[str]:
        """Remove every tool whose name starts with `prefix` (e.g. `"github__"`); returns their names."""
        gone = [name for name in self._tools if name.startswith(prefix)]
        for name in gone:
            del self._tools[name]
        return sorted(gone)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)


def parse_arguments(tool: Tool, raw: str | None) -> dict[str, Any]:
    """Parse the model's argument text and validate it against the tool's schema.

    Raises ToolArgumentError with a message meant for the model (it will read it and retry).
    """
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        args: Any = {}  # models send "" for tools without parameters
    else:
        try:
            args = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ToolArgumentError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(args, dict):
        raise ToolArgumentError(f"arguments must be an object, got {_json_type(args)}")
    try:
        validator = _validator(_schema_key(tool.parameters))
    except SchemaError as exc:
        raise ToolArgumentError(f"tool {tool.name!r} has an invalid parameter schema: {exc.message}") from None
    errors = list(validator.iter_errors(args))
    if errors:
        # The most telling error first (what jsonschema's best_match picks), the rest in schema order.
        best = best_match(errors)
        errors = [best] + [e for e in errors if e is not best and best not in (e.context or ())]
        shown = "; ".join(f"{_clip(err.message)} (at {err.json_path})" for err in errors[:_MAX_ERRORS])
        more = len(errors) - _MAX_ERRORS
        raise ToolArgumentError(shown + (f"; and {more} more" if more > 0 else ""))
    return args


def _schema_key(schema: dict[str, Any]) -> str:
    # The cache is keyed by the schema's canonical text, not the Tool: Tool holds dicts and is
    # unhashable, and MCP tools are rebuilt on every reconnect with the same schema.
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@lru_cache(maxsize=1024)
def _validator(schema_text: str) -> Draft202012Validator:
    schema = json.loads(schema_text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__


def _clip(text: str) -> str:
    return text if len(text) <= _ECHO_LIMIT else text[:_ECHO_LIMIT] + "…"
