"""What `agent-world serve` checks and prepares before it starts, each refusal one line (`StartupError`):
the port is free, the storage opens and takes writes, the data folder has room, the public URL is an
origin, and the owner token is kept in the data folder. The offline commands open storage here too."""
from __future__ import annotations

import argparse
import asyncio
import errno
import os
import secrets
import socket
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine.engine import Engine


class StartupError(Exception):
    """Why the server cannot start, in one line."""


def check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is already in use (try --port)") from None
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def check_storage(data_dir: Path, redis_url: str | None, redis_prefix: str) -> None:
    from .backends import DataDirError, DataDirLock

    if not redis_url and data_dir.is_dir():  # before SQLite, whose words for these are "disk I/O error"
        await asyncio.to_thread(_check_room, data_dir)
    async with offline_engine(data_dir, redis_url, redis_prefix) as engine:
        if not redis_url:  # one embedded server per data folder
            try:
                DataDirLock(data_dir).acquire().release()
            except DataDirError as exc:
                raise StartupError(str(exc)) from None
            await _check_log_writes(engine, data_dir)


START_SPACE = 256 * 1024  # bytes the data folder must have free to start: the first appends need room


def _check_room(data_dir: Path) -> None:
    """Fail in one line, before the banner, on a full or read-only data folder (a write is the only sure test)."""
    try:
        with tempfile.TemporaryFile(dir=data_dir) as probe:
            probe.write(b"\0" * START_SPACE)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise StartupError(f"the data folder {data_dir} cannot be written: {exc.strerror or exc}") from None


async def _check_log_writes(engine: Engine, data_dir: Path) -> None:
    """One real write to the log (the database file itself may be read-only)."""
    from .log.failures import StorageError

    try:
        await engine.check_log_writes()
    except StorageError as exc:
        raise StartupError(f"the event log in {data_dir} cannot be written: {one_line(exc)}") from None


@asynccontextmanager
async def offline_engine(data_dir: Path, redis_url: str | None, redis_prefix: str) -> AsyncIterator[Engine]:
    """An engine on the data folder or Redis URL that hosts nothing (no agent runs): for one-off commands."""
    from .backends import open_backends
    from .engine.engine import Engine
    from .tools.registry import ToolRegistry

    try:
        event_log, bus = await open_backends(data_dir=data_dir, redis_url=redis_url, redis_prefix=redis_prefix)
    except OSError as exc:
        raise StartupError(one_line(exc)) from None
    except ValueError as exc:  # only a Redis URL can be malformed
        message = one_line(exc)
        raise StartupError(message if "Redis URL" in message else f"bad Redis URL: {message}") from None
    except Exception as exc:  # e.g. redis errors that are not OSErrors
        raise StartupError(f"cannot open storage: {one_line(exc)}") from None
    try:  # (no tools: it runs none, and making the built-in ones would probe the sandbox)
        yield Engine(event_log, bus, data_dir=data_dir, tools=ToolRegistry())
    finally:
        await bus.disconnect()
        await event_log.close()


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__



OWNER_TOKEN_FILE = "owner.token"


def owner_token(data_dir: Path, shortest: int) -> tuple[str, bool]:
    """(the owner token kept in the data folder, whether it was made now): made once, 0600, then reused,
    so a restart keeps the login link and the owner's sessions (a session names the token it came from)."""
    path = data_dir / OWNER_TOKEN_FILE
    made = False
    try:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
            made = True
        os.chmod(path, 0o600)  # tighten one copied or made by hand
        token = path.read_text().strip()
    except OSError as exc:
        raise StartupError(f"cannot keep the owner token in {path}: {exc.strerror or exc}") from None
    if len(token) < shortest:
        raise StartupError(f"{path} holds no owner token of {shortest}+ characters: delete it to make a new one")
    return token, made


def check_public_url(url: str) -> None:
    """--public-url is an origin (scheme, host, port): links are made by appending to it, and the
    same-origin checks compare browsers' `Origin` with it. The app is served at /, never under a path."""
    from urllib.parse import urlsplit

    problem = None
    try:
        parts = urlsplit(url)  # as given: it is used as given (a space before https:// gave the http cookie)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError as exc:
        problem = str(exc)
    else:
        if url != url.strip():
            problem = "it has spaces around it"
        elif any(c.isspace() or not c.isprintable() for c in url):  # urlsplit drops a tab or newline inside
            problem = "it has a space or control character in it"
        elif parts.scheme.lower() not in ("http", "https"):
            problem = "it needs http:// or https://"
        elif not parts.hostname:
            problem = "it has no host"
        elif parts.username is not None or parts.password is not None:
            problem = "it holds a user name or password"
        elif parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
            problem = "the server is reached at / of its origin: no path, query or fragment"
    if problem:
        raise StartupError(f"--public-url must be the address people open, http(s)://HOST[:PORT], "
                           f"not {url!r}: {problem}")


def check_sandbox_uids() -> None:
    """AGENT_WORLD_SANDBOX_UIDS, when set, must be a range of uids worlds' users can be given."""
    from .tools.sandbox import world_users

    try:
        world_users.world_uids()
    except ValueError as exc:
        raise StartupError(str(exc)) from None


async def remember_public_url(args: argparse.Namespace, data_dir: Path, redis_url: str | None,
                               redis_prefix: str) -> None:
    """For `agent-world invite`: the address this server is reached by."""
    from . import public_address
    from .app import ServerConfig

    url = ServerConfig(data_dir=data_dir, token="", host=args.host, port=args.port, url=args.public_url).public_url
    try:
        await public_address.remember(url, data_dir=data_dir, redis_url=redis_url, redis_prefix=redis_prefix)
    except (OSError, ConnectionError) as exc:
        raise StartupError(f"cannot record the public URL: {one_line(exc)}") from None
