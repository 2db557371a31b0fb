"""Paid gateways as real ``x402-gateway serve`` subprocesses, and a client that pays them.

The third parties live in the test process, on loopback, and every gateway process is pointed at
the same ones: the recording provider (``Upstream``), the fake CDP facilitator (JWT-checked; none
when they settle with their own fee payer) and the LiteSVM chain's JSON-RPC server.
:func:`paid_processes` starts ``count`` gateways with the env of
:func:`tests.support.paid_fixtures.paid_env` plus the test's own (a shared
``STATE_STORE_REST_URL`` makes them replicas) and always stops them.

The event loop of the test serves the provider and the facilitator, so a test must never block
it while a gateway waits on them: wait for a process in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.store import Store
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.cdp_facilitator import CdpFacilitatorServer
from tests.support.gateway_process import GatewayProcess, serve
from tests.support.paid_fixtures import GET_BALANCE, Reply, balance_body, encode_body, paid_env
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream


@dataclass
class Replica:
    """One gateway process and an HTTP client for it."""

    process: GatewayProcess
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.process.url

    async def post(self, path: str, body: Any = None, headers: Mapping[str, str] | None = None) -> Reply:
        data = b"" if body is None else encode_body(body)
        all_headers = {"content-type": "application/json", **(headers or {})}
        async with self.http.post(self.url + path, data=data, headers=all_headers) as resp:
            return Reply(resp.status, resp.headers, await resp.read())

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        async with self.http.get(self.url + path, headers=headers) as resp:
            return Reply(resp.status, resp.headers, await resp.read())

    async def pay(self, path: str, body: Any, payment: PaymentPayload) -> Reply:
        return await self.post(path, body, {"payment-signature": encode_header(payment)})


@dataclass
class PaidProcesses:
    """The running gateway processes and the third parties they share."""

    replicas: list[Replica]
    chain: UsdcChain
    rpc: LiteSvmRpcServer
    upstream: Upstream
    facilitator: CdpFacilitatorServer | None
    """None: the gateways settle with their own fee payer (``FACILITATOR_URL=internal``)."""

    async def requirements(
        self, replica: Replica, path: str = GET_BALANCE
    ) -> tuple[PaymentRequirements, ResourceInfo]:
        """``accepts[0]`` and ``resource`` of the challenge ``replica`` answers for ``path``."""
        reply = await replica.post(path, balance_body())
        assert reply.status == 402, reply.body
        header = reply.header_json("payment-required")
        return (
            msgspec.convert(header["accepts"][0], PaymentRequirements),
            msgspec.convert(header["resource"], ResourceInfo),
        )

    async def payment(
        self, replica: Replica, path: str = GET_BALANCE, *, payment_id: str | None = None
    ) -> PaymentPayload:
        """A real signed exact payment of ``replica``'s challenge (with a payment-identifier)."""
        requirements, resource = await self.requirements(replica, path)
        extensions = None
        if payment_id is not None:
            extensions = {"payment-identifier": {"info": {"required": False, "id": payment_id}}}
        mint = MintInfo(address=str(self.chain.mint), decimals=self.chain.decimals)
        tx = build_exact_transaction(requirements, self.chain.payer, mint, self.chain.blockhash)
        return build_payment_payload(requirements, tx, resource=resource, extensions=extensions)

    def settle_calls(self) -> int:
        assert self.facilitator is not None
        return self.facilitator.count("settle")

    def verify_calls(self) -> int:
        assert self.facilitator is not None
        return self.facilitator.count("verify")

    @property
    def upstream_calls(self) -> int:
        return len(self.upstream.calls)


@asynccontextmanager
async def paid_processes(
    count: int,
    *,
    chain: UsdcChain,
    rpc: LiteSvmRpcServer,
    upstream: Upstream,
    facilitator: CdpFacilitatorServer | None,
    env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> AsyncIterator[PaidProcesses]:
    """``count`` gateway processes, each answering ``/healthz`` before the block starts."""
    full_env = {**paid_env(chain, rpc, upstream, facilitator), **(env or {})}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        with contextlib.ExitStack() as stack:
            processes = await start_all([serve(full_env, *args) for _ in range(count)], stack)
            replicas = [Replica(process, http) for process in processes]
            for replica in replicas:  # the worker is up: timings in the test are the gateway's own
                assert (await replica.get("/healthz")).status == 200
            yield PaidProcesses(replicas, chain, rpc, upstream, facilitator)


async def start_all(
    starting: list[contextlib.AbstractContextManager[GatewayProcess]], stack: contextlib.ExitStack
) -> list[GatewayProcess]:
    """Start every process at once (each waits for its port in a thread), all stopped by ``stack``."""
    entered = await asyncio.gather(
        *(asyncio.to_thread(cm.__enter__) for cm in starting), return_exceptions=True
    )
    for cm, result in zip(starting, entered, strict=True):
        if not isinstance(result, BaseException):
            stack.push(cm.__exit__)
    for result in entered:
        if isinstance(result, BaseException):
            raise result
    return [result for result in entered if not isinstance(result, BaseException)]


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Wait (without blocking the loop) until ``condition()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        await asyncio.sleep(0.01)


async def eventually_async(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 5.0) -> None:
    """Wait (without blocking the loop) until ``check()`` answers true."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        await asyncio.sleep(0.02)


async def stored_eventually(store: Store, key: str, timeout_s: float = 5.0) -> None:
    """Wait until ``key`` is written (a follow-up's, which runs in its own time)."""

    async def found() -> bool:
        return await store.get(key) is not None

    await eventually_async(found, what=f"{key} written", timeout_s=timeout_s)
