"""What the API, the page and the CLI change or read of a world through the engine: worlds, agents,
chats, rules, grants and invites. Role checks go through `Refusals.require`, so a refusal is audited."""
from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ... import vocab
from ...log.portable import Imported, export_lines, import_lines
from ..actors import Actor
from ..approvals.carried_over import close_carried_over
from ..approvals.deciding import Approvals
from ..approvals.elicitations import Elicitations
from ..approvals.ownership import Refusals
from ..hosting.hosted import Hosting
from ..public import public, public_part
from ..store import Store
from .invites import Invites
from .mcp_sign_in import McpSignIns
from .worlds import Worlds


class Administration:
    """A part of `Engine` (a mixin): the attributes below are the engine's."""

    store: Store
    instance: str
    worlds: Worlds
    approvals: Approvals
    refusals: Refusals
    elicitations: Elicitations
    invites: Invites
    hosting: Hosting
    mcp_sign_ins: McpSignIns

    async def require_to_manage(self, world: str, actor: Actor, action: str) -> None:
        """Refuse (audited) unless `actor` may manage `world` (`action` says what they tried)."""
        await self.refusals.require(world, actor, vocab.CAN_MANAGE, action)

    # -- worlds ----------------------------------------------------------------
    async def world_exists(self, world: str) -> bool:
        return await self.worlds.exists(world)

    async def world_info(self, world: str) -> dict[str, Any]:
        """The world's name, settings (secrets masked) and agents; not_found for an unknown world."""
        return await self.worlds.get(world)

    async def world_settings(self, world: str) -> dict[str, Any]:
        return await self.worlds.settings(world)

    async def list_worlds(self, after: str = "", limit: int = 100) -> tuple[list[dict[str, Any]], str | None]:
        """A page of worlds (id, name) after the id `after`, and the next page's cursor (None after the last)."""
        return await self.worlds.page(after, limit)

    async def last_seq(self, world: str) -> int:
        return await self.store.log.last_seq(world)

    async def update_world(self, world: str, actor: Actor, name: str | None = None,
                           settings: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.require_to_manage(world, actor, "change the world")
        return await self.worlds.update(world, actor, name=name, settings=settings)

    async def delete_world(self, world: str, actor: Actor) -> None:
        await self.require_to_manage(world, actor, "delete the world")
        settings = await self.worlds.settings(world)
        await self.worlds.delete(world, actor)
        await self.mcp_sign_ins.forget(world, settings)  # its MCP servers' tokens go with it

    # -- agents ----------------------------------------------------------------
    async def agent(self, world: str, name: str) -> dict[str, Any]:
        """One agent's config; not_found for an unknown agent."""
        return await self.worlds.agent(world, name)

    async def add_agent(self, world: str, actor: Actor, config: dict[str, Any]) -> dict[str, Any]:
        await self.require_to_manage(world, actor, "add agents")
        return await self.worlds.add_agent(world, actor, config)

    async def update_agent(self, world: str, actor: Actor, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        await self.require_to_manage(world, actor, "change agents")
        return await self.worlds.update_agent(world, actor, name, changes)

    async def remove_agent(self, world: str, actor: Actor, name: str) -> None:
        await self.require_to_manage(world, actor, "remove agents")
        await self.worlds.remove_agent(world, actor, name)

    async def cancel_approvals(self, world: str, actor: Actor, agent: str) -> int:
        """Deny every pending approval of `agent`; how many there were (not_found for an unknown agent)."""
        await self.refusals.require(world, actor, vocab.CAN_DECIDE, "cancel approvals")
        cancelled = await self.approvals.cancel(world, actor, agent)
        if cancelled == 0:
            await self.worlds.agent(world, agent)  # not_found for an unknown agent with nothing pending
        return cancelled

    # -- chats -----------------------------------------------------------------
    async def list_chats(self, world: str) -> list[dict[str, Any]]:
        """The world's chats as clients see them (a title is people's text: redacted as the stream does)."""
        return [public_part("chat", chat) for chat in await self.worlds.chats(world)]

    async def latest_chat(self, world: str) -> str:
        return await self.worlds.latest_chat(world)

    async def create_chat(self, world: str, actor: Actor, title: str | None = None) -> dict[str, Any]:
        await self.refusals.require(world, actor, vocab.CAN_SEND, "start chats")
        return await self.worlds.create_chat(world, actor, title=title)

    # -- rules, grants, questions ----------------------------------------------
    async def add_rule(self, world: str, actor: Actor, tool: str, match: dict[str, str] | None, effect: str,
                       reason: str | None = None, approvals_required: object = 1) -> dict[str, Any]:
        await self.refusals.require(world, actor, vocab.CAN_DECIDE, "add rules")
        return await self.approvals.add_rule(world, actor, tool, match, effect, reason=reason,
                                             approvals_required=approvals_required)

    async def revoke_rule(self, world: str, actor: Actor, rule_id: str) -> None:
        await self.require_to_manage(world, actor, "revoke rules")
        await self.approvals.revoke_rule(world, actor, rule_id)

    async def revoke_grant(self, world: str, actor: Actor, grant_id: str) -> None:
        await self.require_to_manage(world, actor, "revoke session grants")
        await self.approvals.revoke_grant(world, actor, grant_id)

    async def pending_questions(self, world: str) -> list[dict[str, Any]]:
        """MCP servers' questions waiting for a person's answer, as clients see them (`public`: redacted)."""
        return [public(e) for e in await self.elicitations.pending(world)]

    # -- invites -----------------------------------------------------------------
    async def create_invite(self, world: str, actor: Actor, role: object, name: object = None, *,
                            base_url: str = "") -> dict[str, Any]:
        """A new invite to `world`: {"url", "token", "role", "name", "id"}; the log keeps only the token's hash."""
        return await self.invites.create(world, actor, role, name, base_url=base_url)

    async def list_invites(self, world: str, actor: Actor) -> list[dict[str, Any]]:
        return await self.invites.list(world, actor)

    async def revoke_invite(self, world: str, actor: Actor, invite_id: str) -> None:
        await self.invites.revoke(world, actor, invite_id)

    async def find_invite(self, world: str, digest: str) -> dict[str, Any] | None:
        return await self.invites.find(world, digest)

    async def invite_hashes(self) -> dict[str, str]:
        return await self.invites.hashes()

    # -- export and import (the CLI) -------------------------------------------
    def export_world(self, world: str) -> AsyncIterator[str]:
        return export_lines(self.store.log, world)

    async def import_world(self, lines: Iterable[str], *, allowances: bool = False) -> Imported:
        """Import a world's exported lines; running servers (other processes too) host it at once.

        A file's allow rules and allow grants would run calls with nobody asked: unless `allowances`, each
        is revoked (by the owner, on the audit trail), its pending requests are denied and the calls it
        says were approved or started are answered without running (`Imported.closed`), before any server
        hosts the world. Either way `Imported.allowances` lists them, for the owner to read."""
        done = await import_lines(self.store.log, lines)
        done.allowances = [e for e in [*await self.worlds.rules(done.world), *await self.worlds.grants(done.world)]
                           if (e.get("rule") or e.get("grant") or {}).get("effect") == "allow"]
        done.allowances_kept = allowances
        if not allowances:
            owner = Actor("owner", vocab.OWNER)
            for event in done.allowances:
                if "rule" in event:
                    await self.approvals.revoke_rule(done.world, owner, event["rule"]["id"])
                else:
                    await self.approvals.revoke_grant(done.world, owner, event["grant"]["id"])
            # Decisions in the file are allowances too: a pending request's votes, an approved call not run.
            done.closed = await close_carried_over(self.approvals, done.world, owner,
                                                   "imported without its allowances: ask again")
        await self.hosting.announce(done.world)
        return done

    # -- health (the CLI's startup check, /healthz) -------------------------------
    async def check_log_writes(self) -> None:
        """One real write to the log (a lease taken and given back): raises what the storage raises."""
        await self.store.log.lease("startup-check", self.instance, 1.0, mark=True)
        await self.store.log.release("startup-check", self.instance, mark=True)

    async def log_round_trip(self) -> None:
        await self.store.log.last_seq("healthz")  # one indexed read; no such world is fine

    async def bus_round_trip(self) -> None:
        """Publish a nonce on a channel of its own and hear it back."""
        bus = self.store.bus
        channel = f"healthz:{secrets.token_hex(6)}"
        nonce = secrets.token_hex(8)
        async with bus.subscribe(channel, maxsize=4) as sub:
            await bus.publish(channel, nonce)
            while await sub.get() != nonce:
                pass
