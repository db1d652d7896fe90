"""The review's findings on the page's management routes (bugs 1, 5 and 9), over the real app in process."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.fixtures.inprocess import CLOSED_LLM, Site
from tests.fixtures.static_http import static_http

KEY = "Bearer test-key-not-real"  # tests/conftest.py's OPENAI_API_KEY


MODELS = b'{"object":"list","data":[{"id":"m-listed","object":"model","created":0,"owned_by":"x"}]}'


@contextlib.contextmanager
def _endpoint() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A real /v1/models endpoint on loopback: its base URL, and (path, Authorization) of each request it got."""
    with static_http(MODELS, "application/json") as (origin, seen):
        yield f"{origin}/v1", seen


# -- bug 1: a cross-site GET sent the server's OPENAI_API_KEY to any URL -----------------------------------
def test_loading_models_is_a_post_a_cross_site_link_cannot_make(site: Site) -> None:
    with _endpoint() as (url, seen):
        cross_site = {"Cookie": f"aw_session={site.sessions['owner']}", "Sec-Fetch-Site": "cross-site",
                      "Sec-Fetch-Mode": "navigate", "Referer": "https://evil.example/"}
        link = site.client.get(f"/w/{site.world}/models", params={"base_url": url}, headers=cross_site)
        assert link.status_code == 405, link.text
        form = site.page("owner", "POST", f"/w/{site.world}/models", data={"base_url": url},
                         headers={"Origin": "https://evil.example", "HX-Request": "true"})
        assert "cross-origin request refused" in form.text, form.text  # htmx gets the refusal as a toast
        assert seen == []  # nothing reached the endpoint


def test_a_typed_endpoint_is_asked_without_the_servers_key(site: Site) -> None:
    with _endpoint() as (url, seen):
        listed = site.page("owner", "POST", f"/w/{site.world}/models", data={"base_url": url, "list": "models-x"},
                           headers={"HX-Request": "true"})
        assert '<datalist id="models-x" hx-swap-oob="true"><option value="m-listed">' in listed.text, listed.text
        assert "without the server's API key" in listed.text
        assert seen == [("/v1/models", None)]


def test_the_key_goes_to_the_default_endpoint_and_to_an_agents_saved_one(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    w = site.world
    with _endpoint() as (url, seen):
        monkeypatch.setenv("OPENAI_BASE_URL", url)  # the server's default endpoint: no base_url typed
        default = site.page("owner", "POST", f"/w/{w}/models", data={"base_url": ""}, headers={"HX-Request": "true"})
        assert "1 model listed" in default.text and "without" not in default.text, default.text
        monkeypatch.delenv("OPENAI_BASE_URL")
        added = site.api("owner", "POST", f"/api/worlds/{w}/agents",
                         json={"name": "saved", "provider": "openai", "model": "m", "base_url": url})
        assert added.status_code == 201, added.text
        try:
            saved = site.page("owner", "POST", f"/w/{w}/models", data={"base_url": url + "/"},
                              headers={"HX-Request": "true"})
            assert "1 model listed" in saved.text and "without" not in saved.text, saved.text
        finally:
            site.api("owner", "DELETE", f"/api/worlds/{w}/agents/saved")
        assert seen == [("/v1/models", KEY), ("/v1/models", KEY)]


# -- bug 5: saving the edit form gave a no-tools agent every tool ------------------------------------------
def test_the_edit_form_keeps_an_empty_tool_list_unless_all_tools_is_chosen(site: Site) -> None:
    w = site.world
    made = site.api("owner", "POST", f"/api/worlds/{w}/agents",
                    json={"name": "boxed", "model": "m", "base_url": CLOSED_LLM, "tools": []})
    assert made.json()["tools"] == []

    def tools() -> list[str] | None:
        agents = site.api("owner", "GET", f"/api/worlds/{w}").json()["agents"]
        found: list[str] | None = next(a for a in agents if a["name"] == "boxed")["tools"]
        return found

    def save(**fields: str) -> None:
        form = {"model": "m2", "provider": "openai", "base_url": CLOSED_LLM, "system_prompt": "", **fields}
        saved = site.page("owner", "POST", f"/w/{w}/agents/boxed", data=form, headers={"HX-Request": "true"})
        assert saved.status_code == 200 and "field-error" not in saved.text, saved.text

    try:
        page = site.page("owner", "GET", f"/w/{w}/settings", headers={"Accept": "text/html"}).text
        meta = page.split('id="agent-config-boxed"', 1)[1].split("</form>", 1)[0]
        assert 'name="tools_mode" value="list" checked' in meta and 'name="tools_mode" value="all">' in meta
        save(tools="")  # a form without the choice (an older page) leaves the tools as they are
        assert tools() == []
        save(tools_mode="list", tools="")  # what the page sends as shown
        assert tools() == []
        save(tools_mode="list", tools="shell_exec, read_file")
        assert tools() == ["shell_exec", "read_file"]
        save(tools_mode="all", tools="shell_exec")  # only an explicit choice widens
        assert tools() is None
        page = site.page("owner", "GET", f"/w/{w}/settings", headers={"Accept": "text/html"}).text
        meta = page.split('id="agent-config-boxed"', 1)[1].split("</form>", 1)[0]
        assert 'name="tools_mode" value="all" checked' in meta
    finally:
        site.api("owner", "DELETE", f"/api/worlds/{w}/agents/boxed")


# -- bug 9: the edit form's error render reflected the URL's agent name unescaped ------------------------
def test_an_unknown_agents_edit_is_a_toast_and_nothing_is_reflected(site: Site) -> None:
    name = 'x"><img src=x onerror=alert(1)>'
    answer = site.page("owner", "POST", f"/w/{site.world}/agents/{name}", data={"model": "", "tools": ""},
                       headers={"HX-Request": "true"})
    assert "<img" not in answer.text, answer.text
    assert "no agent" in answer.text and answer.headers.get("HX-Reswap") == "none", answer.text
