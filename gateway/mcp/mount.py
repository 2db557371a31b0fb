"""Mounting the MCP endpoint: only a gateway with tools to serve loads the ``mcp`` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from gateway.mcp.tools import route_tools
from gateway.routing.pricing import CreditTerms, FacilitatorFee
from gateway.routing.routes import RouteSpec

if TYPE_CHECKING:
    from gateway.mcp.endpoint import McpEndpoint


def mcp_endpoint(
    routes: Sequence[RouteSpec], fee: FacilitatorFee, credit: CreditTerms | None, max_body: int
) -> McpEndpoint | None:
    """The endpoint of the served routes' tools; None when the gateway sells nothing."""
    tools = route_tools(routes, fee, credit)
    if not tools:
        return None
    from gateway.mcp.endpoint import McpEndpoint  # the SDK is a third of a second to import

    return McpEndpoint(tools, max_body=max_body)


Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]


def with_endpoint(lifespan: Lifespan, endpoint: McpEndpoint | None) -> Lifespan:
    """The app's lifespan, with the endpoint's session manager running inside it."""
    if endpoint is None:
        return lifespan

    @asynccontextmanager
    async def both(app: Any) -> AsyncIterator[None]:
        async with lifespan(app), endpoint.running():
            yield

    return both
