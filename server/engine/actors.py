"""Who is acting: a member of a world with a role (docs/protocol.md §2)."""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .. import vocab
from ..errors import AppError


@dataclass(frozen=True)
class Actor:
    name: str
    role: str
    is_server: bool = False
    # Who this really is, whatever name it shows (server/api/context.py decides: `Principal.person`).
    # None where no login made the actor (the CLI, tests): its sender stands for it then.
    person: str | None = None

    @property
    def sender(self) -> str:
        return vocab.SERVER_SENDER if self.is_server else vocab.sender_of(self.name)

    @property
    def identity(self) -> str:
        """The person acting, for what counts people (the two-person rule): a display name is not one,
        since every login of an unnamed invite may show another, and two invites may share one."""
        return vocab.SERVER_SENDER if self.is_server else self.person or self.sender

    def require(self, allowed: Collection[str], action: str) -> None:
        """Raise `forbidden` unless this actor's role may do `action`."""
        if self.role not in allowed:
            raise AppError(vocab.FORBIDDEN, f"a {self.role} may not {action}")


SYSTEM = Actor("server", vocab.OWNER, is_server=True)  # the server itself: timeouts, recovery
