"""Client traffic for the fault tests: timer bursts, schedule/cancel storms that race the fire
(their answers recorded in a :class:`~.harness.TimerBook`), and waiting for the timers to drain.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import httpx
import trio

from ..brokers import BrokerProcess
from ..timer_ops import timer_op
from .harness import TimerBook, asql, poll_until

API = "/api/v1"

def payload_for(key: str, path: str) -> Any:
    """"postgres": small JSON that PostgreSQL fires inside the sweep statement; "broker": a
    compressible payload, claimed under a lease and fired by the broker (queen.sweep_timers in
    schema/functions/timers.sql)."""
    return {"key": key} if path == "postgres" else {"key": key, "padding": "abcdefgh" * 16}


async def schedule_burst(broker: BrokerProcess, queue: str, n: int, delay_ms: int,
                         path: str) -> set[str]:
    """Schedule ``n`` timers through the broker's HTTP API in bundles; returns their txns."""
    txns: set[str] = set()
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        for start in range(0, n, 500):
            timers = [timer_op(queue, f"k{i}", delay_ms, payload_for(f"k{i}", path),
                               txn=f"{queue}-{i}")
                      for i in range(start, min(n, start + 500))]
            r = await http.post(f"{API}/transaction", json={"timers": timers})
            assert r.status_code == 200, r.text
            assert {t["status"] for t in r.json()["results"]} == {"scheduled"}
            txns |= {t["txn"] for t in timers}
    return txns


async def count(url: str, query: str, params: Any = None) -> int:
    return (await asql(url, query, params))[0]["n"]


async def wait_drained(url: str, within: float, brokers: list[BrokerProcess]) -> None:
    async def none_left() -> bool:
        for b in brokers:
            assert b.alive, f"{b.name} died ({b.returncode}); stderr:\n{b.stderr()}"
        return await count(url, "SELECT count(*) AS n FROM queen.timers") == 0
    try:
        await poll_until(none_left, within, every=0.05)
    except trio.TooSlowError:
        left = await asql(url, "SELECT count(*) AS n, count(claim_token) AS claimed "
                               "FROM queen.timers")
        raise AssertionError(f"timers still pending after {within}s: {left}; " + "; ".join(
            f"{b.name}: {b.stderr(1500)}" for b in brokers)) from None


async def storm(brokers: list[BrokerProcess], book: TimerBook, *, clients: int, keys: int,
                seconds: float, tolerate: tuple[int, ...] = (), seed: int = 0,
                prefix: str = "") -> None:
    """``clients`` clients, each owning ``keys`` keys, schedule (PUT or a one-timer bundle),
    reschedule and cancel at random for ``seconds`` against random brokers, every delay short
    enough that fires race them. Answers go to ``book``; a status in ``tolerate`` or a
    transport error makes the key's outcome unknown; anything else fails the test."""
    stop_at = trio.current_time() + seconds

    async def client(c: int) -> None:
        rnd = random.Random(seed * 1000 + c)
        mine = [f"{prefix}c{c}-k{i}" for i in range(keys)]
        https = [httpx.AsyncClient(base_url=b.url, timeout=10) for b in brokers]
        try:
            while trio.current_time() < stop_at:
                slot = rnd.randrange(keys)
                key = mine[slot]
                http = rnd.choice(https)
                try:
                    if rnd.random() < 0.6:
                        done = await schedule_one(http, rnd, key, book, tolerate)
                    else:
                        r = await http.delete(f"{API}/timers/storm/{key}")
                        done = r.status_code not in tolerate
                        if done:
                            assert r.status_code == 200, r.text
                            book.cancelled(key, r.json()["status"], r.json()["txn"])
                        else:
                            book.lost_answer(key, why=str(r.status_code))
                except httpx.TransportError as exc:
                    if not tolerate:
                        raise
                    book.lost_answer(key, why=type(exc).__name__)
                    done = False
                if not done:
                    # That key's story is now partly unknown: go on under a new name, so
                    # that everything after the fault is checked in full.
                    mine[slot] = f"{key.split('.')[0]}.{book.answers.total()}"
                    await trio.sleep(0.05)
        finally:
            for h in https:
                await h.aclose()

    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client, c)


async def schedule_one(http: httpx.AsyncClient, rnd: random.Random, key: str, book: TimerBook,
                        tolerate: tuple[int, ...]) -> bool:
    """One schedule; False if its answer was lost (a tolerated status)."""
    txn = str(uuid.uuid4())
    body = {"delayMs": rnd.randrange(-20, 250),
            "payload": payload_for(key, rnd.choice(["postgres", "broker"])), "txn": txn}
    if rnd.random() < 0.5:
        r = await http.put(f"{API}/timers/storm/{key}", json=body)
        answer = r.json() if r.status_code == 200 else None
    else:
        r = await http.post(f"{API}/transaction", json={"timers": [
            timer_op("storm", key, body["delayMs"], body["payload"], txn=txn)]})
        answer = r.json()["results"][0] if r.status_code == 200 else None
    if answer is None:
        if r.status_code in tolerate:
            book.lost_answer(key, txn, str(r.status_code))
            return False
        raise AssertionError(f"schedule {key}: {r.status_code} {r.text[:300]}")
    book.scheduled(key, txn, answer["status"], answer["txn"])
    return True
