"""Worlds, their agents and chats: each is an open item in the log pointing at its latest state."""
from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from ... import events, vocab
from ...aio import Paced
from ...errors import AppError
from ...log import Claim, Close, Conflict, Open
from ...redact import REDACTED
from ...tools.mcp.masking import masked_settings, restore_masked
from ...tools.mcp.settings import check_mcp_servers
from ...vocab import Event
from ...webhooks.settings import check_webhooks, restore_webhooks
from ..actors import Actor
from ..public import public_agent, public_part
from ..store import Store
from .tools import remember_mcp_secrets

T = TypeVar("T")

DEFAULT_SETTINGS: dict[str, Any] = {
    "turn_limit": 5,  # LLM calls per agent since the last human message
    "approval_timeout": None,  # seconds; None waits for ever
    "context_messages": 200,  # how much of an agent's memory goes to the LLM
    "mcp_servers": [],  # [{"name", "command", "args", "env", "trusted", "tools"}]: tools appear as <name>__<tool>
    "sandbox_network": False,  # the shell's and MCP servers' network: false (none), true (open), "ask" (a proxy)
    "network_connection_bytes": 256 << 20,  # `ask` mode: bytes one connection may carry, both ways together
    "network_call_bytes": 1 << 30,  # `ask` mode: bytes all of one call's connections may carry
    "mcp_timeout": 60,  # seconds an MCP tool call may take (its questions' waiting included; a call made
                        # again after the links it asked for were opened has a deadline of its own)
    "mcp_result_limit": 1024 * 1024,  # bytes of an MCP result kept (text and binary); the rest is cut, with a note
    "elicitation_limit": 5,  # MCP servers' questions open at once in the world (and at most 5 per call)
    "llm_timeout": 120,  # seconds an LLM call may take in all (retries included)
    "llm_first_token_timeout": 30,  # seconds until the first text or tool-call fragment arrives
    "llm_reply_limit": 2_000_000,  # characters of one LLM reply (text and tool-call arguments) read
    "llm_calls_per_minute": 120,  # the world's LLM calls a minute (each process); past it, calls wait
    "webhooks": [],  # [{"url", "format", "secret", "events", "allow_private"}]: docs/notifications.md
    "escalate_after": None,  # minutes a request waits before it is escalated; None never escalates
    "escalate_to": [],  # whom an escalation names: "owner" and members' names (none: the owner)
}
# Bounds of what a world holds (docs/protocol.md §5): past one, adding is `conflict` until something goes.
MAX_AGENTS = 50
MAX_CHATS = 200  # open chats; a deleted one no longer counts
MAX_RULES = 500  # open rules and session grants together
_SCAN_PAGE = 100  # worlds read at once when every world is read: one pipeline, short enough to let requests by
PROVIDERS = ("openai", "scripted")
DEFAULT_CHAT = "main"
_AGENT_FIELDS = {"name", "system_prompt", "provider", "model", "base_url", "tools", "script"}


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]
    return slug or "world"


MIN_RESULT_LIMIT, MAX_RESULT_LIMIT = 1024, 16 * 1024 * 1024  # bounds of `mcp_result_limit`, in bytes
# Characters, each up to 4 bytes stored: a reply at the bound stays well under an event's 32 MiB.
MAX_REPLY_LIMIT = 4_000_000
MAX_NETWORK_BYTES = 64 << 30  # the `ask` mode's byte caps go up to 64 GiB

# A deadline is a date: one past Python's (or beyond any approval anyone waits for) broke every request.
MAX_APPROVAL_TIMEOUT = 30 * 86400


def expires_at(seconds: float) -> str:
    """The deadline `seconds` from now, as requests carry it (`expiresAt`); capped at MAX_APPROVAL_TIMEOUT,
    since a world may hold a timeout stored before the cap."""
    deadline = datetime.now(UTC) + timedelta(seconds=min(seconds, MAX_APPROVAL_TIMEOUT))
    return deadline.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    merged = {**DEFAULT_SETTINGS, **settings}
    unknown = set(merged) - set(DEFAULT_SETTINGS)
    if unknown:
        raise AppError(vocab.INVALID, f"unknown settings: {', '.join(sorted(unknown))}")
    limit = merged["turn_limit"]
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 100:
        raise AppError(vocab.INVALID, "turn_limit must be an integer from 1 to 100")
    timeout = merged["approval_timeout"]
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or not 0 < timeout <= MAX_APPROVAL_TIMEOUT):  # (NaN is neither)
        raise AppError(vocab.INVALID, f"approval_timeout must be a number of seconds above 0 and at most "
                                      f"{MAX_APPROVAL_TIMEOUT} (30 days), or null")
    context = merged["context_messages"]
    if not isinstance(context, int) or isinstance(context, bool) or not 2 <= context <= 10_000:
        raise AppError(vocab.INVALID, "context_messages must be an integer from 2 to 10000")
    if not isinstance(merged["sandbox_network"], bool) and merged["sandbox_network"] != "ask":
        raise AppError(vocab.INVALID, 'sandbox_network must be false (off), true (open) or "ask"')
    for key in ("network_connection_bytes", "network_call_bytes"):
        value = merged[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1024 <= value <= MAX_NETWORK_BYTES:
            raise AppError(vocab.INVALID, f"{key} must be an integer number of bytes from 1024 to {MAX_NETWORK_BYTES}")
    merged["mcp_servers"] = check_mcp_servers(merged["mcp_servers"])
    result_limit = merged["mcp_result_limit"]
    if not isinstance(result_limit, int) or isinstance(result_limit, bool) \
            or not MIN_RESULT_LIMIT <= result_limit <= MAX_RESULT_LIMIT:
        raise AppError(vocab.INVALID, f"mcp_result_limit must be an integer number of bytes from "
                                      f"{MIN_RESULT_LIMIT} to {MAX_RESULT_LIMIT} (16 MiB)")
    questions = merged["elicitation_limit"]
    if not isinstance(questions, int) or isinstance(questions, bool) or not 1 <= questions <= 100:
        raise AppError(vocab.INVALID, "elicitation_limit must be an integer from 1 to 100")
    for key, (low, high) in {"llm_reply_limit": (1000, MAX_REPLY_LIMIT), "llm_calls_per_minute": (1, 10_000)}.items():
        value = merged[key]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise AppError(vocab.INVALID, f"{key} must be an integer from {low} to {high}")
    for key in ("llm_timeout", "llm_first_token_timeout", "mcp_timeout"):
        value = merged[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 3600:
            raise AppError(vocab.INVALID, f"{key} must be a number of seconds from 0 (excluded) to 3600")
    _check_notifications(merged)
    return merged


MAX_ESCALATE_AFTER = 30 * 24 * 60  # minutes (30 days), as approval_timeout


def _check_notifications(merged: dict[str, Any]) -> None:
    """`webhooks`, `escalate_after` and `escalate_to` (docs/notifications.md), in place."""
    try:
        merged["webhooks"] = check_webhooks(merged["webhooks"])
    except ValueError as exc:
        raise AppError(vocab.INVALID, str(exc)) from None
    after = merged["escalate_after"]
    if after is not None and (not isinstance(after, (int, float)) or isinstance(after, bool)
                              or not 0 < after <= MAX_ESCALATE_AFTER):
        raise AppError(vocab.INVALID, f"escalate_after must be a number of minutes above 0 and at most "
                                      f"{MAX_ESCALATE_AFTER} (30 days), or null")
    to = merged["escalate_to"]
    if not isinstance(to, list) or len(to) > 20 or not all(isinstance(n, str) and 0 < len(n) <= 64 for n in to):
        raise AppError(vocab.INVALID, "escalate_to must be a list of at most 20 names (\"owner\" or members' names)")


def _with_stored_secrets(settings: dict[str, Any], stored: list[dict[str, Any]],
                         stored_hooks: object = None) -> dict[str, Any]:
    """`settings` with every `•••` (a write-only value the client was shown) back to its stored value."""
    try:
        if "webhooks" in settings:
            settings = {**settings, "webhooks": restore_webhooks(settings["webhooks"], stored_hooks)}
        if "mcp_servers" not in settings:
            return settings
        return {**settings, "mcp_servers": restore_masked(settings["mcp_servers"], stored)}
    except ValueError as exc:
        raise AppError(vocab.INVALID, str(exc)) from None


def check_agent(config: dict[str, Any], *, partial: bool = False) -> dict[str, Any]:
    """A validated agent configuration (clear `invalid` errors for anything off)."""
    if not isinstance(config, dict):
        raise AppError(vocab.INVALID, "an agent must be a JSON object")
    unknown = set(config) - _AGENT_FIELDS
    if unknown:
        raise AppError(vocab.INVALID, f"unknown agent fields: {', '.join(sorted(unknown))}")
    out = dict(config)
    if not partial or "name" in out:
        name = out.get("name")
        if not isinstance(name, str) or not vocab.LLM_NAME.match(name):
            raise AppError(vocab.INVALID, "agent name must match ^[a-zA-Z0-9_-]{1,64}$")
    if not partial:
        out.setdefault("system_prompt", "")
        out.setdefault("provider", "openai")
        out.setdefault("model", "gpt-4o-mini" if out["provider"] == "openai" else "demo")
        out.setdefault("base_url", None)
        out.setdefault("tools", None)
    for key in ("system_prompt", "model"):
        if key in out and not isinstance(out[key], str):
            raise AppError(vocab.INVALID, f"{key} must be a string")
    if "provider" in out and out["provider"] not in PROVIDERS:
        raise AppError(vocab.INVALID, f"provider must be one of {', '.join(PROVIDERS)}")
    if out.get("base_url") is not None and not (isinstance(out["base_url"], str)
                                                 and out["base_url"].startswith(("http://", "https://"))):
        raise AppError(vocab.INVALID, "base_url must be an http(s) URL")
    tools = out.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise AppError(vocab.INVALID, "tools must be a list of tool names or null (all tools)")
    return out


class Worlds:
    """Create, read, update and delete worlds, agents and chats.

    Reads of a world's settings and agents happen on every agent step, so they are memoized
    per world; every event that changes them (from this process or, via the bus, any other)
    drops the memo, and a read that raced with such an event is not kept. A read is kept only
    while this process hears every change of the world (`hears`, set by the engine: it is the
    only process, or its listener on the world is subscribed); otherwise nothing would drop it.
    """

    _CONFIG_KINDS = frozenset({vocab.WORLD_CREATED, vocab.WORLD_UPDATED, vocab.WORLD_DELETED, vocab.AGENT_ADDED,
                               vocab.AGENT_UPDATED, vocab.AGENT_REMOVED, vocab.RULE_ADDED, vocab.RULE_REVOKED,
                               vocab.GRANT_ADDED, vocab.GRANT_REVOKED, vocab.GRANT_EXPIRED, vocab.CHAT_CREATED,
                               vocab.CHAT_RENAMED, vocab.CHAT_DELETED, vocab.CHAT_BRANCHED})

    def __init__(self, store: Store) -> None:
        self.store = store
        self.log = store.log
        self._memo: dict[str, dict[str, Any]] = {}  # world -> {key: value}
        self.hears: Callable[[str], bool] = lambda world: False  # see the class's doc
        self._generation = 0  # counts forgets (of any world): a read that raced with one is not kept
        store.observers.append(self.observe)  # this process's writes; the engine passes on the others'

    def observe(self, world: str, event: Event) -> None:
        """Forget memoized configuration that `event` changes."""
        if event.get("kind") in self._CONFIG_KINDS:
            self.forget(world)

    def forget(self, world: str) -> None:
        """Forget the memoized configuration of `world` (a write that may have changed it lost its answer)."""
        self._memo.pop(world, None)
        self._generation += 1

    async def rules(self, world: str) -> list[Event]:
        """Open always-rules (allow and deny) of the world."""
        return await self._memoized(world, "rules", lambda: self.log.list_open(world, vocab.ALL_RULES))

    async def grants(self, world: str) -> list[Event]:
        """Open session grants of every chat of the world."""
        return await self._memoized(world, "grants", lambda: self.log.list_open(world, vocab.ALL_GRANTS))

    async def _memoized(self, world: str, key: str, read: Callable[[], Awaitable[T]]) -> T:
        memo = self._memo.get(world)
        if memo is not None and key in memo:
            return cast(T, memo[key])
        generation = self._generation
        value = await read()
        if self._generation == generation and self.hears(world):
            self._memo.setdefault(world, {})[key] = value
        return value

    # -- worlds --------------------------------------------------------------
    async def create(self, name: str, actor: Actor, settings: dict[str, Any] | None = None,
                     world_id: str | None = None) -> dict[str, Any]:
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise AppError(vocab.INVALID, "a world needs a name of 1 to 200 characters")
        checked = _check_settings(_with_stored_secrets(settings or {}, []))
        candidates = [world_id] if world_id else [_slug(name)] + [
            f"{_slug(name)}-{secrets.token_hex(3)}" for _ in range(5)]
        for candidate in candidates:
            event = events.world_created(name.strip(), checked, actor.sender)
            try:
                # The claim is permanent: a deleted world's id is never reused for a new one.
                await self.store.append(candidate, event, [Claim("world-id"), Open(vocab.world_key())])
            except Conflict:
                continue
            await self.create_chat(candidate, actor, title="Main", chat_id=DEFAULT_CHAT)
            return await self.get(candidate)
        raise AppError(vocab.CONFLICT, f"a world named {name!r} already exists")

    async def _world_event(self, world: str) -> Event:
        event = await self._memoized(world, "world", lambda: self._read_world(world))
        if event is None:
            raise AppError(vocab.NOT_FOUND, f"no world {world!r}")
        return event

    async def exists(self, world: str) -> bool:
        return await self._memoized(world, "world", lambda: self._read_world(world)) is not None

    async def _read_world(self, world: str) -> Event | None:
        """The world's latest settings. Its MCP secrets are hidden from the first time they are read (every
        request about a world reads them), not only once the world is hosted: worlds are hosted lazily."""
        event = await self.log.get_open(world, vocab.world_key())
        if event is not None:
            remember_mcp_secrets(event.get("settings") or {})
        return event

    async def remember_every_secret(self) -> None:
        """Read every world's MCP secrets once (at start, in the background): a value configured in one
        world is hidden in every other, as when every world was hosted at start. Not memoized: idle
        worlds cost no memory."""
        cursor: str | None = ""
        pace = Paced()
        while cursor is not None:
            ids = await self.log.worlds(cursor, _SCAN_PAGE + 1)
            for event in (await self._world_events(ids[:_SCAN_PAGE])).values():
                remember_mcp_secrets(event.get("settings") or {})
            cursor = ids[_SCAN_PAGE - 1] if len(ids) > _SCAN_PAGE else None
            await pace.step()

    async def settings(self, world: str) -> dict[str, Any]:
        settings: dict[str, Any] = (await self._world_event(world))["settings"]
        return settings

    async def get(self, world: str) -> dict[str, Any]:
        event = await self._world_event(world)
        # env values and secret-looking args of MCP servers are write-only: no client sees them.
        return {"id": world, "name": event["name"], "settings": masked_settings(event["settings"]),
                "agents": [public_agent(a) for a in await self.agents(world)],
                "chats": [public_part("chat", c) for c in await self.chats(world)]}  # titles are people's text

    async def page(self, after: str = "", limit: int = 100) -> tuple[list[dict[str, Any]], str | None]:
        """Up to `limit` worlds (id and name) after the id `after`, in id order, read a page at a time from
        the log's index (deleted ones skipped), and the cursor of the next page (None after the last)."""
        out: list[dict[str, Any]] = []
        cursor = after
        while len(out) < limit:
            wanted = limit - len(out)
            ids = await self.log.worlds(cursor, wanted + 1)  # one more: is there a next page?
            for world, event in (await self._world_events(ids[:wanted])).items():
                out.append({"id": world, "name": event["name"]})
            if len(ids) <= wanted:
                return out, None
            cursor = ids[wanted - 1]
        return out, cursor

    async def _world_events(self, ids: list[str]) -> dict[str, Event]:
        """The current `world_created`/`world_updated` event of each world in `ids` that exists, in order.
        Read side by side: the Redis log sends them as one pipeline, where one after another was a round
        trip each (100,000 of them after a start, for `remember_every_secret`, slowed every request)."""
        found = await asyncio.gather(*(self.log.get_open(world, vocab.world_key()) for world in ids))
        return {world: event for world, event in zip(ids, found, strict=True) if event is not None}

    async def update(self, world: str, actor: Actor, name: str | None = None,
                     settings: dict[str, Any] | None = None) -> dict[str, Any]:
        actor.require(vocab.CAN_MANAGE, "change the world")
        current = await self._world_event(world)
        new_name = current["name"] if name is None else name
        if not isinstance(new_name, str) or not new_name.strip():
            raise AppError(vocab.INVALID, "a world needs a name")
        event = events.world_updated(new_name.strip(), _check_settings({**current["settings"], **_with_stored_secrets(
            settings or {}, current["settings"].get("mcp_servers") or [], current["settings"].get("webhooks"))}),
            actor.sender)
        await self.store.append(world, event, [Open(vocab.world_key(), new=False)])
        return await self.get(world)

    async def delete(self, world: str, actor: Actor) -> None:
        actor.require(vocab.CAN_MANAGE, "delete the world")
        try:
            await self.store.append(world, events.world_deleted(actor.sender),
                                    [Close(vocab.world_key())])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"no world {world!r}") from None

    # -- agents --------------------------------------------------------------
    async def agents(self, world: str) -> list[dict[str, Any]]:
        events = await self._memoized(world, "agents", lambda: self.log.list_open(world, vocab.ALL_AGENTS))
        return [e["agent"] for e in events]

    async def agent(self, world: str, name: str) -> dict[str, Any]:
        for agent in await self.agents(world):
            if agent["name"] == name:
                return agent
        raise AppError(vocab.NOT_FOUND, f"no agent {name!r} in world {world!r}")

    async def add_agent(self, world: str, actor: Actor, config: dict[str, Any]) -> dict[str, Any]:
        actor.require(vocab.CAN_MANAGE, "add agents")
        await self._world_event(world)
        agent = check_agent(config)
        if len(await self.agents(world)) >= MAX_AGENTS:
            raise AppError(vocab.CONFLICT, f"world {world!r} already has {MAX_AGENTS} agents, the most a world "
                                           f"may have: remove one first")
        try:
            await self.store.append(world, events.agent_added(agent, actor.sender),
                                    [Open(vocab.agent_key(agent["name"]))])
        except Conflict:
            raise AppError(vocab.CONFLICT, f"an agent named {agent['name']!r} already exists") from None
        return public_agent(agent)

    async def update_agent(self, world: str, actor: Actor, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        actor.require(vocab.CAN_MANAGE, "change agents")
        current = await self.agent(world, name)
        shown, changes = public_agent(current), dict(changes)
        for key, value in list(changes.items()):
            if not (isinstance(value, str) and REDACTED in value) or value == current.get(key):
                continue
            if value != shown.get(key):  # changed around a hidden part: it would be stored as `[redacted]`
                raise AppError(vocab.INVALID, f"{key} holds {REDACTED}: a hidden value can be kept as it was "
                                              f"shown, or typed again in full, not edited around")
            changes[key] = current[key]  # sent back as it was shown (clients see it hidden): the real value stays
        changes = check_agent(changes, partial=True)
        if changes.get("name", name) != name:
            raise AppError(vocab.INVALID, "an agent cannot be renamed")
        agent = {**current, **changes}
        await self.store.append(world, events.agent_updated(agent, actor.sender),
                                [Open(vocab.agent_key(name), new=False)])
        return public_agent(agent)

    async def remove_agent(self, world: str, actor: Actor, name: str) -> None:
        actor.require(vocab.CAN_MANAGE, "remove agents")
        try:
            await self.store.append(world, events.agent_removed(name, actor.sender),
                                    [Close(vocab.agent_key(name))])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"no agent {name!r} in world {world!r}") from None

    # -- chats ---------------------------------------------------------------
    async def chats(self, world: str) -> list[dict[str, Any]]:
        # Oldest first by creation: a rename re-opens the chat's key, and must not make it the newest. (Memoized:
        # every request about a world and every page that opens lists them.)
        opened = await self._memoized(world, "chats", lambda: self.log.list_open(world, vocab.ALL_CHATS))
        return [e["chat"] for e in sorted(opened, key=lambda e: int(e.get("created_seq") or e["seq"]))]

    async def latest_chat(self, world: str) -> str:
        chats = await self.chats(world)
        if not chats:
            raise AppError(vocab.NOT_FOUND, f"world {world!r} has no chat")
        return str(chats[-1]["id"])

    async def require_chat(self, world: str, chat: str) -> None:
        if await self.log.get_open(world, vocab.chat_key(chat)) is None:
            raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}")

    async def create_chat(self, world: str, actor: Actor, title: str | None = None,
                          chat_id: str | None = None) -> dict[str, Any]:
        actor.require(vocab.CAN_SEND, "start chats")  # members may start chats; renaming and deleting is the owner's
        if title is not None and (not isinstance(title, str) or len(title) > 200):
            raise AppError(vocab.INVALID, "a chat title is a string of at most 200 characters")
        if len(await self.chats(world)) >= MAX_CHATS:
            raise AppError(vocab.CONFLICT, f"world {world!r} already has {MAX_CHATS} chats, the most a world "
                                           f"may have open: delete one first")
        chat = {"id": chat_id or vocab.new_id("chat")[:17], "title": title or "New chat"}
        await self.store.append(world, events.chat_created(chat, actor.sender),
                                [Open(vocab.chat_key(chat["id"]))])
        return chat
