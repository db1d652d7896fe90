"""The world's workspace over HTTP (docs/protocol.md §5): list, download (a folder as a zip), show an image,
upload. What leaves never runs in the page's origin: downloads are attachments, images are served only with
an image type, and both carry `Content-Security-Policy: sandbox` and `nosniff`."""
from __future__ import annotations

import posixpath
import re
from typing import Any
from urllib.parse import quote

from starlette.responses import StreamingResponse
from starlette.routing import BaseRoute, Route

from .. import vocab
from ..engine.public import public
from ..engine.world.files import LIST_PAGE, MAX_LIST_PAGE, MAX_UPLOAD, Download
from ..errors import AppError
from .bodies import query_int
from .http import Call, endpoint

# What a workspace file may be served inline as: images only, never anything a browser would run
# (SVG, HTML, XML are downloads).
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp", ".avif": "image/avif", ".bmp": "image/bmp"}
SANDBOX_CSP = "sandbox; default-src 'none'"  # no script, no plugin, a unique origin: even if it were HTML
UPLOAD_PATH = re.compile(r"^/api/worlds/[^/]+/files$")  # the one route whose body may exceed the API's cap


def _disposition(kind: str, name: str) -> str:
    """`attachment` or `inline` with the name both as plain ASCII and as RFC 6266's UTF-8 form."""
    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name) or "download"
    return f"{kind}; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"


def _headers(kind: str, name: str) -> dict[str, str]:
    return {"Content-Disposition": _disposition(kind, name), "Content-Security-Policy": SANDBOX_CSP,
            "X-Content-Type-Options": "nosniff", "Cache-Control": "private, no-store"}


def _served(download: Download, media_type: str, kind: str) -> StreamingResponse:
    headers = {**_headers(kind, download.name), "Content-Length": str(download.size)}
    return StreamingResponse(download.chunks, media_type=media_type, headers=headers)


async def list_files(call: Call) -> dict[str, Any]:
    """GET …/files?path=&offset=&limit=: one page of a folder (every role: reading is watching)."""
    offset = query_int(call.request, "offset", 0, minimum=0)
    limit = query_int(call.request, "limit", LIST_PAGE, minimum=1, cap=MAX_LIST_PAGE)
    return await call.ctx.engine.files.list(call.world or "", call.request.query_params.get("path"), offset, limit)


async def download(call: Call) -> StreamingResponse:
    """GET …/files/download?path=: a file as an attachment, a folder (or the workspace) as a zip."""
    found = await call.ctx.engine.files.download(call.world or "", call.request.query_params.get("path"))
    return _served(found, "application/zip" if found.folder else "application/octet-stream", "attachment")


async def raw(call: Call) -> StreamingResponse:
    """GET …/files/raw?path=: an image, inline, for the page's preview; anything else is refused."""
    path = call.request.query_params.get("path") or ""
    media = IMAGE_TYPES.get(posixpath.splitext(path)[1].lower())
    if media is None:
        raise AppError(vocab.INVALID, f"only images ({', '.join(sorted(IMAGE_TYPES))}) are shown inline: "
                                      "download other files")
    found = await call.ctx.engine.files.download(call.world or "", path)
    if found.folder:
        await found.chunks.aclose()  # type: ignore[attr-defined]
        raise AppError(vocab.INVALID, f"{path} is a folder")
    return _served(found, media, "inline")


async def upload(call: Call) -> dict[str, Any]:
    """POST …/files?path=&chat=: the raw body becomes the file (members and the owner, MAX_UPLOAD bytes)."""
    request = call.request
    raw_length = request.headers.get("content-length")
    if raw_length is not None and not raw_length.isdigit():
        raise AppError(vocab.INVALID, "malformed Content-Length")
    event = await call.ctx.engine.files.upload(
        call.world or "", call.actor, request.query_params.get("path"), request.query_params.get("chat"),
        request.stream(), int(raw_length) if raw_length is not None else None, cap=MAX_UPLOAD)
    return public(event)


def upload_cap(path: str, method: str) -> int | None:
    """The body cap of an upload (server/api/middleware.py `BodyLimit`), None for every other request."""
    return MAX_UPLOAD if method == "POST" and UPLOAD_PATH.fullmatch(path) else None


def routes() -> list[BaseRoute]:
    w = "/api/worlds/{world}/files"
    return [
        Route(w, endpoint(list_files), methods=["GET"]),
        Route(w, endpoint(upload, status=201), methods=["POST"]),
        Route(f"{w}/download", endpoint(download), methods=["GET"]),
        Route(f"{w}/raw", endpoint(raw), methods=["GET"]),
    ]
