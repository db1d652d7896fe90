"""MCP server settings as clients see them: `env` and header values, secret-looking `args` and a registered
OAuth client's secret are write-only.

The log keeps the real values (the server starts MCP servers with them); every client, the owner
included, sees `•••` instead. A settings change that sends `•••` back keeps the stored value, so
the owner can edit a server without knowing (or re-typing) its secrets.
"""
from __future__ import annotations

import re
from typing import Any

from ...redact import URL_PASSWORD
from ...webhooks.settings import masked_webhooks

MASK = "•••"
_SECRET_WORD = re.compile(r"(?i)(token|secret|passw(or)?d|pass|api[-_]?key|apikey|auth|credential|bearer|cookie|"
                          r"session|private[-_]?key|access[-_]?key|\bkey\b)")
_FLAG = re.compile(r"^(--?[A-Za-z0-9][A-Za-z0-9_.-]*)=(.*)$", re.S)
_KNOWN_SHAPES = re.compile(r"^(sk-|sk_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|xox[abposr]-|AKIA|ASIA|AIza|"
                           r"eyJ|Bearer\s|Basic\s|-----BEGIN)")
_TOKEN_LIKE = re.compile(r"^[A-Za-z0-9_\-+=.~]{24,}$")
# `DB_PASSWORD=…`, `GITHUB_TOKEN=…`: an argument that sets a variable whose name says it holds a secret.
_SECRET_NAME = re.compile(r"(?i)^([A-Za-z_][A-Za-z0-9_.-]*(?:passw(?:or)?d|pass|pwd|secret|token|key))=(.+)$", re.S)
# `password=…` (or `token=`, `apikey=`…) inside a value: a connection string, a query. The label stays.
_LABELLED = re.compile(r"(?i)(\b(?:passw(?:or)?d|pwd|secret|token|api[-_]?key|access[-_]?key)[ \t]*[:=][ \t]*)"
                       r"([^\s;&,'\"]+)")
_SHORT_PASSWORD_FLAG = "-p"  # `mysql -p <password>`, `sshpass -p <password>` (a port behind it is masked too)


def _looks_secret(value: str) -> bool:
    if _KNOWN_SHAPES.match(value) or URL_PASSWORD.match(value):
        return True
    # A long run of token characters with letters and digits (not a path, not a package name).
    return bool(_TOKEN_LIKE.match(value)) and any(c.isdigit() for c in value) and any(c.isalpha() for c in value)


def _is_secret_flag(flag: str) -> bool:
    return flag.startswith("-") and (flag == _SHORT_PASSWORD_FLAG or bool(_SECRET_WORD.search(flag)))


def _masked_arg(args: list[str], index: int) -> tuple[str, list[str]]:
    """Argument `index` as clients see it, and the values hidden in it (each a secret to remember)."""
    arg = args[index]
    flag = _FLAG.match(arg)
    if flag and (_is_secret_flag(flag.group(1)) or _looks_secret(flag.group(2))):
        return f"{flag.group(1)}={MASK}", [flag.group(2)]
    if index and _is_secret_flag(args[index - 1]) and not _FLAG.match(args[index - 1]) and not arg.startswith("-"):
        return MASK, [arg]  # the value after `--token` or `-p`
    named = _SECRET_NAME.match(arg)
    if named:
        return f"{named.group(1)}={MASK}", [named.group(2)]
    if _looks_secret(arg):
        return MASK, [arg]
    hidden: list[str] = []

    def hide(match: re.Match[str]) -> str:
        hidden.append(match.group(2))
        return match.group(1) + MASK
    return _LABELLED.sub(hide, arg), hidden


def masked_args(args: list[str]) -> list[str]:
    """`args` with secret-looking values replaced by `•••` (`--token=•••` keeps the flag, `DB_PASSWORD=•••`
    the name, `host=db password=•••` the rest of the value)."""
    return [_masked_arg(args, index)[0] for index in range(len(args))]


def secret_args(args: list[str]) -> list[str]:
    """The values `masked_args` hides (the part after `=` of `--token=…`; a URL's password too): each is a
    secret, to be remembered so that it is hidden wherever else it shows (errors, a stderr tail, events)."""
    values: list[str] = []
    for index in range(len(args)):
        for value in _masked_arg(args, index)[1]:
            values.append(value)
            url = URL_PASSWORD.match(value)
            if url:  # the password alone, as a client library may quote it
                values.append(url.group(2))
    return values


def masked_server(server: dict[str, Any]) -> dict[str, Any]:
    """One `mcp_servers` entry as clients see it."""
    if "url" in server:  # streamable HTTP: every header value is write-only (Authorization, API keys)
        oauth = server.get("oauth")
        if isinstance(oauth, dict) and oauth.get("client_secret"):  # a registered OAuth client's secret too
            server = {**server, "oauth": {**oauth, "client_secret": MASK}}
        return {**server, "headers": {name: MASK for name in server.get("headers") or {}}}
    return {**server, "env": {name: MASK for name in server.get("env") or {}},
            "args": masked_args(list(server.get("args") or []))}


def masked_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """World settings as clients see them (a copy when there are MCP servers)."""
    if settings.get("webhooks"):  # their URLs and secrets are write-only too (server/webhooks/settings.py)
        settings = {**settings, "webhooks": masked_webhooks(settings["webhooks"])}
    servers = settings.get("mcp_servers")
    if not servers:
        return settings
    return {**settings, "mcp_servers": [masked_server(s) if isinstance(s, dict) else s for s in servers]}


def _restore_values(values: dict[Any, Any], stored: dict[str, str], what: str) -> dict[Any, Any]:
    for name, value in values.items():
        if value == MASK and name not in stored:
            raise ValueError(f"{what.format(repr(name))} is {MASK} but has no stored value: send the value")
    return {name: stored[name] if value == MASK else value for name, value in values.items()}


def _stored_client_secret(server: dict[str, Any], old: dict[str, Any]) -> str:
    """The stored secret a `•••` stands for: only for the same client, of the same authorization server, for
    the same URL (a secret belongs to one authorization server: a changed one must not inherit it)."""
    before = old.get("oauth")
    client: dict[str, Any] = before if isinstance(before, dict) else {}
    now, secret = server.get("oauth") or {}, client.get("client_secret")
    if not secret or old.get("url") != server.get("url") or any(
            client.get(k) != now.get(k) for k in ("issuer", "client_id")):
        raise ValueError(f"oauth.client_secret of MCP server {server.get('name')!r} is {MASK} but no stored secret "
                         "belongs to that client, issuer and URL: send the secret")
    return str(secret)


def restore_masked(servers: Any, stored: list[dict[str, Any]]) -> Any:
    """Incoming `mcp_servers` with each `•••` replaced by the stored value it stands for.

    ValueError when a `•••` stands for nothing: a server or variable that was never stored, or an
    argument that is not masked at that place.
    """
    if not isinstance(servers, list):
        return servers
    by_name = {s["name"]: s for s in stored}
    out = []
    for server in servers:
        if not isinstance(server, dict):
            out.append(server)
            continue
        old = by_name.get(server.get("name"), {})
        env, args, headers = server.get("env"), server.get("args"), server.get("headers")
        if isinstance(env, dict):
            env = _restore_values(env, old.get("env") or {}, f"env {{}} of MCP server {server.get('name')!r}")
        if isinstance(headers, dict):
            headers = _restore_values(headers, old.get("headers") or {},
                                      f"header {{}} of MCP server {server.get('name')!r}")
        oauth = server.get("oauth")
        if isinstance(oauth, dict) and oauth.get("client_secret") == MASK:
            oauth = {**oauth, "client_secret": _stored_client_secret(server, old)}
        if isinstance(args, list):
            old_args = list(old.get("args") or [])
            shown = masked_args(old_args)
            restored = []
            for index, arg in enumerate(args):
                if isinstance(arg, str) and MASK in arg:
                    if index >= len(old_args) or shown[index] != arg:
                        raise ValueError(f"argument {index} of MCP server {server.get('name')!r} is masked "
                                         f"({MASK}) but no stored argument matches it: send the value")
                    arg = old_args[index]
                restored.append(arg)
            args = restored
        out.append({**server, **({"env": env} if env is not None else {}),
                    **({"headers": headers} if headers is not None else {}),
                    **({"oauth": oauth} if oauth is not None else {}),
                    **({"args": args} if args is not None else {})})
    return out
