"""The first timers a fresh broker fires, as a user's handler feels them (issue 32: idle lag).

Each round starts a fresh database and a fresh broker, then one ``consume()`` at its defaults on
a new queue. It schedules ``--timers`` timers through the SDK, ``--spacing-ms`` apart, each due
``--delay-ms`` after its schedule, and records each handler's start minus its timer's due
instant (the ``deliverAt`` the schedule answered), in firing order. The idle scenario of
``bench.peer_graphile`` starts fresh processes the same way, and its slowest timers of a round
are these first fires.

``--warm`` rounds first send two timers through another queue and consume them, so the broker's
fire and pop paths have run once before the measured queue's first timer. The other rounds do
not. The two kinds of rounds alternate. What differs between them is what running those paths
once costs a fresh broker; what stays is the new queue's own first message (its partition and
cursor).

``python -m bench.first_fires [--rounds 3] [--timers 6] [--warm]``; a table to stdout and the
numbers to ``bench/results/first_fires.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench.harness.brokers import side_broker
from bench.harness.pg import shared_server
from bench.harness.report import load, now_iso, save_json, source_revision

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "first_fires.json"
WARM_TIMERS = 2
_WAIT_S = 30.0  # how long past the last due instant a round waits for its handlers


async def _through(q: Any, queue: str, handle: Any, timers: int, spacing_s: float,
                   delay_ms: int, due: dict[int, float]) -> None:
    """``timers`` timers on ``queue`` through the SDK, ``spacing_s`` apart, each due
    ``delay_ms`` after its schedule (its due instant into ``due``), while one ``consume()`` at
    its defaults hands them to ``handle``. A timer never handled ends this after a bound,
    instead of waiting for ever."""
    import trio

    with trio.move_on_after(1.0 + timers * spacing_s + delay_ms / 1000 + _WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: q.consume(queue, handle, max_messages=timers))
            await trio.sleep(1.0)  # (the stream parked, as a user's consumer is)
            for i in range(timers):
                held = await q.timer(queue).key(f"t{i}").delay(delay_ms).payload(
                    {"i": i}).schedule()
                due[i] = held.deliver_at.timestamp()
                await trio.sleep(spacing_s)


async def _fires(url: str, timers: int, spacing_s: float, delay_ms: int, warm: bool
                 ) -> list[float]:
    """Handler lags in ms, in firing order, of ``timers`` timers on a new queue (fewer if
    some were never handled)."""
    import queen_trio

    due: dict[int, float] = {}
    lags: list[float] = []

    async def ignore(message: Any) -> None:
        pass

    async def handle(message: Any) -> None:
        lags.append((time.time() - due[message.data["i"]]) * 1000)

    async with queen_trio.Client(url) as q:
        if warm:
            await _through(q, "warm-up", ignore, WARM_TIMERS, spacing_s, delay_ms, {})
        await _through(q, "first", handle, timers, spacing_s, delay_ms, due)
    return lags


def run(rounds: int, timers: int, spacing_s: float, delay_ms: int, warm: bool,
        admin_url: str | None) -> dict[str, Any]:
    import trio

    started, load_before = now_iso(), load()
    kinds = ["cold", "warm"] if warm else ["cold"]
    out: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    with shared_server(admin_url) as server:
        for r in range(rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                with server.database("first_fires") as db, side_broker(REPO, db) as (url, _):
                    lags = trio.run(_fires, url, timers, spacing_s, delay_ms, kind == "warm")
                out[kind].append({"round": r + 1, "load": load(),
                                  "lags_ms": [round(x, 2) for x in lags]})
    return {"started": started, "load": [load_before, load()], "revision": source_revision(),
            "timers": timers, "spacing_ms": spacing_s * 1000, "delay_ms": delay_ms,
            "rounds": out}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timers", type=int, default=6)
    parser.add_argument("--spacing-ms", type=int, default=250)
    parser.add_argument("--delay-ms", type=int, default=500)
    parser.add_argument("--warm", action="store_true",
                        help="alternate with rounds that first consume two timers of another "
                        "queue")
    parser.add_argument("--admin-url", default=os.environ.get("QUEEN_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    out = run(args.rounds, args.timers, args.spacing_ms / 1000, args.delay_ms, args.warm,
              args.admin_url)
    print(f"# python -m bench.first_fires --rounds {args.rounds} --timers {args.timers}"
          f"{' --warm' if args.warm else ''}; load {out['load'][0]} -> {out['load'][1]}")
    print("| broker | round | handler lag of each fire in order, ms |\n|---|--:|---|")
    for kind, rounds in out["rounds"].items():
        for r in rounds:
            print(f"| {kind} | {r['round']} | {' / '.join(map(str, r['lags_ms']))} |")
    save_json(args.out, out)


if __name__ == "__main__":
    main()
