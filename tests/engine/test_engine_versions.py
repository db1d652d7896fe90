"""Edit, regenerate, branch (#31 item 5): a person's edit supersedes their message for the agents and their
replies are made again; any reply can be regenerated, every version kept; any message can start a branch.
All of it is events in the log, which the agents' memory reads."""
from __future__ import annotations

from typing import Any

import pytest

from server import vocab
from server.errors import AppError
from server.testing.openai_double import Text
from tests.fixtures.engine import MEMBER, OWNER, SPECTATOR, Harness, tool_calls


def _input(harness: Harness, n: int) -> list[dict[str, Any]]:
    """The messages (role and content) of the n-th LLM request (1-based)."""
    return [{"role": m["role"], "content": m.get("content")} for m in harness.double.requests[n - 1].body["messages"]]


async def test_an_edit_supersedes_the_message_and_the_replies_are_made_again(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Text("four"), Text("five"))
    said = await harness.say("what is 2+2?")
    [four] = await harness.wait_for(lambda e: e.get("content") == "four")
    await harness.idle()
    edited = await harness.engine.edit_message(harness.world, MEMBER, said["seq"], "what is 2+3?")
    assert edited["kind"] == vocab.MESSAGE_EDITED and edited["message_id"] == said["id"]
    assert edited["edit_of"] == said["seq"] and edited["to"] == ["alice"] and edited["sender"] == "human:max"
    [five] = await harness.wait_for(lambda e: e.get("content") == "five")
    await harness.idle()
    # The agent read the new version in the old one's place, and not its reply to the old one.
    assert _input(harness, 2) == [{"role": "user", "content": "what is 2+3?"}]
    assert five["answers"] == [said["seq"], edited["seq"]]
    # Both versions are on the record: the original message is as it was.
    log = await harness.events()
    assert [e["content"] for e in log if e.get("id") == said["id"]] == ["what is 2+2?"]
    assert [e["seq"] for e in log if e.get("sender") == "alice"] == [four["seq"], five["seq"]]

    harness.double.queue(Text("six"))
    await harness.say("and 3+3?")
    await harness.wait_for(lambda e: e.get("content") == "six")
    assert _input(harness, 3)[-3:] == [{"role": "user", "content": "what is 2+3?"},
                                       {"role": "assistant", "content": "five"},
                                       {"role": "user", "content": "and 3+3?"}]


async def test_only_the_person_who_sent_a_message_may_edit_it(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Text("hi"))
    said = await harness.say("hello")
    [reply] = await harness.wait_for(lambda e: e.get("content") == "hi")
    await harness.idle()
    before = len(await harness.events())
    for actor, code in ((OWNER, vocab.FORBIDDEN), (SPECTATOR, vocab.FORBIDDEN)):
        with pytest.raises(AppError) as refused:
            await harness.engine.edit_message(harness.world, actor, said["seq"], "changed")
        assert refused.value.code == code
    with pytest.raises(AppError) as not_a_message:
        await harness.engine.edit_message(harness.world, MEMBER, reply["seq"], "changed")
    assert not_a_message.value.code == vocab.INVALID
    with pytest.raises(AppError) as empty:
        await harness.engine.edit_message(harness.world, MEMBER, said["seq"], " ")
    assert empty.value.code == vocab.INVALID
    assert len(await harness.events()) == before


async def test_any_reply_is_regenerated_and_every_version_kept(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Text("version one"), Text("version two"), Text("version three"))
    await harness.say("a haiku please")
    [one] = await harness.wait_for(lambda e: e.get("content") == "version one")
    await harness.idle()
    regenerated = await harness.engine.retry(harness.world, MEMBER, "alice", one["seq"])
    assert regenerated["kind"] == vocab.REPLY_REGENERATED and regenerated["reply_id"] == one["id"]
    assert (regenerated["version_of"], regenerated["version"], regenerated["sender"]) == (one["id"], 2, "human:max")
    [two] = await harness.wait_for(lambda e: e.get("content") == "version two")
    await harness.idle()
    assert (two["version_of"], two["version"]) == (one["id"], 2)
    assert _input(harness, 2) == _input(harness, 1)  # the same input: the first version is left out

    with pytest.raises(AppError) as superseded:  # an earlier version is not regenerated again
        await harness.engine.retry(harness.world, MEMBER, "alice", one["seq"])
    assert superseded.value.code == vocab.CONFLICT
    with pytest.raises(AppError) as spectator:
        await harness.engine.retry(harness.world, SPECTATOR, "alice", two["seq"])
    assert spectator.value.code == vocab.FORBIDDEN
    await harness.engine.retry(harness.world, OWNER, "alice", two["seq"])
    [three] = await harness.wait_for(lambda e: e.get("content") == "version three")
    assert (three["version_of"], three["version"]) == (one["id"], 3)
    assert _input(harness, 3) == _input(harness, 1)
    log = await harness.events()
    assert [e["content"] for e in log if e.get("sender") == "alice"] == ["version one", "version two", "version three"]
    audit = await harness.engine.audit(harness.world)
    assert [entry["who"] for entry in audit if entry["action"] == "reply_regenerated"] == ["human:max", "human:olivia"]


async def test_a_regenerated_reply_s_pending_approval_is_denied_on_the_record(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(tool_calls(("shell_exec", {"command": "rm -rf build"})), Text("no need to delete anything"))
    await harness.say("clean up")
    [asking] = await harness.wait_for(lambda e: e.get("sender") == "alice" and e.get("tool_calls"))
    [pending] = await harness.wait_pending(1)
    await harness.engine.retry(harness.world, MEMBER, "alice", asking["seq"])
    [denied] = await harness.wait_for(lambda e: e.get("tool_call_id") == pending["id"]
                                      and bool(e.get("decision")))
    assert denied["decision"]["decision"] == vocab.DENY
    assert denied["decision"]["reason"] == "superseded: max regenerated alice's reply"
    await harness.wait_for(lambda e: e.get("content") == "no need to delete anything")
    assert await harness.engine.pending_approvals(harness.world) == []
    assert _input(harness, 2) == _input(harness, 1)
    call = pending["request"]["toolCallId"]
    assert [r.get("not_run") for r in (await harness.results()).values() if r["tool_call_id"] == call] == ["denied"]


async def test_an_edit_denies_the_approvals_pending_on_the_replies_it_supersedes(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(tool_calls(("shell_exec", {"command": "rm -rf build"})), Text("listing instead"))
    said = await harness.say("clean up")
    [pending] = await harness.wait_pending(1)
    await harness.engine.edit_message(harness.world, MEMBER, said["seq"], "just list the files")
    [denied] = await harness.wait_for(lambda e: e.get("tool_call_id") == pending["id"]
                                      and bool(e.get("decision")))
    assert denied["decision"]["reason"] == "superseded: max edited the message"
    await harness.wait_for(lambda e: e.get("content") == "listing instead")
    assert _input(harness, 2)[-1] == {"role": "user", "content": "just list the files"}
    assert not any(m["role"] == "assistant" for m in _input(harness, 2))


async def test_a_chat_branches_from_a_message_with_the_messages_up_to_it(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.queue(Text("one back"), Text("two back"), Text("three back"))
    first = await harness.say("one")
    [one_back] = await harness.wait_for(lambda e: e.get("content") == "one back")
    await harness.idle()
    await harness.engine.edit_message(harness.world, MEMBER, first["seq"], "one, edited")
    await harness.wait_for(lambda e: e.get("content") == "two back")
    await harness.idle()
    [two_back] = await harness.wait_for(lambda e: e.get("content") == "two back")
    with pytest.raises(AppError) as spectator:
        await harness.engine.branch_chat(harness.world, SPECTATOR, first["chat"], two_back["seq"])
    assert spectator.value.code == vocab.FORBIDDEN

    branched = await harness.engine.branch_chat(harness.world, MEMBER, first["chat"], two_back["seq"])
    assert branched["kind"] == vocab.CHAT_BRANCHED and branched["from_chat"] == first["chat"]
    assert branched["from_seq"] == two_back["seq"] and branched["copied"] == 2
    chat = branched["chat"]["id"]
    assert chat in [c["id"] for c in await harness.engine.list_chats(harness.world)]
    copies = [e for e in await harness.events() if e.get("chat") == chat and e["kind"] == vocab.MESSAGE]
    # What the agent's memory held there: the edited version, not the superseded reply.
    assert [(e["content"], e["copy_of"]) for e in copies] == [("one, edited", first["seq"]),
                                                               ("two back", two_back["seq"])]
    assert [e["seq"] for e in copies] == [branched["seq"] + 1, branched["seq"] + 2]
    await harness.say("three", chat=chat)
    await harness.wait_for(lambda e: e.get("content") == "three back" and e.get("chat") == chat)
    assert _input(harness, 3) == [{"role": "user", "content": "one, edited"},
                                  {"role": "assistant", "content": "two back"},
                                  {"role": "user", "content": "three"}]
    assert one_back["chat"] == first["chat"]  # the source chat is as it was
