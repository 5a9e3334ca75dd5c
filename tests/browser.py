"""Debian's headless Chromium, driven over its own DevTools protocol (CDP) on a websocket.

Why CDP and not Selenium: aiohttp, which genready already depends on, speaks websockets, so the
browser test needs no package beyond Debian's `chromium`, and runs the same on every run of
`./dev test` (the venvs and Debian's own python3-* libraries, where Selenium is not installed); and
CDP reports each request the page makes and each console or CSP error as an event, which
Selenium only reaches through the same protocol. The protocol:
https://chromedevtools.github.io/devtools-protocol/ (Target, Page, Runtime, Log, Network domains).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from genready_dev.harness import stop_process, wait_for
from tests import ci

T = TypeVar("T")

# As root Chromium needs --no-sandbox. The rest stop its own traffic (updates, sync, field trials,
# DNS for its services) on a host without a way out (shared README, machines/python.md), so that
# every request left in the log is the page's.
FLAGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-extensions", "--disable-default-apps", "--disable-domain-reliability",
    "--disable-client-side-phishing-detection", "--disable-breakpad", "--metrics-recording-only", "--no-pings",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,InterestFeedContentSuggestions",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
    "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1200,900",
]


def chromium_path() -> str:
    """Debian's Chromium binary (its /usr/bin/chromium is a shell wrapper); skips or fails under CI without it."""
    ci.tool("chromium", "apt-get install chromium: ./dev does")
    real = Path("/usr/lib/chromium/chromium")
    return str(real) if real.exists() else str(shutil.which("chromium"))


class Browser:
    """One headless Chromium with one page, whose console errors and requests are recorded."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.log_path = profile.parent / "chromium.log"
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cdp", daemon=True)
        self._session_id = ""
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._reader: asyncio.Task[None] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Browser:
        self.profile.mkdir(parents=True, exist_ok=True)
        # No D-Bus for it: the session's private bus is systemd's, and Chromium has no use for it.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "XDG_RUNTIME"))}
        env["DBUS_SESSION_BUS_ADDRESS"] = "disabled:"
        with self.log_path.open("ab") as log:
            proc = self.proc = subprocess.Popen(
                [chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        port_file = self.profile / "DevToolsActivePort"
        try:
            wait_for(lambda: self._port_file_read(port_file) or proc.poll() is not None, 30,
                     "Chromium's DevToolsActivePort")
            assert proc.poll() is None, f"Chromium exited: {self.log()}"
            port, path = port_file.read_text().split()[:2]
            self._thread.start()
            self._run(self._connect(f"ws://127.0.0.1:{port}{path}"))
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _port_file_read(p: Path) -> bool:
        return p.exists() and len(p.read_text().split()) >= 2

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _connect(self, url: str) -> None:
        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(url, max_msg_size=0)
        self._reader = asyncio.ensure_future(self._read())
        target = await self._send("Target.createTarget", {"url": "about:blank"})
        attached = await self._send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        self._session_id = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self._send(f"{domain}.enable")
        await self._send("Emulation.setDeviceMetricsOverride",
                         {"width": 1200, "height": 900, "deviceScaleFactor": 1, "mobile": False})

    async def _send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._ws is not None
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._waiting[msg_id] = fut
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if self._session_id:
            msg["sessionId"] = self._session_id
        await self._ws.send_str(json.dumps(msg))
        reply = await fut
        if "error" in reply:
            raise RuntimeError(f"CDP {method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def _read(self) -> None:
        assert self._ws is not None
        async for m in self._ws:
            if m.type != aiohttp.WSMsgType.TEXT:
                break
            msg = json.loads(m.data)
            if "id" in msg:
                fut = self._waiting.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            else:
                self._event(msg.get("method", ""), msg.get("params", {}))

    def _event(self, method: str, p: dict[str, Any]) -> None:
        if method == "Network.requestWillBeSent":
            self.requests.append(p["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            self.console_errors.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            self.console_errors.append("console." + p["type"] + ": " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            e = p["entry"]
            self.console_errors.append(f"{e.get('source')}: {e.get('text')} ({e.get('url', '')})")

    def navigate(self, url: str) -> None:
        self._run(self._send("Page.navigate", {"url": url}))

    def js(self, expression: str) -> Any:
        """The value of `expression` in the page (JSON-able)."""
        r = self._run(self._send("Runtime.evaluate", {"expression": expression, "returnByValue": True}))
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression!r} raised in the page: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, as long as it is, into a PNG."""
        async def shot() -> bytes:
            # To the end of what is drawn, not of the window: a short page leaves no empty band.
            bottom = await self._send("Runtime.evaluate", {"returnByValue": True, "expression":
                                      "document.body.lastElementChild && Math.max(...[...document.body.children]"
                                      ".map((e) => e.getBoundingClientRect().bottom)) + 16"})
            height = bottom["result"].get("value") or 900
            r = await self._send("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": 1200, "height": height, "scale": 1}})
            return base64.b64decode(r["data"])
        path.write_bytes(self._run(shot()))

    def stop(self) -> None:
        if self._thread.is_alive():
            async def close() -> None:
                if self._ws is not None:
                    await self._ws.close()
                if self._reader is not None:
                    with contextlib.suppress(BaseException):
                        await self._reader
                if self._http is not None:
                    await self._http.close()
            with contextlib.suppress(Exception):
                self._run(close(), 10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
        if self.proc is not None:
            stop_process(self.proc)
