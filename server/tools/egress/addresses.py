"""Where a host may be reached from a sandbox: public addresses only, checked after the name is
resolved, and connected to as checked (no second lookup: a name that answers a public address to the
check and a private one to the connection — DNS rebinding — reaches nothing)."""
from __future__ import annotations

import asyncio
import ipaddress
import socket

from .hosts import BadHost

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def refusal(address: IpAddress) -> str:
    """Why `address` may not be reached ("" when it may): private, loopback, link-local, shared (CGNAT),
    multicast and reserved ranges, and the IPv4 ones in IPv6 clothing."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if inner is not None:
            return refusal(inner)
    if address.is_global and not address.is_multicast:
        return ""
    kind = ("loopback" if address.is_loopback else "link-local" if address.is_link_local
            else "shared (CGNAT)" if address in ipaddress.ip_network("100.64.0.0/10")
            else "private" if address.is_private else "not a public")
    return f"{address} is a {kind} address"


async def resolve(host: str, port: int) -> list[IpAddress]:
    """The addresses to try for `host`, every one checked: one refused refuses the host (a name that
    points at both a public and a private address is not a public host). Raises BadHost."""
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise BadHost(f"{host} does not resolve: {exc.strerror}") from None
        found = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))
    for address in found:
        if why := refusal(address):
            raise BadHost(f"{host} is refused: {why}" if str(address) != host else f"{why}: refused")
    if not found:
        raise BadHost(f"{host} does not resolve")
    return found
