"""Find and take away (issue #31 item 8): search a world's chats, and a chat as Markdown.

Both read through the log's indexes (a search: `EventLog.search`, a bounded window looked through by the
storage itself; an export: the chat's memory tags) and hand out only `public` events, redacted as every
event leaving the server is (off the loop for a large one). A search tests its query on the public form,
inside the scan: a hit only in a hidden value is no hit, and does not use up the `limit` either (else an
empty answer where an older public match should be would tell that a secret holds the query).
"""
from __future__ import annotations

import json

from ... import vocab
from ...errors import AppError
from ...log.search import MAX_QUERY, MAX_RESULTS
from ...vocab import Event
from ..public import public_off_loop
from ..store import Store
from .worlds import Worlds

EXPORT_EVENTS = 10_000  # the newest messages of a chat an export holds
EXPORT_BYTES = 16 * 2**20  # bytes of Markdown an export holds at most; a note closes a cut one


async def search(store: Store, worlds: Worlds, world: str, query: object, chat: object = None,
                 limit: int = 50) -> list[Event]:
    """Messages of `world` (of `chat`, when given) holding `query`, newest first, as clients may see them."""
    if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY:
        raise AppError(vocab.INVALID, f"q must be a non-empty query of at most {MAX_QUERY} characters")
    if chat is not None:
        if not isinstance(chat, str):
            raise AppError(vocab.INVALID, "chat must be a chat id")
        await worlds.require_chat(world, chat)
    return await store.log.search(world, query.strip(), chat=chat, limit=max(1, min(limit, MAX_RESULTS)),
                                  shown=public_off_loop)


async def chat_markdown(store: Store, worlds: Worlds, world: str, chat: str,
                        max_bytes: int = EXPORT_BYTES) -> tuple[str, str]:
    """The chat as a Markdown document, redacted, and a file name for it: at most `max_bytes` of it (and a
    closing note saying where the rest is)."""
    await worlds.require_chat(world, chat)
    info = await worlds.get(world)
    title = next((c.get("title") or chat for c in info["chats"] if c["id"] == chat), chat)
    agents = [a["name"] for a in info["agents"]]
    tags = [vocab.shared_memory_tag(chat), *(vocab.memory_tag(chat, a) for a in agents)]
    events = await store.log.read_tagged(world, tags, limit=EXPORT_EVENTS, newest=True)
    lines = [f"# {_line(title)}", "", f"World: {_line(info['name'])} · chat `{chat}` · {len(events)} messages", ""]
    size = sum(len(line.encode()) + 1 for line in lines)
    for event in events:
        shown = await public_off_loop(event)
        if shown.get("kind", vocab.MESSAGE) != vocab.MESSAGE or not (block := _block(shown)):
            continue
        size += len(block.encode()) + 2
        if size > max_bytes:
            lines += [f"*Export cut at {max_bytes:,} bytes, before the message with seq {event['seq']}. "
                      f"The rest: `GET /api/worlds/{world}/events?after={event['seq'] - 1}`.*", ""]
            break
        lines += [block, ""]
    slug = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in f"{info['name']}-{title}")[:80]
    return "\n".join(lines).rstrip() + "\n", f"{slug or 'chat'}.md"


def _line(text: object) -> str:
    return " ".join(str(text).split())


def _block(event: Event) -> str:
    who = str(event.get("sender") or event.get("agent") or "?").removeprefix("human:")
    when = str(event.get("ts") or "")[:19].replace("T", " ")
    role = event.get("role")
    content = event.get("content")
    text = content if isinstance(content, str) else "\n".join(
        p["text"] for p in content or () if isinstance(p, dict) and isinstance(p.get("text"), str))
    parts = []
    if role == "tool":
        name = event.get("name") or ("decision" if event.get("decision") else "tool")
        parts.append(f"**{_line(name)} result** · {when}\n\n```\n{_fence(text)}\n```")
    elif text:
        parts.append(f"**{_line(who)}** · {when}\n\n{text}")
    for call in event.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        try:
            arguments = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
        parts.append(f"**{_line(who)}** calls `{_line(function.get('name'))}` · {when}\n\n```json\n"
                     f"{_fence(str(arguments))}\n```")
    return "\n\n".join(parts)


def _fence(text: str) -> str:
    """Text inside a ``` fence: a line of backticks in it must not close the fence."""
    return text.replace("```", "`\u200b``")
