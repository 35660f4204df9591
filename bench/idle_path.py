"""Where the time goes between an idle timer's due instant and a parked consumer, step by step.

A broker runs with timestamps taken along the path (this module's ``--serve`` mode watches the
functions below with a trace hook in its own process; nothing in the broker is replaced): the
sweep returning to the broker, the NOTIFY that names the queue, the pop statement's start and
end (the ordinary pop, or the one waiting behind the fire lock of queen.pop_head_after), the
answer built, its head handed to the socket. A consumer parks a pop (blocking socket,
HTTP/1.1), schedules one timer 150–300 ms ahead, receives the frame, and reads the broker's
timestamps. Each step is shown as time after the due instant (PostgreSQL's clock: every party
shares this machine's clock).

The variants run in interleaved rounds, each on a fresh broker and database:
``QUEEN_POP_FIRE_WAIT_MS=0`` (the pop hears of the fire by NOTIFY) and the default (the parked
pop waits for the fire inside PostgreSQL).

Run from the repository root::

    python -m bench.idle_path | tee bench/results/idle_path.txt
"""

from __future__ import annotations

import argparse
import dis
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
#
# Nothing in the broker is replaced: a trace hook (sys.settrace, in every thread) watches the
# code objects below and notes when they are entered or return. It costs every Python call in
# the broker one call of the hook's function, which delays the broker's steps (at load 11 on
# 2 cores the consumer's p50 was 23-24 ms untraced, 51-63 ms traced): compare the variants of
# one run, and take absolute figures from ``--untraced`` (no hook: only the steps PostgreSQL
# and the consumer see). The marks are read through a side socket, not a route added to the
# broker.


class _Tracer:
    """Marks (step name, wall-clock time) when a watched function is entered or returns."""

    def __init__(self) -> None:
        import trio

        from queen_trio.api import common
        from queen_trio.log import store as log_store
        from queen_trio.log import wakeups
        from queen_trio.timers import store as timer_store

        self.marks: list[tuple[str, float]] = []
        send_all = trio.SocketStream.send_all.__code__
        # A coroutine's frame is "called" again on each resume: its first entry is at the
        # code's first RESUME instruction.
        self._send_entry = next(i.offset for i in dis.get_instructions(send_all)
                                if i.opname == "RESUME")
        self.on_return = {log_store.pop_head.__code__: self._popped,
                          log_store.pop_head_after.__code__: self._popped,
                          timer_store.sweep.__code__: self._swept,
                          common.model_response.__code__: self._built}
        self._started: dict[int, float] = {}  # pop frames running: id(frame) -> entered at
        # What to do on entering a watched code object (its answer: the frame's local tracer).
        self.on_entry: dict[Any, Callable[[Any], Any]] = {
            wakeups.QueueWakeups.notify.__code__: self._wake, send_all: self._send,
            **{code: self._enter for code in self.on_return}}

    def hook(self) -> Callable[[Any, str, Any], Any]:
        """The global trace function: every Python call of the broker runs it, so it does no
        more than one dict look-up for the others."""
        entry = self.on_entry.get

        def trace(frame: Any, event: str, arg: Any) -> Any:
            act = entry(frame.f_code)
            return None if act is None else act(frame)

        return trace

    def _enter(self, frame: Any) -> Any:
        self._started[id(frame)] = time.time()
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            self.on_return[frame.f_code](frame, self._started.pop(id(frame), time.time()), arg)
        return self._local

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks.append((name, time.time() if at is None else at))

    def _wake(self, frame: Any) -> None:
        self.mark("wake")

    def _send(self, frame: Any) -> None:
        first_entry = frame.f_lasti == self._send_entry
        if first_entry and bytes(frame.f_locals["data"][:12]) == b"HTTP/1.1 200":
            self.mark("head_sent")

    def _popped(self, frame: Any, started: float, outcome: Any) -> None:
        if outcome is not None and outcome.batch is not None:
            self.mark("pop_start", started)
            self.mark("pop_end")

    def _swept(self, frame: Any, started: float, result: Any) -> None:
        if result is not None and result.fired:
            self.mark("sweep_ret")

    def _built(self, frame: Any, started: float, response: Any) -> None:
        if response is not None and getattr(frame.f_locals.get("model"), "messages", None):
            self.mark("resp_built")


def serve(marks_port: int, traced: bool) -> None:
    import threading

    import trio

    from queen_trio import server
    from queen_trio.config import load_settings

    tracer = _Tracer()

    async def hand_marks(stream: trio.SocketStream) -> None:
        taken = list(tracer.marks)
        del tracer.marks[:len(taken)]
        await stream.send_all(json.dumps(taken).encode())
        await stream.aclose()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_tcp, hand_marks, marks_port)
            await server.serve_until_signalled(load_settings(os.environ))
            nursery.cancel_scope.cancel()

    if traced:
        trace = tracer.hook()
        threading.settrace(trace)
        sys.settrace(trace)
    trio.run(main)


# -- the consumer -------------------------------------------------------------------------------


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _commit_time(db: psycopg.Connection, transaction_id: str) -> float | None:
    """When the frame's transaction committed, by PostgreSQL's clock (None unless the server
    tracks commit timestamps)."""
    row = db.execute("SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
                     "FROM queen.frames WHERE transaction_id = %s", [transaction_id]).fetchone()
    return None if row is None else row[0]


def _marks(marks_port: int) -> list[tuple[str, float]]:
    """The broker's marks since the last call (its side socket answers them and closes)."""
    with socket.create_connection(("127.0.0.1", marks_port)) as sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [(name, at) for name, at in json.loads(data)]


def _tracks_commits(db: psycopg.Connection) -> bool:
    row = db.execute("SHOW track_commit_timestamp").fetchone()
    return row is not None and row[0] == "on"


def consume(port: int, marks_port: int, url: str, timers: int,
            seed: int) -> list[dict[str, float]]:
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
        commits = _tracks_commits(db)
        for i in range(timers):
            _marks(marks_port)
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
            committed = _commit_time(db, message["transactionId"]) if commits else None
            if committed is not None:
                row["committed"] = committed - due
            for name, at in _marks(marks_port):
                # The PUT's own answer also has a head: the pop's is the last one.
                if name not in row or name == "head_sent":
                    row[name] = at - due
            rows.append(row)
            time.sleep(0.03)
    sock.close()
    return rows


def run_variant(admin_url: str, wait_ms: str, timers: int, seed: int,
                traced: bool) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="queen-bench-path-") as root:
        port, marks_port = free_port(), free_port()
        log_path = Path(root) / "broker.log"
        env = {**os.environ, "QUEEN_DATABASE_URL": admin_url, "QUEEN_PORT": str(port),
               "QUEEN_HOST": "127.0.0.1", "QUEEN_DATA_DIR": root,
               "QUEEN_POP_FIRE_WAIT_MS": wait_ms}
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "bench.idle_path",
                                     "--serve", str(marks_port),
                                     *([] if traced else ["--untraced"])],
                                    cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", proc, log_path)
            return consume(port, marks_port, admin_url, timers, seed)
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
    parser.add_argument("--serve", type=int, metavar="MARKS_PORT", help=argparse.SUPPRESS)
    parser.add_argument("--timers", type=int, default=200, help="timers per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", choices=["both", "notify", "fire-lock"], default="both")
    parser.add_argument("--untraced", action="store_true",
                        help="no trace hook in the broker: only the steps PostgreSQL and the "
                             "consumer see (created, committed, arrive), undelayed by the hook")
    parser.add_argument("--admin-url", default=None)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, traced=not args.untraced)
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
                    rows = run_variant(url, wait_ms, args.timers, seed=round_no,
                                       traced=not args.untraced)
                print(f"round {round_no}, {label}: ms after the due instant")
                print(f"  {'step':10} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7}")
                for step, n, p50, p90, p99, top in summary(rows):
                    print(f"  {step:10} {n:4d} {p50:7.2f} {p90:7.2f} {p99:7.2f} {top:7.2f}")
                print()


if __name__ == "__main__":
    main()
