"""x402-gateway: sells Solana data per request over the x402 payment protocol."""

SERVICE_NAME = "x402-gateway"
__version__ = "0.1.0"
