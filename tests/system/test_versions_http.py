"""Edit, regenerate, branch over HTTP and the JSON WebSocket (#31 item 5), against a real server: the
new events come live in order, a reconnect replays them the same, and the roles are the server's."""
from __future__ import annotations

import httpx2 as httpx

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, error_of, invite, make_world, wait_until
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import read_until, replay_and_snapshot, ws_connect


async def test_edit_regenerate_and_branch_are_events_live_and_in_replay(server: ServerProcess, owner: httpx.Client,
                                                                       llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double)
    llm_double.queue(Text("four"), Text("five"), Text("five, again"))
    member, spectator = invite(owner, world, "member", "max"), invite(owner, world, "spectator", "sam")
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {member['token']}"}) as max_, \
            httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {spectator['token']}"}) as sam:
        async with ws_connect(server, world, spectator["token"]) as ws:
            _, snapshot, _ = await replay_and_snapshot(ws)
            said = max_.post(f"/api/worlds/{world}/messages", json={"content": "what is 2+2?"}).json()
            [four] = wait_until(lambda: [e for e in all_events(owner, world) if e.get("content") == "four"],
                                what="the first reply")
            edit_url = f"/api/worlds/{world}/messages/{said['seq']}/edit"
            # Only the sender edits: the owner is refused too, and a spectator before its body is read.
            assert error_of(owner.post(edit_url, json={"content": "what is 2+3?"})) == "forbidden"
            assert error_of(sam.post(edit_url, content=b"not json")) == "forbidden"
            edited = max_.post(edit_url, json={"content": "what is 2+3?"})
            assert edited.status_code == 201 and edited.json()["kind"] == "message_edited", edited.text
            [five] = wait_until(lambda: [e for e in all_events(owner, world) if e.get("content") == "five"],
                                what="the reply to the new version")
            retry_url = f"/api/worlds/{world}/agents/alice/retry"
            assert error_of(sam.post(retry_url, json={"seq": five["seq"]})) == "forbidden"
            regenerated = max_.post(retry_url, json={"seq": five["seq"]})
            assert regenerated.status_code == 201, regenerated.text
            assert regenerated.json()["kind"] == "reply_regenerated" and regenerated.json()["version"] == 2
            again = wait_until(lambda: [e for e in all_events(owner, world) if e.get("content") == "five, again"],
                               what="the second version")
            assert again[0]["version_of"] == five["id"] and again[0]["version"] == 2
            branch_url = f"/api/worlds/{world}/chats/{said['chat']}/branch"
            assert error_of(sam.post(branch_url, json={"seq": four["seq"]})) == "forbidden"
            assert error_of(max_.post(branch_url, json={"seq": 10_000})) == "invalid"
            branched = max_.post(branch_url, json={"seq": again[0]["seq"], "title": "Another way"})
            assert branched.status_code == 201, branched.text
            chat = branched.json()["chat"]
            assert chat["title"] == "Another way" and branched.json()["copied"] == 2
            assert chat in max_.get(f"/api/worlds/{world}/chats").json()
            last = all_events(owner, world)[-1]["seq"]
            frames = await read_until(ws, lambda f: f["type"] == "event" and f["event"]["seq"] == last)
        live = [f["event"] for f in frames if f["type"] == "event"]
    logged = [e for e in all_events(owner, world) if e["seq"] > snapshot["last_seq"]]
    assert live == logged  # every event live, once, in seq order
    kinds = [e["kind"] for e in logged]
    assert kinds.index("message_edited") < kinds.index("reply_regenerated") < kinds.index("chat_branched")
    copies = [e for e in logged if e.get("chat") == chat["id"] and e["kind"] == "message"]
    assert [(e["content"], e["copy_of"]) for e in copies] == [("what is 2+3?", said["seq"]),
                                                               ("five, again", again[0]["seq"])]
    assert not any("person" in e for e in logged)  # who really sent them stays on the server
    async with ws_connect(server, world, server.token, after=snapshot["last_seq"]) as ws:
        replayed, _, _ = await replay_and_snapshot(ws)
    assert replayed == logged
