"""The one same-origin check, for WebSockets (refused before accept) and cookie-authenticated writes."""
from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import HTTPConnection


def _origin_key(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin or base URL; None when it does not parse."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.scheme.lower(), parts.hostname.lower(), port


def own_origin(conn: HTTPConnection) -> str:
    """The origin this request came to (scheme, Host and port), normalized: what a session is bound to."""
    secure = conn.url.scheme in ("https", "wss")
    key = _origin_key(f"{'https' if secure else 'http'}://{conn.headers.get('host', '')}")
    return "" if key is None else f"{key[0]}://{key[1]}:{key[2]}"


def origin_allowed(conn: HTTPConnection, public_url: str) -> bool:
    """No `Origin` (not a browser), or the server's own: the Host the request came to, or `public_url`."""
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    key = _origin_key(origin)
    if key is None:
        return False  # "null" (a sandboxed frame, a file) and garbage
    own = {_origin_key(public_url)}
    host = conn.headers.get("host")
    if host:
        secure = conn.url.scheme in ("https", "wss")
        own.add(_origin_key(f"{'https' if secure else 'http'}://{host}"))
    return key in own
