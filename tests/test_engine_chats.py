"""Renaming and deleting chats: a rename keeps the chat's place (chats are listed by creation), cannot
bring a deleted chat back, and a deleted chat's open turns end."""
from __future__ import annotations

from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from tests.fixtures.engine import OWNER, Harness


async def test_a_renamed_chat_keeps_its_place(harness: Harness) -> None:
    await harness.make_world("alice")
    first = (await harness.engine.worlds.chats(harness.world))[0]["id"]
    newest = (await harness.engine.worlds.create_chat(harness.world, OWNER, "second"))["id"]
    await harness.engine.chats.rename(harness.world, OWNER, first, "renamed")
    chats = await harness.engine.worlds.chats(harness.world)
    assert [(c["id"], c["title"]) for c in chats][-1] == (newest, "second")
    assert next(c["title"] for c in chats if c["id"] == first) == "renamed"
    assert await harness.engine.worlds.latest_chat(harness.world) == newest


async def test_a_rename_racing_a_delete_does_not_bring_the_chat_back(harness: Harness) -> None:
    await harness.make_world("alice")
    doomed = (await harness.engine.worlds.create_chat(harness.world, OWNER, "doomed"))["id"]
    store = harness.engine.store
    append = store.append

    async def deleted_meanwhile(world: str, event: Any, ops: Any = ()) -> Any:
        if event.get("kind") == vocab.CHAT_RENAMED:  # the rename read the chat; the delete lands before it writes
            store.append = append  # type: ignore[method-assign]
            await harness.engine.chats.delete(world, OWNER, doomed)
        return await append(world, event, ops)

    store.append = deleted_meanwhile  # type: ignore[method-assign]
    try:
        with pytest.raises(AppError) as refused:
            await harness.engine.chats.rename(harness.world, OWNER, doomed, "back again")
    finally:
        store.append = append  # type: ignore[method-assign]
    assert refused.value.code == vocab.NOT_FOUND
    assert doomed not in [c["id"] for c in await harness.engine.worlds.chats(harness.world)]
