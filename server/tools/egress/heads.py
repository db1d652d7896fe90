"""The head of a request a sandboxed client sends its proxy: `CONNECT host:port` (a tunnel, for
HTTPS and anything else) or a plain HTTP request in absolute form (`GET http://host/path`).

A plain request goes to its host as one request only: its `Host` is written from the URL that was
checked (never the client's own line, which a server behind a shared address would route by), and
its body is framed by its own Content-Length or chunked encoding (relay.py); nothing after it goes."""
from __future__ import annotations

from dataclasses import dataclass

from .hosts import BadHost, host_port, split_host_port

HEAD_LIMIT = 16 * 1024  # bytes of a request head
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "trailer", "upgrade"}


@dataclass(frozen=True)
class Head:
    host: str
    port: int
    tunnel: bool  # CONNECT: the bytes that follow go through as they are
    forward: bytes = b""  # plain HTTP: the head to send the host (origin form, `Connection: close`)
    length: int = 0  # plain HTTP: its body's Content-Length
    chunked: bool = False  # plain HTTP: its body is chunked (re-framed on the way: relay.py)


def _fields(lines: list[str]) -> tuple[list[str], int, bool]:
    """A plain request's header lines to send on (no Host, no hop-by-hop ones), its Content-Length and
    whether it is chunked. Raises BadHost for what a server could read otherwise than this proxy does."""
    kept: list[str] = []
    lengths: set[str] = set()
    chunked = False
    for line in lines:
        if not line:
            continue
        if line[0] in " \t":
            raise BadHost("a folded header line (obs-fold) is not forwarded")
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadHost(f"not a header line: {line[:60]!r}")
        key, value = name.lower(), value.strip()
        if key == "content-length":
            lengths.add(value)
        elif key == "transfer-encoding":
            if value.lower() != "chunked" or chunked:
                raise BadHost("only `Transfer-Encoding: chunked` is forwarded")
            chunked = True
        if key not in _HOP_BY_HOP and key != "host":
            kept.append(line)
    if len(lengths) > 1 or not all(v.isdigit() and len(v) < 19 for v in lengths):
        raise BadHost("an unclear Content-Length")
    if lengths and chunked:
        raise BadHost("both Content-Length and Transfer-Encoding")
    return kept, int(next(iter(lengths), "0")), chunked


def parse_head(data: bytes) -> Head:
    """The request in `data` (its head, up to and including the blank line). Raises BadHost with what
    is wrong, said as the proxy's 400 answer says it."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise BadHost("the request head is not ASCII") from None
    lines = text.split("\r\n")
    if any(c < " " and c != "\t" for line in lines for c in line):  # a bare CR or LF some servers end a line at
        raise BadHost("a control character in the request head")
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
    kept, length, chunked = _fields(lines[1:])
    named = host_port(host, port) if port != 80 else f"[{host}]" if ":" in host else host
    # One request per connection: a kept-alive one could go on to another host through the same socket.
    forward = "\r\n".join([f"{method} /{path if slash else ''} {version}", f"Host: {named}", *kept,
                           "Connection: close", "", ""])
    return Head(host, port, tunnel=False, forward=forward.encode("ascii"), length=length, chunked=chunked)
