"""pytest plugin: the real gateway with paid routes, wired to real-wire third parties.

``start_paid_gateway(...)`` serves the real app (hypercorn on loopback) configured with:

* ``X402_PAY_TO_WALLET`` = the LiteSVM chain's payTo, ``SOLANA_MAINNET_RPC_URL`` = the LiteSVM
  JSON-RPC server (``usdc_chain`` is installed on it);
* every ``PROVIDER_*_URL`` = the recording loopback ``upstream`` (one path per provider and
  cluster, each carrying an ``api-key`` query secret that must never leak);
* ``FACILITATOR_URL`` = a fake CDP facilitator that checks every JWT (``StaticBackend`` with the
  chain's fee payer by default, or any backend, e.g. ``ReferenceBackend``), or ``internal``.

:class:`PaidGateway` talks to it over HTTP and builds REAL signed Solana payments with our
client-side builder (``client.svm_payer``) from the challenge the gateway sent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import base58
import msgspec
import pytest_asyncio
from multidict import CIMultiDictProxy
from solders.hash import Hash
from solders.keypair import Keypair

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.store import Store
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.cdp_facilitator import (
    CdpCredentials,
    CdpFacilitatorServer,
    FacilitatorBackend,
    StaticBackend,
    close_sdk_rpc_clients,
    settlement_signature,
)
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.gateway_server import PAID_GROUPS, RunningGateway, run_gateway
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream

PROVIDER_KEY = "provider-secret-key-0123456789"
"""The API key in every provider URL; it must never reach a client."""

UPSTREAM_PATHS = {
    "PROVIDER_A_MAINNET_RPC_URL": "/provider-a/mainnet",
    "PROVIDER_A_DEVNET_RPC_URL": "/provider-a/devnet",
    "PROVIDER_B_MAINNET_RPC_URL": "/provider-b/mainnet",
    "PROVIDER_B_DEVNET_RPC_URL": "/provider-b/devnet",
}

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
GET_BALANCE_PROVIDER_PRICE = 5
"""routes.yaml: provider_a getBalance, 10 CU x 0.45 micro-USDC, rounded up: the provider part."""
INTERNAL_SETTLEMENT_FEE = 2200
"""routes.yaml: the settlement fee every price carries through the internal facilitator."""
GET_BALANCE_PRICE_INTERNAL = GET_BALANCE_PROVIDER_PRICE + INTERNAL_SETTLEMENT_FEE
"""provider_a getBalance through the internal facilitator: 2205 micro-USDC."""
ACCOUNT = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
MARKER = 987654321
"""The value in ``PROVIDER_ANSWER``: where it shows, the provider's answer went out."""
PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 1}, "value": MARKER}}
"""What the provider answers in the tests that follow a paid answer to the client."""


def balance_body(account: str = ACCOUNT, request_id: int | str = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "getBalance", "params": [account]}


@dataclass
class Reply:
    """One HTTP answer; its JSON is decoded strictly (no NaN, no numbers out of range)."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return msgspec.json.decode(self.body)

    @property
    def error_code(self) -> str | None:
        """``error.code`` of the one error shape, or the 402's ``error`` reason."""
        data = self.json()
        error = data.get("error")
        return error.get("code") if isinstance(error, dict) else error

    def header_json(self, name: str) -> Any:
        return msgspec.json.decode(base64.b64decode(self.headers[name], validate=True))


def assert_answered(reply: Reply, transaction: str | None = None) -> None:
    """``PROVIDER_ANSWER``, paid for: both payment-response headers name one successful
    settlement (of ``transaction`` when given)."""
    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert reply.headers["payment-response"] == reply.headers["x-payment-response"]
    settled = reply.header_json("payment-response")
    assert settled["success"] is True
    if transaction is not None:
        assert settled["transaction"] == transaction


def assert_challenge(reply: Reply, error: str, amount: int = GET_BALANCE_PROVIDER_PRICE) -> None:
    """A fresh, uncacheable 402 challenge for ``amount`` refusing with ``error`` (header and body
    agree), with no settlement and nothing of the provider's answer."""
    assert reply.status == 402, reply.body
    assert reply.headers["cache-control"] == "no-store"
    body, header = reply.json(), reply.header_json("payment-required")
    assert body["error"] == header["error"] == error
    assert body["accepts"][0]["amount"] == header["accepts"][0]["amount"] == str(amount)
    assert "payment-response" not in reply.headers and "x-payment-response" not in reply.headers
    assert str(MARKER) not in reply.body.decode()


def encode_body(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


@dataclass
class PaidGateway:
    """The running gateway and the third parties around it, plus a paying client."""

    running: RunningGateway
    chain: UsdcChain
    rpc: LiteSvmRpcServer
    upstream: Upstream
    facilitator: CdpFacilitatorServer | None
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def store(self) -> Store:
        """The gateway's own store (for a test on the gateway's event loop)."""
        store: Store = self.running.services.store
        return store

    @property
    def settlement_fee(self) -> int:
        """The settlement fee this gateway's facilitator adds: routes.yaml's for the internal one,
        the configured FACILITATOR_SETTLEMENT_FEE_MICRO_USDC (0 unless set) for the fake CDP."""
        if self.facilitator is None:
            return INTERNAL_SETTLEMENT_FEE
        return self.running.settings.facilitator_settlement_fee_micro_usdc

    @property
    def balance_price(self) -> int:
        """What provider_a getBalance (``GET_BALANCE``) charges through this gateway's facilitator."""
        return GET_BALANCE_PROVIDER_PRICE + self.settlement_fee

    async def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Reply:
        data = b"" if body is None else encode_body(body)
        all_headers = {"content-type": "application/json", **(headers or {})}
        async with self.http.post(self.url + path, data=data, headers=all_headers) as resp:
            return Reply(resp.status, resp.headers, await resp.read())

    async def get(self, path: str) -> Reply:
        async with self.http.get(self.url + path) as resp:
            return Reply(resp.status, resp.headers, await resp.read())

    async def challenge(self, path: str = GET_BALANCE, body: Any = None) -> Reply:
        reply = await self.post(path, body if body is not None else balance_body())
        assert reply.status == 402, reply.body
        return reply

    async def requirements(self, path: str = GET_BALANCE) -> tuple[PaymentRequirements, ResourceInfo]:
        """``accepts[0]`` (as v2 requirements) and ``resource`` of the route's challenge header."""
        header = (await self.challenge(path)).header_json("payment-required")
        return (
            msgspec.convert(header["accepts"][0], PaymentRequirements),
            msgspec.convert(header["resource"], ResourceInfo),
        )

    def sign(
        self,
        requirements: PaymentRequirements,
        resource: ResourceInfo | None = None,
        *,
        payer: Keypair | None = None,
        extensions: dict[str, Any] | None = None,
        blockhash: Hash | None = None,
    ) -> PaymentPayload:
        """A real partially signed exact payment of ``requirements`` (random memo: unique). Pass
        a ``blockhash`` read beforehand to sign while the chain is busy in another thread."""
        mint = MintInfo(address=str(self.chain.mint), decimals=self.chain.decimals)
        recent = blockhash or self.chain.blockhash
        tx = build_exact_transaction(requirements, payer or self.chain.payer, mint, recent)
        return build_payment_payload(requirements, tx, resource=resource, extensions=extensions)

    async def payment(
        self,
        path: str = GET_BALANCE,
        *,
        payer: Keypair | None = None,
        payment_id: str | None = None,
    ) -> PaymentPayload:
        """Read the route's challenge and pay it (opting in to payment-identifier with an id)."""
        requirements, resource = await self.requirements(path)
        extensions = None
        if payment_id is not None:
            extensions = {"payment-identifier": {"info": {"required": False, "id": payment_id}}}
        return self.sign(requirements, resource, payer=payer, extensions=extensions)

    async def pay(
        self,
        path: str,
        body: Any,
        payment: PaymentPayload | str,
        header: str = "payment-signature",
    ) -> Reply:
        value = payment if isinstance(payment, str) else encode_header(payment)
        return await self.post(path, body, {header: value})

    def verify_calls(self) -> int:
        assert self.facilitator is not None
        return self.facilitator.count("verify")

    def settle_calls(self) -> int:
        assert self.facilitator is not None
        return self.facilitator.count("settle")

    def last_settled(self) -> str:
        """The transaction of the last settle the facilitator was asked for."""
        assert self.facilitator is not None
        last = self.facilitator.calls_to("settle")[-1].body
        assert last is not None
        return settlement_signature(last)

    @property
    def upstream_calls(self) -> int:
        return len(self.upstream.calls)


async def send_and_hang_up(url: str, path: str, body: bytes, headers: Mapping[str, str]) -> None:
    """Send one whole request, then close the connection without reading a byte of the answer."""
    parts = urlsplit(url)
    _, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def settled_once(paid: PaidGateway, route: str, timeout_s: float = 5.0) -> None:
    """Wait until the gateway has settled and delivered one payment on ``route`` (the delivery
    keeps the answer; it is counted once the response went out, or the client was found gone)."""
    services = paid.running.services
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (await services.usage.snapshot([route]))[(route, "paid")] == 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the abandoned request was not settled")


async def reference_client_header(
    payment_required_header: str,
    payer: Keypair,
    rpc_url: str,
    *,
    with_payment_identifier: str | None = None,
) -> str:
    """``PAYMENT-SIGNATURE`` built by the REFERENCE x402 client (``x402Client`` with the exact
    SVM scheme) from the gateway's ``PAYMENT-REQUIRED`` header; it reads the mint and a
    blockhash over ``rpc_url``. ``with_payment_identifier`` opts in to that extension."""
    from x402 import x402Client
    from x402.extensions.payment_identifier import append_payment_identifier_to_extensions
    from x402.http.utils import decode_payment_required_header, encode_payment_signature_header
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.register import register_exact_svm_client
    from x402.schemas import PaymentRequired

    client = x402Client()
    register_exact_svm_client(client, KeypairSigner(payer), rpc_url=rpc_url)
    required = decode_payment_required_header(payment_required_header)
    assert isinstance(required, PaymentRequired), "the gateway answers x402 v2 challenges"
    extensions = None
    if with_payment_identifier is not None:
        extensions = append_payment_identifier_to_extensions(
            dict(required.extensions or {}), with_payment_identifier
        )
    try:
        payload = await client.create_payment_payload(required, extensions=extensions)
    finally:
        for schemes in client._schemes.values():  # the SDK cannot close its RPC clients itself
            for scheme in schemes.values():
                close_sdk_rpc_clients(scheme)
    return encode_payment_signature_header(payload)


def wallet_base58(keypair: Keypair) -> str:
    """``FACILITATOR_WALLET_BASE58``: base58 of the raw 64-byte secret key."""
    return str(base58.b58encode(bytes(keypair)).decode("ascii"))


def paid_env(
    chain: UsdcChain, rpc: LiteSvmRpcServer, upstream: Upstream, facilitator: CdpFacilitatorServer | None
) -> dict[str, str]:
    env = {
        "X402_PAY_TO_WALLET": str(chain.pay_to),
        "SOLANA_MAINNET_RPC_URL": rpc.url,
        "LOG_LEVEL": "WARNING",
        "ROUTE_GROUPS": PAID_GROUPS,  # no asset-data upstream here: that group is switched off
        **{name: f"{upstream.url}{path}?api-key={PROVIDER_KEY}" for name, path in UPSTREAM_PATHS.items()},
    }
    if facilitator is None:
        env["FACILITATOR_URL"] = "internal"
        env["FACILITATOR_WALLET_BASE58"] = wallet_base58(chain.fee_payer)
    else:
        assert facilitator.credentials is not None
        env["FACILITATOR_URL"] = facilitator.base_url
        env["FACILITATOR_API_KEY_ID"] = facilitator.credentials.key_id
        env["FACILITATOR_API_KEY_SECRET"] = facilitator.credentials.secret
    return env


StartPaidGateway = Callable[..., Awaitable[PaidGateway]]


@pytest_asyncio.fixture(loop_scope="session")
async def start_paid_gateway(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> AsyncIterator[StartPaidGateway]:
    """Factory: ``await start(backend=..., internal=False, env={...}, store=...)``.

    ``backend`` defaults to a StaticBackend naming the chain's fee payer; ``internal=True``
    uses ``FACILITATOR_URL=internal`` with the chain's fee payer as the wallet instead.
    Everything started is stopped after the test.
    """
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())

        async def start(
            *,
            backend: FacilitatorBackend | None = None,
            internal: bool = False,
            env: Mapping[str, str] | None = None,
            store: Store | None = None,
        ) -> PaidGateway:
            facilitator = None
            if not internal:
                facilitator = await start_cdp_facilitator(
                    credentials=cdp_credentials,
                    backend=backend or StaticBackend(fee_payer=str(usdc_chain.fee_payer.pubkey())),
                )
            full_env = {**paid_env(usdc_chain, solana_rpc_server, upstream, facilitator), **(env or {})}
            running = await stack.enter_async_context(run_gateway(full_env, store=store))
            return PaidGateway(running, usdc_chain, solana_rpc_server, upstream, facilitator, http)

        yield start


def paid_gateways_on_the_store() -> Any:
    """A module's ``start_paid_gateway`` whose gateways keep their state in ``clean_redis_url``
    (``start_paid_gateway = paid_gateways_on_the_store()`` in the module, beside
    ``redis_url = on_redis_and_cluster()``): the claims, replays, limits and fee guard its attacks
    aim at live in the store replicas share, single-node or cluster, not in one process's memory.
    A test's own ``STATE_STORE_REST_URL`` or ``store`` still wins."""

    @pytest_asyncio.fixture(loop_scope="session", name="start_paid_gateway")
    async def on_the_store(start_paid_gateway: StartPaidGateway, clean_redis_url: str) -> StartPaidGateway:
        async def start(*, env: Mapping[str, str] | None = None, **options: Any) -> PaidGateway:
            return await start_paid_gateway(
                env={"STATE_STORE_REST_URL": clean_redis_url, **(env or {})}, **options
            )

        return start

    return on_the_store


@pytest_asyncio.fixture(loop_scope="session")
async def paid(start_paid_gateway: StartPaidGateway) -> PaidGateway:
    """The everyday paid gateway: fake CDP facilitator (StaticBackend), memory store."""
    return await start_paid_gateway()
