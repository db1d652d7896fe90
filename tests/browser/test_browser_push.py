"""Web Push in Chromium (issue #32 item 1): "Notify me on this device" registers the service worker at /sw.js
with the whole site in its scope and asks the browser's real PushManager to subscribe with the server's
VAPID key. Chromium here reaches no push service, so its subscribe fails: the page says so, and the test
pins the flow up to that call (the server's side of a subscription is tested in tests/engine/test_push.py)."""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.fixtures.browser import WorldSetup


def test_notify_me_registers_the_service_worker_and_asks_the_push_manager(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    page = setup.open_page("owner", permissions=["notifications"])
    page.click("#push summary")
    page.click("#push-subscribe")
    status = page.locator("#push-status")
    # The words of PushManager.subscribe's own refusal: the page got as far as the browser's push service.
    expect(status).to_have_text(re.compile(r"^Could not subscribe: Registration failed"), timeout=15_000)
    scope = page.evaluate("navigator.serviceWorker.getRegistration('/').then(r => r && r.scope)")
    assert scope == f"{setup.server.url}/"
    worker = page.evaluate("navigator.serviceWorker.ready.then(r => r.active && r.active.scriptURL)")
    assert worker == f"{setup.server.url}/sw.js"
    assert setup.api("GET", "/api/push/subscriptions")["subscriptions"] == []  # nothing half-made was kept
