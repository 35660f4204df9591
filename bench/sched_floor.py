"""How far one cold schedule through the broker is from the least a Python server could take
(issue 32: one schedule through the SDK on an idle broker, p50 at most 2 ms).

One bare blocking client (``bench.sched_path``'s ``--client raw``: the SDK's request spelled by
hand) sends a one-timer ``POST /api/v1/timers`` to three servers on one database, in turn,
``--gap-ms`` (250) after the last call, so every process finds its caches as cold as a broker
called now and then does:

- ``blocking``: a minimal server in one blocking thread: read the request, ``json.loads`` it,
  run the broker's own statement (``queen.schedule_timer``, prepared) through libpq, write a
  small JSON answer. No validation, no metrics, no framework: the floor of any Python broker.
- ``trio``: the same on trio (its sockets, libpq non-blocking, ``wait_readable``): what trio's
  wake-ups add.
- ``broker``: this checkout's broker.

``python -m bench.sched_floor [--calls 100] [--gap-ms 250]``; the table goes to stdout and the
numbers to ``bench/results/sched_floor.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.brokers import free_port, side_broker
from bench.harness.pg import shared_server
from bench.harness.raw_client import RawClient
from bench.harness.report import load, now_iso, save_json, source_revision
from bench.harness.stats import distribution

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "sched_floor.json"
SERVERS = ("blocking", "trio", "broker")

# The broker's lone schedule statement (queen_trio/sql/timer_store.sql: schedule_one).
_STATEMENT = (b"SELECT ord, status, txn, message_id::text, deliver_at FROM queen.schedule_timer("
              b"$1, $2, $3, $4, $5, $6::bigint, $7::integer, $8::bytea, $9, $10::bigint)")


def _serve(kind: str, url: str, port: int) -> None:
    """A minimal server (``blocking`` or ``trio``) on ``port``, for one client at a time."""
    import base64
    import socket

    import psycopg
    from psycopg import pq

    conn = psycopg.connect(url, autocommit=True)
    row = conn.execute("SELECT min(tenant_id) FROM queen.tenants").fetchone()
    assert row is not None
    tenant = str(row[0]).encode()
    pg = conn.pgconn
    prepared = pg.prepare(b"s", _STATEMENT)
    assert prepared.status == pq.ExecStatus.COMMAND_OK, prepared.error_message
    formats = [0] * 7 + [1] + [0] * 2

    def params(body: bytes) -> list[bytes]:
        op = json.loads(body)["operations"][0]
        payload = base64.b64decode(op["payload"])
        return [tenant, op["queue"].encode(), op["timerKey"].encode(), b"Default",
                op["txn"].encode(), str(op["delayMs"]).encode(), str(len(payload)).encode(),
                payload, b"f", b"500"]

    def answer(result: Any) -> bytes:
        assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
        body = json.dumps({"results": [{"status": result.get_value(0, 1).decode(),
                                        "txn": result.get_value(0, 2).decode()}]}).encode()
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def request(buffer: bytes) -> tuple[bytes, bytes] | None:
        """(body, what follows it) of the first whole request in ``buffer``, or None."""
        head, sep, rest = buffer.partition(b"\r\n\r\n")
        if not sep:
            return None
        size = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return (rest[:size], rest[size:]) if len(rest) >= size else None

    if kind == "blocking":
        server = socket.create_server(("127.0.0.1", port))
        print("ready", flush=True)
        while True:
            client, _ = server.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buffer = b""
            while data := client.recv(65536):
                buffer += data
                while (whole := request(buffer)) is not None:
                    body, buffer = whole
                    client.sendall(answer(pg.exec_prepared(b"s", params(body), formats)))
    import trio

    pg.nonblocking = 1

    async def execute(values: list[bytes]) -> Any:
        pg.send_query_prepared(b"s", values, formats)
        while pg.flush():
            await trio.lowlevel.wait_writable(pg.socket)
        last = None
        while True:
            pg.consume_input()
            while not pg.is_busy():
                result = pg.get_result()
                if result is None:
                    return last
                last = result
            await trio.lowlevel.wait_readable(pg.socket)

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while data := await stream.receive_some(65536):
            buffer += data
            while (whole := request(buffer)) is not None:
                body, buffer = whole
                await stream.send_all(answer(await execute(params(body))))

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("ready", flush=True)
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


def run(calls: int, gap_s: float, admin_url: str | None) -> dict[str, Any]:
    samples: dict[str, list[float]] = {name: [] for name in SERVERS}
    started, load_before = now_iso(), load()
    with shared_server(admin_url) as server, server.database("floor") as db, \
            side_broker(REPO, db) as (broker_url, _):
        minimal: list[subprocess.Popen[str]] = []
        urls = {"broker": broker_url}
        try:
            for kind in ("blocking", "trio"):
                port = free_port()
                proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, db, str(port)],
                                        cwd=REPO, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
                minimal.append(proc)
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                urls[kind] = f"http://127.0.0.1:{port}"
            clients = {name: RawClient(urls[name]) for name in SERVERS}
            for name, client in clients.items():  # untimed: connections and statements warm
                for i in range(5):
                    client.timer("floor").key(f"warm-{name}-{i}").delay("1h").payload(
                        {"i": i}).schedule()
            for i in range(calls):
                if i % 900 == 899:  # (hypercorn closes a connection after 1,000 requests)
                    clients["broker"] = RawClient(urls["broker"])
                for name in SERVERS:
                    time.sleep(gap_s)
                    t = time.perf_counter()
                    clients[name].timer("floor").key(f"{name}-{i}").delay("1h").payload(
                        {"i": i}).schedule()
                    samples[name].append(time.perf_counter() - t)
        finally:
            for proc in minimal:
                proc.kill()
                proc.wait()
    return {"started": started, "load": [load_before, load()], "revision": source_revision(),
            "calls": calls, "gap_ms": gap_s * 1000,
            "servers": {name: distribution(v) for name, v in samples.items()}}


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--gap-ms", type=int, default=250)
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    out = run(args.calls, args.gap_ms / 1000, args.admin_url)
    print(f"# python -m bench.sched_floor --calls {args.calls} --gap-ms {args.gap_ms}; "
          f"load {out['load'][0]} -> {out['load'][1]}")
    print("| server | p50 | p90 | p99 | max (ms) |\n|---|--:|--:|--:|--:|")
    for name, d in out["servers"].items():
        print(f"| {name} | {d['p50']} | {d['p90']} | {d['p99']} | {d['max']} |")
    save_json(args.out, out)


if __name__ == "__main__":
    main()
