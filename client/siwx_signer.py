"""Client side of sign-in-with-x on Solana: turn a 402's challenge into a ``SIGN-IN-WITH-X`` header.

Used by the tests and the ``x402-gateway pay`` CLI. It builds the message with the verifier's
own :func:`gateway.x402.siwx.siws_message`, so what we sign and what we check cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import base58
import msgspec
from nacl.signing import SigningKey
from solders.keypair import Keypair

from gateway.x402.headers import encode_header
from gateway.x402.siwx import SIGNATURE_TYPE, normalize_origin, siws_message
from gateway.x402.types import SiwxExtension, SiwxInfo, SiwxPayload, SiwxSupportedChain

Signer = Keypair | SigningKey


def signer_address(signer: Signer) -> str:
    """The base58 public key a Solana wallet signs in as."""
    if isinstance(signer, Keypair):
        return str(signer.pubkey())
    return str(base58.b58encode(bytes(signer.verify_key)).decode("ascii"))


def _sign(signer: Signer, message: bytes) -> str:
    if isinstance(signer, Keypair):
        return str(signer.sign_message(message))
    return str(base58.b58encode(signer.sign(message).signature).decode("ascii"))


def sign_payload(
    info: SiwxInfo, signer: Signer, chain_id: str, signature_scheme: str | None = None
) -> SiwxPayload:
    """Sign ``info`` exactly as given, with no checks (tests use it to craft hostile headers)."""
    address = signer_address(signer)
    signature = _sign(signer, siws_message(info, address, chain_id).encode())
    return SiwxPayload(
        domain=info.domain,
        address=address,
        uri=info.uri,
        version=info.version,
        chainId=chain_id,
        type=SIGNATURE_TYPE,
        nonce=info.nonce,
        issuedAt=info.issuedAt,
        signature=signature,
        statement=info.statement,
        expirationTime=info.expirationTime,
        notBefore=info.notBefore,
        requestId=info.requestId,
        resources=info.resources,
        signatureScheme=signature_scheme,
    )


def _check_origin(info: SiwxInfo, request_url: str) -> None:
    """Refuse a challenge for another site, so a hostile 402 cannot harvest a sign-in for it."""
    scheme, netloc = normalize_origin(request_url)
    if info.domain.lower() != netloc:
        raise ValueError(f"challenge domain {info.domain!r} is not the requested host {netloc!r}")
    if normalize_origin(info.uri) != (scheme, netloc):
        raise ValueError(f"challenge uri {info.uri!r} is not on the requested origin")


def _pick_chain(chains: list[SiwxSupportedChain], chain_id: str | None) -> SiwxSupportedChain:
    solana = [c for c in chains if c.type == SIGNATURE_TYPE and c.chainId.startswith("solana:")]
    for chain in solana:
        if chain_id is None or chain.chainId == chain_id:
            return chain
    wanted = chain_id or "a Solana chain"
    offered = ", ".join(c.chainId for c in chains) or "none"
    raise ValueError(f"challenge does not accept {wanted} (offers {offered})")


def sign_in(
    challenge: SiwxExtension | Mapping[str, Any],
    signer: Signer,
    chain_id: str | None = None,
    *,
    request_url: str | None = None,
) -> str:
    """The ``SIGN-IN-WITH-X`` header value answering ``challenge`` (``extensions["sign-in-with-x"]``).

    ``chain_id`` must be one the challenge offers; None picks its first Solana chain. Give
    ``request_url`` (the URL that answered 402) to refuse challenges bound to another origin.
    Raises ValueError when the challenge cannot be answered.
    """
    if isinstance(challenge, SiwxExtension):
        extension = challenge
    else:
        try:
            extension = msgspec.convert(challenge, SiwxExtension)
        except msgspec.ValidationError as exc:
            raise ValueError(f"not a sign-in-with-x challenge: {exc}") from None
    info = extension.info
    if request_url is not None:
        _check_origin(info, request_url)
    chain = _pick_chain(extension.supportedChains, chain_id)
    return encode_header(sign_payload(info, signer, chain.chainId, chain.signatureScheme))
