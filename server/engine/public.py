"""Events as clients receive them: secret-looking values hidden, wherever they are.

The log keeps the real values (tools run with them, the LLM sees what it wrote, deciders' rules
match them); every event that leaves the server — on the bus, over the WebSocket, from `/events`,
in the page — goes through `public` first, so nobody reads a token that an agent passed to a
tool, that a tool printed, or that somebody pasted into the chat. An event with anything hidden
carries `"redacted": true`, and each hidden value reads `[redacted]`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .. import offload
from .. import redact as redact_module
from ..aio import SingleFlight
from ..redact import hide_known, in_worker, redact
from ..tools.mcp.masking import masked_settings
from ..vocab import Event

# Fields that only ever hold ids, names and numbers the server made: never secrets, never hidden.
_STRUCTURAL = frozenset({"kind", "seq", "ts", "world", "id", "chat", "agent", "sender", "role", "name",
                         "tool_call_id", "call_id", "instance", "client_calls", "usage", "rule_id", "grant_id",
                         "invite_id", "retry", "message_id", "reply_id", "version_of", "from_chat",
                         "approval_id", "hook", "source_seq", "subject", "taken_from"})


# Fields clients never see: an invite's token hash (it identifies the token), and who really sent or
# decided something (`person`, an approval's `people` and a vote's `voted`: the invite behind a name).
_PRIVATE = frozenset({"token_sha256", "person", "people", "voted"})

# The fields of an agent's config that may hold a secret: the rest (name, model, tools) are shown as they are.
_AGENT_SECRETS = frozenset({"system_prompt", "base_url"})

_CACHE_SIZE = 20_000
_cache: OrderedDict[tuple[str, int], Event] = OrderedDict()
_redacting: SingleFlight[Event] = SingleFlight()


async def public_off_loop(event: Event) -> Event:
    """`public`, in a worker process for a large event (server/offload.py): redacting a 16 MiB tool result
    on the loop, or in a thread holding the GIL, stalled every world for seconds. Kept as `public` keeps
    its results, so later readers find it."""
    if not offload.is_large(event):
        return public(event)
    message_id, generation = event.get("id"), redact_module.secrets_generation
    cached = _cache.get((message_id, generation)) if isinstance(message_id, str) else None
    if cached is not None:
        return cached
    if not isinstance(message_id, str) or event.get("seq") is None:
        return await in_worker(_public, event)

    async def redacting() -> Event:
        cached = _cache.get((message_id, generation))  # (redacted by the run this one waited for)
        if cached is None:
            cached = _cache[(message_id, generation)] = await in_worker(_public, event)
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return cached
    # The bus, the pages and the readers of one 16 MiB result ask at once: it is redacted once.
    return await _redacting.run((message_id, generation), redacting)


def public(event: Event) -> Event:
    """`event` with secret-looking values hidden (a copy if anything changed) and the `_PRIVATE`
    fields left out. A stored message never changes and its id is random, so its public form is kept
    (by id): listing a thousand pending approvals must not redact a thousand events each time."""
    message_id = event.get("id")
    if not isinstance(message_id, str) or event.get("seq") is None:
        return _public(event)
    key = (message_id, redact_module.secrets_generation)
    cached = _cache.get(key)
    if cached is None:
        cached = _cache[key] = _public(event)
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return cached


def _public(event: Event) -> Event:
    out: dict[str, Any] = {}
    changed = hid = False
    for key, value in event.items():
        if key in _PRIVATE:
            changed = True
            continue
        if key == "settings" and isinstance(value, dict):  # a world's: MCP env and secret args are write-only
            masked = masked_settings(value)
            changed |= masked != value
            value = masked
        if key in _STRUCTURAL and not isinstance(value, dict):
            out[key] = value
            continue
        if key == "elicitation" and isinstance(value, dict) and isinstance(value.get("url"), str):
            # A URL question's link is for the person to open: only secrets the server knows are hidden in it
            # (a random-looking id in its query is its point, not a leak).
            hidden = {**redact({k: v for k, v in value.items() if k != "url"}), "url": hide_known(value["url"])}
            hid |= hidden != value
            out[key] = hidden
            continue
        # `agent` is a whole config in agent_added and agent_updated
        hidden = public_agent(value) if key == "agent" and isinstance(value, dict) else redact(value)
        hid |= hidden is not value and hidden != value
        out[key] = hidden
    if not (changed or hid):
        return event
    if hid:
        out["redacted"] = True
    return out


def public_part(field: str, value: Any) -> Any:
    """One field of an event as `public` shows it, for an answer that carries a part of an event (the rule
    that `POST /rules` added, a chat): the same redaction, never a second one. None for a private field."""
    return public({field: value}).get(field)


def public_agent(config: dict[str, Any]) -> dict[str, Any]:
    """An agent's config as clients see it: secrets in its prompt or its endpoint's URL hidden, its name,
    model and tools as they are (a model id may look random). An edit that sends a hidden value back
    unchanged keeps the real one: `Worlds.update_agent`."""
    hidden = {key: redact(value) if key in _AGENT_SECRETS else value for key, value in config.items()}
    return config if hidden == config else hidden
