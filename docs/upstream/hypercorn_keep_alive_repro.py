"""Standalone reproduction for docs/upstream/hypercorn-keep-alive.md (needs only hypercorn[trio];
quart-trio for the last app).

    python hypercorn_keep_alive_repro.py plain        # an ASGI app that returns: all correct
    python hypercorn_keep_alive_repro.py cancelling   # cancels itself on http.disconnect
    python hypercorn_keep_alive_repro.py quart-trio   # a bare QuartTrio app

For each app it serves one request per connection with keep_alive_timeout = 2 s and reports
whether hypercorn ends the connection: when idle, for ``Connection: close``, for HTTP/1.0. It
then has 50 clients close their keep-alive connections and counts the server's sockets still
open. Observed with hypercorn 0.18.0, trio 0.35, quart-trio 0.12.0, Python 3.11, Linux.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

KEEP_ALIVE_TIMEOUT = 2


async def lifespan(receive: Any, send: Any) -> None:
    while True:
        kind = (await receive())["type"]
        await send({"type": kind + ".complete"})
        if kind == "lifespan.shutdown":
            return


async def respond(send: Any) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def plain_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return await lifespan(receive, send)
    await respond(send)


async def cancelling_app(scope: Any, receive: Any, send: Any) -> None:
    """What quart-trio's TrioASGIHTTPConnection does: one task reads ``receive()`` until
    ``http.disconnect`` and then cancels the request's nursery."""
    if scope["type"] != "http":
        return await lifespan(receive, send)
    async with trio.open_nursery() as nursery:
        async def until_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(until_disconnect)
        await respond(send)
        nursery.cancel_scope.cancel()


def quart_trio_app() -> Any:
    from quart_trio import QuartTrio

    app = QuartTrio(__name__)

    @app.route("/")
    async def index() -> str:
        return "ok"

    return app


def probe(port: int, request: bytes, wait: float) -> str:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        s.settimeout(wait)
        started = time.monotonic()
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            return f"STILL OPEN after {wait:.0f} s"
        return f"closed after {time.monotonic() - started:.1f} s"


def server_sockets_after_client_close(port: int) -> int:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(65536)
            time.sleep(0.01)  # the server is idle on the connection when the client closes
    time.sleep(0.5)
    return max(0, len(os.listdir("/proc/self/fd")) - before)


async def main(app: Any) -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
        port = int(urls[0].rsplit(":", 1)[1])
        for name, request in [
            ("idle keep-alive connection", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("Connection: close", b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            ("HTTP/1.0", b"GET / HTTP/1.0\r\n\r\n"),
        ]:
            print(f"  {name}: {await trio.to_thread.run_sync(probe, port, request, 5)}")
        held = await trio.to_thread.run_sync(server_sockets_after_client_close, port)
        print(f"  50 clients closed their idle connections: {held} server sockets still open "
              f"0.5 s later (keep_alive_timeout {KEEP_ALIVE_TIMEOUT} s)")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "cancelling"
    apps = {"plain": lambda: plain_app, "cancelling": lambda: cancelling_app,
            "quart-trio": quart_trio_app}
    print(which)
    trio.run(main, apps[which]())
