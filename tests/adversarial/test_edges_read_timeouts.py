"""Attack: slow clients (slowloris) dripping headers or a body one byte at a time.

A raw TCP client talks to the running gateway. A dripped body is cut off at
CLIENT_BODY_TIMEOUT_SECONDS with a 408 in the one error shape, before the payment it carries is
verified or claimed: no facilitator or chain call, no provider call, no balance moves, and the
same payment still buys its answer afterwards. Dripped headers are cut off at
CLIENT_HEADER_TIMEOUT_SECONDS by the server (``x402-gateway serve``) closing the connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from solders.keypair import Keypair

from gateway.x402.headers import encode_header
from tests.support.gateway_process import serve
from tests.support.gateway_server import SERVICE_ONLY_ENV
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    StartPaidGateway,
    balance_body,
    wallet_base58,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

DRIP_INTERVAL_S = 0.3
TIMEOUT = "1"  # seconds, for both timeouts; a drip lasts far longer than this


def _request_head(method: str, path: str, port: int, body_length: int, extra: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}", "content-type: application/json"]
    lines += [f"content-length: {body_length}", *(f"{k}: {v}" for k, v in extra.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _parse_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, json.loads(body)


async def _drip_body_async(port: int, path: str, body: bytes, extra: dict[str, str]) -> bytes:
    """Send the head at once, then the body one byte per interval until the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request_head("POST", path, port, len(body), extra))
        await writer.drain()
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                first = await asyncio.wait_for(reader.read(65536), DRIP_INTERVAL_S)
            except TimeoutError:
                continue
            return first + await asyncio.wait_for(reader.read(), 10)  # until the server closes
        raise AssertionError("the whole body was dripped without the server cutting it off")
    finally:
        writer.close()


async def test_a_dripped_body_is_cut_off_with_408_before_the_payment_is_verified(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(internal=True, env={"CLIENT_BODY_TIMEOUT_SECONDS": TIMEOUT})
    payment = await paid.payment(GET_BALANCE)
    header = encode_header(payment)
    body = json.dumps(balance_body()).encode()
    fee_payer = usdc_chain.fee_payer.pubkey()
    before = (
        usdc_chain.balance(usdc_chain.payer_ata),
        usdc_chain.balance(usdc_chain.pay_to_ata),
        usdc_chain.lamports(fee_payer),
    )
    solana_rpc_server.calls.clear()
    port = int(paid.url.rsplit(":", 1)[1])

    raw = await _drip_body_async(port, GET_BALANCE, body, {"payment-signature": header})

    status, headers, error = _parse_response(raw)
    assert status == 408
    assert headers["connection"] == "close"
    assert error == {
        "ok": False,
        "error": {
            "code": "request_timeout",
            "message": "request body not received within 1 s",
            "details": {"timeoutSeconds": 1.0},
        },
    }
    assert paid.upstream_calls == 0
    assert not {"simulateTransaction", "sendTransaction"} & set(solana_rpc_server.calls)
    after = (
        usdc_chain.balance(usdc_chain.payer_ata),
        usdc_chain.balance(usdc_chain.pay_to_ata),
        usdc_chain.lamports(fee_payer),
    )
    assert after == before

    # Nothing was claimed: the same payment, sent whole, buys its answer exactly once.
    reply = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert reply.status == 200, reply.body
    assert paid.upstream_calls == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == before[0] - GET_BALANCE_PRICE_INTERNAL
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == before[1] + GET_BALANCE_PRICE_INTERNAL


def _drip(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data`` one byte per interval; what the server sent back once it answered or closed."""
    sock.settimeout(DRIP_INTERVAL_S)
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return b""
        try:
            first = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return b""
        sock.settimeout(10)
        rest = b""
        while first and (chunk := sock.recv(65536)):
            rest += chunk
        return first + rest
    raise AssertionError("everything was dripped without the server cutting it off")


def test_the_served_gateway_closes_a_connection_dripping_its_headers() -> None:
    with serve({**SERVICE_ONLY_ENV, "CLIENT_HEADER_TIMEOUT_SECONDS": TIMEOUT}) as gateway:
        # About 110 bytes: dripped whole in about 33 s, if nothing cut it off.
        head = _request_head("GET", "/healthz", gateway.port, 0, {"x-slow": "slowloris"})
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            answer = _drip(sock, head)
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(head)
            sock.settimeout(10)
            healthy = sock.recv(65536)
    assert answer == b""  # closed before the headers were complete: no request was started
    assert healthy.startswith(b"HTTP/1.1 200")


def test_the_served_gateway_answers_a_dripped_internal_body_with_408() -> None:
    secret = "edges-internal-secret-0123456789abcdef"
    env = {
        **SERVICE_ONLY_ENV,
        "CLIENT_BODY_TIMEOUT_SECONDS": TIMEOUT,
        "INTERNAL_SETTLEMENT_SECRET": secret,
        "FACILITATOR_WALLET_BASE58": wallet_base58(Keypair()),
    }
    body = b'{"x402Version": 2, "paymentPayload": {}, "paymentRequirements": {}}'
    with serve(env) as gateway:
        head = _request_head(
            "POST",
            "/api/internal/facilitator/verify",
            gateway.port,
            len(body),
            {"x-gateway-internal-secret": secret},
        )
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(head)
            raw = _drip(sock, body)
    status, headers, error = _parse_response(raw)
    assert status == 408 and headers["connection"] == "close"
    assert error["ok"] is False and error["error"]["code"] == "request_timeout"
