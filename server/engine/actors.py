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

    @property
    def sender(self) -> str:
        return vocab.SERVER_SENDER if self.is_server else vocab.sender_of(self.name)

    def require(self, allowed: Collection[str], action: str) -> None:
        """Raise `forbidden` unless this actor's role may do `action`."""
        if self.role not in allowed:
            raise AppError(vocab.FORBIDDEN, f"a {self.role} may not {action}")


SYSTEM = Actor("server", vocab.OWNER, is_server=True)  # the server itself: timeouts, recovery
