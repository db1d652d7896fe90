"""A file write is asked with a diff against the file as it is (issue #28, item 3): the real engine, the
OpenAI double and the real file_write tool; the current file is read as file_read reads it, without
following a link."""
from __future__ import annotations

import os
from typing import Any

from server.testing.openai_double import Text
from tests.fixtures.engine import Harness, tool_calls


def _writes(path: str, content: str) -> Any:
    def respond(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] == "tool":
            return Text("written")
        return tool_calls(("file_write", {"path": path, "content": content}))
    return respond


async def _asked_diff(harness: Harness, path: str, content: str) -> dict[str, Any]:
    harness.double.respond_with(_writes(path, content))
    await harness.say("@alice write it")
    [pending] = await harness.wait_pending(1)
    diff: dict[str, Any] = pending["request"]["diff"]
    return diff


async def test_a_file_write_is_asked_with_a_unified_diff_against_the_current_file(harness: Harness) -> None:
    await harness.make_world("alice")
    workspace = harness.engine.workspace_for(harness.world)
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.md").write_text("title\nkeep\nold line\n")
    diff = await _asked_diff(harness, "notes.md", "title\nkeep\nnew line\n")
    assert diff == {"path": "notes.md", "new": False, "text": "\n".join([
        "--- a/notes.md", "+++ b/notes.md", "@@ -1,3 +1,3 @@", " title", " keep", "-old line", "+new line"])}


async def test_a_new_file_is_asked_with_every_line_added(harness: Harness) -> None:
    await harness.make_world("alice")
    diff = await _asked_diff(harness, "docs/new.txt", "one\ntwo\n")
    assert diff == {"path": "docs/new.txt", "new": True,
                    "text": "--- /dev/null\n+++ b/docs/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two"}


async def test_the_diff_never_reads_through_a_symbolic_link(harness: Harness, tmp_path: Any) -> None:
    await harness.make_world("alice")
    workspace = harness.engine.workspace_for(harness.world)
    workspace.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("TOP SECRET CONTENT\n")
    os.symlink(outside, workspace / "link.txt")
    diff = await _asked_diff(harness, "link.txt", "replaced\n")
    assert diff["path"] == "link.txt" and "symbolic links are not followed" in diff["error"]
    assert "TOP SECRET" not in repr(await harness.events())
