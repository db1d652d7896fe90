"""Invites to a world: made, listed and revoked by its owner; the log keeps only each token's SHA-256."""
from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any
from urllib.parse import quote

from ... import events, vocab
from ...errors import AppError
from ...log import Close, Conflict, Open, Tag
from ..actors import Actor
from ..approvals.ownership import Refusals
from ..store import Store
from .worlds import Worlds

INVITE_ROLES = (vocab.MEMBER, vocab.SPECTATOR)
OWNER_NAME = "owner"
_MEMBER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,39}$")
_RESERVED_NAMES = {OWNER_NAME, vocab.SERVER_SENDER}


def invite_key(token_hash: str) -> str:
    """The open-item key of an invite: only the token's SHA-256 is ever stored."""
    return f"invite:{token_hash}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_member_name(name: object) -> str:
    """A valid invitee display name, or raise `invalid`."""
    if not isinstance(name, str) or not _MEMBER_NAME.match(name) or name.lower() in _RESERVED_NAMES:
        raise AppError(vocab.INVALID, "a member name has 1 to 40 letters, digits, spaces, '_', '.' or '-' "
                                      "and is not 'owner' or 'server'")
    return name


def member_name(invite: dict[str, Any]) -> str:
    """The name an invitee shows: the invite's, or for an unnamed one `guest-xxxx` from its id (the
    same in every session and for the bearer token: one invite, one name)."""
    name = invite.get("name")
    return name if isinstance(name, str) and name else f"guest-{invite['id'][-4:]}"


def shown_invite(invite: dict[str, Any]) -> dict[str, Any]:
    """An invite record as the owner's list and page show it: with the name its holder shows."""
    return {**invite, "name": member_name(invite)}


class Invites:
    def __init__(self, store: Store, worlds: Worlds, refusals: Refusals) -> None:
        self.store, self.worlds, self.refusals = store, worlds, refusals

    async def create(self, world: str, actor: Actor, role: object, name: object = None, *,
                     base_url: str = "") -> dict[str, Any]:
        """Store a new invite to `world` (only its token's SHA-256): {"url", "token", "role", "name", "id"};
        `name` is what its holder shows (`member_name`: a `guest-xxxx` for an unnamed one)."""
        await self.worlds.get(world)  # not_found for an unknown world
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, "invite people")
        if role not in INVITE_ROLES:
            raise AppError(vocab.INVALID, f"role must be one of {', '.join(INVITE_ROLES)}")
        if name is not None:
            name = check_member_name(name)
        # The world travels in the token, so a bearer token is found with one index read of one world.
        token = f"{world}.{secrets.token_urlsafe(24)}"
        invite = {"id": vocab.new_id("invite")[:19], "role": role, "name": name}
        digest = token_hash(token)
        # The hash is kept in the event too, so the invite can be revoked by its id (clients never see it).
        await self.store.append(
            world, events.invite_created(invite, actor.sender, digest),
            [Open(invite_key(digest)), Tag(vocab.AUDIT_TAG)])
        url = f"{base_url.rstrip('/')}/login?world={quote(world, safe='')}&token={quote(token, safe='')}"
        return {"url": url, "token": token, "role": role, "name": member_name(invite), "id": invite["id"]}

    async def list(self, world: str, actor: Actor) -> list[dict[str, Any]]:
        """The invites to `world` that still work: id, role, name, when and by whom (never a token)."""
        await self.worlds.get(world)
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, "list invites")
        return [{**shown_invite(event["invite"]), "created": event["ts"], "by": event["sender"]}
                for event in await self.store.log.list_open(world, "invite:")]

    async def revoke(self, world: str, actor: Actor, invite_id: str) -> None:
        """End an invite: its token and every session it gave stop working at once."""
        await self.worlds.get(world)
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, "revoke invites")
        opened = [e for e in await self.store.log.list_open(world, "invite:") if e["invite"]["id"] == invite_id]
        if not opened or not isinstance(opened[0].get("token_sha256"), str):
            # (invites made before they carried their token's hash cannot be revoked by id)
            raise AppError(vocab.NOT_FOUND, f"no revocable invite {invite_id!r} in this world")
        try:
            await self.store.append(
                world, events.invite_revoked(invite_id, actor.sender),
                [Close(invite_key(opened[0]["token_sha256"])), Tag(vocab.AUDIT_TAG)])
        except Conflict:
            raise AppError(vocab.NOT_FOUND, f"invite {invite_id!r} was already revoked") from None

    async def find(self, world: str, digest: str) -> dict[str, Any] | None:
        """The open invite of `world` whose token hashes to `digest` (one index read)."""
        event = await self.store.log.get_open(world, invite_key(digest))
        return event["invite"] if event else None

    async def hashes(self) -> dict[str, str]:
        """token hash -> world, for every open invite that kept its hash (tokens that do not name their world)."""
        found: dict[str, str] = {}
        for world in await self.store.log.worlds():
            for event in await self.store.log.list_open(world, "invite:"):
                if isinstance(event.get("token_sha256"), str):
                    found[event["token_sha256"]] = world
        return found
