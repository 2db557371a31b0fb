"""Paid MCP tools: the routes this gateway sells, as Model Context Protocol tools at ``/mcp``.

Each tool is a route of the table (:mod:`gateway.mcp.tools`); a call runs that route's own
pipeline in-process (:mod:`gateway.mcp.calls`), so it is paid, limited, settled and answered
again exactly as the same HTTP request would be; the endpoint (:mod:`gateway.mcp.endpoint`)
speaks the protocol through the ``mcp`` SDK and the x402 MCP transport's ``_meta`` keys.
"""
