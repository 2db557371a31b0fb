"""The buyer's side: `x402-gateway pay`, `credits` and credit sessions, with the wallet signers they use.

It speaks to a gateway only over HTTP, as any x402 client would; it imports the protocol types of
``gateway.x402`` and the credit routes' wire shapes, never the server's machinery."""
