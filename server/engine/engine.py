"""The engine's public face: everything the HTTP API, the WebSockets, the CLI and the tests call."""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import vocab
from ..aio import cancel_and_wait
from ..bus import Bus, Overflow
from ..errors import AppError
from ..llm import Provider
from ..log import Conflict, EventLog, Open, Tag
from ..log.codec import decode
from ..metrics import Metrics
from ..tools.base import Tool
from ..tools.builtin import builtin_tools
from ..tools.registry import ToolRegistry
from ..vocab import Event
from .actors import Actor
from .approvals import Approvals, pending_entry
from .audit import audit_entry
from .calls import CallRef, append_result
from .executor import Executor
from .ownership import refuse, resolve
from .routing import addressees
from .public import public
from .runner import AgentRunner
from .status import StatusBoard
from .store import Store, channel
from .world_tools import WorldTools
from .worlds import Worlds

log = logging.getLogger(__name__)
ProviderFactory = Callable[[dict[str, Any]], Provider]
MAX_CONTENT = 100_000
# Frames are compact JSON written by one encoder, so their type leads: no need to parse them all.
_IGNORED_FRAMES = ('{"type":"chunk"', '{"type":"presence"')
_STATUS_FRAME = '{"type":"status"'
WORLDS_CHANNEL = "agent-world:worlds"  # announces new worlds to every process


def process_lease(instance: str) -> str:
    return f"proc:{instance}"


def default_providers() -> ProviderFactory:
    """`openai` agents talk to OPENAI_BASE_URL (or their own base_url); `scripted` ones run offline."""
    from ..llm.openai_provider import OpenAIProvider
    from ..llm.scripted import ScriptedProvider, demo_script

    cache: dict[tuple[str, str | None], Provider] = {}

    def make(config: dict[str, Any]) -> Provider:
        if config["provider"] == "scripted":
            key = ("scripted", config["name"])
            if key not in cache:
                cache[key] = ScriptedProvider(demo_script(config["name"]), delay=0.02)
        else:
            base_url = config.get("base_url") or os.environ.get("OPENAI_BASE_URL") or None
            key = ("openai", base_url)
            if key not in cache:
                cache[key] = OpenAIProvider(api_key=os.environ.get("OPENAI_API_KEY") or "not-set",
                                            base_url=base_url)
        return cache[key]
    return make


class _Hosted:
    """What this process runs for one world: its bus listener and its agents' runners."""

    def __init__(self) -> None:
        self.listener: asyncio.Task[None] | None = None
        self.runners: dict[str, AgentRunner] = {}


class Engine:
    def __init__(self, log: EventLog, bus: Bus, *, data_dir: Path, providers: ProviderFactory | None = None,
                 tools: ToolRegistry | None = None, metrics: Metrics | None = None, lease_ttl: float = 15.0,
                 exclusive: bool = False) -> None:
        self.store = Store(log, bus)
        self.data_dir = Path(data_dir)
        self.metrics = metrics or Metrics()
        self.instance = vocab.new_id("proc")
        self.worlds = Worlds(self.store)
        self.status = StatusBoard(self.store)
        if tools is None:
            tools = ToolRegistry()
            for tool in builtin_tools():
                tools.register(tool)
        self.tools = tools
        self.world_tools = WorldTools(tools)
        self.executor = Executor(self.store, self.status, self.tools_for, self.workspace_for, self.instance)
        self.approvals = Approvals(self.store, self.worlds, self.executor, self.metrics)
        self._providers = providers or default_providers()
        self._hosted: dict[str, _Hosted] = {}
        self._background: list[asyncio.Task[None]] = []
        self.lease_ttl = lease_ttl  # how long a dead process keeps its agents and running calls
        # The only engine on its storage (the embedded mode holds a lock on the data folder):
        # no leases to wait for, and a call started by any other instance was interrupted.
        self.exclusive = exclusive

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Host every world: resume owed turns, pending calls and approval timers from the log."""
        await self.store.log.lease(self.process_lease, self.instance, self.lease_ttl)
        self._background.append(asyncio.create_task(self._heartbeat(), name="engine-heartbeat"))
        ready = asyncio.Event()
        self._background.append(asyncio.create_task(self._follow_new_worlds(ready), name="engine-worlds"))
        await ready.wait()
        for world in await self.store.log.worlds():
            if await self.worlds.exists(world):
                await self.host(world)

    async def stop(self, grace: float = 5.0) -> None:
        """Finish running tools (up to `grace`), then stop; what is left resumes on the next start."""
        self.approvals.stop()
        for task in self._background:
            await cancel_and_wait(task)
        self._background.clear()
        for hosted in list(self._hosted.values()):
            for runner in hosted.runners.values():
                await runner.stop()
        await self.executor.stop(grace)
        for world in list(self._hosted):
            await self._unhost(world)
        await self.store.log.release(self.process_lease, self.instance)

    @property
    def process_lease(self) -> str:
        return process_lease(self.instance)

    async def is_alive(self, instance: str) -> bool:
        """Whether the process `instance` still runs (holds its lease)."""
        if instance == self.instance:
            return True
        return not self.exclusive and await self.store.log.lease_holder(process_lease(instance)) is not None

    async def _heartbeat(self) -> None:
        """Renew this process's lease and its agents' leases; a runner whose lease was lost stops."""
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self.store.log.lease(self.process_lease, self.instance, self.lease_ttl)
                for hosted in list(self._hosted.values()):
                    for runner in list(hosted.runners.values()):
                        await runner.renew_lease()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("lease renewal failed")

    async def _follow_new_worlds(self, ready: asyncio.Event) -> None:
        """Host worlds that other processes create."""
        async with self.store.bus.subscribe(WORLDS_CHANNEL, maxsize=10_000) as sub:
            ready.set()
            async for world in sub:
                if world not in self._hosted and await self.worlds.exists(world):
                    await self.host(world)

    def hosts(self, world: str) -> bool:
        return world in self._hosted

    async def host(self, world: str) -> None:
        if world in self._hosted:
            return
        hosted = self._hosted[world] = _Hosted()
        ready = asyncio.Event()
        hosted.listener = asyncio.create_task(self._listen(world, ready), name=f"listen-{world}")
        await ready.wait()
        self.world_tools.sync(world, await self.worlds.settings(world))
        for agent in await self.worlds.agents(world):
            self._ensure_runner(world, agent["name"])
        for approval in await self.approvals.pending(world):
            self.approvals.schedule_timeout(world, approval)

    async def _unhost(self, world: str) -> None:
        hosted = self._hosted.pop(world, None)
        if hosted is None:
            return
        for runner in hosted.runners.values():
            await runner.stop()
        await cancel_and_wait(hosted.listener)
        await self.world_tools.close(world)
        self.status.forget(world)

    def _ensure_runner(self, world: str, agent: str) -> None:
        hosted = self._hosted.get(world)
        if hosted is not None and agent not in hosted.runners:
            runner = hosted.runners[agent] = AgentRunner(self, world, agent)
            runner.start()
            runner.wake()

    async def _listen(self, world: str, ready: asyncio.Event) -> None:
        """Follow the world's bus channel: wake runners on every event, from any process."""
        while True:
            try:
                async with self.store.bus.subscribe(channel(world), maxsize=100_000) as sub:
                    ready.set()
                    self._wake_all(world)  # anything missed while (re)subscribing is in the log
                    async for text in sub:
                        if text.startswith(_IGNORED_FRAMES):  # streamed text: nothing for the engine
                            continue
                        if self.exclusive and text.startswith(_STATUS_FRAME):
                            continue  # the only process: every status was set here, on this board
                        await self._on_frame(world, decode(text))
            except Overflow:
                log.warning("engine fell behind on %s; resubscribing", world)

    async def _on_frame(self, world: str, frame: dict[str, Any]) -> None:
        if frame.get("type") == "status":
            self.status.observe(world, frame)
            return
        if frame.get("type") != "event":
            return
        event = frame["event"]
        kind = event.get("kind")
        self.worlds.observe(world, event)
        self.metrics.events.labels(kind or "unknown").inc()
        if kind == vocab.AGENT_ADDED:
            self._ensure_runner(world, event["agent"]["name"])
        elif kind == vocab.AGENT_REMOVED:
            hosted = self._hosted.get(world)
            runner = hosted.runners.pop(event["name"], None) if hosted else None
            if runner:
                asyncio.ensure_future(runner.stop())
        elif kind == vocab.WORLD_UPDATED:
            self.world_tools.sync(world, event["settings"])
        elif kind == vocab.WORLD_DELETED:
            asyncio.ensure_future(self._unhost(world))
            return
        hosted = self._hosted.get(world)
        for runner in hosted.runners.values() if hosted else ():
            if runner.concerns(event):
                runner.wake()

    def wake_agents(self, world: str) -> None:
        """Make every agent of `world` hosted here look at the log again."""
        self._wake_all(world)

    def _wake_all(self, world: str) -> None:
        hosted = self._hosted.get(world)
        if hosted:
            for runner in hosted.runners.values():
                runner.wake()

    # -- helpers the parts share ---------------------------------------------
    def workspace_for(self, world: str) -> Path:
        path = self.data_dir / "workspaces" / world
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def tools_for(self, world: str, agent: str) -> dict[str, Tool]:
        """The tools `agent` may call, by name (all of them when its config says null)."""
        allowed = (await self.worlds.agent(world, agent)).get("tools")
        return {t.name: t for t in await self.world_tools.tools(world) if allowed is None or t.name in allowed}

    def provider_for(self, config: dict[str, Any]) -> Provider:
        return self._providers(config)

    # -- worlds, agents, chats -----------------------------------------------
    async def create_world(self, actor: Actor, name: str, settings: dict[str, Any] | None = None,
                           agents: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        actor.require(vocab.CAN_MANAGE, "create worlds")
        world = await self.worlds.create(name, actor, settings)
        await self.host(world["id"])
        await self.store.bus.publish(WORLDS_CHANNEL, world["id"])
        for config in agents or ():
            await self.worlds.add_agent(world["id"], actor, config)
        return await self.get_world(world["id"])

    async def get_world(self, world: str) -> dict[str, Any]:
        info = await self.worlds.get(world)
        info["tools"] = [t.info() for t in await self.world_tools.tools(world)]
        info["tool_errors"] = self.world_tools.errors(world)
        info["status"] = {a["name"]: self.status.get(world, a["name"]) for a in info["agents"]}
        return info

    # -- messages and tool results -------------------------------------------
    async def post_message(self, world: str, actor: Actor, content: object, chat: str | None = None) -> Event:
        """A human message; it goes to the agents it mentions, or to all of them."""
        actor.require(vocab.CAN_SEND, "send messages")
        if not isinstance(content, str) or not content.strip() or len(content) > MAX_CONTENT:
            raise AppError(vocab.INVALID, f"content must be a non-empty string of at most {MAX_CONTENT} characters")
        if chat is None:
            chat = await self.worlds.latest_chat(world)
        elif not isinstance(chat, str):
            raise AppError(vocab.INVALID, "chat must be a chat id")
        await self.worlds.require_chat(world, chat)
        agents = [a["name"] for a in await self.worlds.agents(world)]
        ops = [Tag(vocab.shared_memory_tag(chat))]
        ops += [Open(vocab.turn_key(agent, chat), new=False) for agent in addressees(content, agents, sender_agent=None)]
        event = {"kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": chat, "agent": None,
                 "sender": actor.sender, "role": "user", "content": content}
        return await self.store.append(world, event, ops)

    async def submit_tool_result(self, world: str, actor: Actor, message: object) -> Event:
        """A decision on an approval, or a client tool's answer (PROTOCOL §4), after the ownership checks."""
        if not isinstance(message, dict) or message.get("role") != "tool":
            raise AppError(vocab.INVALID, 'a tool result is {"role": "tool", "tool_call_id", "content"}')
        if not await self.worlds.exists(world):
            raise AppError(vocab.NOT_FOUND, f"no world {world!r}")
        target = await resolve(self.store, world, message.get("tool_call_id"), actor)
        content = message.get("content")
        if target.kind == "approval":
            return await self.approvals.decide(world, target.event, content, actor, target.origin)
        if not isinstance(content, str) or len(content) > MAX_CONTENT:
            raise AppError(vocab.INVALID, f"content must be a string of at most {MAX_CONTENT} characters")
        call = CallRef.find(target.event, message["tool_call_id"])
        assert call is not None
        try:
            return await append_result(self.store, call, content, sender=actor.sender)
        except Conflict:
            raise await refuse(self.store, world, actor, vocab.ALREADY_DECIDED,
                               f"{call.id} was already answered", call.id) from None

    async def refresh_gauges(self) -> None:
        """Bring gauges that are derived from the log up to date (called on each /metrics scrape)."""
        for world in list(self._hosted):
            self.metrics.pending.labels(world).set(len(await self.approvals.pending(world)))

    # -- reading -------------------------------------------------------------
    async def events(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """A page of the world's log as clients may see it (`public`: secrets in arguments hidden)."""
        return [public(event) for event in await self.store.log.read(world, after, limit)]

    async def pending_approvals(self, world: str) -> list[dict[str, Any]]:
        return [pending_entry(e) for e in await self.approvals.pending(world)]

    async def pending_client_calls(self, world: str) -> list[dict[str, Any]]:
        """Client tool calls waiting for a browser to run them."""
        out = []
        for message in await self.store.log.list_open(world, "clientcall:"):
            for call in CallRef.all_in(message):
                if call.location == "client" and await self.store.log.get_open(world, call.open_key):
                    out.append({"id": call.id, "agent": call.agent, "chat": call.chat, "name": call.name,
                                "arguments": call.parsed_arguments(), "seq": message["seq"]})
        return out

    async def snapshot(self, world: str) -> dict[str, Any]:
        """What a client needs after a replay (PROTOCOL §6), minus `members`, which the API layer adds."""
        last_seq = await self.store.log.last_seq(world)
        agents = [{**a, "status": self.status.get(world, a["name"])} for a in await self.worlds.agents(world)]
        return {"type": "snapshot", "last_seq": last_seq, "pending_approvals": await self.pending_approvals(world),
                "pending_client_calls": await self.pending_client_calls(world), "agents": agents,
                "chats": await self.worlds.chats(world)}

    async def audit(self, world: str, limit: int = 1000) -> list[dict[str, Any]]:
        await self.worlds.get(world)
        events = await self.store.log.read_tagged(world, [vocab.AUDIT_TAG], limit=limit, newest=True)
        return [audit_entry(e) for e in events]
