"""An agent's memory of its chats, read incrementally from the log, and what the runner asks of it."""
from __future__ import annotations

from typing import NamedTuple

from .. import vocab
from ..vocab import Event
from .prepare import Entry
from .routing import addressees
from .store import Store
from .worlds import Worlds


class TurnPeople(NamedTuple):
    asker: str | None  # the sender of the first person's message since this agent last finished a turn there
    retriers: list[str]  # who retried a failed or stopped reply of the turn (asker aside), by name
    people: list[str]  # who those really are (their `person`, not their names): what votes are checked against


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

    def turn_people(self, chat: str) -> TurnPeople:
        """Who the current turn in `chat` belongs to: whom a request needing several approvals does not count."""
        # A stopped reply that a later `turn_retried` retries does not end the turn: the retry goes on
        # with it, so its asker is still the one who started it (else she could approve her own request).
        # Walked back from the newest event to the turn's start: a retry comes after what it retries.
        events, _ = self._memory.get(chat, ([], 0))
        retried: set[object] = set()
        asker: str | None = None
        retriers: list[str] = []
        people: set[str] = set()  # the retriers' `person`
        asker_person: set[str] = set()
        for event in reversed(events):
            if (event.get("role") == "assistant" and event.get("sender") == self.agent
                    and not event.get("tool_calls") and event.get("seq") not in retried):
                break
            if event.get("kind") == vocab.TURN_RETRIED:
                retried.add(event.get("retry_of"))
                if vocab.member_of(event.get("sender")):
                    retriers.append(event["sender"])
                    people.add(str(vocab.person_of(event)))
            if event.get("role") == "user" and vocab.member_of(event.get("sender")):
                asker, asker_person = event["sender"], {str(vocab.person_of(event))}
        return TurnPeople(asker, sorted({r for r in retriers if r != asker}), sorted(people | asker_person))

    def llm_calls_since_human(self, memory: list[Event]) -> int:
        count = 0
        for event in reversed(memory):
            sender = event.get("sender") or ""
            if vocab.member_of(sender):
                break
            if event.get("role") == "assistant" and sender == self.agent:
                count += 1
        return count
