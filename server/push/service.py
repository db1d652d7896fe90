"""Web Push assembled for the app: its key, the subscriptions, the sender (server/app.py starts and stops it)."""
from __future__ import annotations

from pathlib import Path

from ..api.context import Presence
from ..engine.engine import Engine
from .keys import open_key
from .sender import Push
from .subscriptions import RedisSubscriptions, SqliteSubscriptions, Subscriptions

FALLBACK_SUBJECT = "mailto:push@agent-world.invalid"


async def open_push(engine: Engine, presence: Presence, *, data_dir: Path, redis_url: str | None,
                    redis_prefix: str, public_url: str) -> Push:
    """A started sender. The VAPID `sub` claim is the server's https address, where it has one."""
    key = await open_key(data_dir=data_dir, redis_url=redis_url, redis_prefix=redis_prefix)
    subscriptions: Subscriptions = (await RedisSubscriptions.open(redis_url, redis_prefix) if redis_url
                                    else await SqliteSubscriptions.open(Path(data_dir)))
    subject = public_url if public_url.startswith("https://") else FALLBACK_SUBJECT
    push = Push(engine, presence, subscriptions, key, subject)
    push.start()
    return push


async def close_push(push: Push) -> None:
    await push.stop()
    await push.subscriptions.close()
