"""msgspec Structs for every x402 wire shape the gateway reads or writes.

Field names are the protocol's camelCase. Decoding with these structs is the validation:
a payload that does not fit is a malformed payment, never a 500.
"""

from __future__ import annotations

from typing import Any

import msgspec

SCHEME_EXACT = "exact"
"""The x402 scheme of one signed transfer of an exact amount (the ``exact`` payment method's)."""

SOLANA_MAINNET = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
SOLANA_DEVNET = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
V1_NETWORKS = {"solana": SOLANA_MAINNET, "solana-devnet": SOLANA_DEVNET}
USDC_MAINNET_MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
USDC_DECIMALS = 6


class Base(msgspec.Struct, omit_defaults=True):
    """Omit unset optionals on the wire; ignore unknown fields from peers (forward compatible)."""


class ResourceInfo(Base):
    url: str
    description: str | None = None
    mimeType: str | None = None


class PaymentRequirements(Base):
    """v2 PaymentRequirements: what one payment must be. Sent to facilitators as is."""

    scheme: str
    network: str
    amount: str
    asset: str
    payTo: str
    maxTimeoutSeconds: int
    extra: dict[str, Any] | None = None


class FacilitatorRef(Base):
    url: str


class ChallengeAccept(PaymentRequirements):
    """``accepts[0]`` of our 402: v2 requirements plus the v1 names and the spec's fields."""

    maxAmountRequired: str | None = None
    resource: str | None = None
    description: str | None = None
    mimeType: str | None = None
    outputSchema: dict[str, Any] | None = None
    facilitator: FacilitatorRef | None = None


class PaymentRequired(Base):
    """The 402 envelope (v2), also sent as the JSON body for v1 clients."""

    x402Version: int
    resource: ResourceInfo
    accepts: list[ChallengeAccept]
    error: str | None = None
    extensions: dict[str, Any] | None = None


class PaymentPayload(Base):
    """What the client sends in ``PAYMENT-SIGNATURE`` (v2) or ``X-PAYMENT`` (v1).

    v2 echoes the chosen requirements in ``accepted``; v1 carries ``scheme`` and ``network``.
    """

    x402Version: int
    payload: dict[str, Any]
    accepted: PaymentRequirements | None = None
    resource: ResourceInfo | None = None
    extensions: dict[str, Any] | None = None
    scheme: str | None = None
    network: str | None = None


class ExactSvmPayload(Base):
    """``payload`` of an exact payment on Solana: a partially signed v0 transaction."""

    transaction: str


class FacilitatorRequest(Base):
    """Body of ``POST /verify`` and ``POST /settle``."""

    x402Version: int
    paymentPayload: PaymentPayload
    paymentRequirements: PaymentRequirements


class VerifyResponse(Base):
    isValid: bool
    invalidReason: str | None = None
    invalidMessage: str | None = None
    payer: str | None = None


class SettleResponse(Base):
    """``transaction`` is required on the wire (``""`` on failure): the reference SDKs insist."""

    success: bool
    network: str
    transaction: str
    errorReason: str | None = None
    errorMessage: str | None = None
    payer: str | None = None
    amount: str | None = None


class SupportedKind(Base):
    x402Version: int
    scheme: str
    network: str
    extra: dict[str, Any] | None = None


class SupportedResponse(Base):
    kinds: list[SupportedKind]
    extensions: list[str] = msgspec.field(default_factory=list)
    signers: dict[str, list[str]] = msgspec.field(default_factory=dict)


# --- sign-in-with-x -------------------------------------------------------------------------


class SiwxSupportedChain(Base):
    chainId: str
    type: str
    signatureScheme: str | None = None


class SiwxInfo(Base):
    """``extensions["sign-in-with-x"].info``: the fields the client must sign."""

    domain: str
    uri: str
    version: str
    nonce: str
    issuedAt: str
    expirationTime: str | None = None
    notBefore: str | None = None
    requestId: str | None = None
    statement: str | None = None
    resources: list[str] | None = None


class SiwxPayload(Base):
    """The decoded ``SIGN-IN-WITH-X`` header."""

    domain: str
    address: str
    uri: str
    version: str
    chainId: str
    type: str
    nonce: str
    issuedAt: str
    signature: str
    statement: str | None = None
    expirationTime: str | None = None
    notBefore: str | None = None
    requestId: str | None = None
    resources: list[str] | None = None
    signatureScheme: str | None = None


class SiwxExtension(Base):
    """``extensions["sign-in-with-x"]`` of a 402: what to sign and on which chains.

    ``info``, ``supportedChains`` and ``schema`` are the x402 extension proper; ``networks``,
    ``statement``, ``expirationSeconds`` and ``resource`` are the gateway's own summary of the challenge.
    The summary is optional so a client can also decode other servers' challenges.
    """

    info: SiwxInfo
    supportedChains: list[SiwxSupportedChain] = msgspec.field(default_factory=list)
    schema: dict[str, Any] = msgspec.field(default_factory=dict)
    networks: list[str] | None = None
    statement: str | None = None
    expirationSeconds: int | None = None
    resource: str | None = None
