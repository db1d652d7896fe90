"""`agent-world`: serve worlds, and a few conveniences around a data folder (PROTOCOL §1)."""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends import DEFAULT_PREFIX, SQLITE_FILE
from .logs import configure_logging

if TYPE_CHECKING:
    from .engine.engine import Engine


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "agent-world"


class StartupError(Exception):
    """Why the server cannot start, in one line."""


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(f"port {port} on {host} is already in use (try --port)") from None
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def _check_storage(data_dir: Path, redis_url: str | None, redis_prefix: str) -> None:
    from .backends import DataDirError, DataDirLock

    async with _storage(data_dir, redis_url, redis_prefix):
        if not redis_url:  # one embedded server per data folder
            try:
                DataDirLock(data_dir).acquire().release()
            except DataDirError as exc:
                raise StartupError(str(exc)) from None


@asynccontextmanager
async def _storage(data_dir: Path, redis_url: str | None, redis_prefix: str) -> AsyncIterator[Engine]:
    """An engine on the data folder or Redis URL that hosts nothing (no agent runs): for one-off commands."""
    from .backends import open_backends
    from .engine.engine import Engine

    try:
        event_log, bus = await open_backends(data_dir=data_dir, redis_url=redis_url, redis_prefix=redis_prefix)
    except OSError as exc:
        raise StartupError(_one_line(exc)) from None
    except ValueError as exc:  # only a Redis URL can be malformed
        message = _one_line(exc)
        raise StartupError(message if "Redis URL" in message else f"bad Redis URL: {message}") from None
    except Exception as exc:  # e.g. redis errors that are not OSErrors
        raise StartupError(f"cannot open storage: {_one_line(exc)}") from None
    try:
        yield Engine(event_log, bus, data_dir=data_dir)
    finally:
        await bus.disconnect()
        await event_log.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _where(args: argparse.Namespace) -> tuple[Path, str | None, str]:
    """The data folder, Redis URL and Redis prefix a command works on (flags, then the environment, then defaults)."""
    redis_url = args.redis_url or os.environ.get("REDIS_URL") or None
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    return data_dir, redis_url, args.redis_prefix


def _run_offline(args: argparse.Namespace, work: Callable[[Engine], Awaitable[int]]) -> int:
    """Run `work` on the storage named by `args`; any refusal is one line on stderr and exit code 1."""
    from .errors import AppError

    async def go() -> int:
        data_dir, redis_url, redis_prefix = _where(args)
        if redis_url is None and not (data_dir / SQLITE_FILE).exists():
            # Do not create an empty store by mistake: a typo in --data-dir would look like "no worlds".
            raise StartupError(f"no Agent World data in {data_dir} (check --data-dir)")
        async with _storage(data_dir, redis_url, redis_prefix) as engine:
            return await work(engine)
    try:
        return asyncio.run(go())
    except StartupError as exc:
        return _fail(str(exc))
    except AppError as exc:
        return _fail(exc.message)


def _fail(message: str) -> int:
    print(f"agent-world: error: {message}", file=sys.stderr)
    return 1


def worlds(args: argparse.Namespace) -> int:
    """`agent-world worlds`: one line per world: its id, then its name."""
    async def work(engine: Engine) -> int:
        found = await engine.worlds.list()
        lines = [json.dumps(found, ensure_ascii=False)] if args.json else [f"{w['id']}\t{w['name']}" for w in found]
        for line in lines:
            print(line)
        return 0
    return _run_offline(args, work)


def invite(args: argparse.Namespace) -> int:
    """`agent-world invite WORLD --role R`: print a login URL for a new member or spectator."""
    from . import vocab
    from .api.auth import create_invite
    from .engine.actors import Actor

    async def work(engine: Engine) -> int:
        made: dict[str, Any] = await create_invite(engine, args.world, Actor("owner", vocab.OWNER), args.role,
                                                   args.name, base_url=args.url)
        print(json.dumps(made) if args.json else made["url"])
        return 0
    return _run_offline(args, work)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerConfig, create_app

    configure_logging(args.log_level)
    data_dir, redis_url, redis_prefix = _where(args)
    token = os.environ.get("AGENT_WORLD_TOKEN") or ""
    generated = not token
    token = token or secrets.token_urlsafe(24)
    try:
        _check_port(args.host, args.port)
        asyncio.run(_check_storage(data_dir, redis_url, redis_prefix))
    except StartupError as exc:
        print(f"agent-world: error: {exc}", file=sys.stderr)
        return 1
    config = ServerConfig(data_dir=data_dir, token=token, host=args.host, port=args.port, redis_url=redis_url,
                          redis_prefix=redis_prefix, demo=not args.no_demo)
    where = "Redis at " + redis_url.split("@")[-1] if redis_url else f"data in {data_dir}"
    login = f"{config.public_url}/login?token={token}" if generated else f"{config.public_url}/ (token from AGENT_WORLD_TOKEN)"
    print(f"Agent World is serving on {config.public_url} ({where})", flush=True)
    print(f"Open: {login}", flush=True)
    server = uvicorn.Server(uvicorn.Config(
        create_app(config), host=args.host, port=args.port, log_config=None, access_log=False,
        ws_ping_interval=20, ws_ping_timeout=20, ws_max_size=1 << 20, timeout_graceful_shutdown=5,
        # Compressing every frame once per connection costs 10x the fan-out latency (bench/fanout.py).
        ws_per_message_deflate=False,
        lifespan="on"))
    ok = server.run()
    return 0 if ok is None or ok else 1


def _port(text: str) -> int:
    """argparse type: a TCP port number."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r} (1 to 65535)")
    return int(text)


def redis_prefix_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-prefix", default=os.environ.get("AGENT_WORLD_REDIS_PREFIX") or DEFAULT_PREFIX,
                        help="the namespace of this deployment's keys and channels in Redis: deployments "
                             f"sharing one Redis use different ones (default: $AGENT_WORLD_REDIS_PREFIX or "
                             f"{DEFAULT_PREFIX!r})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-world", description="Worlds of LLM agents and people.")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="serve the worlds over HTTP and WebSockets")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_port, default=8000)
    s.add_argument("--data-dir", default=None, help="where the embedded mode keeps its data")
    s.add_argument("--redis-url", default=None, help="distributed mode: share worlds through this Redis")
    redis_prefix_flag(s)
    s.add_argument("--no-demo", action="store_true", help="do not create the demo world")
    s.add_argument("--log-level", default=os.environ.get("AGENT_WORLD_LOG_LEVEL", "info"))
    s.set_defaults(run=serve)

    def storage_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=None, help="the embedded mode's data folder")
        p.add_argument("--redis-url", default=None, help="the Redis of the distributed mode")
        redis_prefix_flag(p)
        p.add_argument("--json", action="store_true", help="print JSON")

    w = commands.add_parser("worlds", help="list the worlds")
    storage_flags(w)
    w.set_defaults(run=worlds)
    i = commands.add_parser("invite", help="print an invite URL to a world")
    i.add_argument("world")
    i.add_argument("--role", required=True, choices=["member", "spectator"])
    i.add_argument("--name", default=None, help="the invitee's display name (default: a guest-xxxx name)")
    i.add_argument("--url", default=os.environ.get("AGENT_WORLD_URL", "http://127.0.0.1:8000"),
                   help="the server's public URL (default: $AGENT_WORLD_URL or http://127.0.0.1:8000)")
    storage_flags(i)
    i.set_defaults(run=invite)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
