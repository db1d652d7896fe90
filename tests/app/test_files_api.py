"""The workspace over the JSON API (docs/protocol.md §5, Files): list, download (headers), a folder as a
zip, upload (its cap, the path confined, spectators refused, the event on the record and in agents'
memory), on the in-process app."""
from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from server.api.context import AppContext
from server.engine.turns.llm_input import prepare_input
from server.engine.world.files import LIST_SCAN, MAX_UPLOAD
from tests.fixtures.inprocess import Site, site

__all__ = ["site"]


def _workspace(site: Site) -> Path:
    ctx: AppContext = site.client.app.state.ctx  # type: ignore[attr-defined]
    return ctx.engine.workspace_for(site.world)


def _files(site: Site) -> str:
    return f"/api/worlds/{site.world}/files"


def test_a_folder_lists_folders_first_then_files_with_their_sizes(site: Site) -> None:
    ws = _workspace(site)
    (ws / "listing" / "sub").mkdir(parents=True, exist_ok=True)
    (ws / "listing" / "b.txt").write_text("bee")
    (ws / "listing" / "a.md").write_text("# a")
    for role in ("owner", "member", "spectator"):  # reading is watching: every role
        answer = site.api(role, "GET", _files(site), params={"path": "listing"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert [(e["name"], e["type"], e["size"]) for e in body["entries"]] == [
            ("sub", "dir", None), ("a.md", "file", 3), ("b.txt", "file", 3)]
        assert body["path"] == "listing" and body["next"] is None and not body["capped"]
        assert body["entries"][1]["path"] == "listing/a.md"


def test_a_long_folder_is_read_a_page_at_a_time(site: Site) -> None:
    ws = _workspace(site) / "many"
    ws.mkdir(exist_ok=True)
    for i in range(25):
        (ws / f"f{i:02d}").write_text("x")
    first = site.api("owner", "GET", _files(site), params={"path": "many", "limit": 10}).json()
    assert [e["name"] for e in first["entries"]] == [f"f{i:02d}" for i in range(10)]
    assert first["total"] == 25 and first["next"] == 10
    last = site.api("owner", "GET", _files(site), params={"path": "many", "offset": 20, "limit": 10}).json()
    assert [e["name"] for e in last["entries"]] == [f"f{i:02d}" for i in range(20, 25)] and last["next"] is None
    assert LIST_SCAN >= 1000  # the cap on names read is documented as 10,000


def test_listing_never_leaves_the_workspace(site: Site, tmp_path: Path) -> None:
    ws = _workspace(site)
    (tmp_path / "secret.txt").write_text("outside")
    link = ws / "escape"
    if not link.is_symlink():
        link.symlink_to(tmp_path)
    for path in ("..", "../..", "a/../../x", "/etc", "escape", "escape/"):
        answer = site.api("owner", "GET", _files(site), params={"path": path})
        assert answer.status_code == 400, (path, answer.text)
    listed = site.api("owner", "GET", _files(site)).json()
    assert {"name": "escape", "type": "link"}.items() <= next(
        e for e in listed["entries"] if e["name"] == "escape").items()


def test_a_download_is_an_attachment_that_can_never_run_in_the_page(site: Site) -> None:
    ws = _workspace(site)
    (ws / "evil.html").write_text("<script>alert(1)</script>")
    for role in ("owner", "spectator"):
        answer = site.api(role, "GET", f"{_files(site)}/download", params={"path": "evil.html"})
        assert answer.status_code == 200, answer.text
        assert answer.content == b"<script>alert(1)</script>"
        assert answer.headers["content-type"] == "application/octet-stream"
        assert answer.headers["content-disposition"].startswith('attachment; filename="evil.html"')
        assert answer.headers["content-security-policy"].startswith("sandbox")
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_only_images_are_served_inline_and_then_sandboxed(site: Site) -> None:
    ws = _workspace(site)
    (ws / "dot.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (ws / "page.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>")
    shown = site.page("member", "GET", f"{_files(site)}/raw", params={"path": "dot.png"})
    assert shown.status_code == 200
    assert shown.headers["content-type"] == "image/png"
    assert shown.headers["content-disposition"].startswith("inline")
    assert shown.headers["content-security-policy"].startswith("sandbox")
    for path in ("page.svg", "evil.html"):
        assert site.page("member", "GET", f"{_files(site)}/raw", params={"path": path}).status_code == 400


def test_a_link_or_a_hard_link_is_never_downloaded(site: Site, tmp_path: Path) -> None:
    ws = _workspace(site)
    outside = tmp_path / "outside.txt"
    outside.write_text("server secret")
    (ws / "soft").unlink(missing_ok=True)
    (ws / "soft").symlink_to(outside)
    os.link(outside, ws / "hard")
    for path in ("soft", "hard", "escape/secret.txt"):
        answer = site.api("owner", "GET", f"{_files(site)}/download", params={"path": path})
        assert answer.status_code in (400, 404), (path, answer.text)
        assert b"server secret" not in answer.content
    (ws / "hard").unlink()


def test_a_folder_downloads_as_a_zip_without_its_links(site: Site, tmp_path: Path) -> None:
    ws = _workspace(site) / "zipme"
    (ws / "deep").mkdir(parents=True, exist_ok=True)
    (ws / "one.txt").write_text("1")
    (ws / "deep" / "two.txt").write_text("22")
    (tmp_path / "outside.txt").write_text("server secret")
    (ws / "link").symlink_to(tmp_path / "outside.txt")
    answer = site.api("member", "GET", f"{_files(site)}/download", params={"path": "zipme"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/zip"
    assert answer.headers["content-disposition"].startswith('attachment; filename="zipme.zip"')
    archive = zipfile.ZipFile(io.BytesIO(answer.content))
    assert sorted(archive.namelist()) == ["deep/", "deep/two.txt", "one.txt"]
    assert archive.read("deep/two.txt") == b"22"
    assert b"link" in archive.comment


def test_an_upload_is_written_and_recorded_for_the_agents(site: Site) -> None:
    data = b"col\n1\n" * 1000
    answer = site.page("member", "POST", _files(site), params={"path": "in/data.csv"}, content=data)
    assert answer.status_code == 201, answer.text
    event = answer.json()
    assert event["kind"] == "file_uploaded" and "person" not in event
    assert (event["path"], event["size"]) == ("in/data.csv", len(data))
    assert event["sha256"] == hashlib.sha256(data).hexdigest()
    assert event["sender"] == "human:member"
    assert (_workspace(site) / "in" / "data.csv").read_bytes() == data
    assert not [p for p in (_workspace(site) / "in").iterdir() if p.name.startswith(".upload-")]
    assert any(e["kind"] == "file_uploaded" and e["seq"] == event["seq"] for e in site.events())
    audit = site.api("owner", "GET", f"/api/worlds/{site.world}/audit").json()
    assert any(line["action"] == "file_uploaded" and line.get("path") == "in/data.csv" for line in audit)
    # Every agent of the chat reads it as a note from the member.
    messages = prepare_input(agent="alice", system_prompt="", memory=[event])
    assert messages[-1]["role"] == "user" and messages[-1]["name"] == "member"
    assert "uploaded the file in/data.csv" in messages[-1]["content"]


def test_an_upload_replaces_a_link_instead_of_writing_through_it(site: Site, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text("untouched")
    (_workspace(site) / "planted").symlink_to(target)
    answer = site.page("member", "POST", _files(site), params={"path": "planted"}, content=b"new")
    assert answer.status_code == 201, answer.text
    assert target.read_text() == "untouched"
    assert not (_workspace(site) / "planted").is_symlink() and (_workspace(site) / "planted").read_bytes() == b"new"


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "escape/x", "", "."])
def test_an_upload_stays_in_the_workspace(site: Site, tmp_path: Path, path: str) -> None:
    ws = _workspace(site)
    if not (ws / "escape").is_symlink():
        (ws / "escape").symlink_to(tmp_path)
    answer = site.page("member", "POST", _files(site), params={"path": path}, content=b"x")
    assert answer.status_code == 400, answer.text
    assert not (tmp_path / "x").exists()


def test_a_spectator_may_not_upload_and_leaves_no_record(site: Site) -> None:
    before = site.events()[-1]["seq"]
    answer = site.page("spectator", "POST", _files(site), params={"path": "s.txt"}, content=b"x")
    assert answer.status_code == 403, answer.text
    assert not (_workspace(site) / "s.txt").exists()
    assert site.events()[-1]["seq"] == before


def test_an_upload_over_the_cap_is_refused_and_leaves_nothing(site: Site) -> None:
    big = b"x" * (MAX_UPLOAD + 1)
    declared = site.page("member", "POST", _files(site), params={"path": "big.bin"}, content=big)
    assert declared.status_code == 413, declared.text

    def chunks() -> object:  # no Content-Length: counted as it streams
        for _ in range(MAX_UPLOAD // (1 << 20) + 1):
            yield b"y" * (1 << 20)
    streamed = site.page("member", "POST", _files(site), params={"path": "big.bin"}, content=chunks())
    assert streamed.status_code == 413, streamed.text
    assert not (_workspace(site) / "big.bin").exists()
    assert not [p for p in _workspace(site).iterdir() if p.name.startswith(".upload-")]


def test_an_upload_may_exceed_the_api_body_cap_but_other_routes_may_not(site: Site) -> None:
    two_mib = b"z" * (2 << 20)
    assert site.page("member", "POST", _files(site), params={"path": "two.bin"}, content=two_mib).status_code == 201
    answer = site.api("member", "POST", f"/api/worlds/{site.world}/messages", content=two_mib,
                      headers={"Content-Type": "application/json"})
    assert answer.status_code == 413
