"""The owner's checks of an agent's endpoint from the page: which models it offers, and one tiny call."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from server.aio import import_in_thread

if TYPE_CHECKING:  # imported where first used (a check from the page): `import openai` costs ~1.5 s of startup
    import openai

TIMEOUT = 15.0  # seconds: a check the owner waits for
KEYLESS = "it is sent only to the default endpoint and to those the world's agents use: save the agent first"


def endpoint(base_url: str | None) -> str:
    """Where an `openai` agent with this base_url sends its calls (as engine.default_providers decides)."""
    return base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"


def same_endpoint(a: str | None, b: str | None) -> bool:
    return endpoint(a).rstrip("/") == endpoint(b).rstrip("/")


def api_key_missing() -> bool:
    return not os.environ.get("OPENAI_API_KEY")


OPENAI_HOST = "api.openai.com"


def lacking_key(agents: list[dict[str, Any]]) -> list[str]:
    """The `openai` agents that will fail for want of a key: the server has no OPENAI_API_KEY and their
    endpoint is OpenAI's own. One on another endpoint (a local model server, say) may need none: its agents
    get no warning."""
    if not api_key_missing():
        return []
    return [str(a.get("name")) for a in agents
            if a.get("provider") == "openai" and urlsplit(endpoint(a.get("base_url"))).hostname == OPENAI_HOST]


def _client(base_url: str | None, with_key: bool) -> openai.AsyncOpenAI:
    import openai  # loaded by then: the check imported it in a thread
    key = (os.environ.get("OPENAI_API_KEY") or "not-set") if with_key else "not-sent"
    return openai.AsyncOpenAI(api_key=key, base_url=endpoint(base_url), timeout=TIMEOUT, max_retries=0)


def explain(exc: Exception, base_url: str | None, with_key: bool = True) -> str:
    """What went wrong, and what to do about it."""
    import openai  # loaded by then: the failed check imported it
    url = endpoint(base_url)
    if isinstance(exc, openai.APIStatusError) and not with_key and exc.status_code in (401, 403):
        return f"{exc.status_code} from {url}: asked without the server's API key ({KEYLESS})"
    if isinstance(exc, openai.APIStatusError):
        hint = {401: "check OPENAI_API_KEY", 403: "check OPENAI_API_KEY and the key's permissions",
                404: "check the model name and the base URL", 429: "rate limited or out of quota: check the account"}
        return f"{exc.status_code} from {url}: {hint.get(exc.status_code, exc.message)}"
    if isinstance(exc, openai.APITimeoutError):
        return f"no answer from {url} within {TIMEOUT:g} s: check the base URL"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach {url}: check the base URL (or OPENAI_BASE_URL)"
    return f"{type(exc).__name__} from {url}: {exc}"


async def models(base_url: str | None, with_key: bool) -> list[str]:
    """The model ids the endpoint lists at /v1/models (raises what `explain` words)."""
    await import_in_thread("openai")
    from openai import Omit  # loaded just above
    async with _client(base_url, with_key) as client:
        # Without the key, the request omits Authorization (the SDK would send its placeholder key otherwise).
        page = await client.models.list(extra_headers=None if with_key else {"Authorization": Omit()})
        return sorted(model.id for model in page.data)


async def tiny_call(base_url: str | None, model: str) -> str:
    """One short completion: its text (raises what `explain` words)."""
    await import_in_thread("openai")
    async with _client(base_url, with_key=True) as client:  # the agent's saved endpoint: its calls carry the key
        reply = await client.chat.completions.create(model=model, max_tokens=8,
                                                     messages=[{"role": "user", "content": "Reply with: OK"}])
        return (reply.choices[0].message.content or "").strip() if reply.choices else ""
