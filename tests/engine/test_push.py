"""Web Push (issue #32 item 1): a request tells its deciders' devices, through a push-service double that
checks the VAPID signature and decrypts each payload with keys the test made."""
from __future__ import annotations

import asyncio
import json
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from server import vocab
from server.api.live.presence import SharedPresence
from server.push.keys import KEY_FILE, open_key
from server.push.sender import Push
from server.push.subscriptions import SqliteSubscriptions, subscription_id
from tests.fixtures.engine import OWNER, Harness, run_on_request
from tests.fixtures.eventually import eventually_async
from tests.fixtures.push_service import Device, PushService, push_service

SECRET = "sk-live-51HxQvT2eZvKYlo2C9vS8aQ7mP3nR6tB"  # what value redaction hides, in the request's arguments


@dataclass
class Rig:
    harness: Harness
    push: Push
    presence: SharedPresence
    service: PushService
    member: str = ""  # the member's person

    async def subscribe(self, person: str) -> Device:
        device = self.service.device()
        record = {**device.subscription(), "id": subscription_id(device.endpoint), "label": "", "created": "t"}
        record.pop("expirationTime")
        await self.push.subscriptions.put(person, record)
        return device

    async def request(self) -> None:
        await self.harness.say(f"run echo {SECRET}")
        await self.harness.wait_pending(1)
        await self.push.settled()


@pytest.fixture
def service() -> Iterator[PushService]:
    with push_service() as running:
        yield running


@pytest.fixture
async def rig(harness: Harness, service: PushService, tmp_path: Path) -> AsyncIterator[Rig]:
    engine = harness.engine
    harness.double.respond_with(run_on_request)
    await harness.make_world("alice")
    invite = await engine.invites.create(harness.world, OWNER, vocab.MEMBER, "max")
    key = await open_key(data_dir=tmp_path, redis_url=None, redis_prefix="")
    service.server_key = key.public
    presence = SharedPresence(engine.store, engine.instance, shared=False)
    subscriptions = await SqliteSubscriptions.open(tmp_path)
    # The double listens on loopback: allowed here as a webhook's `allow_private` allows its receiver.
    push = Push(engine, presence, subscriptions, key, "mailto:ops@example.org", allow_http=True, allow_private=True)
    push.start()
    try:
        yield Rig(harness, push, presence, service, vocab.invitee_person(invite["id"]))
    finally:
        await push.stop()
        await subscriptions.close()


async def test_request_is_pushed_to_each_decider_naming_world_agent_and_tool(rig: Rig) -> None:
    owner, member = await rig.subscribe(vocab.OWNER_PERSON), await rig.subscribe(rig.member)
    await rig.request()
    world = await rig.harness.engine.worlds.get(rig.harness.world)
    for device in (owner, member):
        [payload] = rig.service.payloads(device)  # the pushes under way ended: each device got its one
        assert (payload["world"], payload["agent"], payload["tool"]) == (world["name"], "alice", "shell_exec")
        assert payload["url"].startswith(f"/w/{rig.harness.world}?chat=") and payload["url"].endswith("#queue")
        assert "echo" not in json.dumps(payload) and SECRET not in json.dumps(payload)
    assert rig.service.refused == []


async def test_nobody_with_a_page_open_on_the_world_is_pushed(rig: Rig) -> None:
    owner, member = await rig.subscribe(vocab.OWNER_PERSON), await rig.subscribe(rig.member)
    await rig.presence.join(rig.harness.world, {"name": "owner", "role": vocab.OWNER})
    await rig.request()
    assert len(rig.service.payloads(member)) == 1
    assert rig.service.payloads(owner) == []


async def test_a_subscription_the_push_service_says_is_gone_is_dropped(rig: Rig) -> None:
    kept, gone, missing = [await rig.subscribe(vocab.OWNER_PERSON) for _ in range(3)]
    gone.status, missing.status = 410, 404
    await rig.request()
    left = [r["endpoint"] for r in await rig.push.subscriptions.list(vocab.OWNER_PERSON)]
    assert left == [kept.endpoint]


async def test_a_push_the_service_cannot_take_now_is_tried_again(rig: Rig) -> None:
    # One try was all a push got: a push service down for a moment (503), or busy (429), and the person
    # was never told of the request.
    device = await rig.subscribe(vocab.OWNER_PERSON)
    device.answers = [(503, ""), (429, "0")]
    rig.push.first_wait = 0.01
    await rig.request()
    assert len(rig.service.payloads(device)) == 1
    assert rig.service.posted.count(device.endpoint.removeprefix(rig.service.origin)) == 3


async def test_a_device_tried_again_holds_up_no_other(rig: Rig) -> None:
    down = await rig.subscribe(rig.member)  # (the member's devices are pushed first)
    down.status = 503  # for good: it is tried again for minutes
    ready = await rig.subscribe(vocab.OWNER_PERSON)
    rig.push.first_wait = 60.0
    rig.push.posting = asyncio.Semaphore(1)  # one try posted at a time: the other waits only for that try
    await rig.harness.say("run echo hi")
    await rig.harness.wait_pending(1)
    await eventually_async(lambda: rig.service.payloads(ready), timeout=10, what="the other device's push",
                           accept=bool)
    assert rig.service.payloads(down) == []


async def test_one_device_that_cannot_be_pushed_stops_no_other(rig: Rig) -> None:
    # A push that raised (here a subscription stored without its keys) failed the whole send, and the
    # other devices' pushes went on untracked: `settled` and `stop` no longer saw them.
    broken = {**rig.service.device().subscription(), "id": "push_broken", "label": "", "created": "t"}
    del broken["keys"], broken["expirationTime"]
    await rig.push.subscriptions.put(vocab.OWNER_PERSON, broken)
    ready = await rig.subscribe(rig.member)
    assert await rig.push.send(rig.harness.world, [vocab.OWNER_PERSON, rig.member], {"title": "t"}) == 1
    assert [p["title"] for p in rig.service.payloads(ready)] == ["t"]


async def test_notify_tells_the_people_named_and_no_one_else(rig: Rig) -> None:
    owner, member = await rig.subscribe(vocab.OWNER_PERSON), await rig.subscribe(rig.member)
    rig.push.notify(rig.harness.world, [rig.member], {"title": "Escalated", "body": "b", "url": "/inbox"})
    await rig.push.settled()
    assert [p["title"] for p in rig.service.payloads(member)] == ["Escalated"]
    assert rig.service.payloads(owner) == []


async def test_an_escalation_is_pushed_to_the_people_it_names_even_with_a_page_open(rig: Rig) -> None:
    engine, world = rig.harness.engine, rig.harness.world
    other = await engine.invites.create(world, OWNER, vocab.MEMBER, "joe")
    watcher = await engine.invites.create(world, OWNER, vocab.SPECTATOR, "max")  # a spectator is never told
    owner, member = await rig.subscribe(vocab.OWNER_PERSON), await rig.subscribe(rig.member)
    joe, spectator = (await rig.subscribe(vocab.invitee_person(other["id"])),
                      await rig.subscribe(vocab.invitee_person(watcher["id"])))
    await engine.update_world(world, OWNER, settings={"escalate_after": 0.01, "escalate_to": ["max"]})
    await rig.presence.join(world, {"name": "max", "role": vocab.MEMBER})  # max's page is open
    await rig.request()
    escalated = await eventually_async(lambda: rig.service.payloads(member), timeout=10,
                                       what="max's escalation push", accept=bool)
    [payload] = escalated  # the request itself was not pushed to max: the page was open
    name = (await engine.worlds.get(world))["name"]
    assert payload["type"] == "escalation" and (payload["world"], payload["tool"]) == (name, "shell_exec")
    assert payload["body"] == "alice's request to run shell_exec has waited 0.01 minutes: escalated to you"
    assert payload["url"].startswith(f"/w/{world}?chat=") and payload["url"].endswith("#queue")
    assert "echo" not in json.dumps(payload) and SECRET not in json.dumps(payload)
    await rig.push.settled()
    for device in (owner, joe):  # told of the request, not of the escalation
        assert [p["type"] for p in rig.service.payloads(device)] == ["approval"]
    assert rig.service.payloads(spectator) == []


async def test_an_endpoint_on_a_private_address_is_never_pushed(rig: Rig) -> None:
    device = await rig.subscribe(vocab.OWNER_PERSON)
    guarded = Push(rig.harness.engine, rig.presence, rig.push.subscriptions, rig.push.key, "mailto:ops@example.org",
                   allow_http=True)
    guarded.start()
    try:
        assert await guarded.send(rig.harness.world, [vocab.OWNER_PERSON], {"title": "t"}) == 0
    finally:
        await guarded.stop()
    assert rig.service.payloads(device) == [] and rig.service.refused == []


async def test_a_push_service_redirect_is_never_followed(rig: Rig) -> None:
    # The checks see only the endpoint's own address: a followed `Location` could be any other (issue #32 H3).
    elsewhere = await rig.subscribe(rig.member)
    device = await rig.subscribe(vocab.OWNER_PERSON)
    device.status, device.location = 307, elsewhere.endpoint
    assert await rig.push.send(rig.harness.world, [vocab.OWNER_PERSON], {"title": "t"}) == 0
    assert rig.service.posted == [device.endpoint.removeprefix(rig.service.origin)]  # one post, not two
    assert rig.service.payloads(elsewhere) == []
    # a failed push, not a gone subscription: it is kept
    assert [r["endpoint"] for r in await rig.push.subscriptions.list(vocab.OWNER_PERSON)] == [device.endpoint]


async def test_vapid_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    first = await open_key(data_dir=tmp_path, redis_url=None, redis_prefix="")
    again = await open_key(data_dir=tmp_path, redis_url=None, redis_prefix="")
    assert first.public == again.public
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


async def test_vapid_key_is_shared_through_redis(redis_url: str) -> None:
    prefix = f"test-push-{uuid.uuid4().hex}"
    first = await open_key(data_dir=Path("/nonexistent"), redis_url=redis_url, redis_prefix=prefix)
    again = await open_key(data_dir=Path("/nonexistent"), redis_url=redis_url, redis_prefix=prefix)
    assert first.public == again.public and len(first.public) == 87
