"""Headless Chromium (Debian's package) driven over the DevTools protocol, with no network but 127.0.0.1.

Only what the browser tests need: open a page, evaluate JavaScript, wait for a
condition, take a screenshot, and list every URL the page asked for (to prove
nothing came from outside).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(AssertionError):
    pass


class Page:
    def __init__(self, socket: ClientConnection) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._load_events: asyncio.Queue[None] = asyncio.Queue()
        self.requested: list[str] = []
        self.requests: list[dict[str, Any]] = []  # url, method, headers, postData
        self.errors: list[str] = []  # uncaught JavaScript exceptions
        self.console_errors: list[str] = []  # failed loads and the like, as the console shows them
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self._socket:
            message = json.loads(raw)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    if "error" in message:
                        future.set_exception(BrowserError(str(message["error"])))
                    else:
                        future.set_result(message.get("result", {}))
                continue
            method, params = message.get("method"), message.get("params", {})
            if method == "Network.requestWillBeSent":
                self.requested.append(params["request"]["url"])
                self.requests.append(params["request"])
            elif method == "Page.loadEventFired":
                self._load_events.put_nowait(None)
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                self.errors.append(
                    details.get("exception", {}).get("description") or details["text"]
                )
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                self.console_errors.append(params["entry"]["text"])

    async def send(self, method: str, **params: Any) -> Any:
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        await self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        return await asyncio.wait_for(future, 30)

    async def goto(self, url: str) -> None:
        while not self._load_events.empty():
            self._load_events.get_nowait()
        await self.send("Page.navigate", url=url)
        await asyncio.wait_for(self._load_events.get(), 30)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str, within: float = 20) -> Any:
        """The expression's first truthy value; fails naming `what` when it never comes."""
        deadline = time.monotonic() + within
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(
                    f"timed out waiting for {what}; "
                    f"page errors: {self.errors + self.console_errors}"
                )
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> Path:
        result = await self.send("Page.captureScreenshot", format="png")
        png = base64.b64decode(result["data"])

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)

        await asyncio.to_thread(write)
        return path

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        await self._socket.close()


@contextlib.asynccontextmanager
async def chromium(width: int = 1400, height: int = 900) -> AsyncIterator[Page]:
    """A fresh headless Chromium and one page; every host name but 127.0.0.1 fails to resolve."""
    if CHROMIUM is None:
        raise BrowserError("chromium is not installed")
    profile = Path(tempfile.mkdtemp(prefix="llmgw-chromium-"))
    process = await asyncio.create_subprocess_exec(
        *[
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # as root in CI; the pages are our own
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            # The air gap: a CDN URL cannot load, only the service under test can.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--proxy-server=direct://",
            f"--window-size={width},{height}",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socket: ClientConnection | None = None
    page: Page | None = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.returncode is not None:
                raise BrowserError(f"chromium exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise BrowserError("chromium did not open its DevTools port")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as devtools:
            targets = (await devtools.get("/json/list")).json()
        target = next(t for t in targets if t["type"] == "page")
        socket = await connect(target["webSocketDebuggerUrl"], max_size=None)
        page = Page(socket)
        for domain in ("Page", "Runtime", "Network", "Log"):
            await page.send(f"{domain}.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        yield page
    finally:
        if page is not None:
            await page.close()
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        shutil.rmtree(profile, ignore_errors=True)
