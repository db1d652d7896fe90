"""Hosts as a network request names them (`host:port`), the pseudo-tool rules match them by, and the
package registries an owner may start from."""
from __future__ import annotations

import ipaddress
import re
from typing import Final

from ...vocab import APPROVAL_OPTIONS
from ..base import Tool

NETWORK: Final = "network"  # the tool name of network requests, rules and grants (`{"host": "*.pypi.org:443"}`)
NETWORK_TOOL: Final = Tool(
    name=NETWORK, description="A sandboxed command's connection to a host:port (the `ask` network mode).",
    parameters={"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"],
                "additionalProperties": False},
    options=APPROVAL_OPTIONS)
# What the settings' "Add package registries" adds as ordinary allow rules (docs/protocol.md §4): never in
# force until an owner adds them, each then revoked like any rule. Python, JavaScript, Rust, Go, Ruby, Java.
PACKAGE_REGISTRIES: Final = ("pypi.org:443", "files.pythonhosted.org:443", "registry.npmjs.org:443",
                             "crates.io:443", "static.crates.io:443", "index.crates.io:443",
                             "proxy.golang.org:443", "sum.golang.org:443", "rubygems.org:443",
                             "repo.maven.apache.org:443")
_NAME = re.compile(r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$")
# A last label that is a number (WHATWG's "ends in a number"): inet_aton, and so getaddrinfo, reads
# `0x8.0x8.0x8.0x8`, `0x08080808` or `8.8.0x808` as the address 8.8.8.8, past rules written for it.
_NUMERIC_LABEL = re.compile(r"^([0-9]+|0x[0-9a-f]*)$")
_IPV6_LITERAL = re.compile(r"\[([0-9a-fA-F.*?]*:[0-9a-fA-F:.*?]*)\]")  # `[2001:db8::1]`, not `[[]` nor `[a-z]`


def network_mode(setting: object) -> str:
    """A world's `sandbox_network` as a mode: false is `off`, true `open` (a network of its own: netns.py),
    "ask" `ask` (this folder)."""
    return "ask" if setting == "ask" else "open" if setting is True else "off"


class BadHost(ValueError):
    """A host or port no connection may name."""


def normal_host(text: str) -> str:
    """`text` as rules see it: a lower-case DNS name without its final dot, or an IP address in its
    usual form (an IPv6 one without brackets). Raises BadHost."""
    host = text.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    host = host.removesuffix(".")
    if not _NAME.match(host) or _NUMERIC_LABEL.match(host.rpartition(".")[2]):  # nor is `1.2.3`, `0x7f.1`
        raise BadHost(f"not a host name or IP address: {text[:100]!r}")
    return host


def check_port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BadHost(f"not a port: {text[:20]!r}")
    return int(text)


def host_port(host: str, port: int) -> str:
    """What a request and a rule's `host` pattern read: `pypi.org:443`, `[2001:db8::1]:443`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_glob(match: dict[str, str]) -> dict[str, str]:
    """A `network` rule's `match` as written, with the bracket of an IPv6 address in its host pattern
    escaped: `[2001:db8::1]:443` is otherwise a character class, matching `d:443` (and not that host)."""
    if "host" not in match:
        return match
    return {**match, "host": _IPV6_LITERAL.sub(r"[[]\1]", match["host"])}


def split_host_port(text: str, default_port: int | None = None) -> tuple[str, int]:
    """`host:port` (an IPv6 address in brackets) as a checked (host, port). Raises BadHost."""
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1:] if end > 0 else "!"
    else:
        host, colon, port_text = text.rpartition(":")
        host, rest = (host, ":" + port_text) if colon else (text, "")
    if not rest and default_port is not None:
        return normal_host(host), default_port
    if not rest.startswith(":"):
        raise BadHost(f"not host:port: {text[:100]!r}")
    return normal_host(host), check_port(rest[1:])


def is_address(host: str) -> bool:
    """Whether a checked host (normal_host) is an IP address rather than a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
