"""Network requests of the `ask` mode (server/engine/approvals/network.py) through what a crash or a slow
reader leaves: a request nobody waits for any more leaves the queue, and a connection cut off from the
bus still hears its decision."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from server import vocab
from server.engine.approvals.decisions import request_of
from server.engine.approvals.network import MAX_ASKED, NetworkRequests
from server.engine.calls.refs import CallRef, append_result, error_content
from server.engine.store import channel
from server.engine.turns.runner import INTERRUPTED
from server.errors import AppError
from server.log import Open
from server.tools.base import Passage, ToolContext
from server.tools.egress.hosts import NETWORK_TOOL
from tests.fixtures.engine import Harness
from tests.fixtures.eventually import eventually_async


async def running_call(harness: Harness, call_id: str) -> CallRef:
    """alice's `shell_exec` call, open (asked by the LLM, not answered): as it is while its command runs."""
    if not harness.world:
        await harness.make_world("alice")
    message = {"kind": "message", "id": vocab.new_id("msg"), "chat": "main", "agent": "alice", "sender": "alice",
               "role": "assistant", "content": None,
               "tool_calls": [{"id": call_id, "type": "function",
                               "function": {"name": "shell_exec", "arguments": '{"command": "pip install x"}'}}]}
    await harness.engine.store.append(harness.world, message, [Open(vocab.call_key(call_id))])
    return CallRef(harness.world, "alice", "main", call_id, "shell_exec", '{"command": "pip install x"}')


async def left_asking(harness: Harness, call: CallRef, host: str, n: int = 1) -> vocab.Event:
    """A network request of `call` as a process that died while its connection waited leaves it: open,
    and nobody here waiting for it."""
    args = {"host": host}
    item = await harness.engine.approvals.request_item(
        CallRef(call.world, call.agent, call.chat, call.id, NETWORK_TOOL.name, json.dumps(args)), NETWORK_TOOL,
        args, f"alice's `shell_exec` (in chat main) wants to reach {host}",
        network={"host": host.rpartition(":")[0], "port": 443, "tool": "shell_exec"},
        approval_id=f"{vocab.approval_id_for(call.id)}.net{n}")
    return await harness.engine.store.append(harness.world, *item)


async def test_a_request_left_by_a_dead_process_closes_when_its_call_is_reported_interrupted(
        harness: Harness) -> None:
    call = await running_call(harness, "call_dead")
    other = await running_call(harness, "call_dead_2")  # a namesake's (its id starts the same): untouched
    await left_asking(harness, other, "pypi.org:443")
    first, second = [await left_asking(harness, call, host, n) for n, host in
                     enumerate(("pypi.org:443", "evil.example:443"), 1)]
    assert len(await harness.engine.approvals.pending(call.world)) == 3
    # The process that recovers the call reports it interrupted (as runner._interrupted does).
    await append_result(harness.engine.store, call, error_content(INTERRUPTED))
    closed = await harness.wait_for(lambda e: e.get("role") == "tool" and bool(e.get("decision")), count=2)
    assert {e["tool_call_id"] for e in closed} == {first["tool_calls"][0]["id"], second["tool_calls"][0]["id"]}
    for event in closed:
        assert event["decision"]["decision"] == vocab.DENY, event
        assert event["decision"]["reason"] == "the command ended before anyone decided", event
    [left] = await harness.engine.approvals.pending(call.world)
    assert request_of(left)["toolCallId"] == "call_dead_2"


async def test_an_orphaned_request_is_denied_by_a_person_and_cannot_be_approved(harness: Harness) -> None:
    call = await running_call(harness, "call_gone")
    request = await left_asking(harness, call, "pypi.org:443")
    approval_id = request["tool_calls"][0]["id"]
    # Its call's result written with nobody here to close it (a process from before the cleanup, say).
    observers = list(harness.engine.store.observers)
    harness.engine.store.observers.clear()
    try:
        await append_result(harness.engine.store, call, error_content(INTERRUPTED))
    finally:
        harness.engine.store.observers.extend(observers)
    with pytest.raises(AppError) as refused:
        await harness.decide(approval_id, "approve")
    assert refused.value.code == vocab.ALREADY_DECIDED
    denied = await harness.decide(approval_id, "deny", reason="stale")
    assert denied["decision"]["decision"] == vocab.DENY and denied["tool_call_id"] == approval_id
    assert await harness.engine.approvals.pending(call.world) == []


async def test_a_connection_cut_off_from_the_bus_listens_again_and_hears_its_decision(harness: Harness) -> None:
    call = await running_call(harness, "call_slow")
    network = harness.engine.executor.network
    assert isinstance(network, NetworkRequests)
    request = await left_asking(harness, call, "pypi.org:443")
    bus, where = harness.engine.store.bus, channel(call.world)
    async with bus.subscribe(where, maxsize=1) as sub:
        bus.deliver_here(where, json.dumps({"type": "noise"}))
        bus.deliver_here(where, json.dumps({"type": "noise"}))  # one more than it holds: cut off
        listening = bus.subscriber_count(where)
        waiter = asyncio.ensure_future(network._decision(sub, call.world, request))
        # It subscribes afresh (before reading the log) rather than failing the connection.
        await eventually_async(lambda: _settled(waiter, bus.subscriber_count(where) > listening), timeout=10,
                               what="the waiter listening again")
        assert not waiter.done(), waiter
        await harness.decide(request["tool_calls"][0]["id"], "approve")
        decided = await asyncio.wait_for(waiter, 10)
    assert decided["decision"]["decision"] == vocab.APPROVE
    assert bus.subscriber_count(where) == listening - 1  # its own fresh subscription is gone with it


async def _settled(waiter: asyncio.Future[vocab.Event], listening_again: bool) -> bool:
    return waiter.done() or listening_again



async def test_a_calls_connections_to_one_host_share_a_request_and_only_so_many_requests_wait(
        harness: Harness, tmp_path: Path) -> None:
    call = await running_call(harness, "call_many")
    network = harness.engine.executor.network
    assert isinstance(network, NetworkRequests)
    ctx = ToolContext(call.world, "alice", "main", tmp_path, call.id)
    hosts = ["a.example", "a.example", "b.example", "c.example", "d.example"]
    waiting = [asyncio.ensure_future(network.ask(ctx, "shell_exec", host, 443)) for host in hosts]
    pending = await eventually_async(lambda: harness.engine.approvals.pending(call.world), what="the requests",
                                     accept=lambda found: len(found) == MAX_ASKED)
    # One more host: answered at once, not queued.
    over = await network.ask(ctx, "shell_exec", "e.example", 443)
    assert (over.status, over.refusal) == (429, f"this call has {MAX_ASKED} connections waiting for a person already")
    [for_a] = [p for p in pending if request_of(p)["toolArguments"] == {"host": "a.example:443"}]
    approval_id = for_a["tool_calls"][0]["id"]
    await harness.decide(approval_id, "approve")
    first, second = await asyncio.gather(*waiting[:2])
    assert first == second == Passage(by={"approval_id": approval_id})
    waiting[2].cancel()  # b's only connection goes: so does its request
    await asyncio.gather(waiting[2], return_exceptions=True)
    left = await eventually_async(lambda: harness.engine.approvals.pending(call.world), what="b's request closed",
                                  accept=lambda found: len(found) == 2)
    assert {request_of(p)["toolArguments"]["host"] for p in left} == {"c.example:443", "d.example:443"}
    for task in waiting[3:]:
        task.cancel()
    await asyncio.gather(*waiting[3:], return_exceptions=True)
