"""Shared fixtures. Each area keeps its fixtures in tests/fixtures/<area>.py; they are gathered here."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# No test may reach a real LLM by accident: any default OpenAI client points at a closed port.
os.environ["OPENAI_API_KEY"] = "test-key-not-real"
os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"
os.environ.pop("REDIS_URL", None)
os.environ.pop("AGENT_WORLD_TOKEN", None)

from tests.fixtures.api import *  # noqa: F403
from tests.fixtures.browser import *  # noqa: F403
from tests.fixtures.engine import *  # noqa: F403
from tests.fixtures.inprocess import *  # noqa: F403
from tests.fixtures.llm import *  # noqa: F403
from tests.fixtures.mcp_oauth import *  # noqa: F403
from tests.fixtures.rendering import *  # noqa: F403
from tests.fixtures.server import *  # noqa: F403
from tests.fixtures.storage import *  # noqa: F403
from tests.fixtures.tools import *  # noqa: F403
from tests.fixtures.ws import *  # noqa: F403

# Markers follow from the fixtures a test uses (directly or through other fixtures), so a new test is
# marked without anyone remembering: `./dev test -m "not browser"` is the quick loop.
BROWSER_FIXTURES = frozenset({"chromium", "browser", "page", "context"})
REDIS_FIXTURES = frozenset({"redis_url", "private_redis", "persistent_redis", "redis_cluster"})
# `pytest -m fast`: the in-process layer (Starlette's TestClient) and the fragment renderer, in seconds.
# A module of `site` tests belongs here too: `-m fast` collects only these modules (pytest_ignore_collect).
FAST_MODULES = frozenset({"test_fast_routes.py", "test_fragments.py", "test_manage_review.py",
                          "test_revocation_paths.py", "test_fragments_hidden_text.py", "test_write_flood.py",
                          "test_inbox_socket.py", "test_streamed_markdown.py"})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m fast` exactly: import only FAST_MODULES (importing every module took longer than the tests)."""
    if config.option.markexpr == "fast" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in FAST_MODULES
    return None  # pytest decides


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        if "site" in used or item.path.name in FAST_MODULES:
            item.add_marker(pytest.mark.fast)
        # log_impl / bus_impl reach Redis through getfixturevalue: their "redis" parameter says so.
        if used & REDIS_FIXTURES or "redis" in params.values():
            item.add_marker(pytest.mark.redis)
