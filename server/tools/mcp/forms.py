"""Elicitation forms: the flat JSON Schema subset MCP allows in `requestedSchema`, and answers checked
against it on the server before they go back (a form in the browser is a convenience, not a check).
URL mode (the spec's out-of-band consent): the URL checked before a person is shown it, and its answer.

A schema is `{"type": "object", "properties": {name: field}, "required": [...]}`, each field one of:
string (`minLength`, `maxLength`, `format`: email, uri, date, date-time; or `enum` with `enumNames`),
number / integer (`minimum`, `maximum`), boolean, or a multi-select array of strings (`items` with `enum`
or `anyOf` consts, `minItems`, `maxItems`); each may have `title`, `description`, `default`.
"""
from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from datetime import date, datetime
from typing import Any
from urllib.parse import urlsplit

import idna

ACTIONS = ("accept", "decline", "cancel")
MAX_URL = 2000  # characters of a URL-mode question's URL
MAX_SCHEMA = 64_000  # characters of a form's schema, as JSON
MAX_TEXT = 10_000  # characters of one answered string
FORMATS = ("email", "uri", "date", "date-time")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_FIELD_KEYS = {"type", "title", "description", "default", "minLength", "maxLength", "format", "enum",
               "enumNames", "oneOf", "minimum", "maximum", "items", "minItems", "maxItems"}


def check_schema(schema: object) -> dict[str, Any]:
    """The schema if it is the flat subset; ValueError saying what is not."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError("requestedSchema must be an object schema")
    if len(json.dumps(schema, default=str)) > MAX_SCHEMA:  # it is stored and shown: an untrusted server's text
        raise ValueError(f"requestedSchema is larger than {MAX_SCHEMA} characters")
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict) or len(properties) > 50:
        raise ValueError("requestedSchema.properties must map at most 50 names to fields")
    for name, field in properties.items():
        if not isinstance(field, dict) or field.get("type") not in ("string", "number", "integer", "boolean", "array"):
            raise ValueError(f"field {name!r}: only flat string, number, integer and boolean fields (and "
                             "multi-select arrays of strings) are allowed")
        if field["type"] == "array" and (not isinstance(field.get("items"), dict) or _enum(field["items"]) is None):
            raise ValueError(f"field {name!r}: an array field is a multi-select: items with enum or anyOf")
        if set(field) - _FIELD_KEYS:
            raise ValueError(f"field {name!r}: unsupported keywords {sorted(set(field) - _FIELD_KEYS)}")
        if "format" in field and field["format"] not in FORMATS:
            raise ValueError(f"field {name!r}: format must be one of {', '.join(FORMATS)}")
    required = schema.get("required") or []
    if not isinstance(required, list) or not all(r in properties for r in required):
        raise ValueError("requestedSchema.required must name its properties")
    return {"type": "object", "properties": properties, "required": required}


def _enum(field: dict[str, Any]) -> list[Any] | None:
    if isinstance(field.get("enum"), list):
        return list(field["enum"])
    for key in ("oneOf", "anyOf"):
        if isinstance(field.get(key), list):
            return [option.get("const") for option in field[key] if isinstance(option, dict)]
    return None


def _check_field(name: str, field: dict[str, Any], value: Any) -> Any:
    kind = field["type"]
    if kind == "array":
        options = _enum(field["items"]) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v in options for v in value):
            raise ValueError(f"{name} must be a list of {', '.join(map(str, options))}")
        if "minItems" in field and len(value) < field["minItems"]:
            raise ValueError(f"{name} needs at least {field['minItems']} choices")
        if "maxItems" in field and len(value) > field["maxItems"]:
            raise ValueError(f"{name} allows at most {field['maxItems']} choices")
        return list(value)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (kind == "integer" and not float(value).is_integer()):
            raise ValueError(f"{name} must be {'an integer' if kind == 'integer' else 'a number'}")
        value = int(value) if kind == "integer" else value
        if "minimum" in field and value < field["minimum"]:
            raise ValueError(f"{name} must be at least {field['minimum']}")
        if "maximum" in field and value > field["maximum"]:
            raise ValueError(f"{name} must be at most {field['maximum']}")
        return value
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be a string of at most {MAX_TEXT} characters")
    choices = _enum(field)
    if choices is not None and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}")
    if "minLength" in field and len(value) < field["minLength"]:
        raise ValueError(f"{name} must have at least {field['minLength']} characters")
    if "maxLength" in field and len(value) > field["maxLength"]:
        raise ValueError(f"{name} must have at most {field['maxLength']} characters")
    fmt = field.get("format")
    try:
        if fmt == "email" and not _EMAIL.match(value):
            raise ValueError
        if fmt == "uri" and not (urlsplit(value).scheme and (urlsplit(value).netloc or urlsplit(value).path)):
            raise ValueError
        if fmt == "date":
            date.fromisoformat(value)
        if fmt == "date-time":
            datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name} must be a valid {fmt}") from None
    return value


def check_answer(schema: dict[str, Any], answer: object) -> dict[str, Any]:
    """`{"action": "accept", "content": {...}}`, `{"action": "decline"}` or `{"action": "cancel"}`, checked
    against `schema`; ValueError with every problem in one message."""
    if not isinstance(answer, dict) or answer.get("action") not in ACTIONS or set(answer) - {"action", "content"}:
        raise ValueError('an answer is {"action": "accept"|"decline"|"cancel", "content"?: {...}}')
    if answer["action"] != "accept":
        return {"action": answer["action"]}
    content = answer.get("content") or {}
    if not isinstance(content, dict):
        raise ValueError("content must be an object")
    properties: dict[str, Any] = schema.get("properties") or {}
    problems = [f"unknown field {name!r}" for name in content if name not in properties]
    problems += [f"{name} is required" for name in schema.get("required") or [] if content.get(name) is None]
    checked: dict[str, Any] = {}
    for name, value in content.items():
        if name in properties and value is not None:
            try:
                checked[name] = _check_field(name, properties[name], value)
            except ValueError as exc:
                problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))
    return {"action": "accept", "content": checked}


def check_url(url: object) -> tuple[str, str]:
    """A URL-mode question's URL (or a sign-in link) and the host a person is shown, as a browser opens it
    (UTS #46 non-transitional IDNA, so no look-alike letters hide it: `faß.de` is `xn--fa-hia.de`, where the
    old IDNA 2003 said `fass.de`); ValueError for anything but an absolute http(s) URL without credentials,
    with a host of letters, digits, hyphens and dots (or a bracketed IPv6 address; a browser reads a backslash
    as `/`), and without invisible or bidirectional formatting characters anywhere."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL or any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError(f"the url must be one line of at most {MAX_URL} characters")
    if any(unicodedata.category(c) == "Cf" for c in url):  # RLO, ZWJ, soft hyphen…: what is shown is not read
        raise ValueError("the url must not hold invisible or bidirectional formatting characters")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("the url must be an absolute http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the url must not carry a user name or password (they hide the real host)")
    return url, f"{_host(parts.hostname)}:{parts.port}" if parts.port else _host(parts.hostname)


def _host(name: str) -> str:
    """The host as a browser resolves it, in ASCII; ValueError for a character no host name holds."""
    if name.startswith("[") or ":" in name:  # urlsplit drops the brackets of an IPv6 literal
        try:
            return f"[{ipaddress.IPv6Address(name.strip('[]'))}]"
        except ValueError:
            raise ValueError("the url's host is not a valid IPv6 address") from None
    if not all(c.isalnum() or c in "-." for c in name):
        raise ValueError("the url's host may hold only letters, digits, hyphens and dots")
    try:
        return idna.encode(name, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError:
        raise ValueError("the url's host is not a valid name") from None


def check_url_answer(answer: object) -> dict[str, Any]:
    """A URL-mode answer: `{"action": "accept"}` (the person did what the page asked), `"decline"` or
    `"cancel"`; nothing else (the spec sends no content back for URL mode)."""
    if not isinstance(answer, dict) or answer.get("action") not in ACTIONS or set(answer) - {"action"}:
        raise ValueError('an answer to a URL question is {"action": "accept"|"decline"|"cancel"}')
    return {"action": answer["action"]}
