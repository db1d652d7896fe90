"""Where a host may be reached from a sandbox: public addresses only, checked after the name is
resolved, and connected to as checked (no second lookup: a name that answers a public address to the
check and a private one to the connection — DNS rebinding — reaches nothing)."""
from __future__ import annotations

import asyncio
import ipaddress
import socket

from .hosts import BadHost

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: a network's own translators
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765's ::ffff:0:a.b.c.d
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # the deprecated ::a.b.c.d
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


def inner_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries, which a host (or its network's translator) really reaches:
    IPv4-mapped, 6to4, Teredo's client, NAT64, IPv4-translated or IPv4-compatible. None for a plain one."""
    inner = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
    if inner is not None:
        return inner
    if (address in _NAT64 or address in _IPV4_TRANSLATED or address in _IPV4_COMPATIBLE) and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)  # (not `::` and `::1`: those are themselves)
    return None


def classify(address: IpAddress) -> tuple[IpAddress, str]:
    """The address that is really reached (an IPv6 one's inner IPv4 address) and the kind of range that
    keeps it from being reached: "" for a public address. The one check of the sandbox's proxy and of
    webhooks and push endpoints (server/webhooks/targets.py)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return address, "local NAT64"
        if address in _SITE_LOCAL:
            return address, "site-local"
        if (inner := inner_ipv4(address)) is not None:
            return classify(inner)
    for kind, flag in (("loopback", address.is_loopback), ("link-local", address.is_link_local),
                       ("unspecified", address.is_unspecified), ("multicast", address.is_multicast),
                       ("shared (CGNAT)", address in _SHARED), ("private", address.is_private),
                       ("reserved", address.is_reserved), ("not a public", not address.is_global)):
        if flag:
            return address, kind
    return address, ""


def refusal(address: IpAddress) -> str:
    """Why `address` may not be reached from a sandbox ("" when it may): private, loopback, link-local,
    shared (CGNAT), multicast and reserved ranges, and the IPv4 ones in IPv6 clothing."""
    inner, kind = classify(address)
    if not kind:
        return ""
    return f"{address} is a {kind} address" + (f" ({inner})" if inner != address else "")


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
