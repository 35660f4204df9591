"""The HTTP stack's floor: server CPU per request before any broker logic runs.

Issue 18 asks a lone ``POST /api/v1/ack`` to cost the broker at most 0.5 ms of CPU. This
measures what the prescribed stack (hypercorn on trio, Quart via quart-trio, psycopg) costs on
its own, each app in its own hypercorn process, one keep-alive client sending the same small
JSON POST in sequence (server CPU from /proc):

* ``asgi``: hypercorn and a raw ASGI app that reads the body, parses it and answers a constant;
* ``quart``: hypercorn and a bare QuartTrio app with that one route;
* ``asgi+statement``: the raw ASGI app running one statement (``SELECT $1``) through
  ``queen_trio.db.Database``, as any ack must: the least an ack can cost here with no Quart,
  no auth, no metrics, no ack logic at all.

Variants alternate, ``--rounds`` times. Compare with ``bench.consume_cost`` (the broker's own
lone ack) in the same hour.

    python -m bench.stack_floor [--requests 3000] [--rounds 2] [--admin-url URL]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.harness.brokers import free_port
from bench.harness.pg import shared_server
from bench.harness.report import load, source_revision

VARIANTS = ("asgi", "quart", "asgi+statement")
ANSWER = b'[{"status":"completed","success":true}]'


def _app(kind: str, database_url: str) -> Any:
    state: dict[str, Any] = {}

    async def read_body(receive: Any) -> bytes:
        data = b""
        while True:
            message = await receive()
            data += message.get("body", b"")
            if not message.get("more_body"):
                return data

    def select(raw: Any, txn: str) -> Any:
        return raw.execute("SELECT %s::text AS t", (txn,)).fetchone()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    if kind == "asgi+statement":
                        from queen_trio.db import Database

                        state["db"] = Database(database_url, max_size=2)
                        await state["db"].__aenter__()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = json.loads(await read_body(receive))
        answer = ANSWER
        if "db" in state:
            row = await state["db"].run_autocommit(select, body["transactionId"])
            answer = json.dumps([{"transactionId": row["t"], "status": "completed"}]).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    if kind != "quart":
        return app
    from quart import request
    from quart_trio import QuartTrio

    quart = QuartTrio("stack_floor")

    @quart.post("/api/v1/ack")
    async def ack() -> Any:
        await request.get_json()
        return quart.response_class(ANSWER, content_type="application/json")

    return quart


def serve(kind: str, port: int, database_url: str) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = config.errorlog = None
    trio.run(hypercorn_serve, _app(kind, database_url), config)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kind: str, database_url: str, n: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.stack_floor", "--serve", kind,
                             "--port", str(port), "--admin-url", database_url])
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        deadline = time.monotonic() + 20
        body = json.dumps({"transactionId": "t-1", "status": "completed"}).encode()

        def one() -> None:
            conn.request("POST", "/api/v1/ack", body=body,
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status

        while True:
            try:
                one()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                conn.close()
                time.sleep(0.1)
        for _ in range(300):
            one()
        cpu0, t0 = _cpu_s(proc.pid), time.perf_counter()
        for _ in range(n):
            one()
        cpu1, t1 = _cpu_s(proc.pid), time.perf_counter()
        conn.close()
    finally:
        proc.kill()
        proc.wait()
    return {"per_s": round(n / (t1 - t0)), "server_cpu_ms": round((cpu1 - cpu0) * 1000 / n, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--admin-url", default=None)
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.admin_url)
        return 0
    print(f"stack_floor at {source_revision()}, load {load()}", flush=True)
    with shared_server(args.admin_url) as server:
        for _ in range(args.rounds):
            for kind in VARIANTS:
                print(f"[stack_floor] {kind:<16} {measure(kind, server.admin_url, args.requests)}",
                      flush=True)
    print(f"load at the end {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
