"""MCP over OAuth 2.1 (issue #33): the SDK's client-side flow with the sign-in kept in the vault.

The SDK's `OAuthClientProvider` discovers the authorization server (protected resource metadata, then
its metadata), registers a client where the server offers dynamic registration, runs the code flow with
PKCE and refreshes an expired token (here also one the server refused before its expiry); it asks a
`TokenStorage` for what it knows. `VaultStorage` is that storage, over one sealed record (oauth_vault.py).
A connection never waits for a person: without a sign-in it does not start, and a sign-in that ended
(refused refresh, revoked) fails it with the reason.
The sign-in itself (`sign_in`) is driven by the engine, which shows the authorization URL to a person
and hands back what the authorization server sent to the callback route.

Every token, and the client's secret, is remembered as a secret the moment it is read or stored, so
`server/redact.py` hides it wherever it might leave (an MCP server echoing it, an error quoting it).
"""
from __future__ import annotations

import base64
import functools
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from ...redact import MAX_KNOWN, remember_secret
from .forms import check_url
from .oauth_http import oauth_client
from .oauth_vault import Vault

if TYPE_CHECKING:  # imported where first used (a server connecting): `import mcp` costs ~2 s of startup
    import httpx2
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.auth.oauth2 import OAuthContext
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthToken

    from .server import McpServerConfig

CLIENT_NAME = "Agent World"
FALLBACK_CALLBACK = "http://localhost/oauth/callback"  # a connection's redirect URI when no sign-in recorded one
MARGIN = 60.0  # seconds before its expiry a token counts as expired (at most half its lifetime)


class SignInNeeded(Exception):
    """The server wants a sign-in this process cannot do by itself: a person signs in on the page."""


RETIRED = 20  # tokens a record keeps after a refresh replaced them: still hidden after a restart


def remember_record(record: dict[str, Any]) -> None:
    """Hide the record's tokens (those it replaced lately too: a careless server's echo of one may be in the
    log) and client secret wherever they would be shown from now on."""
    tokens = record.get("tokens") or {}
    for value in (tokens.get("access_token"), tokens.get("refresh_token"), *(record.get("retired") or ()),
                  (record.get("client_info") or {}).get("client_secret")):
        remember_secret(value)


def _bounded(what: str, values: dict[str, Any], names: tuple[str, ...]) -> None:
    """SignInNeeded when one of `names` in `values` (from the untrusted authorization server) is longer than
    a token can be hidden by its value (redact.MAX_KNOWN): such a sign-in is refused, never stored."""
    for name in names:
        value = values.get(name)
        if isinstance(value, str) and len(value) > MAX_KNOWN:
            raise SignInNeeded(f"the authorization server sent a {what} {name} of {len(value)} characters "
                               f"(at most {MAX_KNOWN} are accepted): the sign-in is refused")


def _retired(record: dict[str, Any], tokens: OAuthToken) -> list[str]:
    """The record's recently replaced tokens, with those `tokens` replace now (at most RETIRED)."""
    old = record.get("tokens") or {}
    replaced = [v for k in ("access_token", "refresh_token")
                if (v := old.get(k)) and v not in (tokens.access_token, tokens.refresh_token)]
    return [*(record.get("retired") or ()), *replaced][-RETIRED:]


def host_of(url: str) -> str:
    """The host (and port) a person is sent to, as shown beside the link: as a browser reads it (IDNA, never
    a user name: `https://accounts.google.com@evil.example/` goes to evil.example)."""
    try:
        return check_url(url)[1]
    except ValueError:  # not a URL a person is sent to (McpSignIns.start refuses those): its host still
        parts = urlsplit(url)
        return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname or ""


class VaultStorage:
    """The SDK's `TokenStorage` over one server's record; it also restores what the SDK discovered
    (the authorization server's metadata, the token's expiry) so a refresh after a restart goes to
    the right token endpoint. With `fresh`, stored tokens are not offered (a new sign-in)."""

    def __init__(self, vault: Vault, world: str, config: McpServerConfig, *, fresh: bool = False) -> None:
        self.vault, self.world, self.config, self.fresh = vault, world, config, fresh
        self.context: OAuthContext | None = None  # the provider's, set once it is made
        self.redirect_uri = ""  # a sign-in's callback URL: a registration for another is not reused
        self.stored = False  # tokens were stored through this storage

    async def record(self) -> dict[str, Any]:
        """The server's record ({} when none, or when it was made for another URL, or with another client:
        tokens issued to one client are no use to another)."""
        found = await self.vault.load(self.world, self.config.name)
        if not found or found.get("url") != self.config.url or found.get("registered_client") != self._bound():
            return {}
        remember_record(found)
        return found

    def _bound(self) -> dict[str, str] | None:
        """What a record made with the owner's registered client names it by (None: it registered itself)."""
        client = self.config.oauth_client
        return {"issuer": client.get("issuer") or "", "client_id": client["client_id"]} if client else None

    async def signed_in(self) -> bool:
        return bool((await self.record()).get("tokens"))

    async def get_tokens(self) -> OAuthToken | None:
        from mcp.shared.auth import OAuthMetadata, OAuthToken, ProtectedResourceMetadata
        record = {} if self.fresh and not self.stored else await self.record()
        if not record.get("tokens"):
            return None
        if self.context is not None:  # the SDK keeps these in memory only: restored from the record
            self.context.token_expiry_time = record.get("expires_at")
            if record.get("metadata"):
                self.context.oauth_metadata = OAuthMetadata.model_validate(record["metadata"])
            if record.get("resource_metadata"):
                self.context.protected_resource_metadata = ProtectedResourceMetadata.model_validate(
                    record["resource_metadata"])
            self.context.auth_server_url = record.get("auth_server_url")
        return OAuthToken.model_validate(record["tokens"])

    async def set_tokens(self, tokens: OAuthToken) -> None:
        _bounded("token's", tokens.model_dump(), ("access_token", "refresh_token"))
        record = await self.record()
        if not record and not self.fresh:
            return  # signed out meanwhile: a refresh in flight does not bring the sign-in back
        expires_in = tokens.expires_in
        expires_at = time.time() + expires_in - min(MARGIN, expires_in / 2) if expires_in else None
        record |= {"url": self.config.url, "tokens": tokens.model_dump(mode="json", exclude_none=True),
                   "expires_at": expires_at, "updated_at": time.time(), "retired": _retired(record, tokens),
                   "redirect_uri": self.redirect_uri or record.get("redirect_uri"), "registered_client": self._bound()}
        if self.config.oauth_client is not None:  # a registration of its own from before is not this client's
            record.pop("client_info", None)
        context = self.context
        if context is not None:
            context.token_expiry_time = expires_at  # refreshed early: a token is never sent as it expires
            if context.oauth_metadata is not None:
                record["metadata"] = context.oauth_metadata.model_dump(mode="json", exclude_none=True)
            if context.protected_resource_metadata is not None:
                record["resource_metadata"] = context.protected_resource_metadata.model_dump(
                    mode="json", exclude_none=True)
            record["auth_server_url"] = context.auth_server_url
        remember_record(record)
        await self.vault.save(self.world, self.config.name, record)
        self.stored = True

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        from mcp.shared.auth import OAuthClientInformationFull
        if self.config.oauth_client is not None:  # registered by the owner: never registered here
            return await self._registered_client()
        found = (await self.record()).get("client_info")
        if not found:
            return None
        client = OAuthClientInformationFull.model_validate(found)
        if self.redirect_uri and self.redirect_uri not in [str(u) for u in client.redirect_uris or ()]:
            return None  # registered for another callback URL (the server's public address changed)
        return client

    def other_issuer(self) -> str:
        """Why a sign-in with the owner's client stopped: the MCP server names another authorization server."""
        named = (self.context.auth_server_url if self.context else None) or "another one"
        registered_at = (self.config.oauth_client or {}).get("issuer")
        return (f"the MCP server names the authorization server {named}, not {registered_at} where its client is "
                "registered: the sign-in was stopped before the client was sent there")

    async def _registered_client(self) -> OAuthClientInformationFull:
        """The owner's client (from the settings) for this sign-in's callback URL, or the one it signed in with."""
        from mcp.shared.auth import OAuthClientInformationFull
        client = self.config.oauth_client or {}
        remember_secret(client.get("client_secret"))
        callback = self.redirect_uri or (await self.record()).get("redirect_uri") or FALLBACK_CALLBACK
        # Bound to its issuer: the SDK drops a client whose issuer is not the authorization server the MCP server
        # names (SEP-2352), so its secret goes to no other (set_client_info then refuses the one it would register).
        return OAuthClientInformationFull.model_validate({
            "issuer": client.get("issuer") or None, "client_id": client["client_id"],
            "client_secret": client.get("client_secret"),
            "token_endpoint_auth_method": client.get("token_endpoint_auth_method"), "redirect_uris": [callback],
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "client_name": CLIENT_NAME})

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.config.oauth_client is not None:  # the SDK registered one of its own: not where the owner's is
            raise SignInNeeded(self.other_issuer())
        _bounded("registration's", client_info.model_dump(), ("client_id", "client_secret"))
        record = await self.record() or {"url": self.config.url}
        record["client_info"] = client_info.model_dump(mode="json", exclude_none=True)
        record["redirect_uri"] = self.redirect_uri or record.get("redirect_uri")
        remember_record(record)
        await self.vault.save(self.world, self.config.name, record)


@functools.cache
def _refreshing_provider() -> type[OAuthClientProvider]:
    from mcp.client.auth import OAuthClientProvider

    class RefreshingProvider(OAuthClientProvider):
        """The SDK's provider, except that a token the server refuses (401) before it expires is replaced, and
        the request sent once more with the new one, before the SDK's own answer to a 401 is taken: a whole
        new sign-in, which needs a person, so the connection failed ("the sign-in ended") though its refresh
        token was good. An authorization server that restarted and lost its access tokens, or rotated its
        signing keys, refuses tokens early so. The new token is the one in the vault when another process
        stored one since (it refreshed), else a refresh's; an expired one is looked up in the vault too."""

        async def _auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
            if self._initialized and not self.context.is_token_valid():
                async with self.context.lock:  # (not while a request of this process refreshes them)
                    if not self.context.is_token_valid() and self.context.current_tokens is not None:
                        # another process may have refreshed them: not refreshed twice
                        await self._stored_tokens(newer_than=self.context.current_tokens.access_token)
            flow = super()._auth_flow(request)  # (it holds the context's lock until it ends)
            try:
                sending = await flow.__anext__()
                while True:
                    response = yield sending
                    if sending is request and response.status_code == 401:
                        refused = request.headers.get("Authorization", "").removeprefix("Bearer ")
                        if await self._stored_tokens(newer_than=refused):
                            self._add_auth_header(request)
                            response = yield request
                        elif self.context.can_refresh_token():
                            refreshed = yield await self._refresh_token()
                            if await self._handle_refresh_response(refreshed):  # (else the tokens are cleared)
                                self._add_auth_header(request)
                                response = yield request  # a 401 again goes on to the SDK's flow
                    sending = await flow.asend(response)
            except StopAsyncIteration:
                return
            finally:
                await flow.aclose()

        # With the owner's registered client, the authorization server is the client's issuer, whose metadata
        # says where to authorize and where to send the secret: without it the SDK would take the (untrusted)
        # MCP server's own /authorize and /token. Checked before each step that uses them.
        async def _perform_authorization_code_grant(self) -> tuple[str, str]:
            self._at_its_issuer()
            return await super()._perform_authorization_code_grant()

        async def _exchange_token_authorization_code(self, auth_code: str, code_verifier: str) -> httpx2.Request:
            self._at_its_issuer()
            return await super()._exchange_token_authorization_code(auth_code, code_verifier)

        async def _refresh_token(self) -> httpx2.Request:
            self._at_its_issuer()
            return await super()._refresh_token()

        def _at_its_issuer(self) -> None:
            from mcp.client.auth.utils import issuers_match
            storage = self.context.storage
            client = storage.config.oauth_client if isinstance(storage, VaultStorage) else None
            if client is None:
                return
            metadata, issuer = self.context.oauth_metadata, str(client.get("issuer") or "")
            if metadata is None or not issuer or not issuers_match(str(metadata.issuer), issuer):
                raise SignInNeeded(f"no metadata of the authorization server {issuer or '(none given)'} was found "
                                   "(RFC 8414): its client is sent nowhere else, and the sign-in stopped")

        async def _stored_tokens(self, newer_than: str | None = None) -> bool:
            """Take the tokens the vault holds now (with their expiry), where they differ from the access
            token `newer_than`: in the distributed mode another process may have refreshed them, and the
            refresh token this one holds was then used up (a second refresh would end the sign-in)."""
            stored = await self.context.storage.get_tokens()
            if stored is None or (newer_than is not None and stored.access_token == newer_than):
                return False
            self.context.current_tokens = stored
            return True
    return RefreshingProvider


def _provider(config: McpServerConfig, storage: VaultStorage, redirect_uri: str,
              show: Callable[[str], Awaitable[None]],
              answer: Callable[[], Awaitable[AuthorizationCodeResult]]) -> OAuthClientProvider:
    from mcp.shared.auth import OAuthClientMetadata
    from pydantic import AnyUrl
    metadata = OAuthClientMetadata(client_name=CLIENT_NAME, redirect_uris=[AnyUrl(redirect_uri)],
                                   grant_types=["authorization_code", "refresh_token"], response_types=["code"])
    provider = _refreshing_provider()(config.url, metadata, storage, redirect_handler=show, callback_handler=answer)
    storage.context = provider.context
    return provider


async def connection_auth(config: McpServerConfig, storage: VaultStorage) -> OAuthClientProvider:
    """The auth of a connection: the stored tokens, refreshed when they expire; SignInNeeded when
    there are none, or when the server wants a new sign-in (nobody is there to do it)."""
    record = await storage.record()
    if not record.get("tokens"):
        raise SignInNeeded("not signed in: the owner signs in to it on the world's page")

    async def refuse(url: str) -> None:
        raise SignInNeeded("the sign-in ended (expired or revoked): the owner signs in again on the world's page")

    async def no_answer() -> AuthorizationCodeResult:
        raise SignInNeeded("no sign-in in progress")
    return _provider(config, storage, record.get("redirect_uri") or FALLBACK_CALLBACK, refuse, no_answer)


async def sign_in(config: McpServerConfig, storage: VaultStorage, redirect_uri: str,
                  show: Callable[[str], Awaitable[None]],
                  answer: Callable[[], Awaitable[AuthorizationCodeResult]]) -> None:
    """Run the flow once: discovery, registration, `show(authorization URL)` for a person, `answer()` for
    what came back to the callback, the code exchanged for tokens (stored), a handshake with them."""
    from mcp import ClientSession
    from mcp.client.auth.exceptions import OAuthRegistrationError
    from mcp.client.streamable_http import streamable_http_client

    from .server import innermost
    storage.redirect_uri = redirect_uri
    provider = _provider(config, storage, redirect_uri, show, answer)
    try:
        async with await oauth_client(config.url, headers=dict(config.headers), auth=provider) as client:
            async with streamable_http_client(config.url, http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
    except Exception as exc:
        refused = innermost(exc)
        if not isinstance(refused, OAuthRegistrationError):
            raise
        if config.oauth_client is not None:  # the SDK dropped the owner's client: another issuer
            raise SignInNeeded(storage.other_issuer()) from None
        # Many authorization servers register no client by itself (no dynamic registration): the owner does.
        raise SignInNeeded(f"the authorization server did not register this server as a client ({refused}): "
                           f"register one there with the redirect URI {redirect_uri}, and give its client_id "
                           "(and client_secret) as this MCP server's oauth") from None
    if not storage.stored:
        raise SignInNeeded("the server answered without asking for a sign-in: it needs none")


async def revoke(record: dict[str, Any], registered: dict[str, str] | None = None) -> bool:
    """Ask the authorization server to revoke the record's tokens (RFC 7009), where it offers that, as the
    client they were issued to: the one the record registered, or the owner's (`registered`).
    True when it accepted; False when it offers no revocation or refused."""
    endpoint = (record.get("metadata") or {}).get("revocation_endpoint")
    tokens, client = record.get("tokens") or {}, registered or record.get("client_info") or {}
    if not endpoint or not client.get("client_id"):
        return False
    headers: dict[str, str] = {}
    auth: dict[str, str] = {"client_id": client["client_id"]}
    secret = client.get("client_secret")
    if secret and client.get("token_endpoint_auth_method") == "client_secret_basic":
        pair = f"{quote(client['client_id'], safe='')}:{quote(secret, safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    elif secret:
        auth["client_secret"] = secret
    accepted = False
    async with await oauth_client(record.get("url") or "") as http:
        for hint in ("refresh_token", "access_token"):  # the refresh token first: it revokes the grant
            if tokens.get(hint):
                response = await http.post(endpoint, data={"token": tokens[hint], "token_type_hint": hint, **auth},
                                           headers=headers)
                accepted = accepted or response.status_code == 200
    return accepted
