"""Where people reach the server: `serve` writes it down beside the data, `invite` reads it back.

So `agent-world invite` prints links to the server as it actually runs (its --public-url, or its
real port), not to a guessed http://127.0.0.1:8000. Embedded: a file in the data folder.
Distributed: one Redis key under the deployment's prefix.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

FILE = "public-url"


def _key(prefix: str) -> str:
    from .log.redis.connect import escape_name  # the log's own escaping of the prefix

    return f"{{{escape_name(prefix)}}}:public-url"


async def remember(url: str, *, data_dir: Path, redis_url: str | None, redis_prefix: str) -> None:
    if redis_url:
        from .log.redis.connect import connect_redis

        client = await connect_redis(redis_url)
        try:
            await client.set(_key(redis_prefix), url)
        finally:
            await client.aclose()
    else:
        await asyncio.to_thread(_write_private, data_dir / FILE, url + "\n")


def _write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by this user only, like everything in the data folder."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


async def recall(*, data_dir: Path, redis_url: str | None, redis_prefix: str) -> str | None:
    """The URL the last server on this storage said it is reached by, if any."""
    if redis_url:
        from .log.redis.connect import connect_redis

        client = await connect_redis(redis_url)
        try:
            value = await client.get(_key(redis_prefix))
        finally:
            await client.aclose()
        return value or None
    try:
        return (await asyncio.to_thread((data_dir / FILE).read_text)).strip() or None
    except FileNotFoundError:
        return None
