"""The engine's public face: everything the HTTP API, the WebSockets, the CLI and the tests call."""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from .. import vocab
from ..aio import cancel_and_wait
from ..bus import Bus, Gap, Overflow
from ..errors import AppError
from ..llm import Provider
from ..log import Conflict, EventLog, Op, Open, Tag
from ..log.codec import decode
from ..metrics import Metrics
from ..tools.base import Tool
from ..tools.builtin import builtin_tools
from ..tools.registry import ToolRegistry
from ..vocab import Event
from .actors import Actor
from .approvals import Approvals
from .audit import audit_entry
from .calls import CallRef, append_result
from .catchup import Handled
from .chats import Chats
from .decisions import approvals_required, pending_entry, request_of
from .elicitations import Elicitations
from .executor import Executor
from .ownership import DECIDE, SEND, Refusals, resolve
from .public import public
from .retry import retry_reply
from .routing import addressees
from .runner import AgentRunner
from .status import StatusBoard
from .store import Store, channel
from .usage import Usage
from .world_tools import WorldTools
from .worlds import Worlds

log = logging.getLogger(__name__)
ProviderFactory = Callable[[dict[str, Any]], Provider]
MAX_CONTENT = 100_000
# Frames are compact JSON written by one encoder, so their type leads: no need to parse them all.
_IGNORED_FRAMES = ('{"type":"chunk"', '{"type":"presence"')
_STATUS_FRAME = '{"type":"status"'
WORLDS_CHANNEL = "agent-world:worlds"  # announces new worlds to every process
STOPS_CHANNEL = "agent-world:stops"  # asks whichever process runs an agent's LLM call to stop it


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


def _settled(task: asyncio.Task[Any]) -> None:
    """Done callback of an engine-owned task whose caller may be gone: its error is then only logged."""
    if not task.cancelled() and (exc := task.exception()) is not None and not isinstance(exc, AppError):
        log.debug("engine task %s failed: %r", task.get_name(), exc)


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
        # A world's MCP servers may write its workspace; their calls' progress shows in the agent's status.
        self.world_tools = WorldTools(tools, self.workspace_for, self.status)
        self.executor = Executor(self.store, self.status, self.tools_for, self.workspace_for, self.instance)
        self.refusals = Refusals(self.store, self.metrics)
        self.chats = Chats(self.store, self.worlds, self.refusals)  # rename and delete
        self.elicitations = Elicitations(self.store, self.refusals, self.worlds)  # MCP servers' questions
        self.world_tools.elicit = self.elicitations.ask
        self.approvals = Approvals(self.store, self.worlds, self.executor, self.metrics, self.refusals)
        self.usage = Usage(self.store.log, self.metrics)  # token counts per agent and world, from the log
        self._providers = providers or default_providers()
        self._hosted: dict[str, _Hosted] = {}
        self._background: list[asyncio.Task[None]] = []
        self._chores: set[asyncio.Task[None]] = set()  # short jobs started from a listener (see _spawn)
        self._applying: set[asyncio.Task[Any]] = set()  # decisions and results being applied (see submit_tool_result)
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
        if not self.exclusive:
            stops_ready = asyncio.Event()
            self._background.append(asyncio.create_task(self._follow_stops(stops_ready), name="engine-stops"))
            await stops_ready.wait()
        for world in await self.store.log.worlds():
            if await self.worlds.exists(world):
                await self.host(world)

    async def stop(self, grace: float = 5.0) -> None:
        """Finish running tools (up to `grace`), then stop; what is left resumes on the next start."""
        await self.approvals.stop()
        if self._applying:  # a decision being applied is finished, so its tool is started (or left to resume)
            await asyncio.wait(set(self._applying), timeout=grace)
        for task in self._background:
            await cancel_and_wait(task)
        self._background.clear()
        if self._chores:
            await asyncio.gather(*self._chores, return_exceptions=True)
        for hosted in list(self._hosted.values()):
            for runner in hosted.runners.values():
                await runner.stop()
        await self.executor.stop(grace)
        for world in list(self._hosted):
            await self._unhost(world)
        await self.refusals.stop()
        await self.store.log.release(self.process_lease, self.instance)

    def _spawn(self, job: Coroutine[Any, Any, None], name: str) -> None:
        """Run `job` beside the caller, tracked: awaited at stop, and its failure logged, never dropped."""
        task = asyncio.create_task(job, name=name)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[None]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("engine job %s failed", task.get_name(), exc_info=task.exception())

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
        """Host worlds that other processes create; after a gap in the bus, every world not hosted yet."""
        async with self.store.bus.subscribe(WORLDS_CHANNEL, maxsize=10_000) as sub:
            ready.set()
            while True:
                try:
                    worlds = [await sub.get()]
                except Gap as gap:
                    if gap.down:
                        continue
                    worlds = None  # back: a world announced meanwhile is in the log's list
                while True:
                    try:
                        for world in worlds if worlds is not None else await self.store.log.worlds():
                            if world not in self._hosted and await self.worlds.exists(world):
                                await self.host(world)
                        break
                    except Exception as exc:  # the storage may still be recovering: try again
                        log.warning("could not host new worlds (%s: %s); trying again in 1 s", type(exc).__name__, exc)
                        await asyncio.sleep(1.0)

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
        pending = await self.approvals.pending(world)
        self.metrics.pending_found(world, (approval["tool_calls"][0]["id"] for approval in pending))
        for approval in pending:
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
        """Follow the world's bus channel: wake runners on every event, from any process. What the bus
        missed (a reconnect, an overflow) is caught up on from the log, each event handled once."""
        handled: Handled | None = None
        while True:
            try:
                if handled is None:
                    handled = Handled(await self.store.log.last_seq(world))
                async with self.store.bus.subscribe(channel(world), maxsize=100_000) as sub:
                    await self._catch_up(world, handled)
                    ready.set()
                    self._wake_all(world)  # anything missed while (re)subscribing is in the log
                    while True:
                        try:
                            text = await sub.get()
                        except Gap as gap:
                            if not gap.down:  # subscribed again: what the bus lost is in the log
                                await self._catch_up(world, handled)
                                self._wake_all(world)
                            continue
                        if text.startswith(_IGNORED_FRAMES):  # streamed text: nothing for the engine
                            continue
                        if self.exclusive and text.startswith(_STATUS_FRAME):
                            continue  # the only process: every status was set here, on this board
                        frame = decode(text)
                        if frame.get("type") == "event" and not handled.add(frame["event"]["seq"]):
                            continue  # caught up on from the log already
                        await self._on_frame(world, frame)
                        if handled.holey:
                            await self._catch_up(world, handled)
            except asyncio.CancelledError:
                raise
            except Overflow:
                log.warning("engine fell behind on %s; resubscribing", world)
            except Exception as exc:  # e.g. the storage is down: catch up once it answers again
                log.warning("engine lost track of %s (%s: %s); catching up in 1 s", world, type(exc).__name__, exc)
                ready.set()  # host() goes on (and meets the same trouble) rather than hang
                await asyncio.sleep(1.0)

    async def _catch_up(self, world: str, handled: Handled) -> None:
        """Handle the logged events of `world` above `handled.floor` that were not handled yet."""
        after = handled.floor
        while True:
            events = await self.store.log.read(world, after, 1000)
            for event in events:
                if handled.add(event["seq"]):
                    await self._on_frame(world, {"type": "event", "event": public(event)})
            if len(events) < 1000:
                return
            after = events[-1]["seq"]

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
        self.metrics.observe(world, event)
        if kind == vocab.MESSAGE and event.get("approval") and event.get("sender") == vocab.SERVER_SENDER:
            # Whichever process wrote the request, every process holds its deadline (first close wins).
            self.approvals.schedule_timeout(world, event)
        elif kind == vocab.AGENT_ADDED:
            self._ensure_runner(world, event["agent"]["name"])
        elif kind == vocab.AGENT_REMOVED:
            hosted = self._hosted.get(world)
            runner = hosted.runners.pop(event["name"], None) if hosted else None
            if runner:
                self._spawn(runner.stop(), f"stop-{world}-{event['name']}")
        elif kind == vocab.WORLD_UPDATED:  # from the log: the bus carries settings with secrets masked
            self.world_tools.sync(world, await self.worlds.settings(world))
        elif kind == vocab.WORLD_DELETED:
            self._spawn(self._unhost(world), f"unhost-{world}")  # not awaited: it cancels this very listener
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
        info["mcp_status"] = self.world_tools.status(world)
        info["status"] = {a["name"]: self.status.get(world, a["name"]) for a in info["agents"]}
        info["usage"] = await self.usage.of(world)
        return info

    # -- messages and tool results -------------------------------------------
    async def post_message(self, world: str, actor: Actor, content: object, chat: str | None = None) -> Event:
        """A human message; it goes to the agents it mentions, or to all of them."""
        await self.require_to_send(world, actor)
        if not isinstance(content, str) or not content.strip() or len(content) > MAX_CONTENT:
            raise AppError(vocab.INVALID, f"content must be a non-empty string of at most {MAX_CONTENT} characters")
        if chat is None:
            chat = await self.worlds.latest_chat(world)
        elif not isinstance(chat, str):
            raise AppError(vocab.INVALID, "chat must be a chat id")
        await self.worlds.require_chat(world, chat)
        agents = [a["name"] for a in await self.worlds.agents(world)]
        ops: list[Op] = [Tag(vocab.shared_memory_tag(chat))]
        to = addressees(content, agents, sender_agent=None)
        ops += [Open(vocab.turn_key(agent, chat), new=False) for agent in to]
        event = {"kind": vocab.MESSAGE, "id": vocab.new_id("msg"), "chat": chat, "agent": None,
                 "sender": actor.sender, "role": "user", "content": content, "to": to}  # the page shows it
        return await self.store.append(world, event, ops)

    async def require_to_send(self, world: str, actor: Actor) -> None:
        """Refuse unless `actor` may send messages (callers check before reading a request's body)."""
        await self.refusals.require(world, actor, vocab.CAN_SEND, SEND)

    async def require_to_decide(self, world: str, actor: Actor) -> None:
        """Refuse unless `actor` may decide approvals and answer client tools."""
        await self.refusals.require(world, actor, vocab.CAN_DECIDE, DECIDE)

    async def submit_tool_result(self, world: str, actor: Actor, message: object) -> Event:
        """A decision on an approval, or a client tool's answer (docs/protocol.md §4), after the ownership checks.

        Applied by a task the engine owns: once a decision is being applied it is stored and carried
        out even if the caller is cancelled (a client that drops mid-frame cancels its socket's reader).
        """
        task = asyncio.create_task(self._submit_tool_result(world, actor, message), name=f"submit-{world}")
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
        task.add_done_callback(_settled)
        return await asyncio.shield(task)

    async def _submit_tool_result(self, world: str, actor: Actor, message: object) -> Event:
        if not isinstance(message, dict) or message.get("role") != "tool":
            raise AppError(vocab.INVALID, 'a tool result is {"role": "tool", "tool_call_id", "content"}')
        if not await self.worlds.exists(world):
            raise AppError(vocab.NOT_FOUND, f"no world {world!r}")
        target = await resolve(self.refusals, world, message.get("tool_call_id"), actor)
        content = message.get("content")
        if target.kind == "approval":
            return await self.approvals.decide(world, target.event, content, actor, target.origin)
        if target.kind == "elicitation":
            return await self.elicitations.answer(world, target.event, content, actor)
        if not isinstance(content, str) or len(content) > MAX_CONTENT:
            raise AppError(vocab.INVALID, f"content must be a string of at most {MAX_CONTENT} characters")
        call = CallRef.find(target.event, message["tool_call_id"])
        assert call is not None
        try:
            return await append_result(self.store, call, content, sender=actor.sender)
        except Conflict:
            raise await self.refusals.refuse(world, actor, vocab.ALREADY_DECIDED,
                                             f"{call.id} was already answered", call.id) from None

    async def cancel_turn(self, world: str, actor: Actor, agent: str) -> bool:
        """Stop `agent`'s LLM call in flight: its partial text is kept, marked "stopped by <name>", and the
        turn ends. True when a call was in flight (here, or possibly in another process)."""
        actor.require(vocab.CAN_SEND, "stop agents")
        await self.worlds.agent(world, agent)  # not_found for an unknown agent
        if self._stop_here(world, agent, actor.name):
            return True
        if self.exclusive:
            return False
        # Another process may run the agent's turns: every process hears this and the one with the call stops it.
        await self.store.bus.publish(STOPS_CHANNEL, json.dumps({"world": world, "agent": agent, "by": actor.name}))
        return self.status.get(world, agent).get("state") == vocab.THINKING

    async def retry(self, world: str, actor: Actor, agent: str, seq: object) -> Event:
        """Have `agent` answer again (a new LLM call, the same input) after its failed or stopped reply at `seq`."""
        return await retry_reply(self.store, self.worlds, self.refusals, world, actor, agent, seq)

    async def cancel_tool(self, world: str, actor: Actor, agent: str) -> bool:
        """Kill the tool `agent` is running in this process (its result says "stopped by <name>", and the
        turn goes on with it). False when none runs here."""
        actor.require(vocab.CAN_SEND, "stop tools")
        await self.worlds.agent(world, agent)  # not_found for an unknown agent
        return self.executor.cancel_tool(world, agent, actor.name)

    def _stop_here(self, world: str, agent: str, by: str) -> bool:
        hosted = self._hosted.get(world)
        runner = hosted.runners.get(agent) if hosted else None
        return runner is not None and runner.stop_turn(by)

    async def _follow_stops(self, ready: asyncio.Event) -> None:
        """Stops asked of another process (see cancel_turn)."""
        async with self.store.bus.subscribe(STOPS_CHANNEL, maxsize=1000) as sub:
            ready.set()
            while True:
                try:
                    text = await sub.get()
                except Gap:
                    continue  # a stop asked while the bus was away is lost: the person can ask again
                try:
                    stop = json.loads(text)
                    self._stop_here(str(stop["world"]), str(stop["agent"]), str(stop["by"]))
                except (ValueError, KeyError, TypeError):
                    log.warning("ignored a malformed stop on %s", STOPS_CHANNEL)

    # -- reading -------------------------------------------------------------
    async def events(self, world: str, after: int = 0, limit: int = 1000) -> list[Event]:
        """A page of the world's log as clients may see it (`public`: secrets in arguments hidden)."""
        return [public(event) for event in await self.store.log.read(world, after, limit)]

    async def pending_approvals(self, world: str) -> list[dict[str, Any]]:
        """Every pending approval, oldest first, with who approved so far where several must."""
        pending = await self.approvals.pending(world)
        several = any(approvals_required(request_of(e)) > 1 for e in pending)
        votes = await self.approvals.votes(world) if several else {}
        return [pending_entry(public(e), votes.get(e["tool_calls"][0]["id"])) for e in pending]

    async def rules(self, world: str) -> list[dict[str, Any]]:
        """The world's open always-rules as clients see them (secret-looking globs hidden)."""
        return [public(e)["rule"] for e in await self.approvals.rules(world)]

    async def grants(self, world: str, chat: str | None = None) -> list[dict[str, Any]]:
        """Open session grants (of one chat, or all) as clients see them."""
        return [public(e)["grant"] for e in await self.approvals.grants(world, chat)]

    async def pending_client_calls(self, world: str) -> list[dict[str, Any]]:
        """Client tool calls waiting for a browser to run them."""
        out = []
        for message in await self.store.log.list_open(world, vocab.ALL_CLIENT_CALLS):
            for call in CallRef.all_in(message):
                if call.location == "client" and await self.store.log.get_open(world, call.open_key):
                    out.append({"id": call.id, "agent": call.agent, "chat": call.chat, "name": call.name,
                                "arguments": call.parsed_arguments(), "seq": message["seq"]})
        return out

    async def snapshot(self, world: str) -> dict[str, Any]:
        """What a client needs after a replay (docs/protocol.md §6), minus `members`, which the API layer adds."""
        last_seq = await self.store.log.last_seq(world)
        agents = [{**a, "status": self.status.get(world, a["name"])} for a in await self.worlds.agents(world)]
        return {"type": "snapshot", "last_seq": last_seq, "pending_approvals": await self.pending_approvals(world),
                "pending_client_calls": await self.pending_client_calls(world), "agents": agents,
                "chats": await self.worlds.chats(world)}

    async def audit(self, world: str, limit: int = 1000) -> list[dict[str, Any]]:
        await self.worlds.get(world)
        events = await self.store.log.read_tagged(world, [vocab.AUDIT_TAG], limit=limit, newest=True)
        return [audit_entry(public(e)) for e in events]
