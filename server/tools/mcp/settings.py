"""The world setting `mcp_servers`, checked: each server is a command run over stdio or a streamable-HTTP URL."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ... import vocab
from ...errors import AppError
from .policy import ToolOverride

MAX_SERVERS = 20
_FIELDS = {"name", "command", "args", "env", "url", "headers", "oauth", "trusted", "tools"}
_SHAPE = ('an MCP server is {"name", "command", "args"?, "env"?, "trusted"?, "tools"?} (stdio) '
          'or {"name", "url", "headers"?, "oauth"?, "trusted"?, "tools"?} (streamable HTTP)')
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")


def _invalid(message: str) -> AppError:
    return AppError(vocab.INVALID, message)


def _check_overrides(name: str, tools: object) -> dict[str, dict[str, Any]]:
    """`tools`: {"<MCP tool name>": {"approval"?: "ask"|"never", "idempotent"?: bool}}."""
    if not isinstance(tools, dict) or len(tools) > 500:
        raise _invalid(f"MCP server {name!r}: tools maps tool names to overrides (at most 500)")
    out: dict[str, dict[str, Any]] = {}
    for tool, value in tools.items():
        if not isinstance(tool, str) or not 1 <= len(tool) <= 128:
            raise _invalid(f"MCP server {name!r}: a tool name in tools is 1 to 128 characters")
        try:
            out[tool] = ToolOverride.parse(value).setting()
        except ValueError as exc:
            raise _invalid(f"MCP server {name!r}, tool {tool!r}: {exc}") from None
    return out


def _strings(value: object, kind: type) -> bool:
    if kind is list:
        return isinstance(value, list) and all(isinstance(a, str) for a in value)
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _transport(server: dict[str, Any]) -> dict[str, Any]:
    """The stored transport fields: a command with args and env, or a URL with headers."""
    command, url = server.get("command"), server.get("url")
    if url is not None:
        if command is not None or server.get("args") or server.get("env"):
            raise _invalid(f"MCP server {server['name']!r}: give a command (stdio) or a url (streamable HTTP), "
                           "not both")
        parsed = urlsplit(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname or len(url) > 2000:
            raise _invalid(f"MCP server {server['name']!r}: url must be an http:// or https:// URL")
        headers = server.get("headers") or {}
        if not _strings(headers, dict) or not all(_HEADER.fullmatch(k) and "\n" not in v and "\r" not in v
                                                   for k, v in headers.items()):
            raise _invalid(f"MCP server {server['name']!r}: headers are names (tokens) to single-line strings")
        oauth = server.get("oauth", False)
        if not isinstance(oauth, bool):
            raise _invalid(f"MCP server {server['name']!r}: oauth is true (a person signs in with OAuth 2.1) or false")
        return {"url": url, "headers": headers, **({"oauth": True} if oauth else {})}
    args, env = server.get("args") or [], server.get("env") or {}
    if server.get("headers") or server.get("oauth"):
        raise _invalid(f"MCP server {server['name']!r}: headers and oauth go with a url")
    if not isinstance(command, str) or not command or not _strings(args, list) or not _strings(env, dict):
        raise _invalid("an MCP server needs a command (string), args (strings), env (strings), or a url")
    return {"command": command, "args": args, "env": env}


def check_mcp_servers(servers: object) -> list[dict[str, Any]]:
    """The validated list, in the stored shape; a clear `invalid` error for anything off."""
    if not isinstance(servers, list) or len(servers) > MAX_SERVERS:
        raise _invalid(f"mcp_servers must be a list of at most {MAX_SERVERS} servers")
    out, names = [], set()
    for server in servers:
        if not isinstance(server, dict) or set(server) - _FIELDS:
            raise _invalid(_SHAPE)
        name = server.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9-]{1,30}(_[a-zA-Z0-9-]+)*", name) or "__" in name:
            raise _invalid("an MCP server name is letters, digits, - and single _ (at most 30)")
        if name in names:
            raise _invalid(f"two MCP servers are named {name!r}")
        names.add(name)
        trusted = server.get("trusted", False)
        if not isinstance(trusted, bool):
            raise _invalid("an MCP server's trusted is true (its annotations count; a command runs unsandboxed) "
                           "or false")
        entry: dict[str, Any] = {"name": name, **_transport(server), "trusted": trusted}
        if server.get("tools"):
            entry["tools"] = _check_overrides(name, server["tools"])
        out.append(entry)
    return out
