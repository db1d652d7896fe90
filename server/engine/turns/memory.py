"""An agent's memory of its chats, read incrementally from the log, and what the runner asks of it."""
from __future__ import annotations

from typing import NamedTuple

from ... import vocab
from ...vocab import Event
from ..store import Store
from ..world.worlds import Worlds
from .llm_input import Entry
from .routing import addressees
from .supersede import current


class TurnPeople(NamedTuple):
    """Whom a turn answers: recorded on its replies, carried by its approval requests, and not counted
    among those who approve a request that needs several people."""
    answers: list[int]  # the seqs of the messages it answers: said to this agent, and not answered yet
    askers: list[str]  # who said them (senders); for another agent's message, whom that agent answered
    retriers: list[str]  # who retried a failed or stopped reply of the turn (askers aside)
    people: list[str]  # who all those really are (their `person`, not their names): what votes are checked against
    version: tuple[str, int] | None = None  # a regenerated reply's first version's id, and this one's number

    @classmethod
    def nobody(cls) -> TurnPeople:
        """A turn no message asked for (or nothing recorded yet)."""
        return cls([], [], [], [])

    @property
    def asker(self) -> str | None:
        return self.askers[0] if self.askers else None

    @classmethod
    def of_reply(cls, reply: Event) -> TurnPeople:
        """What a stored reply recorded (nothing for one stored before replies did)."""
        def names(key: str) -> list[str]:
            value = reply.get(key)
            return [str(v) for v in value] if isinstance(value, list) else []
        answers = [s for s in reply.get("answers") or () if isinstance(s, int)]
        return cls(answers, names("asked_by"), names("retried_by"), names("people"))

    def record(self) -> dict[str, object]:
        """The fields a reply of the turn carries (`people` stays on the server: `public`)."""
        return {"answers": self.answers, "asked_by": self.askers, "people": self.people,
                **({"retried_by": self.retriers} if self.retriers else {}),
                **({"version_of": self.version[0], "version": self.version[1]} if self.version else {})}


def turn_people(events: list[Event], agent: str, agents: list[str]) -> TurnPeople:
    """Whom `agent`'s next LLM call in a chat answers, from its memory of that chat (in seq order).

    Not whoever spoke first since the agent last replied: a message to another agent is not a question
    to this one, and a reply answers only what it was made from (its `input_seq`), so a message said
    while it streamed is still owed an answer. A turn ends with a final reply, a failure or the turn
    limit; a stopped or failed reply that a person retried does not end it (the retry goes on with it,
    and who retried it is part of the turn). A turn longer than the memory read carries on what its
    last tool-calling reply recorded.
    """
    events = current(events, agent)  # without what an edit or a regeneration superseded
    retries_of = [e for e in events if e.get("kind") == vocab.TURN_RETRIED]
    # (a failure has no id: it is named by its seq; a `None` would stand for every event without one)
    retried_ids = {e["retry_of_id"] for e in retries_of if e.get("retry_of_id")}
    retried_seqs = {e["retry_of"] for e in retries_of if isinstance(e.get("retry_of"), int)}
    asked: list[Event] = []  # said to this agent and not answered yet
    retries: list[Event] = []
    carried = TurnPeople.nobody()  # what the turn's last tool-calling reply recorded
    version: tuple[str, int] | None = None  # a regeneration not answered yet: the next reply is that version
    for event in events:
        if event.get("id") in retried_ids or event.get("seq") in retried_seqs:
            continue
        role, sender, kind = event.get("role"), event.get("sender"), event.get("kind")
        if kind in (vocab.TURN_RETRIED, vocab.REPLY_REGENERATED):
            if vocab.member_of(sender):
                retries.append(event)
            if kind == vocab.REPLY_REGENERATED and event.get("agent") == agent:
                version = (str(event.get("version_of")), int(event.get("version") or 2))
        elif kind == vocab.MESSAGE_EDITED:
            if agent in (event.get("to") or ()):
                asked.append(event)  # a person's new version of a message: asked anew
        elif role == "assistant" and sender == agent and event.get("tool_calls"):
            carried = TurnPeople.of_reply(event)
            version = None
        elif (role == "assistant" and sender == agent) or (
                kind in (vocab.AGENT_ERROR, vocab.NOTICE) and event.get("agent") == agent):
            # A final (or stopped) reply, a failure, the turn limit: what the call was made from is done with.
            upto = event.get("input_seq")
            upto = upto if isinstance(upto, int) else event["seq"]
            asked = [e for e in asked if e["seq"] > upto]
            retries = [e for e in retries if e["seq"] > upto]
            carried = TurnPeople.nobody()
            version = None
        elif role in ("user", "assistant") and sender not in (agent, vocab.SERVER_SENDER) and event.get("content"):
            to = event.get("to")
            if not isinstance(to, list):  # stored before messages recorded whom they were for
                to = addressees(event.get("content"), agents, sender_agent=None if role == "user" else sender)
            if agent in to:
                asked.append(event)
    askers, people = list(carried.askers), list(carried.people)
    for event in asked:
        if event.get("role") == "user" or event.get("kind") == vocab.MESSAGE_EDITED:
            names, persons = [str(event.get("sender"))], [str(vocab.person_of(event))]
        else:  # another agent asked: on behalf of those it was answering
            theirs = TurnPeople.of_reply(event)
            names, persons = theirs.askers, theirs.people
        askers += [n for n in names if n not in askers]
        people += [p for p in persons if p not in people]
    retriers = [r for r in carried.retriers if r not in askers]
    for event in retries:
        if event["sender"] not in askers and event["sender"] not in retriers:
            retriers.append(event["sender"])
        if (person := str(vocab.person_of(event))) not in people:
            people.append(person)
    answers = [*carried.answers, *(e["seq"] for e in asked if e["seq"] not in carried.answers)]
    return TurnPeople(answers, askers, retriers, people, version)


class AgentMemory:
    def __init__(self, store: Store, worlds: Worlds, world: str, agent: str) -> None:
        self.store = store
        self.worlds = worlds
        self.world = world
        self.agent = agent
        self._memory: dict[str, tuple[list[Event], int]] = {}  # chat -> (events, last seq read)
        self._entries: dict[str, dict[int, Entry]] = {}  # chat -> seq -> how that event enters LLM input
        self._forgotten = 0  # how many times `forget` was called: a read begun before is read again

    def _tags(self, chat: str) -> list[str]:
        return [vocab.memory_tag(chat, self.agent), vocab.shared_memory_tag(chat)]

    def entries(self, chat: str) -> dict[int, Entry]:
        return self._entries.setdefault(chat, {})

    async def read(self, chat: str) -> list[Event]:
        """This agent's memory of `chat`, read incrementally: no whole-memory reload per turn."""
        tags = self._tags(chat)
        keep = max(1000, 2 * (await self.worlds.settings(self.world))["context_messages"])
        forgotten = self._forgotten
        if chat not in self._memory:
            events = await self.store.log.read_tagged(self.world, tags, limit=keep, newest=True)
        else:
            events, last = self._memory[chat]
            events.extend(await self.store.log.read_tagged(self.world, tags, after=last))
            if len(events) > 2 * keep:
                del events[:-keep]
                entries = self._entries.get(chat, {})
                for seq in [seq for seq in entries if seq < events[0]["seq"]]:
                    del entries[seq]
        if forgotten != self._forgotten:  # the storage lost events meanwhile: what was read may hold them
            return await self.read(chat)
        self._memory[chat] = (events, events[-1]["seq"] if events else 0)
        return events

    def forget(self) -> None:
        """The storage lost events that this memory may hold (new events take their seqs): read it all again."""
        self._memory.clear()
        self._entries.clear()
        self._forgotten += 1

    def last_read(self, chat: str) -> int:
        """The seq up to which `chat` was read: the newest its last LLM call could have answered."""
        return self._memory.get(chat, ([], 0))[1]

    async def heard_since_thinking(self, chat: str) -> bool:
        """Whether someone spoke to this agent in `chat` after the memory its LLM call was given: then its
        reply must not close the turn, or that message would never be answered."""
        last = self.last_read(chat)
        newer = await self.store.log.read_tagged(self.world, self._tags(chat), after=last, limit=50)
        if not newer:
            return False
        agents = [a["name"] for a in await self.worlds.agents(self.world)]
        return any((e.get("role") == "user" and self.agent in addressees(e.get("content"), agents, sender_agent=None))
                   or (e.get("role") == "assistant" and e.get("sender") not in (self.agent, vocab.SERVER_SENDER))
                   for e in newer)

    async def turn_people(self, chat: str, memory: list[Event]) -> TurnPeople:
        """Whom the next LLM call in `chat` answers, from `memory` (see `turn_people`)."""
        agents = [a["name"] for a in await self.worlds.agents(self.world)]
        return turn_people(memory, self.agent, agents)

    def llm_calls_since_human(self, memory: list[Event]) -> int:
        """The turn limit's count: this agent's replies made from input that held the last person's event
        (a reply that was streaming while a person spoke was made before, and does not count)."""
        inputs: list[object] = []
        for event in reversed(memory):
            sender = event.get("sender") or ""
            if vocab.member_of(sender):
                return sum(1 for seq in inputs if not isinstance(seq, int) or seq >= event["seq"])
            if event.get("role") == "assistant" and sender == self.agent:
                inputs.append(event.get("input_seq"))
        return len(inputs)
