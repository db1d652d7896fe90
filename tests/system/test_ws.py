"""The JSON WebSocket (docs/protocol.md §6) against a real `agent-world serve`, with the `websockets` client."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx2 as httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.api import all_events, invite, make_world, wait_until
from tests.fixtures.engine import run_on_request
from tests.fixtures.server import ServerProcess
from tests.fixtures.ws import (
    event_seqs,
    frames_until_closed,
    is_approval,
    read_until,
    recv_frame,
    replay_and_snapshot,
    small_buffer_socket,
    ws_connect,
)


def _pending(owner: httpx.Client, world: str) -> list[dict[str, Any]]:
    response = owner.get(f"/api/worlds/{world}/approvals/pending")
    assert response.status_code == 200, response.text
    pending: list[dict[str, Any]] = response.json()
    return pending


async def test_connect_replays_the_log_then_sends_a_snapshot(server: ServerProcess, owner: httpx.Client,
                                                            llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    for n in range(3):
        assert owner.post(f"/api/worlds/{world}/messages", json={"content": f"note {n}"}).status_code == 201
    logged = all_events(owner, world)
    async with ws_connect(server, world, server.token) as ws:
        events, snapshot, _ = await replay_and_snapshot(ws)
    assert events == logged
    assert snapshot["last_seq"] == logged[-1]["seq"] and snapshot["pending_approvals"] == []
    assert {"name": "owner", "role": "owner", "connections": 1} in snapshot["members"]
    async with ws_connect(server, world, server.token, after=logged[-2]["seq"]) as ws:
        events, snapshot, _ = await replay_and_snapshot(ws)
    assert events == logged[-1:] and snapshot["last_seq"] == logged[-1]["seq"]


async def test_members_and_a_spectator_see_the_same_events(server: ServerProcess, owner: httpx.Client,
                                                           llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(lambda body: Text("hello everyone, nice to meet you", chunk_size=3))
    world = make_world(owner, llm_double)
    member, spectator = invite(owner, world, "member", "max"), invite(owner, world, "spectator", "sam")
    async with ws_connect(server, world, server.token) as ow, ws_connect(server, world, member["token"]) as mw, \
            ws_connect(server, world, spectator["token"]) as sw:
        for ws in (ow, mw, sw):
            await replay_and_snapshot(ws)
        await mw.send(json.dumps({"type": "say", "content": "hi @alice", "ref": "m1"}))
        is_reply = lambda f: f["type"] == "event" and f["event"].get("sender") == "alice"  # noqa: E731
        seen = [await read_until(ws, is_reply) for ws in (ow, mw, sw)]
        presence = (await read_until(sw, lambda f: f["type"] == "presence"
                                     and len(f["members"]) == 3, timeout=5)) if not any(
            f["type"] == "presence" and len(f["members"]) == 3 for f in seen[2]) else []
    events = [[f["event"] for f in frames if f["type"] == "event"] for frames in seen]
    assert events[0] == events[1] == events[2] and events[0]
    assert [e["seq"] for e in events[0]] == list(range(events[0][0]["seq"], events[0][-1]["seq"] + 1))
    human = next(e for e in events[0] if e.get("role") == "user")
    assert human["sender"] == "human:max" and human["content"] == "hi @alice"
    acks = [f for f in seen[1] if f["type"] == "ack"]
    assert acks == [{"type": "ack", "ref": "m1", "seq": human["seq"], "id": human["id"]}]
    for frames in seen:  # the streamed text reached everyone, and it adds up to the saved reply
        chunks = "".join(f["delta"] for f in frames if f["type"] == "chunk")
        assert chunks == "hello everyone, nice to meet you" == events[0][-1]["content"]
    members = next(f for f in seen[2] + presence if f["type"] == "presence" and len(f["members"]) == 3)["members"]
    assert {(m["name"], m["role"]) for m in members} == {("owner", "owner"), ("max", "member"),
                                                          ("sam", "spectator")}


async def test_a_refresh_mid_stream_gets_every_missed_event_once(server: ServerProcess, owner: httpx.Client,
                                                                 llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    world = make_world(owner, llm_double, agents=("alice", "bob", "carol"))  # one pending call each
    async with ws_connect(server, world, server.token) as ws:
        first, _, _ = await replay_and_snapshot(ws)
        owner.post(f"/api/worlds/{world}/messages", json={"content": "@alice run echo one"})
        frames = await read_until(ws, is_approval)
        seen = [e["seq"] for e in first] + event_seqs(frames)
        # Leave while more is happening: the next request is in flight when the page "refreshes".
        owner.post(f"/api/worlds/{world}/messages", json={"content": "@bob run echo two"})
    owner.post(f"/api/worlds/{world}/messages", json={"content": "@carol run echo three"})
    wait_until(lambda: len(_pending(owner, world)) == 3, what="three pending approvals")
    async with ws_connect(server, world, server.token, after=seen[-1]) as ws:
        events, snapshot, _ = await replay_and_snapshot(ws)
    logged = all_events(owner, world)
    assert [e["seq"] for e in events] == list(range(seen[-1] + 1, logged[-1]["seq"] + 1))
    assert seen + [e["seq"] for e in events] == [e["seq"] for e in logged]
    assert events == [e for e in logged if e["seq"] > seen[-1]]
    assert snapshot["last_seq"] == logged[-1]["seq"]
    assert [p["id"] for p in snapshot["pending_approvals"]] == [p["id"] for p in _pending(owner, world)]
    assert len(snapshot["pending_approvals"]) == 3


async def test_a_spectator_cannot_say_or_decide(server: ServerProcess, owner: httpx.Client,
                                                llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    world = make_world(owner, llm_double)
    ran = server.data_dir / "workspaces" / world / "ran.txt"
    owner.post(f"/api/worlds/{world}/messages", json={"content": "run echo x >> ran.txt"})
    approval = wait_until(lambda: _pending(owner, world), what="a pending approval")[0]
    spectator = invite(owner, world, "spectator", "sam")
    before = all_events(owner, world)
    decision = {"role": "tool", "tool_call_id": approval["id"],
                "content": json.dumps({"decision": "approve", "scope": "once"})}
    async with ws_connect(server, world, spectator["token"]) as ws:
        await replay_and_snapshot(ws)
        await ws.send(json.dumps({"type": "say", "content": "let me in", "ref": 1}))
        await ws.send(json.dumps({"type": "tool_result", "message": decision, "ref": 2}))
        errors = [f for f in await read_until(ws, lambda f: f["type"] == "error" and f.get("ref") == 2)
                  if f["type"] in ("error", "ack")]
    assert [(e["type"], e["code"], e["ref"]) for e in errors] == [("error", "forbidden", 1), ("error", "forbidden", 2)]
    await asyncio.sleep(0.5)  # give a wrongly started tool the time to run
    after = all_events(owner, world)
    assert [e for e in after[len(before):] if e["kind"] == "message"] == []
    assert [p["id"] for p in _pending(owner, world)] == [approval["id"]]
    assert not ran.exists()
    member = invite(owner, world, "member", "max")  # the same decision from a member does run it
    async with ws_connect(server, world, member["token"]) as ws:
        await replay_and_snapshot(ws)
        await ws.send(json.dumps({"type": "tool_result", "message": decision, "ref": "ok"}))
        acks = await read_until(ws, lambda f: f.get("ref") == "ok")
    assert acks[-1]["type"] == "ack" and isinstance(acks[-1]["seq"], int)
    wait_until(ran.exists, what="the approved command to run")
    assert ran.read_text() == "x\n"


async def test_a_foreign_origin_and_strangers_are_refused_before_accept(server: ServerProcess, owner: httpx.Client,
                                                                        llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    other = make_world(owner, llm_double, name="Other", agents=())
    outsider = invite(owner, other, "member", "eve")

    async def status_of(token: str | None, target: str = world, **kw: Any) -> int:
        try:
            async with ws_connect(server, target, token, **kw):
                return 101
        except InvalidStatus as exc:
            body = json.loads(exc.response.body)
            assert set(body["error"]) == {"code", "message"}
            return exc.response.status_code

    assert await status_of(server.token, headers={"Origin": "http://evil.example"}) == 403
    assert await status_of(server.token, headers={"Origin": f"http://localhost:{server.port + 1}"}) == 403
    assert await status_of(server.token, headers={"Origin": "null"}) == 403
    assert await status_of(server.token, headers={"Origin": server.url}) == 101
    assert await status_of(server.token) == 101  # no Origin: not a browser
    assert await status_of(None) == 401
    assert await status_of("not-a-token") == 401
    assert await status_of(outsider["token"]) == 403
    assert await status_of(server.token, target="no-such-world") == 404
    assert await status_of(server.token, after="abc") == 400
    assert await status_of(server.token, after="-1") == 400


async def test_malformed_frames_get_errors_and_the_connection_stays_usable(
        server: ServerProcess, owner: httpx.Client, llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    bad: list[str | bytes] = [
        "not json", "[1, 2]", '"text"', "null", '{"type": "nope", "ref": 1}', '{"type": "say", "content": 5, "ref": 2}',
        '{"type": "say", "ref": 3}', '{"type": "say", "content": "x", "chat": 7, "ref": 4}',
        '{"type": "tool_result", "message": "x", "ref": 5}', '{"type": "resync", "after": -1, "ref": 6}',
        '{"type": "resync", "after": true, "ref": 7}', '{"type": "say", "content": "x", "ref": {}}',
        json.dumps({"type": "say", "content": "x" * 70_000, "ref": 8}), b"\x00\x01binary",
        '{"type": "say", "content": "   ", "ref": 9}', '{"type": "say", "content": "x", "chat": "nope", "ref": 10}',
        '{"type": "tool_result", "message": {"role": "tool", "tool_call_id": "call_x", "content": "1"}, "ref": 11}',
    ]
    async with ws_connect(server, world, server.token) as ws:
        await replay_and_snapshot(ws)
        for frame in bad:
            await ws.send(frame)
        errors: list[dict[str, Any]] = []
        while len(errors) < len(bad):  # presence and the audited refusal's event come in between
            got = await recv_frame(ws)
            if got["type"] not in ("presence", "event"):
                errors.append(got)
        await ws.send(json.dumps({"type": "say", "content": "still here", "ref": "last"}))
        tail = await read_until(ws, lambda f: f["type"] == "event" and f["event"].get("content") == "still here")
        if not any(f["type"] == "ack" for f in tail):  # the ack may come just after the event
            tail += await read_until(ws, lambda f: f["type"] == "ack")
    assert [e["type"] for e in errors] == ["error"] * len(bad)
    # too big: not parsed
    assert [e.get("ref") for e in errors] == [None] * 4 + list(range(1, 8)) + [None, None, None, 9, 10, 11]
    assert [e["code"] for e in errors] == ["invalid"] * 15 + ["not_found", "unknown_tool_call"]
    assert all(isinstance(e["message"], str) and e["message"] for e in errors)
    ack = next(f for f in tail if f["type"] == "ack")
    said = [f["event"]["content"] for f in tail if f["type"] == "event"][-1]
    assert ack["ref"] == "last" and said == "still here" == all_events(owner, world)[-1]["content"]


async def test_resync_sends_missed_events_then_a_snapshot(server: ServerProcess, owner: httpx.Client,
                                                          llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    async with ws_connect(server, world, server.token) as ws:
        events, snapshot, _ = await replay_and_snapshot(ws)
        await ws.send(json.dumps({"type": "resync", "after": 1, "ref": "r"}))
        frames = await read_until(ws, lambda f: f["type"] == "ack")
        await ws.send(json.dumps({"type": "resync"}))
        again = await read_until(ws, lambda f: f["type"] == "snapshot")
    assert event_seqs(frames) == [e["seq"] for e in events[1:]]
    assert [f["type"] for f in frames if f["type"] not in ("event", "presence")] == ["snapshot", "ack"]
    assert frames[-1] == {"type": "ack", "ref": "r", "last_seq": snapshot["last_seq"]}
    assert event_seqs(again) == [] and again[-1]["last_seq"] == snapshot["last_seq"]


async def test_a_flood_is_closed_with_1008(server: ServerProcess, owner: httpx.Client,
                                           llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    async with ws_connect(server, world, server.token) as ws:
        await replay_and_snapshot(ws)
        with contextlib.suppress(ConnectionClosed):  # the close may come before the last sends
            for n in range(400):
                await ws.send(json.dumps({"type": "resync", "after": 10**9, "ref": n}))
        acks = [f for f in await frames_until_closed(ws) if f["type"] == "ack"]
    assert 50 <= len(acks) < 100  # the burst was served, then the connection was cut
    assert ws.close_code == 1008 and "too many frames" in (ws.close_reason or "")
    async with ws_connect(server, world, server.token) as ws:  # the server itself is fine
        await replay_and_snapshot(ws)


async def test_fifty_malformed_frames_in_a_row_are_closed_with_1008(server: ServerProcess, owner: httpx.Client,
                                                                   llm_double: OpenAIDouble) -> None:
    world = make_world(owner, llm_double, agents=())
    async with ws_connect(server, world, server.token) as ws:
        await replay_and_snapshot(ws)
        for _ in range(49):
            await ws.send("{")
        await ws.send(json.dumps({"type": "resync", "ref": "good"}))  # resets the count
        await asyncio.sleep(2.6)  # stay within the frame rate: this is about malformed frames, not a flood
        for _ in range(50):
            await ws.send("{")
        frames = await frames_until_closed(ws)
    assert [f["type"] for f in frames].count("error") == 49 + 49
    assert any(f.get("ref") == "good" for f in frames)
    assert ws.close_code == 1008 and "malformed" in (ws.close_reason or "")


async def test_a_stalled_reader_is_closed_1013_without_slowing_anyone(server: ServerProcess, owner: httpx.Client,
                                                                       llm_double: OpenAIDouble) -> None:
    # About 6 MB in 1,560 events: more than loopback's socket buffers (4 MiB) and the 1,000-frame queue hold.
    big = ["#" * 90_000] * 60
    small = [f"small {n}" for n in range(1_500)]
    world = make_world(owner, llm_double, agents=())  # no agents: every frame is a human message's event
    side = owner.post(f"/api/worlds/{world}/chats", json={"title": "pings"}).json()["id"]
    member = invite(owner, world, "member", "max")
    received: list[dict[str, Any]] = []  # everything the well-behaved client got after its snapshot

    async def ping(ws: Any, n: int) -> None:
        """A say (in the side chat) and its event frame coming back."""
        await ws.send(json.dumps({"type": "say", "content": f"ping {n}", "chat": side}))
        received.extend(await read_until(ws, lambda f: f["type"] == "event"
                                         and f["event"].get("content") == f"ping {n}"))

    def flood() -> None:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
            for content in big + small:
                posted = http.post(f"/api/worlds/{world}/messages", json={"content": content, "chat": "main"})
                assert posted.status_code == 201, posted.text

    def flood_done(frame: dict[str, Any]) -> bool:
        return bool(frame["type"] == "event" and frame["event"].get("content") == small[-1])

    async with ws_connect(server, world, member["token"], max_size=None) as good, \
            ws_connect(server, world, server.token, sock=small_buffer_socket(server.port), max_queue=1,
                       compression=None, max_size=None) as stalled:
        await replay_and_snapshot(good)
        await replay_and_snapshot(stalled)
        for n in range(5):
            await ping(good, n)
        flooding = asyncio.get_running_loop().run_in_executor(None, flood)
        for n in range(5, 25):  # the stalled client reads nothing meanwhile
            await ping(good, n)
            await asyncio.sleep(0.1)
        await flooding
        if not any(flood_done(f) for f in received):
            received.extend(await read_until(good, flood_done, timeout=60))
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers) as http:
            metrics = (await http.get("/metrics")).text
        frames: list[dict[str, Any]] = []
        with pytest.raises(ConnectionClosed):  # now the stalled client reads: what it had, then the close
            while True:
                frames.append(await recv_frame(stalled, timeout=30))
    assert stalled.close_code == 1013 and "after=" in (stalled.close_reason or "")
    flooded = [f["event"]["content"] for f in frames if f["type"] == "event" and f["event"].get("chat") == "main"
               and f["event"].get("role") == "user"]
    assert len(flooded) < len(big) + len(small)  # cut off
    assert [f["event"]["content"] for f in received if f["type"] == "event" and f["event"].get("chat") == "main"
            and f["event"].get("role") == "user"] == big + small  # the good client got everything, in order
    pings = [f["event"]["content"] for f in received if f["type"] == "event" and f["event"].get("chat") == side]
    assert pings == [f"ping {n}" for n in range(25)]  # answered during the flood, in order
    assert "agent_world_connections 2.0" in metrics


async def test_shutdown_closes_with_1012_and_a_reconnect_loses_nothing(server: ServerProcess, owner: httpx.Client,
                                                                        llm_double: OpenAIDouble) -> None:
    llm_double.respond_with(run_on_request)
    world = make_world(owner, llm_double)
    owner.post(f"/api/worlds/{world}/messages", json={"content": "run echo kept"})
    pending = wait_until(lambda: _pending(owner, world), what="a pending approval")
    async with ws_connect(server, world, server.token) as ws:
        events, _, _ = await replay_and_snapshot(ws)
        for n in range(20):  # more events the client may not have read when the server stops
            owner.post(f"/api/worlds/{world}/messages", json={"content": f"note {n}"})
        loop = asyncio.get_running_loop()
        stopping = loop.run_in_executor(None, server.stop)
        frames = await frames_until_closed(ws, timeout=20)
        await stopping  # uvicorn re-raises the SIGTERM it handled: the exit status is -15 after a clean stop
    assert ws.close_code == 1012
    seen = [e["seq"] for e in events] + event_seqs(frames)
    server.start()
    async with ws_connect(server, world, server.token, after=seen[-1]) as ws:
        missed, snapshot, _ = await replay_and_snapshot(ws)
    assert seen + [e["seq"] for e in missed] == list(range(1, snapshot["last_seq"] + 1))
    assert [p["id"] for p in snapshot["pending_approvals"]] == [p["id"] for p in pending]

