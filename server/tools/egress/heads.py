"""The head of a request a sandboxed client sends its proxy: `CONNECT host:port` (a tunnel, for
HTTPS and anything else) or a plain HTTP request in absolute form (`GET http://host/path`)."""
from __future__ import annotations

from dataclasses import dataclass

from .hosts import BadHost, split_host_port

HEAD_LIMIT = 16 * 1024  # bytes of a request head
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "trailer", "upgrade"}


@dataclass(frozen=True)
class Head:
    host: str
    port: int
    tunnel: bool  # CONNECT: the bytes that follow go through as they are
    forward: bytes = b""  # plain HTTP: the head to send the host (origin form, `Connection: close`)


def parse_head(data: bytes) -> Head:
    """The request in `data` (its head, up to and including the blank line). Raises BadHost with what
    is wrong, said as the proxy's 400 answer says it."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise BadHost("the request head is not ASCII") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHost("not an HTTP/1 request line")
    method, target, version = parts
    if method == "CONNECT":
        host, port = split_host_port(target)
        return Head(host, port, tunnel=True)
    if not target.lower().startswith("http://"):
        raise BadHost("only CONNECT (for HTTPS and other protocols) and http:// URLs go through this proxy")
    rest = target[len("http://"):]
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]  # user:password@ is not the host
    host, port = split_host_port(authority, default_port=80)
    kept = [line for line in lines[1:] if line and line.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    # One request per connection: a kept-alive one could go on to another host through the same socket.
    forward = "\r\n".join([f"{method} /{path if slash else ''} {version}", *kept, "Connection: close", "", ""])
    return Head(host, port, tunnel=False, forward=forward.encode("ascii"))
