"""Who may still decide a request (issue #32 item 6): the world's owner and member invites, less who
asked (where several must approve) and who approved so far; presence is not needed."""
from __future__ import annotations

import json
from typing import Any

from server import vocab
from server.engine.actors import Actor
from tests.fixtures.engine import OWNER, Harness, run_on_request


async def _people(harness: Harness) -> tuple[Actor, Actor]:
    """Invites for maria and joe (members) and a spectator; returns maria and joe as they come in."""
    ids = {}
    for name, role in (("maria", vocab.MEMBER), ("joe", vocab.MEMBER), ("sam", vocab.SPECTATOR)):
        ids[name] = (await harness.engine.create_invite(harness.world, OWNER, role, name))["id"]
    return (Actor("maria", vocab.MEMBER, person=vocab.invitee_person(ids["maria"])),
            Actor("joe", vocab.MEMBER, person=vocab.invitee_person(ids["joe"])))


async def _ask(harness: Harness, asker: Actor) -> dict[str, Any]:
    await harness.say("run echo a >> ran.txt", asker)
    [pending] = await harness.wait_pending(1)
    return pending


async def test_anyone_of_the_owner_and_members_may_decide_a_request_that_needs_one(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    maria, _ = await _people(harness)
    pending = await _ask(harness, maria)
    assert pending["request"]["mayDecide"] == ["owner", "joe", "maria"]  # the spectator never decides
    assert (pending["needs"], pending["may_decide"]) == (1, ["owner", "joe", "maria"])


async def test_a_two_person_request_needs_two_of_those_who_did_not_ask_and_then_one_more(harness: Harness) -> None:
    await harness.make_world("alice")
    harness.double.respond_with(run_on_request)
    maria, joe = await _people(harness)
    await harness.engine.approvals.add_rule(harness.world, OWNER, "shell_exec", {}, "ask", approvals_required=2)
    pending = await _ask(harness, maria)
    assert (pending["needs"], pending["may_decide"]) == (2, ["owner", "joe"])
    vote = await harness.engine.submit_tool_result(harness.world, joe, {
        "role": "tool", "tool_call_id": pending["id"], "content": json.dumps({"decision": "approve"})})
    assert vote["decision"]["may_decide"] == ["owner"]
    [still] = await harness.engine.pending_approvals(harness.world)
    assert (still["needs"], still["may_decide"], still["approved_by"]) == (1, ["owner"], ["human:joe"])
    # A member invited since may decide it too: the list follows the world's people as they are.
    await harness.engine.create_invite(harness.world, OWNER, vocab.MEMBER, "kim")
    [still] = await harness.engine.pending_approvals(harness.world)
    assert still["may_decide"] == ["owner", "kim"]
