"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no new dependency):
the browser reads commands on fd 3 and writes answers and events on fd 4, each a JSON text
ended by a NUL byte.

It drives one page (tab): navigate, evaluate JavaScript, take a screenshot. Dialogs
(``confirm``) are accepted as they open and every dialog is recorded, so a test can tell an
``alert`` from injected script apart from the page's own confirmations.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio


def chromium_binary() -> str:
    """The browser, or an AssertionError: the browser tests fail, not skip, without it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no chromium on PATH: install Debian's `chromium` package "
                         "(apt-get install -y chromium)")


class Browser:
    def __init__(self, to_browser: trio.lowlevel.FdStream,
                 from_browser: trio.lowlevel.FdStream) -> None:
        self._out = to_browser
        self._in = from_browser
        self._next_id = 0
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.session: str | None = None
        self.dialogs: list[dict[str, Any]] = []
        self.console_errors: list[str] = []
        self._send_lock = trio.Lock()

    async def _read_loop(self) -> None:
        buffer = b""
        while True:
            chunk = await self._in.receive_some(1 << 16)
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    channel = self._waiting.pop(message["id"], None)
                    if channel is not None:
                        channel.send_nowait(message)
                elif message.get("method") == "Page.javascriptDialogOpening":
                    self.dialogs.append(message["params"])
                    await self._post("Page.handleJavaScriptDialog", {"accept": True})
                elif message.get("method") == "Runtime.exceptionThrown":
                    details = message["params"]["exceptionDetails"]
                    self.console_errors.append(json.dumps(details)[:500])

    async def _post(self, method: str, params: dict[str, Any] | None = None,
                    session: bool = True) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session is not None:
            message["sessionId"] = self.session
        async with self._send_lock:
            await self._out.send_all(json.dumps(message).encode() + b"\0")
        return self._next_id

    async def call(self, method: str, params: dict[str, Any] | None = None,
                   session: bool = True, timeout: float = 15) -> dict[str, Any]:
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._next_id += 1
        ident = self._next_id
        self._waiting[ident] = send
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session and self.session is not None:
            message["sessionId"] = self.session
        async with self._send_lock:
            await self._out.send_all(json.dumps(message).encode() + b"\0")
        with trio.fail_after(timeout):
            answer = await receive.receive()
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10) -> Any:
        """Evaluate until the expression is truthy; its value."""
        with trio.fail_after(timeout):
            while True:
                value = await self.evaluate(expression)
                if value:
                    return value
                await trio.sleep(0.05)

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", {"url": url})

    async def screenshot(self, path: Path) -> None:
        result = await self.call("Page.captureScreenshot", {"format": "png"})
        target = trio.Path(path)
        await target.parent.mkdir(parents=True, exist_ok=True)
        await target.write_bytes(base64.b64decode(result["data"]))


@asynccontextmanager
async def chromium(user_data_dir: Path, width: int = 1280, height: int = 900,
                   extra_args: tuple[str, ...] = ()) -> AsyncIterator[Browser]:
    """A headless chromium with one page attached, closed on exit. ``extra_args``: more
    command-line switches (``--host-resolver-rules=MAP name 127.0.0.1``)."""
    binary = chromium_binary()
    commands_r, commands_w = os.pipe()
    answers_r, answers_w = os.pipe()
    # In the child, fds 3 and 4 must be the pipe ends: duplicate them high first, so that
    # dup2 never overwrites an end before it is copied.
    high_r = fcntl.fcntl(commands_r, fcntl.F_DUPFD, 20)
    high_w = fcntl.fcntl(answers_w, fcntl.F_DUPFD, 20)

    def child_fds() -> None:
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    args = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--hide-scrollbars", "--mute-audio", "--disable-breakpad", "--disable-crash-reporter",
            "--remote-debugging-pipe",
            f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}",
            *extra_args, "about:blank"]
    process = await trio.lowlevel.open_process(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(3, 4), preexec_fn=child_fds,
    )
    for fd in (commands_r, answers_w, high_r, high_w):
        os.close(fd)
    browser = Browser(trio.lowlevel.FdStream(commands_w), trio.lowlevel.FdStream(answers_r))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(browser._read_loop)
            target = await browser.call("Target.createTarget", {"url": "about:blank"},
                                        timeout=30)
            attached = await browser.call("Target.attachToTarget", {
                "targetId": target["targetId"], "flatten": True})
            browser.session = attached["sessionId"]
            await browser.call("Page.enable")
            await browser.call("Runtime.enable")
            await browser.call("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            try:
                yield browser
            finally:
                with trio.move_on_after(5):
                    await browser.call("Browser.close", session=False)
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(5):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        await browser._out.aclose()
        await browser._in.aclose()
