"""The workspace over the JSON API as the world's rules let it be read (docs/protocol.md §5, Files): a
path that a `file_read` rule denies, or whose reading needs a person, is neither downloaded, shown inline,
previewed nor zipped, whoever asks, and is marked in its listing; a `file_write` deny rule refuses an
upload. Also: a file something keeps appending to is read as it was, and a deep tree zips without
recursion. On the in-process app."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest

from server.api.context import AppContext
from server.engine.world.files import CHUNK
from tests.fixtures.inprocess import Site, site

__all__ = ["site"]

READERS = ("owner", "member", "spectator")
ZIP_DEPTH = 256  # folders a zip descends (docs/protocol.md §5)


def _workspace(site: Site) -> Path:
    ctx: AppContext = site.client.app.state.ctx  # type: ignore[attr-defined]
    return ctx.engine.workspace_for(site.world)


def _files(site: Site) -> str:
    return f"/api/worlds/{site.world}/files"


def _rule(site: Site, tool: str, path: str, effect: str) -> None:
    added = site.api("owner", "POST", f"/api/worlds/{site.world}/rules",
                     json={"tool": tool, "match": {"path": path}, "effect": effect})
    assert added.status_code == 201, added.text


@pytest.fixture(scope="module")
def guarded(site: Site) -> Path:
    """`kept/`: `secret/**` denied, `.env` and `ask.png` asking a person first, `open.txt` readable."""
    ws = _workspace(site) / "kept"
    (ws / "secret").mkdir(parents=True)
    (ws / "secret" / "key.txt").write_text("deny-me")
    (ws / ".env").write_text("API_KEY=ask-me")
    (ws / "ask.png").write_bytes(b"\x89PNG\r\n\x1a\nask-me")
    (ws / "open.txt").write_text("fine")
    _rule(site, "file_read", "kept/secret/**", "deny")
    _rule(site, "file_read", "kept/.env", "ask")
    _rule(site, "file_read", "kept/ask.png", "ask")
    return ws


@pytest.mark.parametrize("role", READERS)
def test_a_denied_or_asking_file_is_not_downloaded(site: Site, guarded: Path, role: str) -> None:
    for path, effect in (("kept/secret/key.txt", "denies"), ("kept/.env", "without a person")):
        answer = site.api(role, "GET", f"{_files(site)}/download", params={"path": path})
        assert answer.status_code == 403, (path, answer.text)
        assert answer.json()["error"]["code"] == "forbidden" and effect in answer.json()["error"]["message"]
        assert b"-me" not in answer.content
    assert site.api(role, "GET", f"{_files(site)}/download", params={"path": "kept/open.txt"}).content == b"fine"


@pytest.mark.parametrize("role", ["member", "spectator"])
def test_an_asking_image_is_not_shown_inline_nor_previewed(site: Site, guarded: Path, role: str) -> None:
    raw = site.page(role, "GET", f"{_files(site)}/raw", params={"path": "kept/ask.png"})
    assert raw.status_code == 403 and b"ask-me" not in raw.content
    for path in ("kept/.env", "kept/secret/key.txt"):
        preview = site.page(role, "GET", f"/w/{site.world}/files/preview", params={"path": path})
        assert "-me" not in preview.text and "a rule" in preview.text, preview.text


@pytest.mark.parametrize("path", ["kept", None])
def test_a_zip_leaves_out_what_a_rule_keeps_and_says_so(site: Site, guarded: Path, path: str | None) -> None:
    answer = site.api("spectator", "GET", f"{_files(site)}/download", params={"path": path} if path else {})
    assert answer.status_code == 200, answer.text
    archive = zipfile.ZipFile(io.BytesIO(answer.content))
    inside = "" if path else "kept/"
    names = archive.namelist()
    assert f"{inside}open.txt" in names
    assert not {f"{inside}.env", f"{inside}ask.png", f"{inside}secret/key.txt"} & set(names)
    assert b"-me" not in b"".join(archive.read(n) for n in names)
    comment = archive.comment.decode()
    assert "a rule" in comment and f"{inside}.env" in comment and f"{inside}secret/key.txt" in comment


def test_the_listing_marks_what_a_rule_keeps_without_its_content(site: Site, guarded: Path) -> None:
    for role in READERS:
        entries = site.api(role, "GET", _files(site), params={"path": "kept"}).json()["entries"]
        assert {e["name"]: e["guarded"] for e in entries} == {
            "secret": None, ".env": "ask", "ask.png": "ask", "open.txt": None}
        inner = site.api(role, "GET", _files(site), params={"path": "kept/secret"}).json()["entries"]
        assert [(e["name"], e["guarded"]) for e in inner] == [("key.txt", "deny")]


def test_an_upload_a_write_rule_denies_is_refused_and_an_asking_one_is_the_person(site: Site) -> None:
    _rule(site, "file_write", "locked/*", "deny")
    _rule(site, "file_write", "asked/*", "ask")
    before = site.events()[-1]["seq"]
    refused = site.page("member", "POST", _files(site), params={"path": "locked/x.txt"}, content=b"x")
    assert refused.status_code == 403 and "a rule denies writing locked/x.txt" in refused.json()["error"]["message"]
    assert not (_workspace(site) / "locked" / "x.txt").exists() and site.events()[-1]["seq"] == before
    done = site.page("member", "POST", _files(site), params={"path": "asked/y.txt"}, content=b"y")
    assert done.status_code == 201, done.text
    assert (_workspace(site) / "asked" / "y.txt").read_bytes() == b"y"


def test_a_file_that_keeps_growing_is_downloaded_as_it_was_when_opened(site: Site) -> None:
    grows = _workspace(site) / "grows.log"
    grows.write_bytes(b"a" * (CHUNK + 10))
    ctx: AppContext = site.client.app.state.ctx  # type: ignore[attr-defined]
    found = site.client.portal.call(ctx.engine.files.download, site.world, "grows.log")  # type: ignore[union-attr]
    first = site.client.portal.call(found.chunks.__anext__)  # type: ignore[union-attr]
    with grows.open("ab") as more:  # a sandboxed process appending meanwhile
        more.write(b"b" * (4 * CHUNK))
    rest: list[bytes] = []

    async def drain() -> None:
        rest.extend([chunk async for chunk in found.chunks])
    site.client.portal.call(drain)  # type: ignore[union-attr]
    sent = first + b"".join(rest)
    assert len(sent) == found.size == CHUNK + 10 and set(sent) == {ord("a")}


def _nest(folder: Path, depth: int) -> None:
    """`depth` folders `d` one in another under `folder`, made (and later removed) without recursing."""
    fds = [os.open(folder, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fds[-1])
            fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    finally:
        for fd in fds:
            os.close(fd)


def _unnest(folder: Path) -> None:
    """Remove what `_nest` made, deepest first (pytest's own cleanup recurses and would give up)."""
    fds = [os.open(folder, os.O_RDONLY | os.O_DIRECTORY)]
    while "d" in os.listdir(fds[-1]):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.close(fds.pop())
    while fds:
        os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_a_tree_deeper_than_the_cap_zips_without_recursing(site: Site) -> None:
    tree = _workspace(site) / "tree"
    tree.mkdir()
    (tree / "top.txt").write_text("top")
    _nest(tree, ZIP_DEPTH + 1000)  # deeper than Python's recursion limit
    try:
        answer = site.api("member", "GET", f"{_files(site)}/download", params={"path": "tree"})
    finally:
        _unnest(tree)
    assert answer.status_code == 200, answer.text
    archive = zipfile.ZipFile(io.BytesIO(answer.content))
    assert archive.read("top.txt") == b"top"
    assert max(n.count("/") for n in archive.namelist()) == ZIP_DEPTH
    assert f"folders deeper than {ZIP_DEPTH}: {'d/' * (ZIP_DEPTH + 1)}" in archive.comment.decode()


def test_the_panel_names_what_a_rule_keeps_and_offers_no_link_to_it(site: Site, guarded: Path) -> None:
    panel = site.page("spectator", "GET", f"/w/{site.world}/files", params={"path": "kept"}).text
    assert ".env (not shown: a rule)" in panel and "download?path=kept/.env" not in panel
    assert "download?path=kept/open.txt" in panel
