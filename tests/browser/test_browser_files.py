"""The files panel in Chromium (#31 item 6): the workspace listed live (a file an agent writes appears),
previews, downloads, uploads by button and by drop, a `file_write` step that links to its file; axe-clean."""
from __future__ import annotations

import base64
from pathlib import Path

from playwright.sync_api import FilePayload, Page, expect

from server.testing.openai_double import Text
from tests.browser.test_browser_a11y import check
from tests.fixtures.browser import WorldSetup
from tests.fixtures.engine import reply_by_turn, tool_calls

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
                       "awAAAABJRU5ErkJggg==")


def _workspace(setup: WorldSetup) -> Path:
    return setup.server.data_dir / "workspaces" / setup.world


def _listed(page: Page, name: str) -> None:
    expect(page.locator("#files-list .file-name", has_text=name)).to_have_count(1, timeout=10_000)


def test_a_file_an_agent_writes_appears_and_its_step_opens_it(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.api("POST", f"/api/worlds/{setup.world}/rules", {"tool": "file_write", "effect": "allow"})
    setup.llm.respond_with(reply_by_turn(
        tool_calls(("file_write", {"path": "notes/plan.md", "content": "# The plan\n\n**Ship it.**\n"})),
        Text("Written.")))
    page = setup.open_page("spectator")  # it only watches, and watching covers the files
    expect(page.locator("#files-list")).to_contain_text("The workspace is empty", timeout=10_000)
    setup.say("write the plan")
    _listed(page, "notes/")  # listed again when the tool's result arrived: no reload, no polling
    page.locator("#files-list .file-name", has_text="notes/").click()
    _listed(page, "plan.md")
    link = page.locator("#log-main a.file-link", has_text="notes/plan.md")
    expect(link).to_have_count(1, timeout=10_000)
    page.locator("#log-main details.step summary").first.click()  # the step is folded once it has its result
    link.click()
    dialog = page.locator("#file-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("h1")).to_have_text("The plan")  # Markdown, rendered by the server
    expect(dialog.locator("strong")).to_have_text("Ship it.")
    check(page, "world page with a file's preview open")


def test_previews_of_code_and_images_and_a_download(world_setup: WorldSetup, tmp_path: Path) -> None:
    setup = world_setup
    setup.make_world("alice")
    ws = _workspace(setup)
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "tool.py").write_text("def main():\n    return 42\n")
    (ws / "dot.png").write_bytes(PNG)
    (ws / "evil.html").write_text("<script>document.title = 'owned'</script>")
    page = setup.open_page("member")
    _listed(page, "tool.py")
    check(page, "world page with the files panel")
    page.locator("#files-list .file-name", has_text="tool.py").click()
    dialog = page.locator("#file-dialog")
    expect(dialog.locator("pre.highlight span.k").first).to_have_text("def")
    page.locator("[data-close-file]").click()
    expect(dialog).to_be_hidden()
    page.locator("#files-list .file-name", has_text="dot.png").click()
    image = dialog.locator("img")
    expect(image).to_be_visible()
    page.wait_for_function("document.querySelector('#file-dialog img').naturalWidth === 1")
    page.locator("[data-close-file]").click()
    with page.expect_download() as caught:
        page.locator("#files-list li", has_text="evil.html").locator("a[download]").click()
    download = caught.value
    assert download.suggested_filename == "evil.html"
    saved = tmp_path / "saved.html"
    download.save_as(saved)
    assert saved.read_text() == "<script>document.title = 'owned'</script>"
    assert page.title() != "owned"


def test_members_upload_by_button_and_by_drop_and_the_chat_says_so(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    setup.llm.respond_with(lambda body: Text("noted"))
    page = setup.open_page("member", name="maria")
    expect(page.locator("#files-list")).to_contain_text("The workspace is empty", timeout=10_000)
    page.set_input_files("#files-input", files=[FilePayload(name="hello.txt", mimeType="text/plain", buffer=b"hi")])
    expect(page.locator("#files-status")).to_have_text("Uploaded hello.txt.", timeout=10_000)
    _listed(page, "hello.txt")
    expect(page.locator("#log-main .file-uploaded")).to_contain_text("maria uploaded hello.txt (2 bytes)")
    page.evaluate("""() => {
        const data = new DataTransfer();
        data.items.add(new File(["dropped bytes"], "drop.txt", {type: "text/plain"}));
        const panel = document.getElementById("files-panel");
        panel.dispatchEvent(new DragEvent("dragover", {dataTransfer: data, bubbles: true, cancelable: true}));
        panel.dispatchEvent(new DragEvent("drop", {dataTransfer: data, bubbles: true, cancelable: true}));
    }""")
    expect(page.locator("#files-status")).to_have_text("Uploaded drop.txt.", timeout=10_000)
    _listed(page, "drop.txt")
    assert (_workspace(setup) / "drop.txt").read_bytes() == b"dropped bytes"
    assert (_workspace(setup) / "hello.txt").read_bytes() == b"hi"


def test_a_spectator_has_no_upload_control(world_setup: WorldSetup) -> None:
    setup = world_setup
    setup.make_world("alice")
    page = setup.open_page("spectator")
    expect(page.locator("#files-list")).to_contain_text("The workspace is empty", timeout=10_000)
    expect(page.locator("#files-input")).to_have_count(0)
