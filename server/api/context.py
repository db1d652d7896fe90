"""What the routes of the API (and of extensions such as the web app) share: the engine, access, presence."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute

from .. import vocab
from ..engine.actors import Actor
from ..engine.engine import Engine
from ..errors import AppError
from ..metrics import Metrics
from .flood import SEARCH_BURST, SEARCH_RATE, Floods


@dataclass(frozen=True)
class Principal:
    """Who is calling: the owner (the owner token: owner of every world) or an invitee of one world."""
    name: str
    owner: bool = False
    world: str | None = None  # an invitee's world
    role: str | None = None  # an invitee's role there
    invite: str | None = None  # the id of the invite an invitee came in with (revoking it ends their sockets)
    invite_digest: str | None = None  # its token's hash: whether it is still open is one index read
    session: str | None = None  # the keyed digest of the browser session it came from (ending it ends its sockets)

    @property
    def person(self) -> str | None:
        """Who this really is, whatever its name: the owner, or the invite an invitee came in with (every
        session and bearer use of one invite is one person). What the two-person rule counts."""
        if self.owner:
            return vocab.OWNER_PERSON
        return vocab.invitee_person(self.invite) if self.invite else None

    def role_in(self, world: str) -> str | None:
        if self.owner:
            return vocab.OWNER
        return self.role if self.world == world else None

    def world_creator(self) -> Actor:
        """The owner about to create a world (there is none to act in yet); `forbidden` for anyone else."""
        if not self.owner:
            raise AppError(vocab.FORBIDDEN, "only the owner creates worlds")
        return Actor(self.name, vocab.OWNER, person=self.person)

    def actor(self, world: str) -> Actor:
        """This principal acting in `world`, or `forbidden` when it has no role there."""
        role = self.role_in(world)
        if role is None:
            raise AppError(vocab.FORBIDDEN, f"no access to world {world!r}")
        return Actor(self.name, role, person=self.person)


class Authenticator(Protocol):
    async def authenticate(self, conn: HTTPConnection, world: str | None = None, *,
                           again: bool = False) -> Principal | None:
        """From `Authorization: Bearer <token>` or the session cookie; None when neither is valid. `again`:
        an open socket's credentials, checked once more (no guess: the wrong-token limit skips them)."""


class Presence(Protocol):
    async def join(self, world: str, member: dict[str, Any]) -> str:
        """Record a connection (member = {"name", "role"}); returns a connection id; publishes `presence`."""

    async def leave(self, world: str, connection_id: str) -> None: ...

    def members(self, world: str) -> list[dict[str, Any]]:
        """Who is connected to `world` now: [{"name", "role", "connections"}]."""


@dataclass
class AppContext:
    engine: Engine
    auth: Authenticator
    presence: Presence
    metrics: Metrics
    public_url: str  # e.g. "http://127.0.0.1:8000": the Origin WebSockets must come from
    extra: dict[str, Any] = field(default_factory=dict)
    floods: Floods = field(default_factory=Floods)  # per person and world: their frames and writes share it
    searches: Floods = field(default_factory=lambda: Floods(SEARCH_RATE, SEARCH_BURST))  # and their searches


Extension = Callable[[], Sequence[BaseRoute]]
"""An extension (entry point group `agent_world.extensions`) returns routes to mount beside the API.

Its routes find the shared `AppContext` at `request.app.state.ctx` (see `context_of`).
"""


def context_of(conn: HTTPConnection) -> AppContext:
    ctx: AppContext = conn.app.state.ctx
    return ctx
