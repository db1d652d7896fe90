"""Branching a chat: a new chat that starts with the messages of another up to one of them.

The messages are copied (`branch_copy`, each with `copy_of`) in the same write as the `chat_branched` event
that opens the chat, rather than referenced: the branch is then an ordinary chat for every reader (the
agents' memory, the page, exports, other clients replaying it), and nothing that later happens to the
source chat (an edit, a deletion) changes it. What is copied is what the agents' memory held at that
message: edited messages in their latest version, nothing an edit or a regeneration superseded, calls
only with their results (a call still waiting on a person stays behind: it belongs to the source), and
not the approvals' bookkeeping. At most MAX_COPIED messages, the newest: more than an agent's input holds.
"""
from __future__ import annotations

from typing import Any

from ... import events, vocab
from ...errors import AppError
from ...log import Op, Open, Tag
from ...shapes import ToolCallShape
from ...vocab import Event
from ..actors import Actor
from ..approvals.ownership import Refusals
from ..store import Store
from ..turns.supersede import edits, superseded
from .chats import MAX_TITLE
from .worlds import MAX_CHATS, Worlds

BRANCH = "branch chats"
MAX_COPIED = 1000


def _conversation(memory: list[Event], agents: list[str]) -> list[Event]:
    """The messages of `memory` the agents would read: no superseded one, no server request or its answer."""
    gone = set().union(*(superseded(memory, agent) for agent in agents)) if agents else set()
    return [e for e in memory if e.get("kind") == vocab.MESSAGE and e["seq"] not in gone
            and e.get("sender") != vocab.SERVER_SENDER and not e.get("decision")
            and not e.get("elicitation_answer") and not (e.get("role") == "tool" and not e.get("name"))]


def copies(memory: list[Event], agents: list[str], chat: str) -> list[tuple[Event, list[Op]]]:
    """Copies of the conversation in `memory` for branch `chat`, each with the memory tag it goes under."""
    kept = _conversation(memory, agents)[-MAX_COPIED:]
    edited = edits(memory)
    results = {str(e.get("tool_call_id")) for e in kept if e.get("role") == "tool"}
    calls: set[str] = set()
    out: list[tuple[Event, list[Op]]] = []
    for event in kept:
        answered: list[ToolCallShape] = []
        if event.get("role") == "tool":
            if str(event.get("tool_call_id")) not in calls:
                continue  # its call was not copied (before the first copied message, or client-run)
        elif event.get("role") == "assistant":
            answered = [c for c in event.get("tool_calls") or ()
                        if c["id"] in results and not vocab.is_client_name(c["function"]["name"])]
            calls.update(c["id"] for c in answered)
            if not answered and not event.get("content"):
                continue
        content = edited.get(str(event.get("id")), event.get("content"))
        agent = event.get("agent")
        tag = vocab.shared_memory_tag(chat) if agent is None else vocab.memory_tag(chat, str(agent))
        out.append((events.branch_copy(event, chat, content, answered), [Tag(tag)]))
    return out


async def branch_chat(store: Store, worlds: Worlds, refusals: Refusals, world: str, actor: Actor, chat: str,
                      seq: object, title: object = None) -> Event:
    """A new chat starting with `chat`'s messages up to the one at `seq`; the `chat_branched` event."""
    await refusals.require(world, actor, vocab.CAN_SEND, BRANCH)
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise AppError(vocab.INVALID, "seq must be the seq of a message of the chat")
    if title is not None and (not isinstance(title, str) or not title.strip() or len(title.strip()) > MAX_TITLE):
        raise AppError(vocab.INVALID, f"a chat title is 1 to {MAX_TITLE} characters")
    chats = await worlds.chats(world)
    source = next((c for c in chats if c["id"] == chat), None)
    if source is None:
        raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}")
    found = await store.log.read(world, seq - 1, 1)
    if not found or found[0]["seq"] != seq or found[0].get("kind") != vocab.MESSAGE or found[0].get("chat") != chat:
        raise AppError(vocab.INVALID, f"event {seq} is not a message of chat {chat!r}")
    if len(chats) >= MAX_CHATS:
        raise AppError(vocab.CONFLICT, f"world {world!r} already has {MAX_CHATS} chats, the most a world "
                                       f"may have open: delete one first")
    agents = [a["name"] for a in await worlds.agents(world)]
    tags = [vocab.shared_memory_tag(chat), *(vocab.memory_tag(chat, a) for a in agents)]
    memory = [e for e in await store.log.read_tagged(world, tags) if e["seq"] <= seq]
    new: dict[str, Any] = {"id": vocab.new_id("chat")[:17],
                           "title": title.strip() if isinstance(title, str) else
                           f"{source['title']} (branch)"[:MAX_TITLE]}
    copied = copies(memory, agents, new["id"])
    branched = events.chat_branched(new, chat, seq, len(copied), actor.sender)
    stored = await store.append_batch(world, [(branched, [Open(vocab.chat_key(new["id"]))]), *copied])
    return stored[0]
