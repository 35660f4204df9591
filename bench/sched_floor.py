"""How far one cold schedule through the SDK is from the least this machine could take
(issue 32: one schedule through the SDK on an idle broker, p50 at most 2 ms).

A ladder of rungs, each a larger stack than the one before, called in turn, ``--gap-ms`` after
the last call (250: every process finds its caches as cold as a broker called now and then
does; 10: one call soon after another), on one database:

- ``insert``: a one-row insert into a plain table and its commit, straight through libpq from
  this process: the durable commit alone, no HTTP.
- ``statement``: the broker's own statement (``queen.schedule_timer``, prepared) through libpq
  from this process: the database's share, no HTTP.
- ``procrastinate``: Procrastinate's ``defer_job`` of one job, psycopg straight to PostgreSQL
  (a peer's single call, no HTTP; left out when Procrastinate is not installed).
- ``blocking``: a minimal HTTP server in one blocking thread: read the request, ``json.loads``
  it, run the broker's statement through libpq, write a small JSON answer. No validation, no
  metrics, no framework: the floor of any Python broker.
- ``trio``: the same on trio (its sockets, libpq non-blocking, ``wait_readable``): what trio's
  wake-ups add.
- ``hypercorn``: the same statement in a bare ASGI app served by hypercorn on trio, the HTTP
  stack the broker is built on, with no Quart and no broker logic: what that stack adds.
- ``broker``: this checkout's broker, called by a bare blocking client (``bench.sched_path``'s
  ``--client raw``: the SDK's request spelled by hand).
- ``sync-sdk``: the broker through the SDK's ``SyncClient``.
- ``sdk``: the broker through the SDK's async ``Client`` on trio, the issue's path.

The HTTP rungs send the same one-timer ``POST /api/v1/timers``.

``python -m bench.sched_floor [--calls 100] [--gap-ms 250 [10 ...]]``; the table goes to
stdout and the numbers to ``bench/results/sched_floor.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness.brokers import free_port, side_broker
from bench.harness.pg import shared_server
from bench.harness.raw_client import RawClient
from bench.harness.report import load, now_iso, save_json, source_revision
from bench.harness.stats import distribution

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "sched_floor.json"
RUNGS = ("insert", "statement", "procrastinate", "blocking", "trio", "hypercorn", "broker",
         "sync-sdk", "sdk")
SERVERS = ("blocking", "trio", "hypercorn")  # the minimal HTTP servers, each in its own process

# The broker's lone schedule statement (queen_trio/sql/timer_store.sql: schedule_one).
_STATEMENT = (b"SELECT ord, status, txn, message_id::text, deliver_at FROM queen.schedule_timer("
              b"$1, $2, $3, $4, $5, $6::bigint, $7::integer, $8::bytea, $9, $10::bigint)")


def _connect(url: str) -> tuple[Any, bytes]:
    """A libpq connection (psycopg's, autocommit) with the broker's statement prepared as
    ``s``, and the tenant to schedule for."""
    import psycopg
    from psycopg import pq

    conn = psycopg.connect(url, autocommit=True)
    row = conn.execute("SELECT min(tenant_id) FROM queen.tenants").fetchone()
    assert row is not None
    prepared = conn.pgconn.prepare(b"s", _STATEMENT)
    assert prepared.status == pq.ExecStatus.COMMAND_OK, prepared.error_message
    return conn, str(row[0]).encode()


_FORMATS = [0] * 7 + [1] + [0] * 2


def _values(tenant: bytes, queue: str, key: str, txn: str, delay_ms: int,
            payload: bytes) -> list[bytes]:
    return [tenant, queue.encode(), key.encode(), b"Default", txn.encode(),
            str(delay_ms).encode(), str(len(payload)).encode(), payload, b"f", b"500"]


def _serve(kind: str, url: str, port: int) -> None:
    """A minimal server (``blocking`` or ``trio``) on ``port``, for one client at a time."""
    import base64
    import socket

    from psycopg import pq

    conn, tenant = _connect(url)
    pg = conn.pgconn
    formats = _FORMATS

    def params(body: bytes) -> list[bytes]:
        op = json.loads(body)["operations"][0]
        return _values(tenant, op["queue"], op["timerKey"], op["txn"], op["delayMs"],
                       base64.b64decode(op["payload"]))

    def body_of(result: Any) -> bytes:
        assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
        return json.dumps({"results": [{"status": result.get_value(0, 1).decode(),
                                        "txn": result.get_value(0, 2).decode()}]}).encode()

    def answer(result: Any) -> bytes:
        body = body_of(result)
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

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The same on hypercorn: a bare ASGI app (lifespan answered, one route)."""
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        out = body_of(await execute(params(body)))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    async def main() -> None:
        if kind == "hypercorn":
            from hypercorn.config import Config
            from hypercorn.trio import serve

            config = Config()
            config.bind = [f"127.0.0.1:{port}"]
            config.accesslog = None
            config.keep_alive_timeout = 600  # (a pass over every rung at 250 ms takes seconds)
            async with trio.open_nursery() as nursery:
                await nursery.start(serve, app, config)
                print("ready", flush=True)
            return
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        print("ready", flush=True)
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


class _Direct:
    """The rungs with no HTTP: this process straight to PostgreSQL through libpq."""

    def __init__(self, url: str) -> None:
        self.conn, self.tenant = _connect(url)
        self.conn.execute("CREATE TABLE IF NOT EXISTS floor_insert (id bigserial PRIMARY KEY, "
                          "k text NOT NULL, payload bytea NOT NULL)")
        insert = self.conn.pgconn.prepare(
            b"i", b"INSERT INTO floor_insert (k, payload) VALUES ($1, $2::bytea)")
        assert not insert.error_message, insert.error_message

    def insert(self, key: str, payload: bytes) -> None:
        from psycopg import pq

        result = self.conn.pgconn.exec_prepared(b"i", [key.encode(), payload], [0, 1])
        assert result.status == pq.ExecStatus.COMMAND_OK, result.error_message

    def statement(self, key: str, payload: bytes) -> None:
        from psycopg import pq

        result = self.conn.pgconn.exec_prepared(
            b"s", _values(self.tenant, "floor", key, str(uuid.uuid4()), 3_600_000, payload),
            _FORMATS)
        assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
        assert result.get_value(0, 1) == b"scheduled", result.get_value(0, 1)

    def close(self) -> None:
        self.conn.close()


def _procrastinate(url: str) -> Any:
    """Procrastinate's client on ``url`` (its schema applied), or None when not installed."""
    from bench.harness import peer_procrastinate

    if peer_procrastinate.missing() is not None:
        return None
    peer = peer_procrastinate.PeerClient(url)
    peer.apply_schema()
    return peer


async def _ladder(urls: dict[str, str], db: str, calls: int, gaps_s: list[float]
                  ) -> dict[str, dict[str, list[float]]]:
    """Samples in seconds, per gap (ms, as text) and rung."""
    import trio

    import queen_trio

    direct = _Direct(db)
    peer = _procrastinate(db)
    raws = {name: RawClient(urls[name]) for name in (*SERVERS, "broker")}
    sync_sdk = queen_trio.SyncClient(urls["broker"])
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        async with queen_trio.Client(urls["broker"]) as sdk:
            async def call(rung: str, key: str) -> None:
                if rung in ("insert", "statement"):
                    getattr(direct, rung)(key, json.dumps({"k": key}).encode())
                elif rung == "procrastinate":
                    assert peer.defer_at([(key, time.time() + 3600)], queue="floor") == 1
                else:  # the HTTP rungs: the SDK's builder, or the bare client's copy of it
                    client = {"sdk": sdk, "sync-sdk": sync_sdk}.get(rung) or raws[rung]
                    answer = client.timer("floor").key(key).delay("1h").payload(
                        {"k": key}).schedule()
                    if rung == "sdk":
                        await answer

            rungs = [r for r in RUNGS if r != "procrastinate" or peer is not None]
            for rung in rungs:  # untimed: connections opened, statements prepared and warm
                for i in range(5):
                    await call(rung, f"warm-{rung}-{i}")
            for gap_s in gaps_s:
                mine = samples[f"{gap_s * 1000:g}"] = {rung: [] for rung in rungs}
                for i in range(calls):
                    if i % 300 == 299:  # (hypercorn closes a connection after 1,000 requests)
                        for name in ("hypercorn", "broker"):
                            raws[name].close()
                            raws[name] = RawClient(urls[name])
                    for rung in rungs:
                        await trio.sleep(gap_s)
                        t = time.perf_counter()
                        await call(rung, f"{rung}-{gap_s * 1000:g}-{i}")
                        mine[rung].append(time.perf_counter() - t)
    finally:
        sync_sdk.close()
        for raw in raws.values():
            raw.close()
        if peer is not None:
            peer.close()
        direct.close()
    return samples


def _timers_by_rung(url: str) -> dict[str, int]:
    """The timers the timed calls left pending, by the rung that scheduled them (the HTTP
    rungs and ``statement``: one each)."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT regexp_replace(timer_key, '-[0-9.]+-[0-9]+$', ''), count(*)::int "
            "FROM queen.timers WHERE queue = 'floor' AND timer_key NOT LIKE 'warm-%' "
            "GROUP BY 1").fetchall()
    return dict(sorted(rows))


def run(calls: int, gaps_s: list[float], admin_url: str | None) -> dict[str, Any]:
    import trio

    started, load_before = now_iso(), load()
    with shared_server(admin_url) as server, server.database("floor") as db, \
            side_broker(REPO, db) as (broker_url, _):
        minimal: list[subprocess.Popen[str]] = []
        urls = {"broker": broker_url}
        try:
            for kind in SERVERS:
                port = free_port()
                proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, db, str(port)],
                                        cwd=REPO, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONPATH": str(REPO)})
                minimal.append(proc)
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                urls[kind] = f"http://127.0.0.1:{port}"
            samples = trio.run(_ladder, urls, db, calls, gaps_s)
            timers = _timers_by_rung(db)
        finally:
            for proc in minimal:
                proc.kill()
                proc.wait()
    return {"started": started, "load": [load_before, load()], "revision": source_revision(),
            "calls": calls, "timers": timers,
            "gaps_ms": {gap: {rung: distribution(v) for rung, v in by_rung.items()}
                        for gap, by_rung in samples.items()}}


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--gap-ms", type=int, nargs="+", default=[250],
                        help="the pause before each call; several: one pass each, in turn")
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    out = run(args.calls, [g / 1000 for g in args.gap_ms], args.admin_url)
    print(f"# python -m bench.sched_floor --calls {args.calls} --gap-ms "
          f"{' '.join(map(str, args.gap_ms))}; load {out['load'][0]} -> {out['load'][1]}")
    gaps = list(out["gaps_ms"])
    print("| rung | " + " | ".join(f"{g} ms apart: p50 / p90 / p99 / max" for g in gaps)
          + " |\n|---|" + "--:|" * len(gaps))
    for rung in out["gaps_ms"][gaps[0]]:
        print(f"| {rung} | " + " | ".join(
            "{p50} / {p90} / {p99} / {max}".format(**out["gaps_ms"][g][rung]) for g in gaps)
            + " |")
    save_json(args.out, out)


if __name__ == "__main__":
    main()
