"""The list of worlds comes a page at a time (issue #30): `GET /api/worlds?limit=N&cursor=C` with the
next page in a `Link` header, and the world list page with a "more" link."""
from __future__ import annotations

import re
import threading
import time

import httpx2 as httpx

from tests.fixtures.inprocess import Site, site

__all__ = ["site"]


def _make(site: Site, count: int) -> list[str]:
    made = []
    for n in range(count):
        answer = site.api("owner", "POST", "/api/worlds", json={"name": f"Paged {n:03d}"})
        assert answer.status_code == 201, answer.text
        made.append(answer.json()["id"])
    return made


def _next(link: str | None) -> str | None:
    if link is None:
        return None
    found = re.fullmatch(r'<([^>]+)>; rel="next"', link)
    assert found, link
    return found.group(1)


def test_the_owner_pages_through_every_world_following_the_link_header(site: Site) -> None:
    made = _make(site, 5)
    seen: list[str] = []
    url: str | None = "/api/worlds?limit=2"
    pages = 0
    while url is not None:
        answer = site.api("owner", "GET", url)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page) <= 2 and all(w["role"] == "owner" for w in page)
        seen += [w["id"] for w in page]
        url, pages = _next(answer.headers.get("link")), pages + 1
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert set(made) | {site.world} <= set(seen) and pages == (len(seen) + 1) // 2
    everything = site.api("owner", "GET", "/api/worlds")  # the default page holds them all here
    assert [w["id"] for w in everything.json()] == seen and "link" not in everything.headers


def test_a_member_sees_only_the_world_they_have_a_role_in(site: Site) -> None:
    _make(site, 2)
    for role in ("member", "spectator"):
        answer = site.api(role, "GET", "/api/worlds?limit=1")
        assert answer.status_code == 200, answer.text
        assert answer.json() == [{"id": site.world, "name": "Lab", "role": role}]
        assert "link" not in answer.headers
        after = site.api(role, "GET", f"/api/worlds?cursor={site.world}")
        assert after.json() == []


def test_a_bad_cursor_or_limit_is_a_400_saying_so(site: Site) -> None:
    for query, says in (("cursor=..%2Fx", "cursor"), ("cursor=A", "cursor"), ("limit=0", "limit"),
                        ("limit=many", "limit"), ("limit=-3", "limit")):
        answer = site.api("owner", "GET", f"/api/worlds?{query}")
        assert answer.status_code == 400, (query, answer.text)
        assert answer.json()["error"]["code"] == "invalid" and says in answer.json()["error"]["message"]
    assert site.api("owner", "GET", "/api/worlds?limit=5000").status_code == 200  # capped, not refused


def test_the_world_list_page_has_a_more_link_past_a_page(site: Site) -> None:
    _make(site, 101)
    first = site.page("owner", "GET", "/")
    assert first.status_code == 200
    more = re.search(r'<a class="more" href="([^"]+)">', first.text)
    assert more, first.text[-500:]
    listed = re.findall(r'<li><a href="/w/([^"]+)">', first.text)
    assert len(listed) == 100
    rest = site.page("owner", "GET", more.group(1).replace("&amp;", "&"))
    assert rest.status_code == 200
    following = re.findall(r'<li><a href="/w/([^"]+)">', rest.text)
    assert following and min(following) > max(listed)
    assert site.page("owner", "GET", "/?cursor=..%2F").status_code == 400


def test_a_history_of_long_messages_is_rendered_while_other_requests_are_answered(site: Site) -> None:
    # Markdown holds the GIL: six messages of 95,000 characters (a member may send 100,000), rendered on the
    # event loop when the page opened, held every world's requests for about a second.
    made = site.api("owner", "POST", "/api/worlds", json={"name": "Long history"})
    world = made.json()["id"]
    block = "A paragraph with **bold** text, `code` and a [link](https://example.com).\n\n- a point\n- another\n\n"
    for n in range(6):
        said = site.api("owner", "POST", f"/api/worlds/{world}/messages",
                        json={"content": block * (95_000 // len(block)) + f"message {n}"})
        assert said.status_code < 300, said.text
    order: list[str] = []
    pages: list[httpx.Response] = []

    def open_page() -> None:
        pages.append(site.page("owner", "GET", f"/w/{world}"))
        order.append("page")
    opening = threading.Thread(target=open_page)
    opening.start()
    time.sleep(0.3)  # the page's render is under way
    assert site.page(None, "GET", "/healthz").status_code == 200
    order.append("healthz")
    opening.join(60)
    assert order == ["healthz", "page"]
    assert pages[0].status_code == 200 and pages[0].text.count("<strong>bold</strong>") > 6 * 100
    assert "message 5" in pages[0].text
