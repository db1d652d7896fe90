"""A chat's Markdown export (issue #31 item 8) is bounded by bytes, and says so where it was cut."""
from __future__ import annotations

from server.engine.world.find import chat_markdown
from tests.fixtures.engine import Harness


async def test_an_export_past_its_bytes_is_cut_with_a_note_saying_where_the_rest_is(harness: Harness) -> None:
    world = await harness.make_world()  # no agent: nothing answers
    said = [await harness.say(f"message {i}: " + "x" * 1000) for i in range(5)]
    whole, _ = await chat_markdown(harness.engine.store, harness.engine.worlds, world, "main")
    assert all(f"message {i}:" in whole for i in range(5)) and "cut" not in whole
    cut, _ = await chat_markdown(harness.engine.store, harness.engine.worlds, world, "main", max_bytes=2500)
    assert len(cut.encode()) < 2500 + 300  # the note, past the bound
    assert "message 0:" in cut and "message 4:" not in cut
    first_left_out = next(e["seq"] for e in said if f"message {e['content'][8]}:" not in cut)
    assert cut.rstrip().endswith(f"`GET /api/worlds/{world}/events?after={first_left_out - 1}`.*")
