"""The in-process transport says what the socket says.

The same ASGI app is served by hypercorn on loopback and registered with :class:`AsgiTransport`
under the same URL; one :class:`UpstreamClient` per transport sends the same requests. What the
app receives (method, path, query, the headers that carry meaning, the body) and what the
client gets back (status, body, headers, or the same typed failure) must be equal, so a test on
the double tests what production does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from gateway.outbound.asgi import AsgiTransport
from gateway.outbound.client import (
    Answer,
    UpstreamClient,
    UpstreamFailure,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.outbound.transport import AiohttpTransport
from gateway.web.asgi import Receive, Scope, Send
from tests.support.gateway_server import run_app

SEEN_HEADERS = ("host", "content-type", "content-length", "x-probe", "authorization")


async def third_party(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers by path: ``/echo`` what it received, ``/status/<n>``, ``/big/<n>`` bytes,
    ``/slow``, ``/moved`` (302 to ``/echo``), ``/see-other`` (303), ``/fail`` (raises first),
    ``/break`` (raises mid-answer)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    path: str = scope["path"]
    status, headers, answer = 200, [(b"content-type", b"application/json"), (b"x-answer", b"Yes")], b"{}"
    if path.startswith("/echo") or path == "/a b/c":
        got = {k.decode(): v.decode() for k, v in scope["headers"] if k.decode() in SEEN_HEADERS}
        answer = json.dumps(
            {
                "method": scope["method"],
                "path": path,
                "raw_path": scope["raw_path"].decode(),
                "query": scope["query_string"].decode(),
                "headers": got,
                "body": body.decode(),
            }
        ).encode()
    elif path.startswith("/status/"):
        status = int(path.rsplit("/", 1)[1])
        answer = b'{"why":"told to"}'
    elif path.startswith("/big/"):
        answer = b'"' + b"x" * int(path.rsplit("/", 1)[1]) + b'"'
    elif path == "/slow":
        await asyncio.sleep(5)
    elif path in ("/moved", "/see-other"):
        status = 302 if path == "/moved" else 303
        headers.append((b"location", b"/echo/landed?from=redirect"))
    elif path == "/fail":
        raise RuntimeError("the app failed before answering")
    elif path == "/break":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"half', "more_body": True})
        raise RuntimeError("the app failed mid-answer")
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@dataclass
class Both:
    url: str
    wire: UpstreamClient
    double: UpstreamClient
    transport: AsgiTransport


@pytest_asyncio.fixture(loop_scope="session")
async def both() -> AsyncIterator[Both]:
    async with run_app(third_party) as url:
        transport = AsgiTransport({url.removeprefix("http://"): third_party})
        wire = UpstreamClient(AiohttpTransport(), timeout_s=1.0, max_bytes=4096)
        double = UpstreamClient(transport, timeout_s=1.0, max_bytes=4096)
        try:
            yield Both(url, wire, double, transport)
        finally:
            await wire.close()
            await double.close()


async def outcome(client: UpstreamClient, method: str, url: str, **kwargs: Any) -> Any:
    """What a caller sees: the answer's status, JSON body and meaningful headers, or the failure."""
    try:
        answer: Answer = await client.request(method, url, **kwargs)
    except UpstreamStatus as failed:
        return ("status", failed.status, failed.answer.body)
    except UpstreamFailure as failed:
        return (type(failed).__name__,)
    headers = {k: answer.headers.get(k) for k in ("content-type", "x-answer", "X-ANSWER")}
    return (answer.status, json.loads(answer.body), headers)


EXCHANGES = [
    pytest.param("GET", "/echo/plain", {}, id="get"),
    pytest.param(
        "POST", "/echo/post?api-key=K&b=1",
        {"data": b'{"a":1}', "headers": {"Content-Type": "application/json", "X-Probe": "p"}}, id="post",
    ),
    pytest.param("POST", "/echo/bytes", {"data": b"raw"}, id="post-without-content-type"),
    pytest.param("PUT", "/echo/empty", {"data": b""}, id="empty-body"),
    pytest.param("GET", "/a%20b/c?q=%2F", {}, id="percent-encoded"),
    pytest.param("GET", "/status/404", {}, id="404"),
    pytest.param("GET", "/status/503", {}, id="503"),
    pytest.param("GET", "/status/409", {"accept": {409}}, id="accepted-409"),
    pytest.param("GET", "/moved", {}, id="redirect-followed"),
    pytest.param(
        "POST", "/see-other", {"data": b"x", "headers": {"Content-Type": "text/plain"}}, id="303-post"
    ),
    pytest.param("GET", "/big/4000", {}, id="under-the-cap"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "kwargs"), EXCHANGES)
async def test_the_double_answers_as_the_socket_does(
    both: Both, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    over_the_wire = await outcome(both.wire, method, both.url + path, **kwargs)
    in_process = await outcome(both.double, method, both.url + path, **kwargs)

    assert in_process == over_the_wire
    assert both.transport.failures == []


@pytest.mark.parametrize(
    ("path", "failure"),
    [
        pytest.param("/big/5000", UpstreamTooLarge, id="over-the-cap"),
        pytest.param("/slow", UpstreamTimeout, id="timeout"),
        pytest.param("/break", UpstreamUnreachable, id="broken-mid-answer"),
    ],
)
async def test_the_double_fails_as_the_socket_does(both: Both, path: str, failure: type[Exception]) -> None:
    with pytest.raises(failure):
        await both.wire.request("GET", both.url + path)
    with pytest.raises(failure):
        await both.double.request("GET", both.url + path)


async def test_an_app_that_fails_before_answering_is_a_500_and_its_error_is_kept(both: Both) -> None:
    with pytest.raises(UpstreamStatus) as over_the_wire:
        await both.wire.request("GET", both.url + "/fail")
    with pytest.raises(UpstreamStatus) as in_process:
        await both.double.request("GET", both.url + "/fail")

    assert over_the_wire.value.status == in_process.value.status == 500
    assert [str(e) for e in both.transport.failures] == ["the app failed before answering"]


async def test_a_redirect_not_followed_is_its_own_answer(both: Both) -> None:
    stays = both.double.bound(upstream=None, follow_redirects=False)
    stays_on_wire = both.wire.bound(upstream=None, follow_redirects=False)

    in_process = await stays.request("GET", both.url + "/moved", accept={302})
    over_the_wire = await stays_on_wire.request("GET", both.url + "/moved", accept={302})

    assert in_process.status == over_the_wire.status == 302
    assert in_process.headers["Location"] == over_the_wire.headers["Location"] == "/echo/landed?from=redirect"


async def test_a_host_no_app_serves_is_unreachable() -> None:
    client = UpstreamClient(AsgiTransport({}), timeout_s=1.0)

    with pytest.raises(UpstreamUnreachable) as caught:
        await client.request("GET", "http://nobody.test/x?api-key=SECRET")

    assert caught.value.cause == "ConnectionRefusedError" and "SECRET" not in str(caught.value)
