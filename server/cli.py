"""`agent-world`: serve worlds, and a few conveniences around a data folder (docs/protocol.md §1)."""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import math
import os
import secrets
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends import DEFAULT_PREFIX, SQLITE_FILE, cluster_url
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

    if not redis_url and data_dir.is_dir():  # before SQLite, whose words for these are "disk I/O error"
        await asyncio.to_thread(_check_room, data_dir)
    async with _storage(data_dir, redis_url, redis_prefix) as engine:
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
        raise StartupError(f"the event log in {data_dir} cannot be written: {_one_line(exc)}") from None


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
    if redis_url and getattr(args, "redis_cluster", False):
        redis_url = cluster_url(redis_url)
    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    return data_dir, redis_url, args.redis_prefix


def _run_offline(args: argparse.Namespace, work: Callable[[Engine], Awaitable[int]], *, create: bool = False) -> int:
    """Run `work` on the storage named by `args` (`create`: a new data folder is fine); any refusal is one
    line on stderr and exit code 1."""
    from .errors import AppError
    from .log.portable import PortError

    async def go() -> int:
        data_dir, redis_url, redis_prefix = _where(args)
        if redis_url is None and not create and not (data_dir / SQLITE_FILE).exists():
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
    except PortError as exc:
        return _fail(str(exc))


def _fail(message: str) -> int:
    print(f"agent-world: error: {message}", file=sys.stderr)
    return 1


def worlds(args: argparse.Namespace) -> int:
    """`agent-world worlds [--limit N [--cursor C]]`: one line per world: its id, then its name. Read a page
    at a time; with `--limit`, one page, and the command for the next on stderr."""
    from . import vocab

    if args.cursor and not vocab.WORLD_ID.fullmatch(args.cursor):
        return _fail("--cursor must be one that a previous `agent-world worlds --limit` printed")

    async def work(engine: Engine) -> int:
        found: list[dict[str, Any]] = []
        cursor: str | None = args.cursor or ""
        while cursor is not None:
            page, cursor = await engine.list_worlds(cursor, args.limit or _CLI_PAGE)
            if args.json:
                found += page
            else:
                for w in page:
                    print(f"{w['id']}\t{w['name']}")
            if args.limit:
                if cursor is not None:
                    print(f"more: agent-world worlds --limit {args.limit} --cursor {cursor}", file=sys.stderr)
                break
        if args.json:
            print(json.dumps(found, ensure_ascii=False))
        return 0
    return _run_offline(args, work)


_CLI_PAGE = 1000  # worlds read at a time when listing them all


def invite(args: argparse.Namespace) -> int:
    """`agent-world invite WORLD --role R`: print a login URL for a new member or spectator."""
    from . import public_address, vocab
    from .engine.actors import Actor

    async def work(engine: Engine) -> int:
        data_dir, redis_url, redis_prefix = _where(args)
        url = args.url or await public_address.recall(data_dir=data_dir, redis_url=redis_url,
                                                       redis_prefix=redis_prefix) or "http://127.0.0.1:8000"
        made: dict[str, Any] = await engine.create_invite(args.world, Actor("owner", vocab.OWNER), args.role,
                                                          args.name, base_url=url)
        print(json.dumps(made) if args.json else made["url"])
        return 0
    return _run_offline(args, work)


def export(args: argparse.Namespace) -> int:
    """`agent-world export WORLD > world.jsonl`: every event of a world, with its index state."""
    async def work(engine: Engine) -> int:
        async for line in engine.export_world(args.world):
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return 0
    return _run_offline(args, work)


def import_world(args: argparse.Namespace) -> int:
    """`agent-world import world.jsonl`: a world exported from any storage, into this one."""
    async def work(engine: Engine) -> int:
        source = sys.stdin if args.file == "-" else None
        try:
            text = source.read() if source else await asyncio.to_thread(Path(args.file).read_text, encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StartupError(f"cannot read {args.file}: {_one_line(exc)}") from None
        # running distributed servers host it now
        done = await engine.import_world(text.splitlines(), allowances=args.with_allowances)
        print(f"imported world {done.world}: {done.events} events, {done.open} open items, {done.claims} claims",
              file=sys.stderr)
        from .import_report import allowances, what_it_grants  # (imports the redaction only when used)

        for line in [*allowances(done), *await what_it_grants(engine, done.world)]:
            print(line, file=sys.stderr)
        return 0
    return _run_offline(args, work, create=True)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import ServerConfig, create_app
    from .http_edge import edge_protocols

    configure_logging(args.log_level)
    os.umask(0o077)  # the data folder and everything in it (database, WAL, lock, sessions): 0700 and 0600
    data_dir, redis_url, redis_prefix = _where(args)
    from .api.auth.tokens import MIN_OWNER_TOKEN

    token = os.environ.get("AGENT_WORLD_TOKEN") or ""
    generated = not token
    made = False
    metrics_token = args.metrics_token or None
    try:
        if generated and redis_url:
            # Each replica would make up its own owner token: a login, a session or a bearer token
            # would work on one replica and be refused by the others, half of the time behind the proxy.
            raise StartupError("set AGENT_WORLD_TOKEN (32+ characters, the same for every replica) with "
                               "--redis-url/REDIS_URL: a generated owner token would differ between replicas")
        if not generated and len(token) < MIN_OWNER_TOKEN:
            raise StartupError(f"AGENT_WORLD_TOKEN has {len(token)} characters: the owner token needs at least "
                               f"{MIN_OWNER_TOKEN} (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        if metrics_token is not None and len(metrics_token) < MIN_OWNER_TOKEN:
            raise StartupError(f"the metrics token needs at least {MIN_OWNER_TOKEN} characters")
        if args.public_url:
            _check_public_url(args.public_url)
        _check_sandbox_uids()
        _check_port(args.host, args.port)
        asyncio.run(_check_storage(data_dir, redis_url, redis_prefix))
        asyncio.run(_remember_public_url(args, data_dir, redis_url, redis_prefix))
        if generated:  # after the storage checks, which say best what is wrong with the data folder
            token, made = _owner_token(data_dir, MIN_OWNER_TOKEN)
    except StartupError as exc:
        print(f"agent-world: error: {exc}", file=sys.stderr)
        return 1
    config = ServerConfig(data_dir=data_dir, token=token, host=args.host, port=args.port, redis_url=redis_url,
                          redis_prefix=redis_prefix, demo=not args.no_demo, url=args.public_url or None,
                          metrics_token=metrics_token)
    where = "Redis at " + redis_url.split("@")[-1] if redis_url else f"data in {data_dir}"
    login = (f"{config.public_url}/login?token={token}" if generated
             else f"{config.public_url}/ (sign in there with the token in AGENT_WORLD_TOKEN)")
    print(f"Agent World is serving on {config.public_url} ({where})", flush=True)
    print(f"Open: {login}", flush=True)
    if made:
        print(f"The owner token was made and kept in {data_dir / OWNER_TOKEN_FILE} (0600): the link above "
              "stays valid across restarts", flush=True)
    from .tools.sandbox import bubblewrap as sandbox  # one line: whether tool commands run sandboxed, and if not, why

    print(sandbox.configure(unsafe=args.unsafe_no_sandbox, hidden=[data_dir]).startup_line(), flush=True)
    # Request heads that take longer are closed, and one address holds a bounded number of connections
    # (server/http_edge.py).
    http, ws = edge_protocols(args.header_timeout, args.connections_per_address, args.forwarded_allow_ips)
    server = uvicorn.Server(uvicorn.Config(
        create_app(config), host=args.host, port=args.port, log_config=None, access_log=False,
        ws_ping_interval=20, ws_ping_timeout=20, ws_max_size=1 << 20, timeout_graceful_shutdown=5,
        # Compressing every frame once per connection costs 10x the fan-out latency (bench/fanout.py).
        ws_per_message_deflate=False,
        # X-Forwarded-For/-Proto are believed only from these addresses (the proxy's); by default from nobody,
        # not even loopback: any local client could otherwise rotate its address past the wrong-token limit.
        proxy_headers=bool(args.forwarded_allow_ips), forwarded_allow_ips=args.forwarded_allow_ips or None,
        http=http, ws=ws,
        lifespan="on"))
    server.run()  # a failed start-up exits by itself (uvicorn: status 3)
    return 0


OWNER_TOKEN_FILE = "owner.token"


def _owner_token(data_dir: Path, shortest: int) -> tuple[str, bool]:
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


def _check_public_url(url: str) -> None:
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


def _check_sandbox_uids() -> None:
    """AGENT_WORLD_SANDBOX_UIDS, when set, must be a range of uids worlds' users can be given."""
    from .tools.sandbox import world_users

    try:
        world_users.world_uids()
    except ValueError as exc:
        raise StartupError(str(exc)) from None


async def _remember_public_url(args: argparse.Namespace, data_dir: Path, redis_url: str | None,
                               redis_prefix: str) -> None:
    """For `agent-world invite`: the address this server is reached by."""
    from . import public_address
    from .app import ServerConfig

    url = ServerConfig(data_dir=data_dir, token="", host=args.host, port=args.port, url=args.public_url).public_url
    try:
        await public_address.remember(url, data_dir=data_dir, redis_url=redis_url, redis_prefix=redis_prefix)
    except (OSError, ConnectionError) as exc:
        raise StartupError(f"cannot record the public URL: {_one_line(exc)}") from None


def _count(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number (0 or more): {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def _port(text: str) -> int:
    """argparse type: a TCP port number."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r} (1 to 65535)")
    return int(text)


def _positive(text: str) -> int:
    """argparse type: a page size (1 to 1,000)."""
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"not a page size: {text!r} (1 to 1000)")
    return int(text)


def redis_prefix_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-prefix", default=os.environ.get("AGENT_WORLD_REDIS_PREFIX") or DEFAULT_PREFIX,
                        help="the namespace of this deployment's keys and channels in Redis: deployments "
                             f"sharing one Redis use different ones (default: $AGENT_WORLD_REDIS_PREFIX or "
                             f"{DEFAULT_PREFIX!r})")
    parser.add_argument("--redis-cluster", action="store_true", help="the Redis URL is a node of a Redis Cluster "
                        "(the same as a redis+cluster://host:port URL)")


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
    s.add_argument("--public-url", default=os.environ.get("AGENT_WORLD_PUBLIC_URL") or None,
                   help="the address people reach this server by, e.g. behind a proxy (links, cookies, the "
                        "Origin check; https gives __Host- Secure cookies): default http://HOST:PORT")
    s.add_argument("--forwarded-allow-ips", default=os.environ.get("FORWARDED_ALLOW_IPS") or "",
                   help="comma-separated addresses or networks of the reverse proxy, whose X-Forwarded-For and "
                        "X-Forwarded-Proto headers are believed (default: $FORWARDED_ALLOW_IPS, else nobody's)")
    s.add_argument("--header-timeout", type=_seconds, default=10.0,
                   help="seconds a request's line and headers may take to arrive before the connection is "
                        "closed (default: 10)")
    s.add_argument("--connections-per-address", type=_count, default=256,
                   help="connections one client address may hold open at once, WebSockets included; past it a "
                        "new one is answered 503 (default: 256; 0: no cap; the "
                        "--forwarded-allow-ips proxies are never capped)")
    s.add_argument("--metrics-token", default=os.environ.get("AGENT_WORLD_METRICS_TOKEN") or None,
                   help="a bearer token that may read /metrics besides the owner's "
                        "(default: $AGENT_WORLD_METRICS_TOKEN)")
    s.add_argument("--log-level", default=os.environ.get("AGENT_WORLD_LOG_LEVEL", "info"))
    s.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run shell commands and MCP servers without the bubblewrap sandbox, with this server's "
                        "rights (only where the sandbox cannot work and you accept that)")
    s.set_defaults(run=serve)

    def storage_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=None, help="the embedded mode's data folder")
        p.add_argument("--redis-url", default=None, help="the Redis of the distributed mode")
        redis_prefix_flag(p)
        p.add_argument("--json", action="store_true", help="print JSON")

    w = commands.add_parser("worlds", help="list the worlds")
    storage_flags(w)
    w.add_argument("--limit", type=_positive, default=None, help="print one page of at most this many worlds")
    w.add_argument("--cursor", default="", help="the page after this cursor (printed with --limit)")
    w.set_defaults(run=worlds)
    i = commands.add_parser("invite", help="print an invite URL to a world")
    i.add_argument("world")
    i.add_argument("--role", required=True, choices=["member", "spectator"])
    i.add_argument("--name", default=None, help="the invitee's display name (default: a guest-xxxx name)")
    i.add_argument("--url", default=os.environ.get("AGENT_WORLD_PUBLIC_URL") or os.environ.get("AGENT_WORLD_URL"),
                   help="the server's public URL (default: $AGENT_WORLD_PUBLIC_URL, $AGENT_WORLD_URL, or the URL "
                        "the last `serve` on this storage was reached by)")
    storage_flags(i)
    i.set_defaults(run=invite)
    e = commands.add_parser("export", help="print a world as JSON Lines: every event, seq and open item")
    e.add_argument("world")
    storage_flags(e)
    e.set_defaults(run=export)
    m = commands.add_parser("import", help="add a world exported by `agent-world export` (from any storage)")
    m.add_argument("file", help="the export file, or - for standard input")
    m.add_argument("--with-allowances", action="store_true",
                   help="keep the file's allow rules and session grants (default: each is listed and revoked)")
    storage_flags(m)
    m.set_defaults(run=import_world)
    a = commands.add_parser("attach", help="a terminal client of a world on a running server (the JSON WebSocket)")
    a.add_argument("world")
    a.add_argument("--url", default=os.environ.get("AGENT_WORLD_URL") or "http://127.0.0.1:8000",
                   help="the server's URL (default: $AGENT_WORLD_URL or http://127.0.0.1:8000)")
    a.add_argument("--token", default=None, help="an owner or invite token (default: $AGENT_WORLD_TOKEN)")
    a.add_argument("--chat", default=None, help="show only this chat, and send into it (default: every chat; "
                   "messages go to the newest)")
    a.set_defaults(run=attach)
    return parser


def attach(args: argparse.Namespace) -> int:
    # The client imports nothing of the server; the server's CLI only hands it the arguments.
    from agent_world_client.tui import run

    token = args.token or os.environ.get("AGENT_WORLD_TOKEN")
    if not token:
        print("agent-world attach: give --token or set AGENT_WORLD_TOKEN", file=sys.stderr)
        return 2
    return run(args.url, args.world, token, chat=args.chat)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
