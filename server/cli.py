"""`agent-world`: serve worlds, and a few conveniences around a data folder (PROTOCOL §1)."""
from __future__ import annotations

import argparse
import asyncio
import errno
import os
import secrets
import socket
import sys
from pathlib import Path

from .logs import configure_logging


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


async def _check_storage(data_dir: Path, redis_url: str | None) -> None:
    from .backends import open_backends

    try:
        event_log, bus = await open_backends(data_dir=data_dir, redis_url=redis_url)
    except (OSError, ValueError) as exc:
        raise StartupError(str(exc).splitlines()[0]) from None
    except Exception as exc:  # e.g. redis errors that are not OSErrors
        raise StartupError(f"cannot open storage: {exc}") from None
    await bus.disconnect()
    await event_log.close()


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerConfig, create_app

    configure_logging(args.log_level)
    redis_url = args.redis_url or os.environ.get("REDIS_URL") or None
    token = os.environ.get("AGENT_WORLD_TOKEN") or ""
    generated = not token
    token = token or secrets.token_urlsafe(24)
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    try:
        _check_port(args.host, args.port)
        asyncio.run(_check_storage(data_dir, redis_url))
    except StartupError as exc:
        print(f"agent-world: error: {exc}", file=sys.stderr)
        return 1
    config = ServerConfig(data_dir=data_dir, token=token, host=args.host, port=args.port, redis_url=redis_url,
                          demo=not args.no_demo)
    where = "Redis at " + redis_url.split("@")[-1] if redis_url else f"data in {data_dir}"
    login = f"{config.public_url}/login?token={token}" if generated else f"{config.public_url}/ (token from AGENT_WORLD_TOKEN)"
    print(f"Agent World is serving on {config.public_url} ({where})", flush=True)
    print(f"Open: {login}", flush=True)
    server = uvicorn.Server(uvicorn.Config(
        create_app(config), host=args.host, port=args.port, log_config=None, access_log=False,
        ws_ping_interval=20, ws_ping_timeout=20, ws_max_size=1 << 20, timeout_graceful_shutdown=5,
        lifespan="on"))
    ok = server.run()
    return 0 if ok is None or ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-world", description="Worlds of LLM agents and people.")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="serve the worlds over HTTP and WebSockets")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--data-dir", default=None, help="where the embedded mode keeps its data")
    s.add_argument("--redis-url", default=None, help="distributed mode: share worlds through this Redis")
    s.add_argument("--no-demo", action="store_true", help="do not create the demo world")
    s.add_argument("--log-level", default=os.environ.get("AGENT_WORLD_LOG_LEVEL", "info"))
    s.set_defaults(run=serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
