"""The providers a server's agents use by default, one per endpoint, closed with the engine."""
from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from ..aio import import_in_thread
from .base import LLMError, OnText, Provider, Reply

if TYPE_CHECKING:
    from .openai_provider import OpenAIProvider


class DefaultProviders:
    """`openai` agents talk to OPENAI_BASE_URL (or their own base_url); `scripted` ones run offline.

    Providers are shared per endpoint (an `openai` one holds an HTTP connection pool) and live until
    `aclose`, which the engine calls when it stops: a dropped client would leave its sockets open.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str | None], Provider] = {}

    def __call__(self, config: dict[str, Any]) -> Provider:
        from .scripted import ScriptedProvider, demo_script

        if config["provider"] == "scripted":
            key = ("scripted", config["name"])
            if key not in self._cache:
                self._cache[key] = ScriptedProvider(demo_script(config["name"]), delay=0.02)
        else:
            base_url = config.get("base_url") or os.environ.get("OPENAI_BASE_URL") or None
            key = ("openai", base_url)
            if key not in self._cache:
                self._cache[key] = _OpenAIWhenUsed(api_key=os.environ.get("OPENAI_API_KEY") or "not-set",
                                                   base_url=base_url)
        return self._cache[key]

    async def aclose(self) -> None:
        """Close every provider's connections; a later call makes fresh ones."""
        providers, self._cache = list(self._cache.values()), {}
        for provider in providers:
            if (close := getattr(provider, "aclose", None)) is not None:
                await close()


class _OpenAIWhenUsed:
    """An `OpenAIProvider` made at its first call, after importing the openai SDK in a thread.

    The SDK takes ~1.5 s of CPU to import: `serve` should not pay it before it answers, and the event
    loop should not stop for it, nor for the client's making, at a world's first LLM call (sockets,
    heartbeats and leases go on).
    """

    def __init__(self, *, api_key: str, base_url: str | None) -> None:
        self._api_key, self._base_url = api_key, base_url
        self._provider: OpenAIProvider | None = None
        self._making: asyncio.Task[OpenAIProvider] | None = None  # one for all first calls at once
        self._closed = False

    async def complete(self, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                       on_text: OnText | None = None, first_token_timeout: float | None = None,
                       reply_limit: int | None = None) -> Reply:
        provider = self._provider
        if provider is None:
            if self._making is None:
                self._making = asyncio.create_task(self._make(), name="openai-client")
                self._making.add_done_callback(_seen)
            # Shielded: a first caller cancelled meanwhile leaves the making to the others.
            provider = await asyncio.shield(self._making)
        return await provider.complete(model=model, messages=messages, tools=tools, on_text=on_text,
                                       first_token_timeout=first_token_timeout, reply_limit=reply_limit)

    async def _make(self) -> OpenAIProvider:
        try:
            module = await import_in_thread("server.llm.openai_provider")
            # Made in a thread too: its HTTP client loads the system's CA certificates (90-140 ms).
            provider: OpenAIProvider = await asyncio.to_thread(module.OpenAIProvider, api_key=self._api_key,
                                                               base_url=self._base_url)
        except BaseException:
            self._making = None  # the next call tries again
            raise
        if self._closed:  # stopped meanwhile: a client kept now would never be closed
            await provider.aclose()
            raise LLMError("the server is stopping", transient=False)
        self._provider = provider
        return provider

    async def aclose(self) -> None:
        self._closed = True
        if self._making is not None:  # a client being made is closed as soon as it is
            await asyncio.gather(self._making, return_exceptions=True)
        if self._provider is not None:
            await self._provider.aclose()


def _seen(task: asyncio.Task[Any]) -> None:
    """Its failure is raised to every caller waiting; with none left (all cancelled), it is not logged as lost."""
    if not task.cancelled():
        task.exception()
