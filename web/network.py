"""The settings view's network defaults (the `ask` network mode, issue #33): the package registries an
owner may start from, added as ordinary allow rules of the `network` pseudo-tool and revoked afterwards
one by one like any rule. Nothing here is in force until the owner adds it."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from server.api.context import context_of
from server.tools.egress.hosts import NETWORK, PACKAGE_REGISTRIES, network_mode

from .manage import _owner, _toasting
from .render import render


@_toasting
async def add_package_registries(request: Request) -> Response:
    """An allow rule for each registry's host:port that no allow rule names exactly yet (a second click
    adds nothing); answers with the section again, saying how many were added."""
    world = request.path_params["world"]
    actor = await _owner(request, world, "add rules")
    engine = context_of(request).engine
    have = {rule["match"].get("host") for rule in await engine.rules(world)
            if rule["tool"] == NETWORK and rule["effect"] == "allow" and set(rule["match"]) == {"host"}}
    added = [host for host in PACKAGE_REGISTRIES if host not in have]
    for host in added:
        await engine.add_rule(world, actor, NETWORK, {"host": host}, "allow")
    mode = network_mode((await engine.world_settings(world)).get("sandbox_network"))
    return HTMLResponse(render("_network_defaults.html", world_id=world, package_registries=PACKAGE_REGISTRIES,
                               network_mode=mode, added=len(added)))
