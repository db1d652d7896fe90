"""What `agent-world import` tells the owner a world's file brings: the allowances it held, whether they
were kept, and what the world does with this server's powers."""
from __future__ import annotations

import json

from .engine.engine import Engine
from .log.portable import Imported
from .redact import redact, redact_text  # a rule's pattern or an endpoint's URL may spell out a secret


def allowances(done: Imported) -> list[str]:
    """Each allow rule and allow grant the file held, and whether it was kept (`--with-allowances`)."""
    closed = ([f"{done.closed} pending request(s) or approved call(s) closed without running: the file's "
               "decisions are not this server's (--with-allowances keeps them); ask again"] if done.closed else [])
    if not done.allowances:
        return closed
    lines = [*closed, f"{len(done.allowances)} allowance(s), which run matching calls without asking anyone, "
             + ("kept (--with-allowances):" if done.allowances_kept
                else "not imported (each revoked at import; --with-allowances keeps them):")]
    for event in done.allowances:
        if "rule" in event:
            rule = redact(event["rule"])
            lines.append(f"  allow rule {rule['id']}: {rule.get('tool')} {json.dumps(rule.get('match') or {})}")
        else:
            grant = redact(event["grant"])
            lines.append(f"  session grant {grant['id']}: {grant.get('tool')} for {grant.get('agent')} "
                         f"in chat {grant.get('chat')}")
    return lines


async def what_it_grants(engine: Engine, world: str) -> list[str]:
    """What an imported world does with this server's powers, as its file's author set it: an import
    restores a log as it was, so the owner should know whom they just trusted."""
    settings = await engine.worlds.settings(world)
    servers = settings.get("mcp_servers") or ()
    trusted = [str(s.get("name")) for s in servers if s.get("trusted")]
    remote = [f"{s.get('name')} ({redact_text(str(s['url']))})" for s in servers if s.get("url")]
    endpoints = sorted({str(a["base_url"]) for a in await engine.worlds.agents(world) if a.get("base_url")})
    lines = []
    if trusted:
        lines.append(f"  trusted MCP servers, which run unsandboxed with this server's rights: {', '.join(trusted)}")
    if remote:
        lines.append(f"  MCP servers this server connects to from its own network: {', '.join(remote)}")
    if settings.get("sandbox_network") == "ask":
        lines.append("  sandbox_network: ask: its tools reach the hosts people (or its rules) allow")
    elif settings.get("sandbox_network"):
        lines.append("  sandbox_network: its tools reach the internet")
    if endpoints:
        shown = ", ".join(redact_text(e) for e in endpoints)
        lines.append(f"  agents' LLM endpoints, which are sent this server's API key: {shown}")
    return (["It keeps what its file set (import only files you trust as this server's owner):", *lines]
            if lines else [])
