"""`agent-world`: serve worlds, and a few conveniences around a data folder (docs/protocol.md §1)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends import DEFAULT_PREFIX, SQLITE_FILE, cluster_url
from .logs import configure_logging
from .runtime import tune_allocator
from .startup import (
    OWNER_TOKEN_FILE,
    StartupError,
    check_port,
    check_public_url,
    check_sandbox_uids,
    check_storage,
    offline_engine,
    one_line,
    owner_token,
    remember_public_url,
)

if TYPE_CHECKING:
    from .engine.engine import Engine
    from .tools.sandbox.bubblewrap import Status


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "agent-world"


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
        async with offline_engine(data_dir, redis_url, redis_prefix) as engine:
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
            raise StartupError(f"cannot read {args.file}: {one_line(exc)}") from None
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
    from .api.auth.tokens import MIN_OWNER_TOKEN
    from .tools.mcp.oauth_vault import KEY_ENV, given_key

    tune_allocator()  # before any thread starts
    configure_logging(args.log_level)
    os.umask(0o077)  # the data folder and everything in it (database, WAL, lock, sessions): 0700 and 0600
    data_dir, redis_url, redis_prefix = _where(args)
    token = os.environ.get("AGENT_WORLD_TOKEN") or ""
    generated = not token
    made = False
    metrics_token = args.metrics_token or None
    mcp_oauth_key = os.environ.get(KEY_ENV) or None
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
            check_public_url(args.public_url)
        if mcp_oauth_key is not None:
            try:
                given_key(mcp_oauth_key)
            except ValueError as exc:
                raise StartupError(str(exc)) from None
        check_sandbox_uids()
        check_port(args.host, args.port)
        probed = _probe_sandbox(args, data_dir)  # beside what follows
        asyncio.run(check_storage(data_dir, redis_url, redis_prefix))
        asyncio.run(remember_public_url(args, data_dir, redis_url, redis_prefix))
        if generated:  # after the storage checks, which say best what is wrong with the data folder
            token, made = owner_token(data_dir, MIN_OWNER_TOKEN)
    except StartupError as exc:
        print(f"agent-world: error: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    from .app import ServerConfig, create_app
    from .http_edge import edge_protocols

    config = ServerConfig(data_dir=data_dir, token=token, host=args.host, port=args.port, redis_url=redis_url,
                          redis_prefix=redis_prefix, demo=not args.no_demo, url=args.public_url or None,
                          metrics_token=metrics_token, mcp_oauth_key=mcp_oauth_key)
    where = "Redis at " + redis_url.split("@")[-1] if redis_url else f"data in {data_dir}"
    login = (f"{config.public_url}/login?token={token}" if generated
             else f"{config.public_url}/ (sign in there with the token in AGENT_WORLD_TOKEN)")
    print(f"Agent World is serving on {config.public_url} ({where})", flush=True)
    print(f"Open: {login}", flush=True)
    if made:
        print(f"The owner token was made and kept in {data_dir / OWNER_TOKEN_FILE} (0600): the link above "
              "stays valid across restarts", flush=True)
    print(probed.result().startup_line(), flush=True)  # whether tool commands run sandboxed, and if not, why
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
    try:
        server.run()  # a failed start-up exits by itself (uvicorn: status 3)
    except KeyboardInterrupt:  # Ctrl+C: uvicorn stopped gracefully, then raised it again for its caller
        pass
    return 0


def _probe_sandbox(args: argparse.Namespace, data_dir: Path) -> Future[Status]:
    """Probe the sandbox in a thread (two sandboxes, 0.1-0.3 s, mostly waiting) while the start goes on:
    the storage checks import most of the server meanwhile (their engine makes no tools, so nothing asks
    for the sandbox before this probe ends). The probe covers the data folder, which must exist for that
    under a system directory: the checks would make it next anyway, and say why when they cannot."""
    from .tools.sandbox import bubblewrap as sandbox

    with contextlib.suppress(OSError):
        data_dir.mkdir(parents=True, exist_ok=True)
    pool = ThreadPoolExecutor(1, thread_name_prefix="sandbox-probe")
    probed = pool.submit(sandbox.configure, unsafe=args.unsafe_no_sandbox, hidden=[data_dir])
    pool.shutdown(wait=False)  # (its thread ends with the probe)
    return probed


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
