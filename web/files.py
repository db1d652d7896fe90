"""The files panel: a folder of the world's workspace as a list, a file as a preview (text and code
highlighted, Markdown rendered safely, images through the sandboxed `files/raw` route), all as fragments.

Every role may browse (reading is watching); uploads and downloads are the JSON API's (server/api/files.py).
"""
from __future__ import annotations

import posixpath
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server import offload, vocab
from server.api.bodies import query_int
from server.api.context import context_of
from server.api.files import IMAGE_TYPES
from server.errors import AppError

from .previews import shown
from .render import render

PREVIEW_BYTES = 256 << 10  # of a file shown in the preview; the rest is the download's


async def _reader(request: Request) -> str:
    """The world, once the caller is known to have a role in it (any role)."""
    world = str(request.path_params["world"])
    principal = await context_of(request).auth.authenticate(request, world)
    if principal is None:
        raise AppError(vocab.FORBIDDEN, "sign in first")
    principal.actor(world)  # forbidden without a role here
    return world


def _error(exc: AppError) -> HTMLResponse:
    return HTMLResponse(render("_file_error.html", message=exc.message), status_code=200)


def _crumbs(path: str) -> list[dict[str, str]]:
    parts = [p for p in path.split("/") if p]
    return [{"name": name, "path": "/".join(parts[:i + 1])} for i, name in enumerate(parts)]


async def listing(request: Request) -> Response:
    """GET /w/{world}/files?path=&offset=: one page of a folder as the panel's list."""
    try:
        world = await _reader(request)
        offset = query_int(request, "offset", 0, minimum=0)
        page = await context_of(request).engine.files.list(world, request.query_params.get("path"), offset)
    except AppError as exc:
        return _error(exc)
    return HTMLResponse(render("_files_list.html", world_id=world, page=page, crumbs=_crumbs(page["path"])))


async def preview(request: Request) -> Response:
    """GET /w/{world}/files/preview?path=: a file's preview, for the panel's dialog."""
    try:
        world = await _reader(request)
        raw = request.query_params.get("path") or ""
        if posixpath.splitext(raw)[1].lower() in IMAGE_TYPES:
            path, _, size = await context_of(request).engine.files.head(world, raw, 0)
            view: dict[str, Any] = {"kind": "image", "cut": False}
        else:
            path, data, size = await context_of(request).engine.files.head(world, raw, PREVIEW_BYTES)
            # In a worker process: Markdown and Pygments hold the GIL (a thread left the loop slices of it).
            view = await offload.run(partial(shown, posixpath.basename(path), data, size), light=True)
    except AppError as exc:
        return _error(exc)
    return HTMLResponse(render("_file_preview.html", world_id=world, path=path, size=size, view=view,
                               limit=PREVIEW_BYTES))
