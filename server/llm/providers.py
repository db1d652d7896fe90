"""The providers a server's agents use by default, one per endpoint, closed with the engine."""
from __future__ import annotations

import os
from typing import Any

from .base import Provider


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
                from .openai_provider import OpenAIProvider  # the openai SDK costs ~1.5 s to import: only when used
                self._cache[key] = OpenAIProvider(api_key=os.environ.get("OPENAI_API_KEY") or "not-set",
                                                  base_url=base_url)
        return self._cache[key]

    async def aclose(self) -> None:
        """Close every provider's connections; a later call makes fresh ones."""
        providers, self._cache = list(self._cache.values()), {}
        for provider in providers:
            if (close := getattr(provider, "aclose", None)) is not None:
                await close()
