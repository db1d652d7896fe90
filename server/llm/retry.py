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
                                max_delay: float = 4.0, timeout: float | None = None,
                                first_token_timeout: float | None = None, reply_limit: int | None = None) -> Reply:
    """`provider.complete(...)`, tried up to `attempts` times while the error is transient.

    `on_retry` runs before the backoff sleep so the caller can discard text the failed attempt streamed.
    A non-transient error, or the last attempt's error, is raised as is. `timeout` bounds the whole call,
    retries included; `first_token_timeout` each attempt's wait for its first fragment. Both end as an
    `LLMError` that names the setting, as does a reply longer than `reply_limit` characters.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    try:
        async with asyncio.timeout(timeout):
            return await _attempts(provider, model, messages, tools, on_text, on_retry, attempts, base_delay,
                                   max_delay, first_token_timeout, reply_limit)
    except TimeoutError:
        raise LLMError(f"the LLM call took longer than {timeout:g} s (llm_timeout)", transient=False) from None


async def _attempts(provider: Provider, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    on_text: OnText | None, on_retry: OnRetry | None, attempts: int, base_delay: float,
                    max_delay: float, first_token_timeout: float | None, reply_limit: int | None) -> Reply:
    attempt = 1
    while True:
        try:
            return await provider.complete(model=model, messages=messages, tools=tools, on_text=on_text,
                                           first_token_timeout=first_token_timeout, reply_limit=reply_limit)
        except LLMError as error:
            if not error.transient or attempt >= attempts:
                raise
            attempt += 1
            if on_retry is not None:
                await on_retry(attempt, error)
            # Full jitter: many agents failing together must not retry in lockstep.
            await asyncio.sleep(random.uniform(0, min(max_delay, base_delay * 2 ** (attempt - 2))))
