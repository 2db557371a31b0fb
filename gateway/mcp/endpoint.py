"""``/mcp``: the Streamable-HTTP MCP endpoint, mounted as its own path.

The ``mcp`` SDK speaks the protocol (stateless, JSON answers: any replica answers any call);
this module only lists the route tools and hands each call to :mod:`gateway.mcp.calls`, which
runs the route's own pipeline. Nothing here is on another route's path: the endpoint is one
entry of the path table, and its session manager runs inside the app's lifespan.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from gateway import SERVICE_NAME
from gateway.errors import ErrorCode, GatewayError, error_body
from gateway.mcp.calls import (
    call_scope,
    credential_headers,
    credentials_of,
    receipt_headers,
    run,
    tool_result,
)
from gateway.mcp.meta import PRICE_META
from gateway.mcp.tools import RouteTool
from gateway.web.asgi import ASGIApp, Receive, Scope, Send, send_bytes

_NOT_ALLOWED_HEADERS = [(b"content-type", b"application/json"), (b"allow", b"POST")]
logging.getLogger("mcp").setLevel(logging.ERROR)
"""The SDK's own lines are plain text beside our JSON ones, and its warnings are the client's
doing (a tool name it made up): only its errors are kept."""


class McpEndpoint:
    """The tools of ``tools``; a call runs on ``gateway`` (the whole app, set once it is built)."""

    def __init__(self, tools: Sequence[RouteTool], *, max_body: int) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.listed = [
            types.Tool(
                name=tool.name,
                description=tool.description,
                inputSchema=tool.input_schema,
                outputSchema=tool.output_schema,
                _meta={PRICE_META: msgspec.to_builtins(tool.price)} if tool.price else None,
            )
            for tool in tools
        ]
        self.gateway: ASGIApp | None = None
        self.not_allowed = error_body(ErrorCode.METHOD_NOT_ALLOWED, "method not allowed; allowed: POST")
        self.known = credential_headers()
        self.receipts = receipt_headers()
        server: Server[Any, Any] = Server(SERVICE_NAME)
        server.list_tools()(self._list)  # type: ignore[no-untyped-call]  # the SDK's decorator
        server.call_tool(validate_input=False)(self._call)  # the route validates, as for HTTP
        self.server = server
        self.sessions = StreamableHTTPSessionManager(
            server, json_response=True, stateless=True, max_request_body_size=max_body
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, for as long as the app runs (its lifespan)."""
        async with self.sessions.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":  # stateless: no stream to hold open (GET), no session to end
            await send_bytes(send, 405, self.not_allowed, _NOT_ALLOWED_HEADERS)
            return
        await self.sessions.handle_request(scope, receive, send)

    async def _list(self) -> list[types.Tool]:
        return self.listed

    async def _call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        tool = self.tools.get(name)
        if tool is None:
            raise ValueError(f"unknown tool {name!r}")
        context = self.server.request_context
        meta = context.meta.model_extra or {} if context.meta is not None else {}
        outer: Scope = context.request.scope if context.request is not None else {}
        request = tool.request(arguments)
        if self.gateway is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "the MCP endpoint is not wired to its gateway")
        scope = call_scope(outer, request, credentials_of(meta, self.known), self.known)
        answer = await run(self.gateway, scope, request.body)
        return tool_result(answer, self.receipts)
