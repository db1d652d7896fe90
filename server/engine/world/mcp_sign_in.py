"""Signing a world's OAuth MCP servers in and out (issue #33): a person's deliberate act, on the record.

`start` (the owner: MCP servers are the world's) runs the SDK's flow up to the authorization URL and
returns it with its host; the page shows both and the person opens the link. The authorization server
sends the browser back to `GET /oauth/callback?code&state`: `callback` finds the sign-in by its `state`
(bound to the world, the server and the person who started it; used once; gone after `SIGN_IN_TTL`),
hands the code to the waiting flow, which exchanges it (PKCE) for tokens kept sealed in the vault.
Then `mcp_signed_in` is appended, and every process hosting the world connects the server again.
`sign_out` revokes the tokens where the authorization server offers it, deletes them, and appends
`mcp_signed_out`. No event, answer or log line carries a token.

A sign-in in flight lives in the process that started it (its PKCE verifier never leaves it); in the
distributed mode a callback that reaches another process is handed to it over the bus (sign_in_relay.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ... import events, vocab
from ...aio import import_in_thread
from ...errors import AppError
from ...log import Tag
from ...tools.mcp.forms import check_url
from ...tools.mcp.oauth import SignInNeeded, VaultStorage, host_of, remember_record, revoke, sign_in
from ...tools.mcp.oauth_http import short
from ...tools.mcp.oauth_vault import Vault
from ...tools.mcp.server import McpServerConfig, describe
from ..actors import Actor
from ..approvals.ownership import Refusals
from ..store import Store
from .sign_in_relay import relay, serve
from .tools import WorldTools, mcp_configs
from .worlds import Worlds

if TYPE_CHECKING:  # imported where first used (a sign-in): `import mcp` costs ~2 s of startup
    from mcp.shared.auth import AuthorizationCodeResult

logger = logging.getLogger(__name__)

SIGN_IN_TTL = 600.0  # seconds a started sign-in waits for the person to come back
URL_WAIT = 30.0  # seconds discovery and registration may take before there is a URL to show
MAX_PENDING = 100  # sign-ins waiting at once in this process
_NOT_YOURS = "this sign-in was started by someone else, or in another browser: sign in to the world there first"


@dataclass
class _Pending:
    world: str
    server: str
    identity: str  # who started it: only they may finish it
    sender: str  # and as the record names them
    expires: float  # time.monotonic()
    answer: asyncio.Future[AuthorizationCodeResult]
    task: asyncio.Task[None] | None = None
    listener: asyncio.Task[None] | None = None  # takes callbacks other processes relay (sign_in_relay.py)
    outcome: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class McpSignIns:
    def __init__(self, store: Store, worlds: Worlds, refusals: Refusals, world_tools: WorldTools, vault: Vault) -> None:
        self.store, self.worlds, self.refusals, self.world_tools = store, worlds, refusals, world_tools
        self.vault = vault
        world_tools.vault = vault
        self._pending: dict[str, _Pending] = {}  # by the flow's `state`
        self.relayed = False  # several processes share the worlds: a callback may land in another one

    def use_vault(self, vault: Vault) -> None:
        self.vault = self.world_tools.vault = vault

    async def _config(self, world: str, server: str) -> McpServerConfig:
        for config in mcp_configs(await self.worlds.settings(world)):
            if config.name == server:
                if not config.oauth:
                    raise AppError(vocab.INVALID, f"MCP server {server!r} does not sign in with OAuth "
                                                  '(set "oauth": true on it)')
                return config
        raise AppError(vocab.NOT_FOUND, f"no MCP server {server!r} in this world", 404)

    async def signed_in(self, world: str, settings: dict[str, Any]) -> dict[str, bool]:
        """Each OAuth server of the world: whether it holds a sign-in (never what it holds)."""
        return {config.name: await VaultStorage(self.vault, world, config).signed_in()
                for config in mcp_configs(settings) if config.oauth}

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for state, pending in list(self._pending.items()):
            if pending.expires <= now:
                self._end(state, pending)

    def _end(self, state: str, pending: _Pending) -> None:
        self._pending.pop(state, None)
        for task in (pending.task, pending.listener):
            if task is not None and not task.done():
                task.cancel()

    async def start(self, world: str, actor: Actor, server: str, redirect_uri: str) -> dict[str, Any]:
        """Begin a sign-in: {"server", "authorization_url", "host", "expires_in"} for the person to open."""
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, f"sign in to MCP server {server}")
        config = await self._config(world, server)
        self._drop_expired()
        if len(self._pending) >= MAX_PENDING:
            raise AppError("too_many_requests", "too many sign-ins are waiting: try again later", 429)
        await import_in_thread("mcp")
        loop = asyncio.get_running_loop()
        shown: asyncio.Future[str] = loop.create_future()
        pending = _Pending(world, server, actor.identity, actor.sender, time.monotonic() + SIGN_IN_TTL,
                           loop.create_future())

        async def show(url: str) -> None:
            shown.set_result(url)

        async def answer() -> AuthorizationCodeResult:
            return await pending.answer

        storage = VaultStorage(self.vault, world, config, fresh=True)
        pending.task = task = asyncio.create_task(self._run(config, storage, redirect_uri, show, answer, pending),
                                                  name=f"mcp-sign-in-{world}-{server}")
        try:
            async with asyncio.timeout(URL_WAIT):
                await asyncio.wait([shown, pending.outcome], return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            task.cancel()
            raise AppError("mcp_sign_in_failed", f"{server}: no authorization URL within {URL_WAIT:g}s", 502) from None
        if not shown.done():  # the flow ended before there was anything to open
            raise AppError("mcp_sign_in_failed", f"{server}: {await pending.outcome}", 502)
        try:  # shown as a browser reads it; no user name in it to pass for the host (`accounts.google.com@…`)
            url, host = check_url(shown.result())
        except ValueError as exc:
            task.cancel()
            raise AppError("mcp_sign_in_failed", f"{server}: the authorization URL is refused: {exc}", 502) from None
        state = (parse_qs(urlsplit(url).query).get("state") or [""])[0]
        if not state:
            task.cancel()
            raise AppError("mcp_sign_in_failed", f"{server}: the authorization URL has no state", 502)
        self._pending[state] = pending
        task.add_done_callback(lambda _: self._pending.pop(state, None))
        if self.relayed:  # the callback may reach another process: it hands it over on the bus
            ready = asyncio.Event()
            pending.listener = asyncio.create_task(
                serve(self.store.bus, state, lambda params, who: self._finish(state, params, who), ready, task),
                name=f"mcp-sign-in-relay-{world}-{server}")
            readying = asyncio.ensure_future(ready.wait())  # listening before anyone can come back
            await asyncio.wait([readying, pending.listener], return_when=asyncio.FIRST_COMPLETED)
            readying.cancel()
        return {"server": server, "authorization_url": url, "host": host, "expires_in": SIGN_IN_TTL}

    async def _run(self, config: McpServerConfig, storage: VaultStorage, redirect_uri: str,
                   show: Callable[[str], Awaitable[None]], answer: Callable[[], Awaitable[AuthorizationCodeResult]],
                   pending: _Pending) -> None:
        """The flow, to its end: tokens stored and the event appended, or the reason it failed."""
        outcome = pending.outcome
        try:
            async with asyncio.timeout(SIGN_IN_TTL + URL_WAIT):
                await sign_in(config, storage, redirect_uri, show, answer)
            host = host_of(str((storage.context.oauth_metadata.issuer if storage.context and
                                storage.context.oauth_metadata else None) or config.url))
            # Every process hosting the world connects the server again as this passes (hosting/hosted.py).
            await self.store.append(pending.world, events.mcp_signed_in(config.name, host, pending.sender),
                                    [Tag(vocab.AUDIT_TAG)])
            outcome.set_result("")
        except asyncio.CancelledError:
            if not outcome.done():
                outcome.set_result("the sign-in was not finished in time: start it again")
            raise
        except BaseException as exc:
            reason = short(str(exc) if isinstance(exc, SignInNeeded) else describe(exc))  # may quote a body
            logger.warning("signing in to MCP server %r in %s failed: %s", config.name, pending.world, reason)
            if not outcome.done():
                outcome.set_result(reason or "the sign-in failed")
            if not isinstance(exc, Exception):
                raise

    async def callback(self, state: str, params: dict[str, str],
                       who: Callable[[], Awaitable[str | None]]) -> tuple[str, str, str]:
        """What the authorization server sent back (`code`, `state`, `iss`, or `error`), in the browser of
        `who` (its person, None when signed out): handed to the waiting flow if `state` is a sign-in this
        person started, here or (`relayed`) in another process. (world, server, "" or why it failed)."""
        self._drop_expired()
        identity = await who()
        if identity is None:  # nobody's browser: refused here, before anything is relayed to another process
            raise AppError(vocab.FORBIDDEN, _NOT_YOURS, 403)
        if state not in self._pending and self.relayed and state:
            return await relay(self.store.bus, state, params, identity, URL_WAIT)
        return await self._finish(state, params, identity)

    async def _finish(self, state: str, params: dict[str, str], identity: str | None) -> tuple[str, str, str]:
        pending = self._pending.get(state)
        if pending is None or pending.answer.done():
            raise AppError(vocab.NOT_FOUND, "this sign-in is unknown, already used or expired: "
                                            "start it again from the world's page", 404)
        if identity is None or identity != pending.identity:  # kept: the one who started it may still come
            raise AppError(vocab.FORBIDDEN, _NOT_YOURS, 403)
        self._pending.pop(state, None)  # used once
        from mcp.shared.auth import AuthorizationCodeResult  # loaded by then: the flow imported it
        if params.get("error") or not params.get("code"):
            error = (params.get("error") or "no code")[:100]
            pending.answer.set_exception(SignInNeeded(f"the authorization server refused the sign-in: {error}"))
        else:
            pending.answer.set_result(AuthorizationCodeResult(code=params["code"], state=state, iss=params.get("iss")))
        try:
            async with asyncio.timeout(URL_WAIT):
                reason = await asyncio.shield(pending.outcome)
        except TimeoutError:
            reason = "the authorization server did not answer in time"
        return pending.world, pending.server, reason

    async def sign_out(self, world: str, actor: Actor, server: str) -> dict[str, Any]:
        """Revoke (where offered) and delete the server's tokens; {"server", "revoked"}."""
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, f"sign out of MCP server {server}")
        config = await self._config(world, server)
        storage = VaultStorage(self.vault, world, config)
        record = await storage.record()
        revoked = False
        if record.get("tokens"):
            await import_in_thread("mcp")
            try:
                revoked = await revoke(record, config.oauth_client)
            except Exception as exc:  # deleted all the same: the tokens are never used again from here
                logger.warning("revoking the tokens of MCP server %r in %s failed: %s", server, world,
                               short(describe(exc)))
        await self.vault.delete(world, server)
        for state, pending in list(self._pending.items()):  # a sign-in in flight for it ends too
            if pending.world == world and pending.server == server:
                self._end(state, pending)
        await self.store.append(world, events.mcp_signed_out(server, revoked, actor.sender), [Tag(vocab.AUDIT_TAG)])
        return {"server": server, "revoked": revoked}

    async def remember_every_record(self) -> None:
        """Every sign-in's tokens (and those it replaced lately) hidden from the start, wherever they show:
        not only once its world's servers connect."""
        try:
            for record in await self.vault.every_record():
                remember_record(record)
        except Exception as exc:  # each is remembered still as it is read (its world's servers connecting)
            logger.warning("could not read every MCP sign-in to hide its tokens: %s", describe(exc))

    async def forget(self, world: str, settings: dict[str, Any]) -> None:
        """A deleted world's sign-ins: deleted (not revoked: its servers' tokens simply expire unused)."""
        for config in mcp_configs(settings):
            if config.oauth:
                await self.vault.delete(world, config.name)

    async def close(self) -> None:
        for state, pending in list(self._pending.items()):
            self._end(state, pending)
        with contextlib.suppress(Exception):
            close = getattr(self.vault, "close", None)
            if close is not None:
                await close()
