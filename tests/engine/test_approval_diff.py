"""A file write is asked with a diff against the file as it is (issue #28, item 3): the real engine, the
OpenAI double and the real file_write tool; the current file is read as file_read reads it, without
following a link."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from server.testing.openai_double import Text
from tests.fixtures.engine import OWNER, Harness, tool_calls


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


async def _world_with(harness: Harness, path: str, text: str) -> Path:
    """A world of alice's whose workspace holds `path` with `text`; returns the workspace."""
    await harness.make_world("alice")
    workspace = harness.engine.workspace_for(harness.world)
    (workspace / path).parent.mkdir(parents=True, exist_ok=True)
    (workspace / path).write_text(text)
    return workspace


async def test_a_file_write_is_asked_with_a_unified_diff_against_the_current_file(harness: Harness) -> None:
    await _world_with(harness, "notes.md", "title\nkeep\nold line\n")
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


async def test_a_file_nobody_may_read_unasked_is_not_shown_in_the_diff(harness: Harness) -> None:
    """The request reaches spectators too: a write does not show what a rule keeps from being read."""
    await _world_with(harness, "secrets/keys.txt", "the vault combination\n")
    await harness.engine.approvals.add_rule(harness.world, OWNER, "file_read", {"path": "secrets/*"}, "deny")
    diff = await _asked_diff(harness, "secrets/keys.txt", "replaced\n")
    assert diff["path"] == "secrets/keys.txt" and "not shown" in diff["error"]
    assert "vault combination" not in repr(await harness.events())


async def test_a_diff_too_large_to_read_is_not_made(harness: Harness) -> None:
    """An LLM's content against a large file: difflib's time grows with both, so neither side passes a cap."""
    await _world_with(harness, "big.txt", "line\n" * 100_000)  # 500 KB
    diff = await _asked_diff(harness, "big.txt", "short\n")
    assert "over 131072 bytes: not compared" in diff["error"]
    assert "text" not in diff
