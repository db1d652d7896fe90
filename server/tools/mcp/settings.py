"""The world setting `mcp_servers`, checked: each server is a command run over stdio or a streamable-HTTP URL."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ... import vocab
from ...errors import AppError
from ...redact import MIN_KNOWN
from .policy import ToolOverride

MAX_SERVERS = 20
_FIELDS = {"name", "command", "args", "env", "url", "headers", "oauth", "trusted", "tools"}
_SHAPE = ('an MCP server is {"name", "command", "args"?, "env"?, "trusted"?, "tools"?} (stdio) '
          'or {"name", "url", "headers"?, "oauth"?, "trusted"?, "tools"?} (streamable HTTP; oauth: true, '
          'or a registered client {"issuer", "client_id", "client_secret"?, "token_endpoint_auth_method"?})')
OAUTH_CLIENT_FIELDS = ("issuer", "client_id", "client_secret", "token_endpoint_auth_method")
TOKEN_AUTH_METHODS = ("client_secret_basic", "client_secret_post")  # how a registered client's secret is sent
MAX_CLIENT_FIELD = 500  # characters of a registered client's id or secret (redact.MAX_KNOWN hides it)
MIN_SECRET = MIN_KNOWN  # characters of a client secret at least: redaction hides no shorter value
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


def _oauth(name: str, oauth: object) -> bool | dict[str, str]:
    """`oauth`: false; true (the client registers itself where the authorization server lets it); or the
    client an owner registered beforehand at the authorization server `issuer`: {"issuer", "client_id",
    "client_secret"?, "token_endpoint_auth_method"?} (client_secret_basic, the default with a secret, or
    client_secret_post; none without a secret). The issuer is the owner's word: a sign-in with that client
    goes to no other authorization server, whichever one the (untrusted) MCP server names."""
    if isinstance(oauth, bool):
        return oauth
    shape = (f"MCP server {name!r}: oauth is true (a person signs in with OAuth 2.1), false, or a registered "
             'client {"issuer", "client_id", "client_secret"?, "token_endpoint_auth_method"?}')
    if not isinstance(oauth, dict) or set(oauth) - set(OAUTH_CLIENT_FIELDS):
        raise _invalid(shape)
    issuer, client_id, secret = oauth.get("issuer"), oauth.get("client_id"), oauth.get("client_secret")
    method = oauth.get("token_endpoint_auth_method") or ("client_secret_basic" if secret else "none")
    parsed = urlsplit(issuer) if isinstance(issuer, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname or len(str(issuer)) > 2000:
        raise _invalid(f"MCP server {name!r}: oauth.issuer is the http(s) URL of the authorization server the "
                       "client is registered at (as its metadata names itself)")
    if not isinstance(client_id, str) or not 1 <= len(client_id) <= MAX_CLIENT_FIELD or "\n" in client_id:
        raise _invalid(f"MCP server {name!r}: oauth.client_id is 1 to {MAX_CLIENT_FIELD} characters on one line")
    if secret is not None and (not isinstance(secret, str) or not MIN_SECRET <= len(secret) <= MAX_CLIENT_FIELD):
        # (a shorter one would not be hidden by its value: redact.remember_secret)
        raise _invalid(f"MCP server {name!r}: oauth.client_secret is {MIN_SECRET} to {MAX_CLIENT_FIELD} characters")
    if method not in (TOKEN_AUTH_METHODS if secret else ("none",)):
        raise _invalid(f"MCP server {name!r}: oauth.token_endpoint_auth_method is "
                       + (" or ".join(TOKEN_AUTH_METHODS) if secret else "none without a client_secret"))
    return {"issuer": str(issuer), "client_id": client_id, **({"client_secret": secret} if secret else {}),
            "token_endpoint_auth_method": method}


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
        oauth = _oauth(server["name"], server.get("oauth", False))
        return {"url": url, "headers": headers, **({"oauth": oauth} if oauth else {})}
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
