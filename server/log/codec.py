"""How events are stored: compact JSON, with orjson (several times faster than `json` on large reads)."""
from __future__ import annotations

import json
from typing import Any

import orjson


def encode(event: dict[str, Any]) -> str:
    try:
        return orjson.dumps(event).decode()
    except TypeError:  # e.g. an integer beyond 64 bits: the standard library takes any JSON value
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def decode(body: str | bytes) -> dict[str, Any]:
    return orjson.loads(body)
