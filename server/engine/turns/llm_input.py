"""The one function that turns an agent's memory into LLM input."""
from __future__ import annotations

import functools
import json
import re
from collections.abc import MutableMapping, Sequence
from typing import Any

from ... import vocab
from ...vocab import Event
from ..world.files import upload_note
from .supersede import edits, superseded

_UNSAFE_NAME = re.compile(r"[^a-zA-Z0-9_-]")


@functools.lru_cache(maxsize=4096)  # a world has few speakers; this runs for every message of every turn
def llm_name(name: str) -> str:
    """A name OpenAI accepts in a message's `name` field."""
    return (_UNSAFE_NAME.sub("_", name) or "anonymous")[:64]


def _speaker(event: Event) -> str:
    sender = event.get("sender") or ""
    return llm_name(vocab.member_of(sender) or sender)


# How one memory event enters the LLM input, worked out once per event (events never change).
SKIP, OWN_CALLS, OWN_RESULT, OTHER = range(4)
Entry = tuple[int, "dict[str, Any] | None", tuple[str, ...]]  # (which of the above, message, call ids)


def _entry(event: Event, agent: str) -> Entry:
    if event.get("kind") == vocab.FILE_UPLOADED:  # a person's upload: a note from them, no turn of its own
        return OTHER, {"role": "user", "name": _speaker(event), "content": upload_note(event)}, ()
    if event.get("kind") != vocab.MESSAGE:
        return SKIP, None, ()
    role = event.get("role")
    own = event.get("agent") == agent
    if own and role == "assistant":
        calls = [{"id": call["id"], "type": "function",
                  "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}
                 for call in event.get("tool_calls") or () if not vocab.is_client_name(call["function"]["name"])]
        if not calls and not event.get("content"):
            return SKIP, None, ()
        message: dict[str, Any] = {"role": "assistant", "content": event.get("content")}
        if calls:
            message["tool_calls"] = calls
        return OWN_CALLS, message, tuple(c["id"] for c in calls)
    if own and role == "tool":
        call_id = str(event.get("tool_call_id"))
        content = (event.get("content") or "") + _edit_note(event.get("edited"))
        return OWN_RESULT, {"role": "tool", "tool_call_id": call_id, "content": content}, (call_id,)
    if role in ("user", "assistant") and event.get("content"):
        # A human, or another agent speaking to this one.
        return OTHER, {"role": "user", "name": _speaker(event), "content": event["content"]}, ()
    return SKIP, None, ()


def _edit_note(edited: object) -> str:
    """What the LLM must know when a person changed its call before approving: what actually ran."""
    if not isinstance(edited, dict):
        return ""
    who = vocab.member_of(edited.get("by")) or "a person"
    changed = ", ".join(str(k) for k in edited.get("changed") or ()) or "the arguments"
    ran = json.dumps(edited.get("arguments"), ensure_ascii=False)
    return f"\n\n[Note: {who} changed {changed} before approving; the call ran with {ran}]"


def prepare_input(*, agent: str, system_prompt: str, memory: Sequence[Event], max_messages: int = 200,
                  entries: MutableMapping[int, Entry] | None = None) -> list[dict[str, Any]]:
    """The agent's memory of one chat as OpenAI messages.

    - system prompt first;
    - `client.*` calls and their answers removed (the LLM never sees them);
    - metadata (ids, seq, sender, timestamps) stripped;
    - a stopped reply that was retried (`turn_retried`), a regenerated reply and the replies an edit
      supersedes removed, an edited message in its latest version (supersede.py);
    - other speakers (humans, other agents) become `user` messages with a `name`;
    - each assistant message's tool results follow it directly, as the API requires,
      even when other messages arrived while the tools ran;
    - what was said while a reply was being made (after the `input_seq` it records) follows that
      reply, so the input always ends on what is still unanswered;
    - only the last `max_messages`, starting at a user message so no tool result is orphaned.

    `entries` (by seq) keeps each event's conversion from one turn to the next; the messages
    returned may then be shared between turns, so nobody may change them.
    """
    body: list[dict[str, Any]] = []
    waiting: set[str] = set()  # tool calls whose results must come before anything else
    deferred: list[dict[str, Any]] = []
    heard: list[tuple[int, dict[str, Any]]] = []  # (seq, message) of others since this agent's last reply
    # A stopped reply that a person retried, a regenerated reply and what an edit supersedes are left out
    # (supersede.py); an edited message says its latest version, in its place.
    gone, edited = superseded(memory, agent), edits(memory)
    for event in memory:
        if gone and event["seq"] in gone:
            continue
        entry: Entry | None
        if edited and event.get("id") in edited:
            entry = _entry({**event, "content": edited[event["id"]]}, agent)  # (not kept: an edit may follow)
        else:
            entry = entries.get(event["seq"]) if entries is not None else None
            if entry is None:
                entry = _entry(event, agent)
                if entries is not None:
                    entries[event["seq"]] = entry
        which, message, call_ids = entry
        if which == OWN_RESULT:
            if call_ids[0] not in waiting:  # a `client.*` answer, or a result with no call before it
                continue
            body.append(message)  # type: ignore[arg-type]
            waiting.discard(call_ids[0])
            if not waiting:
                body.extend(deferred)
                deferred.clear()
        elif which == OWN_CALLS:
            # What was said after the input this reply was made from (while it streamed) is still
            # unanswered: it goes after the reply (and its tool results), never before it.
            late = _heard_after(heard, event.get("input_seq"))
            for _, old in late:
                _remove(old, deferred, body)
            heard.clear()
            (deferred if waiting else body).append(message)  # type: ignore[arg-type]
            waiting.update(call_ids)
            for seq, old in late:
                (deferred if waiting else body).append(old)
                heard.append((seq, old))
        elif which == OTHER:
            (deferred if waiting else body).append(message)  # type: ignore[arg-type]
            heard.append((event["seq"], message))  # type: ignore[arg-type]
    body.extend(deferred)
    return _with_system(system_prompt, _window(body, max_messages))


def _heard_after(heard: list[tuple[int, dict[str, Any]]], input_seq: object
                 ) -> list[tuple[int, dict[str, Any]]]:
    """The messages in `heard` that a reply made from the log up to `input_seq` had not read (none for a
    reply stored before replies recorded their input)."""
    if not isinstance(input_seq, int):
        return []
    return [(seq, message) for seq, message in heard if seq > input_seq]


def _remove(message: dict[str, Any], *lists: list[dict[str, Any]]) -> None:
    """Take out `message` itself (by identity: an equal one may have been said twice) from the first of
    `lists` that holds it, looking from the end, where it is."""
    for messages in lists:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i] is message:
                del messages[i]
                return


def _window(messages: list[dict[str, Any]], max_messages: int) -> list[dict[str, Any]]:
    if len(messages) <= max_messages:
        return messages
    tail = messages[-max_messages:]
    for i, message in enumerate(tail):
        if message["role"] == "user":
            return tail[i:]
    return tail[-1:] if tail[-1]["role"] == "user" else []


def _with_system(system_prompt: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + messages
