"""Small things of the world page (issue #31 item 9), in Chromium: the API-key warning only where it is true,
and who an agent speaks to."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, expect

from server.testing.openai_double import OpenAIDouble, Text
from tests.fixtures.browser import WorldSetup
from tests.fixtures.server import start_server


def test_the_no_api_key_warning_names_only_agents_whose_endpoint_needs_one(
        tmp_path: Path, llm_double: OpenAIDouble, chromium: Browser) -> None:
    server = start_server(tmp_path / "data", llm=llm_double, extra_env={"OPENAI_API_KEY": ""})
    setup = WorldSetup(server, llm_double, chromium)
    try:
        setup.make_world("alice")  # on the double's endpoint: it works without a key
        page = setup.open_settings()
        expect(page.locator(".settings-view")).not_to_contain_text("No API key")
        setup.api("POST", f"/api/worlds/{setup.world}/agents", {
            "name": "bob", "system_prompt": "You are bob.", "provider": "openai", "model": "gpt-4o-mini",
            "base_url": "https://api.openai.com/v1"})
        page.reload()
        warning = page.locator(".settings-view .warning", has_text="No API key")
        expect(warning).to_contain_text("so bob (on api.openai.com) will fail")
        expect(warning).not_to_contain_text("alice")
    finally:
        setup.close()
        server.stop()


def test_an_agents_message_to_another_agent_says_alice_to_bob(world_setup: WorldSetup) -> None:
    setup = world_setup

    def respond(body: dict[str, Any]) -> Text:
        if "You are alice" in body["messages"][0]["content"]:
            return Text("@bob can you check the build?")
        return Text("checked: green")

    setup.llm.respond_with(respond)
    setup.make_world("alice", "bob")
    page = setup.open_page("member", "maria")
    setup.say("@alice start")
    log = page.locator("#log-main")
    expect(log).to_contain_text("checked: green", timeout=15_000)
    alice, bob = (log.locator("article.item-agent", has_text=text) for text in ("can you check", "checked: green"))
    expect(alice.locator("header .to")).to_have_text("→ bob")
    expect(alice.locator("header")).to_contain_text("alice → bob")
    expect(bob.locator("header .to")).to_have_count(0)  # bob's reply names no agent: it is for the room
    page.reload()  # the first render says it too
    expect(page.locator("#log-main article.item-agent", has_text="can you check").locator("header .to")).to_have_text(
        "→ bob")
