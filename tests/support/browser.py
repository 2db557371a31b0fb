"""Headless Chromium, driven over the DevTools protocol (an aiohttp websocket), for page tests.

:func:`chromium_page` starts the machine's own ``chromium`` (Debian's package; nothing is
downloaded) with a fresh profile and no background networking, and yields a :class:`Page`:
navigate, evaluate JavaScript, type, wait for a condition, and read what the page reported: its
console errors, uncaught exceptions, browser log errors (a CSP violation lands there) and the
URL of every request it made. The browser's process group is stopped on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
"""The browser, or None: page tests skip without it (``.ci/run`` installs Debian's)."""

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 30.0


class Page:
    """One browser tab over its DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = message.json()
            waiter = self._waiting.pop(data.get("id", 0), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        """One DevTools command; its ``result``, or AssertionError with the browser's error."""
        command_id = next(self._ids)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[command_id] = waiter
        await self.ws.send_json({"id": command_id, "method": method, "params": params})
        answer = await asyncio.wait_for(waiter, timeout_s)
        assert "error" not in answer, f"{method}: {answer['error']}"
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 15.0) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            await asyncio.sleep(0.05)

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def type_text(self, text: str) -> None:
        """Type into the focused element, as a keyboard would (input events fire)."""
        await self.send("Input.insertText", text=text)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP violations included)."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(str(params["exceptionDetails"]))
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(str(params.get("args")))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")
        return found

    def requested_urls(self) -> list[str]:
        return [
            e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"
        ]


async def _devtools_port(profile: Path, process: asyncio.subprocess.Process) -> int:
    """The port Chromium chose, from the file it writes into its profile once it listens."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if marker.is_file():
            first = marker.read_text(encoding="utf-8").splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        if process.returncode is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before listening")
        if time.monotonic() > deadline:
            raise TimeoutError(f"chromium did not open its DevTools port within {START_TIMEOUT_S} s")
        await asyncio.sleep(0.05)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the browser's own process group (its renderers included), SIGKILL to whatever
    is left after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), 10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


@asynccontextmanager
async def chromium_page() -> AsyncIterator[Page]:
    """A fresh headless Chromium with one blank tab, its DevTools domains enabled."""
    assert CHROMIUM is not None, "chromium is not installed"
    with tempfile.TemporaryDirectory(prefix="x402-chromium-") as tmp:
        profile = Path(tmp)
        process = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port = await _devtools_port(profile, process)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as listing:
                    targets = await listing.json()
                tab = next(t for t in targets if t["type"] == "page")
                async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    page = Page(ws)
                    for domain in ("Page", "Runtime", "Log", "Network"):
                        await page.send(f"{domain}.enable")
                    try:
                        yield page
                    finally:
                        page._reader.cancel()
        finally:
            await _stop(process)
