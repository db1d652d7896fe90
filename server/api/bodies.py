"""Reading requests safely: capped JSON bodies, checked fields and query integers (clear errors, never a 500)."""
from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any
from urllib.parse import parse_qsl

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request

from .. import vocab
from ..errors import AppError, json_problem, may_hold_surrogates

MAX_BODY = 1 << 20  # bytes; a bigger request body is refused with 413
TOO_LARGE = "too_large"
UNSUPPORTED_MEDIA = "unsupported_media_type"
_INTEGER = re.compile(r"-?[0-9]{1,18}")


def _too_large(limit: int = MAX_BODY) -> AppError:
    return AppError(TOO_LARGE, f"request body larger than {limit} bytes", status=413)


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise AppError(vocab.INVALID, "malformed Content-Length")
    return int(raw)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The raw body, refused (413) as soon as it is known to exceed `limit`: by its header or while streaming."""
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # a lying or absent Content-Length (chunked upload) is caught here
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object. `optional`: an empty body means {}."""
    declared = _declared_length(request)
    empty = declared == 0 or (declared is None and "transfer-encoding" not in request.headers)
    if empty and optional:
        return {}
    if not _is_json_type(request.headers.get("content-type", "")):
        raise AppError(UNSUPPORTED_MEDIA, "the body must be JSON (Content-Type: application/json)", status=415)
    raw = await read_body(request)
    if not raw.strip():
        if optional:
            return {}
        raise AppError(vocab.INVALID, "a JSON object body is required")
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise AppError(vocab.INVALID, "the JSON body is nested too deeply") from None
    except ValueError as exc:  # includes UnicodeDecodeError and JSONDecodeError
        raise AppError(vocab.INVALID, f"malformed JSON body: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise AppError(vocab.INVALID, "the body must be a JSON object")
    problem = json_problem(body, strings=may_hold_surrogates(raw))
    if problem:
        raise AppError(vocab.INVALID, f"the JSON body {problem}")
    return body


async def read_form(request: Request, limit: int = MAX_BODY) -> FormData:
    """A URL-encoded form body, capped at `limit` bytes (413) while it streams; nothing else is accepted.

    (Starlette's own `request.form()` reads any size and spools multipart uploads to disk.)
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise AppError(UNSUPPORTED_MEDIA, "the body must be a URL-encoded form", status=415)
    raw = await read_body(request, limit)
    try:
        fields: list[tuple[str, str | UploadFile]] = list(
            parse_qsl(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=200))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AppError(vocab.INVALID, f"malformed form body: {str(exc)[:200]}") from None
    return FormData(fields)


def check_fields(body: dict[str, Any], allowed: Collection[str], required: Collection[str] = ()) -> None:
    """`invalid` for unknown or missing fields, so a typo is an error rather than silently ignored."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise AppError(vocab.INVALID, f"unknown fields: {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
    missing = [name for name in required if name not in body]
    if missing:
        raise AppError(vocab.INVALID, f"missing fields: {', '.join(missing)}")


def optional_str(body: dict[str, Any], name: str, max_len: int = 200) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or len(value) > max_len):
        raise AppError(vocab.INVALID, f"{name} must be a string of at most {max_len} characters")
    return value


def query_int(request: Request, name: str, default: int, *, minimum: int = 0, cap: int | None = None) -> int:
    """An integer query parameter: `invalid` unless a whole number >= `minimum`; values above `cap` are capped."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not _INTEGER.fullmatch(raw):
        raise AppError(vocab.INVALID, f"{name} must be an integer")
    value = int(raw)
    if value < minimum:
        raise AppError(vocab.INVALID, f"{name} must be at least {minimum}")
    return min(value, cap) if cap is not None else value
