"""The files panel's fragments (web/files.py) on the in-process app: a folder's list, previews that never
carry the file's own markup, and the panel offered to every role but its upload control to senders only."""
from __future__ import annotations

from pathlib import Path

from server.api.context import AppContext
from tests.fixtures.inprocess import Site, site

__all__ = ["site"]


def _workspace(site: Site) -> Path:
    ctx: AppContext = site.client.app.state.ctx  # type: ignore[attr-defined]
    return ctx.engine.workspace_for(site.world)


def test_every_role_sees_the_panel_and_only_senders_the_upload(site: Site) -> None:
    for role, uploads in (("owner", True), ("member", True), ("spectator", False)):
        page = site.page(role, "GET", f"/w/{site.world}").text
        assert 'id="files-panel"' in page and 'src="/static/files.js"' in page
        assert ('id="files-input"' in page) is uploads, role


def test_a_folder_lists_as_links_that_open_download_and_zip(site: Site) -> None:
    (_workspace(site) / "docs").mkdir(exist_ok=True)
    (_workspace(site) / "docs" / "a b&c.txt").write_text("x")
    html = site.page("spectator", "GET", f"/w/{site.world}/files", params={"path": "docs"}).text
    assert 'data-path="docs"' in html
    assert f'href="/api/worlds/{site.world}/files/download?path=docs/a%20b%26c.txt"' in html
    assert f'hx-get="/w/{site.world}/files/preview?path=docs/a%20b%26c.txt"' in html
    assert f'href="/api/worlds/{site.world}/files/download?path=docs" download' in html  # the folder's zip


def test_a_preview_renders_text_and_never_the_files_own_markup(site: Site) -> None:
    ws = _workspace(site)
    (ws / "x.html").write_text("<script>alert(1)</script><b>hi</b>")
    (ws / "n.md").write_text("# Title\n\n<img src=x onerror=alert(1)> **bold**")
    (ws / "c.py").write_text("def f():\n    return '<i>'\n")
    (ws / "blob.bin").write_bytes(b"\x00\x01\x02")
    html = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "x.html"}).text
    assert "<script" not in html and "<b>" not in html and "alert" in html  # highlighted as HTML source
    md = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "n.md"}).text
    assert "<h1>Title</h1>" in md and "<strong>bold</strong>" in md and "<img" not in md
    code = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "c.py"}).text
    assert '<span class="k">def</span>' in code and "<i>" not in code
    blob = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "blob.bin"}).text
    assert "not text" in blob


def test_a_preview_of_an_image_points_at_the_sandboxed_route(site: Site) -> None:
    (_workspace(site) / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    html = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "p.png"}).text
    assert f'<img src="/api/worlds/{site.world}/files/raw?path=p.png"' in html


def test_a_path_out_of_the_workspace_previews_as_an_error(site: Site) -> None:
    html = site.page("member", "GET", f"/w/{site.world}/files/preview", params={"path": "../../owner.token"}).text
    assert 'class="error"' in html and "outside the workspace" in html
    signed_out = site.page(None, "GET", f"/w/{site.world}/files")
    assert 'class="error"' in signed_out.text and "files-list" not in signed_out.text
