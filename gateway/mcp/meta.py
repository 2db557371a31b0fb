"""The words of paid MCP tools on the wire, kept apart from the ``mcp`` SDK (which costs a third
of a second to import): the catalog and the buyer's bridge name them without loading it."""

from __future__ import annotations

MCP_PATH = "/mcp"
PAYMENT_META = "x402/payment"
"""The x402 MCP transport's payment payload, in a call's ``params._meta``."""
PAYMENT_RESPONSE_META = "x402/payment-response"
"""The x402 MCP transport's settlement, in a result's ``_meta``."""
GATEWAY_META = "x402-gateway/"
"""The prefix of the ``_meta`` keys carrying this gateway's other credentials and receipts."""
PRICE_META = GATEWAY_META + "price"
"""A tool listing's price (:class:`gateway.mcp.tools.ToolPrice`)."""
SIGN_IN_META = GATEWAY_META + "sign-in-with-x"
SESSION_META = GATEWAY_META + "x-credit-session"
CREDIT_BALANCE_META = GATEWAY_META + "x-credit-balance"
