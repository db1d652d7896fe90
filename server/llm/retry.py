"""Retrying transient LLM failures with exponential backoff and full jitter."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from .base import LLMError, OnText, Provider, Reply

OnRetry = Callable[[int, LLMError], Awaitable[None]]
"""Called as `on_retry(next_attempt, error)` before each retry (next_attempt is 2, 3, ...)."""


async def complete_with_retries(provider: Provider, *, model: str, messages: list[dict[str, Any]],
                                tools: list[dict[str, Any]], on_text: OnText | None = None,
                                on_retry: OnRetry | None = None, attempts: int = 3, base_delay: float = 0.25,
                                max_delay: float = 4.0) -> Reply:
    """`provider.complete(...)`, tried up to `attempts` times while the error is transient.

    `on_retry` runs before the backoff sleep so the caller can discard text the failed attempt streamed.
    A non-transient error, or the last attempt's error, is raised as is.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    attempt = 1
    while True:
        try:
            return await provider.complete(model=model, messages=messages, tools=tools, on_text=on_text)
        except LLMError as error:
            if not error.transient or attempt >= attempts:
                raise
            attempt += 1
            if on_retry is not None:
                await on_retry(attempt, error)
            # Full jitter: many agents failing together must not retry in lockstep.
            await asyncio.sleep(random.uniform(0, min(max_delay, base_delay * 2 ** (attempt - 2))))
