"""Where a webhook (or a push endpoint, server/push/sender.py) may go: never the server's loopback,
link-local, private or own addresses, unless the owner allowed it for that webhook (`allow_private`).
Checked on the addresses a request really connects to (client.py's resolver), so a name that resolves
elsewhere later cannot slip past."""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket

from ..tools.egress.addresses import classify
from ..tools.sandbox.netns import REFUSED, refused_networks

logger = logging.getLogger(__name__)


class RefusedTarget(Exception):
    """A webhook's host resolves to an address it may not reach."""


@functools.cache
def _refused() -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The sandbox network's refused ranges (server/tools/sandbox/netns.py) and the host's own networks."""
    try:
        found = refused_networks()
    except (OSError, ValueError) as exc:  # no `ip` tool: the fixed ranges still hold
        logger.warning("could not list the host's own networks (%s): webhooks refuse the private ranges only", exc)
        found = list(REFUSED)
    return tuple(ipaddress.ip_network(n) for n in found)


def refusal(address: str) -> str | None:
    """Why `address` may not be a webhook's target, or None: the ranges a sandbox's proxy refuses too
    (egress/addresses.py `classify`: an IPv4 address inside an IPv6 one is checked as itself), and the
    server's own networks."""
    ip, kind = classify(ipaddress.ip_address(address.split("%", 1)[0]))
    if kind:
        return f"a {kind} address ({ip})"
    if any(ip in network for network in _refused() if network.version == ip.version):
        return f"one of the server's own or private networks ({ip})"
    return None


WEBHOOK_HINT = "set allow_private on this webhook to allow it"


def check_address(host: str, address: str, hint: str = WEBHOOK_HINT) -> None:
    if (why := refusal(address)) is not None:
        raise RefusedTarget(f"{host} resolves to {why}: {hint}")


def check_literal(host: str, hint: str = WEBHOOK_HINT) -> None:
    """A URL's host that is an IP address is connected to without the resolver: checked here."""
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return
    check_address(host, host.strip("[]"), hint)


async def check_host(host: str, hint: str = WEBHOOK_HINT) -> None:
    """`host` (a name or an address) checked before it is stored: `RefusedTarget` if it resolves to an address
    it may not reach. A name that does not resolve now passes: the resolver checks it when used."""
    check_literal(host, hint)
    try:  # (what aiohttp's resolver asks too, client.py)
        found = await asyncio.get_running_loop().getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # (UnicodeError: a label empty or over 63 characters)
        return  # unknown now: the connection's own resolution decides
    for *_, address in found:
        check_address(host, str(address[0]), hint)
