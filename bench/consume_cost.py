"""What consuming costs the broker: a drain through ``Client.consume()`` and single requests.

Two measurements against one broker process on its own database (broker CPU read from /proc,
so it counts the broker's own work only; PostgreSQL's is reported beside it):

* ``drain``: N messages pushed to one partition, then ``consume(max_messages=N)`` with a
  handler that does nothing, at the SDK's defaults and at ``batch=1, concurrency=1`` (one
  message per batch, as a steady trickle of timers arrives), each over the broker's streaming
  pop and over the HTTP pop loop (``stream=False``); messages/s and broker / PostgreSQL /
  consumer CPU per message. Variants alternate, ``--rounds`` times.
* ``requests``: sequential single requests from one client: a route that does not exist
  (Quart + hypercorn and nothing else), a lone ack, a pop of one message; broker CPU per
  request. The floor for any request on this HTTP stack is the first row.

    python -m bench.consume_cost [--messages 30000] [--rounds 2] [--admin-url URL]
    python -m bench.consume_cost --variant batch=1 --variant "batch=1 http"
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import trio

import queen_trio
from bench.harness.brokers import brokers
from bench.harness.cpu import PartyCpu
from bench.harness.pg import Server, shared_server
from bench.harness.report import load, source_revision

# Each over the broker's stream (the default) and over the HTTP pop loop (``stream=False``,
# what a broker without streams gets), alternating in one run.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {}, "defaults http": {"stream": False},
    "batch=1": {"batch": 1, "concurrency": 1},
    "batch=1 http": {"batch": 1, "concurrency": 1, "stream": False},
}


async def _fill(queen: queen_trio.Client, queue: str, n: int) -> None:
    for start in range(0, n, 1000):
        await queen.push_many(queue, [{"n": i} for i in range(start, min(n, start + 1000))])


async def drain(url: str, cpu: PartyCpu, n: int, options: dict[str, Any]) -> dict[str, Any]:
    queue = f"drain-{uuid.uuid4().hex[:8]}"
    async with queen_trio.Client(url) as queen:
        await _fill(queen, queue, n)
        before, t0, c0 = cpu.snapshot(), time.perf_counter(), time.process_time()
        stats = await queen.consume(queue, lambda m: None, max_messages=n, **options)
        seconds, after = time.perf_counter() - t0, cpu.snapshot()
        consumer_s = time.process_time() - c0
    return {"messages": stats.handled, "msgs_per_s": round(stats.handled / seconds),
            "requests": stats.requests,
            "consumer_ms_per_msg": round(consumer_s * 1000 / n, 4),
            "broker_ms_per_msg": round((after["broker"] - before["broker"]) * 1000 / n, 4),
            "postgres_ms_per_msg": round((after["postgres"] - before["postgres"]) * 1000 / n, 4)}


async def requests(url: str, cpu: PartyCpu, n: int) -> dict[str, Any]:
    queue = f"single-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {}
    async with queen_trio.Client(url) as queen:

        async def timed(name: str, one: Any) -> None:
            before, t0 = cpu.snapshot(), time.perf_counter()
            for i in range(n):
                await one(i)
            seconds, after = time.perf_counter() - t0, cpu.snapshot()
            out[name] = {"per_s": round(n / seconds),
                         "broker_ms": round((after["broker"] - before["broker"]) * 1000 / n, 3)}

        await _fill(queen, queue, n)
        leased = list((await queen.pop(queue, batch=n)).messages)
        await timed("no such route (the HTTP stack alone)",
                    lambda i: queen._http.request("GET", f"{url}/api/v1/no-such-route"))
        await timed("lone ack", lambda i: queen.ack(leased[i]))
        await _fill(queen, queue, n)
        await timed("pop of one (autoAck)",
                    lambda i: queen.pop(queue, batch=1, auto_ack=True))
    return out


def run(server: Server, n: int, rounds: int,
        variants: list[str] | None = None) -> dict[str, Any]:
    chosen = {v: VARIANTS[v] for v in variants or VARIANTS}
    result: dict[str, Any] = {"drain": {v: [] for v in chosen}}
    with server.database("consume_cost") as db, brokers(db) as (broker,):
        assert broker.pid is not None
        cpu = PartyCpu([broker.pid], server.postmaster_pid)
        for _ in range(rounds):
            for name, options in chosen.items():
                # batch=1 costs ~50x more per message: a thirtieth of the messages is enough
                count = n if options.get("batch", 0) != 1 else max(1000, n // 30)
                row = trio.run(drain, broker.url, cpu, count, options)
                result["drain"][name].append(row)
                print(f"[consume_cost] drain {name:<9} {row}", flush=True)
        result["requests"] = trio.run(requests, broker.url, cpu, 1000)
        for name, row in result["requests"].items():
            print(f"[consume_cost] {name:<38} {row}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.consume_cost",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--admin-url", default=None,
                        help="a server where databases may be created (default: a temporary "
                             "embedded PostgreSQL)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="only these drain variants (repeatable; default: all)")
    args = parser.parse_args(argv)
    with shared_server(args.admin_url) as server:
        print(f"consume_cost at {source_revision()}, load {load()}", flush=True)
        result = run(server, args.messages, args.rounds, args.variant)
    print(json.dumps({"checkout": source_revision(), **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
