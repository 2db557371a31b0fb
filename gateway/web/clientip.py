"""The client's IP for rate limiting: a client must never be able to choose its own bucket, nor
get a fresh one by changing address within its own network.

One IPv4 address is what a client (or a NAT full of them) holds; an IPv6 client is handed a
whole /64 or more, so each of its 2^64 addresses would be a new client to every per-IP limit and
guard. :func:`client_subject` therefore names an IPv6 client by its prefix (/64 by default,
``CLIENT_IPV6_PREFIX_LENGTH``); every per-IP limit, guard and fee-guard party takes its key from
it, through :meth:`gateway.limits.rate_limiter.RateLimiter.client_ip`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from gateway.config import IpNetwork
from gateway.web.asgi import Scope

IPV6_PREFIX_LENGTH = 64
"""The IPv6 prefix one client is keyed by, unless configured: what RFC 6177 and the RIRs hand
one end site's subnet (many hand out a /56 or /48: configure it shorter to group those)."""


def _trusted(address: str, proxies: Sequence[IpNetwork]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def client_ip(scope: Scope, proxies: Sequence[IpNetwork]) -> str:
    """The socket peer, or the right-most X-Forwarded-For entry not added by a trusted proxy.

    Entries left of the first untrusted hop are the client's own words and are ignored.
    """
    client = scope.get("client")
    peer = client[0] if client else "unknown"
    if not proxies or not _trusted(peer, proxies):
        return str(peer)
    # Several X-Forwarded-For lines are one list in order (RFC 9110 5.3): a proxy that adds its
    # own line after the client's must still be read right-most first.
    forwarded = ",".join(v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for")
    if not forwarded:
        return str(peer)
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return str(peer)
    return hops[0] if hops else str(peer)


def client_subject(address: str, ipv6_prefix_length: int = IPV6_PREFIX_LENGTH) -> str:
    """The client that ``address`` (from :func:`client_ip`) counts as for per-IP limits: an IPv4
    address itself, an IPv6 address as its ``/ipv6_prefix_length`` network (``2001:db8:1:2::/64``;
    an IPv4-mapped one as its IPv4 address). Anything else (``unknown``) is returned as is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ipv6_prefix_length >= 128:
        return str(ip)
    return str(ipaddress.IPv6Network((ip, ipv6_prefix_length), strict=False))
