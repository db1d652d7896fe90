"""The engine's public face: everything the HTTP API, the WebSockets, the CLI and the tests call."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import events, vocab
from ..aio import Paced, cancel_and_wait, keep
from ..bus import Bus
from ..errors import AppError
from ..llm import Provider
from ..llm.providers import DefaultProviders
from ..log import Conflict, EventLog, Op, Open, Tag
from ..log.failures import StorageError
from ..metrics import Metrics
from ..tools.base import Tool
from ..tools.builtin import builtin_tools
from ..tools.mcp.oauth_vault import FileVault
from ..tools.registry import ToolRegistry
from ..vocab import Event
from .actors import Actor
from .approvals.deciding import Approvals
from .approvals.decisions import parse_decision
from .approvals.elicitations import Elicitations
from .approvals.inbox import INBOX_WORLDS, inbox, pending_counts, worlds_with_requests
from .approvals.network import NetworkRequests
from .approvals.ownership import DECIDE, SEND, Refusals, resolve
from .calls.executor import Executor
from .calls.refs import CallRef, append_result
from .hosting.hosted import Hosting
from .hosting.leases import ProcessLease
from .notify.escalation import Escalations
from .notify.webhooks import Webhooks
from .services import Services
from .store import Store
from .turns.edit_message import EDIT as EDIT  # the actions' names, for callers that check before reading a body
from .turns.edit_message import edit_message
from .turns.retry_reply import retry_reply
from .turns.routing import addressees
from .world.admin import Administration
from .world.branch import BRANCH as BRANCH
from .world.branch import branch_chat
from .world.chats import Chats
from .world.files import WorkspaceFiles
from .world.invites import Invites
from .world.mcp_sign_in import McpSignIns
from .world.reading import Reading
from .world.status import StatusBoard
from .world.tools import WorldTools
from .world.usage import Usage
from .world.worlds import Worlds

logger = logging.getLogger(__name__)
ProviderFactory = Callable[[dict[str, Any]], Provider]
MAX_CONTENT = 100_000
MAX_BATCH = 100  # requests one batch decision may list


def default_providers() -> DefaultProviders:
    """`openai` agents talk to OPENAI_BASE_URL (or their own base_url); `scripted` ones run offline."""
    return DefaultProviders()


def _settled(task: asyncio.Task[Any]) -> None:
    """Done callback of an engine-owned task whose caller may be gone: its error is then only logged."""
    if not task.cancelled() and (exc := task.exception()) is not None and not isinstance(exc, AppError):
        logger.warning("engine task %s failed", task.get_name(), exc_info=exc)  # never dropped unseen


def _message_content(content: object) -> str:
    if not isinstance(content, str) or not content.strip() or len(content) > MAX_CONTENT:
        raise AppError(vocab.INVALID, f"content must be a non-empty string of at most {MAX_CONTENT} characters")
    return content


class Engine(Administration, Reading):
    def __init__(self, log: EventLog, bus: Bus, *, data_dir: Path, providers: ProviderFactory | None = None,
                 tools: ToolRegistry | None = None, metrics: Metrics | None = None, lease_ttl: float = 15.0,
                 exclusive: bool = False, release_after: float = 60.0) -> None:
        self.store = Store(log, bus)
        self.data_dir = Path(data_dir).absolute()  # workspaces by absolute path: the sandbox caches by path
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
        # exclusive: the only engine on its storage (the embedded mode holds a lock on the data folder):
        # no leases to wait for, and a call started by any other instance was interrupted.
        self.leases = ProcessLease(self.store, self.instance, lease_ttl, exclusive)
        self.executor = Executor(self.store, self.status, self.tools_for, self.workspace_for, self.leases)
        self.refusals = Refusals(self.store, self.metrics)
        self.invites = Invites(self.store, self.worlds, self.refusals)
        self.elicitations = Elicitations(self.store, self.refusals, self.worlds)  # MCP servers' questions
        self.world_tools.elicit = self.elicitations.ask
        # OAuth MCP servers' sign-ins; tokens sealed in the data folder (a Redis vault in the distributed mode).
        self.mcp_sign_ins = McpSignIns(self.store, self.worlds, self.refusals, self.world_tools,
                                       FileVault(self.data_dir))
        self.mcp_sign_ins.relayed = not exclusive  # other processes may take a sign-in's callback
        self.approvals = Approvals(self.store, self.worlds, self.executor, self.metrics, self.refusals)
        # A running call's connections (the `ask` network mode), asked and decided as calls are.
        self.executor.network = NetworkRequests(self.store, self.approvals)
        self.chats = Chats(self.store, self.worlds, self.refusals, self.approvals)  # rename and delete
        self.files = WorkspaceFiles(self.store, self.worlds, self.refusals, self.workspace_for)  # the files panel
        self.usage = Usage(self.store.log, self.metrics)  # token counts per agent and world, from the log
        # Our own providers are ours to close at stop; a caller's factory is the caller's.
        self._default_providers: DefaultProviders | None = None
        if providers is None:
            providers = self._default_providers = default_providers()
        self._providers = providers
        self._background: list[asyncio.Task[None]] = []
        self._applying: set[asyncio.Task[Any]] = set()  # decisions and results being applied (see submit_tool_result)
        self.services = Services(self.store, self.worlds, self.approvals, self.executor, self.status, self.metrics,
                                 self.leases, self.tools_for, self.provider_for)
        # the worlds this process runs: those with work, and others while they are used here
        self.hosting = Hosting(self.services, self.world_tools, release_after)
        # What is memoized of a world is kept while every change of it reaches this process: the only one
        # writes them all; otherwise its listener must be subscribed.
        self.worlds.hears = lambda world: self.exclusive or self.hosting.hears(world)
        # Outgoing webhooks and escalations (server/engine/notify/), fed by what the hosted worlds hear.
        self.webhooks = Webhooks(self.store, self.worlds, self.leases)
        self.escalations = Escalations(self.store, self.worlds)
        self.hosting.heard += [self.webhooks.heard, self.escalations.heard]
        self.hosting.found_pending += [self.escalations.found_pending, self.webhooks.found_pending]

    # -- lifecycle -----------------------------------------------------------
    async def start(self, *, host_in_background: bool = False) -> None:
        """Host every world with work (the log's index, not every world): resume owed turns, pending calls
        and approval timers from the log. Other worlds are hosted when they are used.

        `host_in_background` (the server): return once new worlds are followed, and host the worlds with
        work after that, so the server answers at once whatever its work; a world used before its turn
        comes is hosted on demand. Hosting 1,000 worlds with work took 1-2 s of a restart on Redis."""
        await self.leases.take()
        self.hosting.started = True
        self._background.append(asyncio.create_task(self.leases.heartbeat(self.hosting.agent_leases),
                                                    name="engine-heartbeat"))
        ready = asyncio.Event()
        self._background.append(asyncio.create_task(self.hosting.follow_new_worlds(ready), name="engine-worlds"))
        await ready.wait()
        if not self.exclusive:
            stops_ready = asyncio.Event()
            self._background.append(asyncio.create_task(self.hosting.follow_stops(stops_ready), name="engine-stops"))
            await stops_ready.wait()
        if host_in_background:
            self._background.append(asyncio.create_task(self._host_work_in_background(), name="engine-host-work"))
        else:
            await self._host_worlds_with_work(paced=False)

    async def _host_worlds_with_work(self, paced: bool) -> None:
        # Side by side: hosting one is a few reads, which the Redis log pipelines; one after another,
        # 1,000 worlds with work took 3.3 s to host (bench/worlds.py). In the background, 16 at a time
        # and paced, so that requests are served meanwhile.
        at_once = 16 if paced else 64
        pace = Paced()

        async def host(world: str) -> None:
            if await self.worlds.exists(world):
                await self.host(world)
        worlds = await self.store.log.worlds_with_work()
        for start in range(0, len(worlds), at_once):
            await asyncio.gather(*(host(world) for world in worlds[start:start + at_once]))
            if paced:
                await pace.step()
        self._background.append(asyncio.create_task(self._remember_every_secret(), name="engine-secrets"))

    async def _host_work_in_background(self) -> None:
        try:
            await self._host_worlds_with_work(paced=True)
        except StorageError as exc:  # one at a time from here, each tried again until the storage answers
            logger.warning("could not host every world with work (%s); trying again", exc)
            await self.hosting.host_new(None)
            self._background.append(asyncio.create_task(self._remember_every_secret(), name="engine-secrets"))

    async def _remember_every_secret(self) -> None:
        """Every world's MCP secrets, read once in the background (see `Worlds.remember_every_secret`)."""
        for wait in (1.0, 5.0, 30.0, None):
            try:
                await self.worlds.remember_every_secret()
                await self.mcp_sign_ins.remember_every_record()  # OAuth MCP tokens, sealed in the vault
                return
            except StorageError as exc:  # the storage is down a moment: a world's own reads remember its own
                logger.warning("could not read every world's MCP secrets (%s); %s", exc,
                               f"trying again in {wait:g} s" if wait else "giving up until the next start")
                if wait is None:
                    return
                await asyncio.sleep(wait)

    async def stop(self, grace: float = 5.0) -> None:
        """Finish running tools (up to `grace`), then stop; what is left resumes on the next start."""
        self.hosting.started = False  # nothing is hosted anew, nor released, from now on
        await self.approvals.stop()
        await self.escalations.stop()
        if self._applying:  # a decision being applied is finished, so its tool is started (or left to resume)
            await asyncio.wait(set(self._applying), timeout=grace)
        for task in self._background:
            await cancel_and_wait(task)
        self._background.clear()
        await self.hosting.stop()
        await self.executor.stop(grace)
        await self.hosting.unhost_all()
        await self.webhooks.stop()
        await self.mcp_sign_ins.close()
        await self.refusals.stop()
        await self.leases.release()
        if self._default_providers is not None:
            await self._default_providers.aclose()  # their HTTP clients' sockets, once no agent runs

    @property
    def exclusive(self) -> bool:
        return self.leases.exclusive

    @property
    def lease_ttl(self) -> float:
        return self.leases.ttl

    async def is_alive(self, instance: str) -> bool:
        """Whether the process `instance` still runs (holds its lease)."""
        return await self.leases.is_alive(instance)

    def hosts(self, world: str) -> bool:
        return world in self.hosting.hosted

    async def host(self, world: str) -> None:
        await self.hosting.host(world)

    def wake_agents(self, world: str) -> None:
        """Make every agent of `world` hosted here look at the log again."""
        self.hosting.wake_all(world)

    # -- helpers the parts share ---------------------------------------------
    def workspace_for(self, world: str) -> Path:
        if not vocab.WORLD_ID.fullmatch(world):  # never a folder outside workspaces/ (`..`, `/`, `a/../..`)
            raise ValueError(f"{world[:80]!r} is not a world id: no workspace for it")
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
        await self.hosting.announce(world["id"])
        for config in agents or ():
            await self.worlds.add_agent(world["id"], actor, config)
        return await self.get_world(world["id"])

    async def get_world(self, world: str) -> dict[str, Any]:
        info = await self.worlds.get(world)
        if self.hosting.started:  # hosted on demand: its tools synced with its settings, its MCP servers known
            await self.host(world)
        info["tools"] = [t.info() for t in await self.world_tools.tools(world)]
        info["tool_errors"] = self.world_tools.errors(world)
        info["mcp_status"] = self.world_tools.status(world)
        for server, signed_in in (await self.mcp_sign_ins.signed_in(world, await self.worlds.settings(world))).items():
            if server in info["mcp_status"]:
                info["mcp_status"][server]["signed_in"] = signed_in
        info["status"] = {a["name"]: self.status.get(world, a["name"]) for a in info["agents"]}
        info["usage"] = await self.usage.of(world)
        return info

    # -- messages and tool results -------------------------------------------
    async def post_message(self, world: str, actor: Actor, content: object, chat: str | None = None) -> Event:
        """A human message; it goes to the agents it mentions, or to all of them."""
        await self.require_to_send(world, actor)
        content = _message_content(content)
        if chat is None:
            chat = await self.worlds.latest_chat(world)
        elif not isinstance(chat, str):
            raise AppError(vocab.INVALID, "chat must be a chat id")
        await self.worlds.require_chat(world, chat)
        agents = [a["name"] for a in await self.worlds.agents(world)]
        ops: list[Op] = [Tag(vocab.shared_memory_tag(chat))]
        to = addressees(content, agents, sender_agent=None)
        ops += [Open(vocab.turn_key(agent, chat), new=False) for agent in to]
        # `to`: the page shows it; `person` (who really sent it) stays on the server
        event = events.human_message(chat, actor.sender, actor.identity, content, to)
        return await self.store.append(world, event, ops)

    async def require_to_send(self, world: str, actor: Actor, action: str = SEND) -> None:
        """Refuse (audited) unless `actor` may send messages, or do `action`, which a sender may
        (callers check before reading a request's body)."""
        await self.refusals.require(world, actor, vocab.CAN_SEND, action)

    async def require_to_decide(self, world: str, actor: Actor) -> None:
        """Refuse unless `actor` may decide approvals and answer client tools."""
        await self.refusals.require(world, actor, vocab.CAN_DECIDE, DECIDE)

    async def submit_tool_result(self, world: str, actor: Actor, message: object) -> Event:
        """A decision on an approval, or a client tool's answer (docs/protocol.md §4), after the ownership checks.

        Applied by a task the engine owns: once a decision is being applied it is stored and carried
        out even if the caller is cancelled (a client that drops mid-frame cancels its socket's reader).
        """
        task = keep(self._applying, self._submit_tool_result(world, actor, message), f"submit-{world}")
        task.add_done_callback(_settled)
        return await asyncio.shield(task)

    async def decide_listed(self, world: str, actor: Actor, ids: object, content: object) -> list[dict[str, Any]]:
        """One decision (approve or deny, scope `once`) on exactly the listed requests: each still pending is
        decided through the one decision path, on the record as its own decision; one decided meanwhile,
        or not a pending request at all, is reported, never looked for elsewhere (a request asked after
        the list was shown is not among them). Returns each id's outcome, in the list's order."""
        await self.require_to_decide(world, actor)
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_BATCH or not all(isinstance(i, str) for i in ids):
            raise AppError(vocab.INVALID, f"ids must list 1 to {MAX_BATCH} approval ids, as shown")
        decision = parse_decision(content)
        if decision.scope != "once" or decision.arguments is not None:
            raise AppError(vocab.INVALID, "a batch decides each listed call once: scope 'once', without edits")
        outcomes: list[dict[str, Any]] = []
        for approval_id in dict.fromkeys(ids):
            if await self.store.log.get_open(world, vocab.approval_key(approval_id)) is None:
                outcomes.append({"id": approval_id, "outcome": vocab.ALREADY_DECIDED,
                                 "message": f"{approval_id} is not pending"})
                continue
            try:
                event = await self.submit_tool_result(world, actor, {"role": "tool", "tool_call_id": approval_id,
                                                                     "content": json.dumps(content)})
                outcomes.append({"id": approval_id, "outcome": "decided", "seq": event["seq"]})
            except AppError as exc:
                outcomes.append({"id": approval_id, "outcome": exc.code, "message": exc.message})
        return outcomes

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
        if self.hosting.stop_here(world, agent, actor.name):
            return True
        if self.exclusive:
            return False
        # Another process may run the agent's turns: every process hears this and the one with the call stops it.
        await self.hosting.ask_stop(world, agent, actor.name)
        return self.status.get(world, agent).get("state") == vocab.THINKING

    async def retry(self, world: str, actor: Actor, agent: str, seq: object) -> Event:
        """Have `agent` answer again (a new LLM call, the same input) after its failed or stopped reply at `seq`,
        or regenerate its reply at `seq` (a new version; the earlier one kept)."""
        return await retry_reply(self.store, self.worlds, self.refusals, self.approvals, world, actor, agent, seq)

    async def edit_message(self, world: str, actor: Actor, seq: object, content: object) -> Event:
        """The person's new version of their message at `seq`; the agents it is for answer it again."""
        await self.require_to_send(world, actor, EDIT)
        return await edit_message(self.store, self.worlds, self.refusals, self.approvals, world, actor, seq,
                                  _message_content(content))

    async def branch_chat(self, world: str, actor: Actor, chat: str, seq: object, title: object = None) -> Event:
        """A new chat starting with `chat`'s messages up to the one at `seq` (the `chat_branched` event)."""
        return await branch_chat(self.store, self.worlds, self.refusals, world, actor, chat, seq, title)

    async def cancel_tool(self, world: str, actor: Actor, agent: str) -> bool:
        """Kill the tool `agent` is running in this process (its result says "stopped by <name>", and the
        turn goes on with it). False when none runs here."""
        actor.require(vocab.CAN_SEND, "stop tools")
        await self.worlds.agent(world, agent)  # not_found for an unknown agent
        return self.executor.cancel_tool(world, agent, actor.name)

    # -- one inbox for every world (approvals/inbox.py) ------------------------
    INBOX_WORLDS = INBOX_WORLDS  # worlds one inbox looks at, and one live inbox follows

    async def inbox(self, actors: dict[str, Actor]) -> list[dict[str, Any]]:
        """Every request the `actors` (one per world) can decide, oldest first, with where it belongs."""
        return await inbox(self, actors)

    async def inbox_worlds(self) -> list[str]:
        """The worlds an owner's inbox looks at: from the log's work index, never a scan of every world."""
        return await worlds_with_requests(self)

    async def pending_counts(self) -> dict[str, int]:
        """Requests waiting per world, for the worlds of the owner's inbox that have some."""
        return await pending_counts(self)
