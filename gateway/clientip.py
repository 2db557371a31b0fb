"""The client's IP for rate limiting: a client must never be able to choose its own bucket."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from gateway.asgi import Scope
from gateway.config import IpNetwork


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
