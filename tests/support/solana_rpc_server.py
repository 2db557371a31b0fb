"""Re-export of :mod:`gateway.sandbox.chain`: the LiteSVM JSON-RPC server and the USDC chain.

The implementation moved to the runtime package (the offline sandbox serves it); tests keep
importing it from here.
"""

from __future__ import annotations

from gateway.sandbox.chain import (
    BLOCKHASH_VALIDITY,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAINNET_GENESIS_HASH,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    PREFLIGHT_FAILURE,
    SIGNATURE_VERIFICATION_FAILURE,
    TOKEN_2022_PROGRAM,
    TOKEN_PROGRAM,
    USDC_MAINNET_MINT,
    LiteSvmRpcServer,
    RpcError,
    UsdcChain,
    set_mint,
    set_token_account,
    setup_usdc_chain,
    token_balance,
)

__all__ = [
    "BLOCKHASH_VALIDITY",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAINNET_GENESIS_HASH",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "PREFLIGHT_FAILURE",
    "SIGNATURE_VERIFICATION_FAILURE",
    "TOKEN_2022_PROGRAM",
    "TOKEN_PROGRAM",
    "USDC_MAINNET_MINT",
    "LiteSvmRpcServer",
    "RpcError",
    "UsdcChain",
    "set_mint",
    "set_token_account",
    "setup_usdc_chain",
    "token_balance",
]
