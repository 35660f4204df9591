"""Where the time goes between an idle timer's due instant and a parked consumer, step by step.

A broker runs with timestamps added along the path (this module's ``--serve`` mode patches the
functions below in its own process; nothing in the package changes): the sweep returning to the
broker, the NOTIFY that names the queue, the pop statement's start and end (the ordinary pop, or
the one waiting behind the fire lock of queen.pop_head_after), the answer built, its head handed
to the socket. A consumer parks a pop (blocking socket, HTTP/1.1), schedules one timer 150–300
ms ahead, receives the frame, and reads the broker's timestamps. Each step is shown as time after
the due instant (PostgreSQL's clock: every party shares this machine's clock).

The variants run in interleaved rounds, each on a fresh broker and database:
``QUEEN_POP_FIRE_WAIT_MS=0`` (the pop hears of the fire by NOTIFY) and the default (the parked
pop waits for the fire inside PostgreSQL).

Run from the repository root::

    python -m bench.idle_path | tee bench/results/idle_path.txt
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.harness.brokers import REPO, free_port, wait_healthy
from bench.harness.pg import shared_server
from bench.harness.stats import percentile

VARIANTS = {"notify (QUEEN_POP_FIRE_WAIT_MS=0)": "0", "fire lock (default)": "10"}
STEPS = ["created", "wake", "pop_start", "committed", "sweep_ret", "pop_end", "resp_built",
         "head_sent", "arrive"]
MEANING = {
    "created": "frame's createdAt (inserted by the sweep)",
    "wake": "the queue's waiters are woken (by the NOTIFY; with the fire lock, by the "
            "sweeper's announcement, before the due instant)",
    "pop_start": "the pop statement that returns the frame is sent (with the fire lock: ahead, "
                 "it waits in PostgreSQL)",
    "committed": "the fire's commit (PostgreSQL's commit timestamp; only on a server with "
                 "track_commit_timestamp=on)",
    "sweep_ret": "the sweep statement returns to the broker",
    "pop_end": "that pop statement returns",
    "resp_built": "the JSON answer is built",
    "head_sent": "the answer's head is handed to the socket",
    "arrive": "the consumer has the whole answer",
}


# -- the instrumented broker (this module with --serve, in its own process) --------------------


def serve() -> None:
    import trio

    from queen_trio import server
    from queen_trio.api import log as api_log
    from queen_trio.config import load_settings
    from queen_trio.log import store as log_store
    from queen_trio.log import wakeups
    from queen_trio.timers import store as timer_store

    marks: list[tuple[str, float]] = []

    def mark(name: str, at: float | None = None) -> None:
        marks.append((name, time.time() if at is None else at))

    def timed_pop(fn: Any) -> Any:
        def pop(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            outcome = fn(*args, **kwargs)
            if outcome is not None and outcome.batch is not None:
                mark("pop_start", started)
                mark("pop_end")
            return outcome
        return pop

    log_store.pop_head = timed_pop(log_store.pop_head)
    log_store.pop_head_after = timed_pop(log_store.pop_head_after)
    sweep = timer_store.sweep

    def timed_sweep(*args: Any, **kwargs: Any) -> Any:
        result = sweep(*args, **kwargs)
        if result.fired:
            mark("sweep_ret")
        return result

    timer_store.sweep = timed_sweep
    wake = wakeups.QueueWakeups.notify

    def timed_wake(self: Any, key: str, *args: Any, **kwargs: Any) -> None:
        mark("wake")
        wake(self, key, *args, **kwargs)

    wakeups.QueueWakeups.notify = timed_wake  # type: ignore[method-assign]
    to_json = api_log._json

    def timed_json(body: Any, status: int = 200) -> Any:
        response = to_json(body, status)
        if isinstance(body, dict) and "messages" in body:
            mark("resp_built")
        return response

    api_log._json = timed_json
    send_all = trio.SocketStream.send_all

    async def timed_send_all(self: Any, data: Any) -> None:
        if bytes(data[:12]) == b"HTTP/1.1 200":
            mark("head_sent")
        await send_all(self, data)

    trio.SocketStream.send_all = timed_send_all  # type: ignore[method-assign]
    create_app = server.create_app

    def with_trace_route(context: Any) -> Any:
        app = create_app(context)

        @app.route("/bench/idle-path")
        async def trace() -> Any:
            taken = list(marks)
            marks.clear()
            return {"marks": taken}

        return app

    server.create_app = with_trace_route  # type: ignore[assignment]
    trio.run(server.serve_until_signalled, load_settings(os.environ))


# -- the consumer -------------------------------------------------------------------------------


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _commit_time(db: psycopg.Connection, transaction_id: str) -> float | None:
    """When the frame's transaction committed, by PostgreSQL's clock (None unless the server
    tracks commit timestamps)."""
    row = db.execute("SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
                     "FROM queen.frames WHERE transaction_id = %s", [transaction_id]).fetchone()
    return None if row is None else row[0]


def consume(port: int, url: str, timers: int, seed: int) -> list[dict[str, float]]:
    rng = random.Random(seed)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get(path: str) -> tuple[int, bytes]:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        head, body = buf.split(b"\r\n\r\n", 1)
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length")]
        while length and len(body) < length[0]:
            body += sock.recv(65536)
        return int(head.split(b" ")[1]), body

    rows = []
    with (httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http,
          psycopg.connect(url, autocommit=True) as db):
        http.post("/api/v1/configure", json={"queue": "path"}).raise_for_status()
        for i in range(timers):
            http.get("/bench/idle-path")
            put = http.put(f"/api/v1/timers/path/t{i}",
                           json={"delayMs": rng.randint(150, 300), "payload": {"i": i}})
            due = _epoch(put.json()["deliverAt"])
            while True:
                status, body = get("/api/v1/pop/queue/path?wait=true&timeout=5000&autoAck=true")
                arrived = time.time()
                if status == 200:
                    break
            message = json.loads(body)["messages"][0]
            row = {"created": _epoch(message["createdAt"]) - due, "arrive": arrived - due}
            committed = _commit_time(db, message["transactionId"])
            if committed is not None:
                row["committed"] = committed - due
            for name, at in http.get("/bench/idle-path").json()["marks"]:
                # The PUT's own answer also has a head: the pop's is the last one.
                if name not in row or name == "head_sent":
                    row[name] = at - due
            rows.append(row)
            time.sleep(0.03)
    sock.close()
    return rows


def run_variant(admin_url: str, wait_ms: str, timers: int, seed: int) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="queen-bench-path-") as root:
        port = free_port()
        log_path = Path(root) / "broker.log"
        env = {**os.environ, "QUEEN_DATABASE_URL": admin_url, "QUEEN_PORT": str(port),
               "QUEEN_HOST": "127.0.0.1", "QUEEN_DATA_DIR": root,
               "QUEEN_POP_FIRE_WAIT_MS": wait_ms}
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "bench.idle_path", "--serve"],
                                    cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc, log_path)
            return consume(port, admin_url, timers, seed)
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def summary(rows: list[dict[str, float]]) -> list[tuple[str, int, float, float, float, float]]:
    out = []
    for step in STEPS:
        values = sorted(1000 * r[step] for r in rows if step in r)
        if values:
            out.append((step, len(values), percentile(values, 50), percentile(values, 90),
                        percentile(values, 99), values[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timers", type=int, default=200, help="timers per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", choices=["both", "notify", "fire-lock"], default="both")
    parser.add_argument("--admin-url", default=None)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    print(__doc__.split("\n\n")[0].replace("\n", " "))
    for step in STEPS:
        print(f"  {step:10}  {MEANING[step]}")
    with shared_server(args.admin_url) as server:
        print(f"  server: {server.settings()}; {args.timers} timers per variant and round\n")
        for round_no in range(1, args.rounds + 1):
            for label, wait_ms in VARIANTS.items():
                if args.variant != "both" and (wait_ms == "0") != (args.variant == "notify"):
                    continue
                with server.database("idle_path") as url:
                    rows = run_variant(url, wait_ms, args.timers, seed=round_no)
                print(f"round {round_no}, {label}: ms after the due instant")
                print(f"  {'step':10} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}")
                for step, n, p50, p90, p99, top in summary(rows):
                    print(f"  {step:10} {n:4d} {p50:7.2f} {p90:7.2f} {p99:7.2f} {top:7.2f}")
                print()


if __name__ == "__main__":
    main()
