"""Renaming and deleting a world's chats (owner only; the role check is ownership.py's, so refusals are audited)."""
from __future__ import annotations

from typing import Any

from ... import events, vocab
from ...errors import AppError
from ...log import Close, Conflict, Open
from ..actors import Actor
from ..approvals.deciding import Approvals
from ..approvals.ownership import Refusals
from ..store import Store
from .worlds import Worlds

MAX_TITLE = 200


def check_title(title: object) -> str:
    """A chat title: a non-empty string of at most MAX_TITLE characters (spaces trimmed)."""
    if not isinstance(title, str) or not title.strip() or len(title.strip()) > MAX_TITLE:
        raise AppError(vocab.INVALID, f"a chat title is 1 to {MAX_TITLE} characters")
    return title.strip()


class Chats:
    def __init__(self, store: Store, worlds: Worlds, refusals: Refusals, approvals: Approvals) -> None:
        self.store, self.worlds, self.refusals, self.approvals = store, worlds, refusals, approvals

    async def rename(self, world: str, actor: Actor, chat: str, title: object) -> dict[str, Any]:
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, "rename chats")
        opened = await self.store.log.get_open(world, vocab.chat_key(chat))
        if opened is None:
            raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}")
        renamed = {**opened["chat"], "title": check_title(title)}
        # The rename re-opens the chat's key, Close first: a chat deleted meanwhile stays deleted. It keeps
        # its creation seq, by which chats are listed (a renamed chat is not the newest).
        event = events.chat_renamed(renamed, actor.sender, int(opened.get("created_seq") or opened["seq"]))
        try:
            await self.store.append(world, event, [Close(vocab.chat_key(chat)), Open(vocab.chat_key(chat))])
        except Conflict:  # deleted meanwhile
            raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}") from None
        return renamed

    async def delete(self, world: str, actor: Actor, chat: str) -> None:
        """Close the chat: it leaves every list, and nothing more can be said in it (its history stays in the log).
        Its agents' turns end with it (a reply still in flight is dropped) and its pending approvals are denied."""
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, "delete chats")
        chats = await self.worlds.chats(world)
        if not any(c["id"] == chat for c in chats):
            raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}")
        if len(chats) == 1:  # the page and the API always show some chat
            raise AppError(vocab.INVALID, "a world keeps at least one chat: start another before deleting this one")
        try:
            await self.store.append(world, events.chat_deleted(chat, actor.sender),
                                    [Close(vocab.chat_key(chat)),
                                     *(Close(vocab.turn_key(a["name"], chat), must_exist=False)
                                       for a in await self.worlds.agents(world))])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"no chat {chat!r} in world {world!r}") from None
        await self.approvals.deny_in_chat(world, actor, chat, "chat deleted")
