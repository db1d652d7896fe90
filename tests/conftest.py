"""Shared fixtures. Each area keeps its fixtures in tests/fixtures/<area>.py; they are gathered here."""
from __future__ import annotations

import os


# No test may reach a real LLM by accident: any default OpenAI client points at a closed port.
os.environ["OPENAI_API_KEY"] = "test-key-not-real"
os.environ["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"
os.environ.pop("REDIS_URL", None)
os.environ.pop("AGENT_WORLD_TOKEN", None)

from tests.fixtures.api import *  # noqa: E402,F401,F403
from tests.fixtures.engine import *  # noqa: E402,F401,F403
from tests.fixtures.llm import *  # noqa: E402,F401,F403
from tests.fixtures.server import *  # noqa: E402,F401,F403
from tests.fixtures.storage import *  # noqa: E402,F401,F403
from tests.fixtures.tools import *  # noqa: E402,F401,F403
from tests.fixtures.ws import *  # noqa: E402,F401,F403
from tests.fixtures.browser import *  # noqa: E402,F401,F403
