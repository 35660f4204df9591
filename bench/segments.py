"""Sealed segments measured, through the broker's own bridge and store functions, without HTTP:

* compression: event-like JSON payloads sealed into segments of 10 / 100 / 1,000 / 4,000
  frames at zstd levels 1, 3 (the default) and 9; and whether a zstd dictionary trained on the
  same kind of events (what a per-queue dictionary would be) pays off at each segment size;
* storage per message in PostgreSQL: table + TOAST + indexes of the head vs of segments;
* sealing cost: one seal transaction of 1,000 frames (read the head, compress, insert the
  segment, delete the rows), p50 / p90 / p99;
* pop throughput, autoAck, batch 100 and batch 10, reading the same 20,000 frames from the head,
  from segments with a warm cache, and from segments with no cache (every pop decompresses);
  plus pop + ack (a lease, then the ack that finds the frame by transactionId), head vs
  segments.

Run from the repository root::

    python -m bench.segments | tee bench/results/segments.txt

Uses $QUEEN_DATABASE_URL if set (migrated and disposable: it writes queues ``bench.seg.*``),
else a temporary embedded PostgreSQL.
"""

from __future__ import annotations

import os
import platform
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import zstandard

from bench.harness.pg import measure_on_scratch
from bench.harness.stats import median, percentile
from queen_trio.db import Database
from queen_trio.log import housekeeping, rules, store
from queen_trio.log.segments import HeadFrame, SealPolicy, SegmentCache, encode_lines

FRAMES = 20_000
SEGMENT = 1_000
REPEATS = 3
SEAL_ALL = SealPolicy(max_frames=SEGMENT, max_bytes=64 << 20, min_age_ms=0, max_age_ms=0)


def pcts(values: list[float]) -> str:
    ordered = sorted(values)
    return " ".join(f"{percentile(ordered, p):8.2f}" for p in (50, 90, 99))


# -- event-like payloads ------------------------------------------------------------------------


def events(n: int, seed: int) -> list[dict[str, Any]]:
    """What an application pushes: a handful of event types, ids, instants, money, nesting."""
    rnd = random.Random(seed)
    countries = ["DE", "FR", "IT", "ES", "NL", "US", "GB", "PL", "SE", "AT"]
    agents = ["Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/126.0",
              "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15",
              "Mozilla/5.0 (X11; Linux x86_64; rv:127.0) Gecko/20100101 Firefox/127.0"]
    out = []
    t0 = 1_760_000_000
    for i in range(n):
        kind = rnd.choice(["order.created", "page.viewed", "payment.captured", "user.signed_up"])
        at = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 + i))
              + f".{rnd.randrange(1000):03d}Z")
        base = {"type": kind, "id": str(uuid.UUID(int=rnd.getrandbits(128), version=4)),
                "occurredAt": at, "source": "web-frontend", "schemaVersion": 3}
        if kind == "order.created":
            items: list[dict[str, Any]] = [
                {"sku": f"SKU-{rnd.randrange(5000):05d}", "qty": rnd.randrange(1, 4),
                      "unitPrice": round(rnd.uniform(2, 200), 2)}
                     for _ in range(rnd.randrange(1, 5))]
            base["data"] = {"orderId": f"ord_{rnd.getrandbits(40):x}", "currency": "EUR",
                            "customerId": f"cus_{rnd.randrange(100_000)}", "items": items,
                            "total": round(sum(x["qty"] * x["unitPrice"] for x in items), 2),
                            "shipping": {"country": rnd.choice(countries), "method": "standard"}}
        elif kind == "page.viewed":
            base["data"] = {"path": rnd.choice(["/", "/pricing", "/docs/start", "/blog/launch"]),
                            "referrer": rnd.choice([None, "https://www.google.com/"]),
                            "userAgent": rnd.choice(agents),
                            "sessionId": f"s_{rnd.getrandbits(48):x}",
                            "durationMs": rnd.randrange(50, 90_000)}
        elif kind == "payment.captured":
            base["data"] = {"paymentId": f"pay_{rnd.getrandbits(40):x}",
                            "amount": rnd.randrange(100, 100_000), "currency": "EUR",
                            "method": rnd.choice(["card", "sepa_debit", "paypal"]),
                            "card": {"brand": rnd.choice(["visa", "mastercard"]),
                                     "last4": f"{rnd.randrange(10_000):04d}"}}
        else:
            base["data"] = {"userId": f"usr_{rnd.getrandbits(40):x}",
                            "email": f"user{rnd.randrange(10**6)}@example.com",
                            "country": rnd.choice(countries), "marketingOptIn": rnd.random() < 0.3,
                            "plan": rnd.choice(["free", "team", "business"])}
        out.append(base)
    return out


def head_frames(payloads: list[dict[str, Any]]) -> list[HeadFrame]:
    us = 1_760_000_000_000_000
    frames = []
    for i, p in enumerate(payloads):
        text = store.to_json(p)
        frames.append(HeadFrame(i, rules.new_transaction_id(), text, len(text.encode()),
                                us + i * 1000, None))
    return frames


# -- compression, without the database ---------------------------------------------------------


def compression() -> None:
    frames = head_frames(events(FRAMES, seed=1))
    raw_total = sum(f.size_bytes for f in frames)
    print(f"\n== compression: {FRAMES:,} event payloads, mean {raw_total / FRAMES:.0f} B of JSON "
          "each; ratio = payload JSON bytes / stored segment bytes (which also hold txn ids, "
          "timestamps and sizes)")
    print(f"{'frames/segment':>14} {'level':>5} {'ratio':>7} {'B/msg':>7} {'compress µs/msg':>16} "
          f"{'decompress µs/msg':>18}")
    for per in (10, 100, 1000, 4000):
        for level in (1, 3, 9):
            comp = zstandard.ZstdCompressor(level=level)
            dec = zstandard.ZstdDecompressor()
            stored = 0
            t_comp = t_dec = 0.0
            for start in range(0, FRAMES, per):
                text = encode_lines(frames[start:start + per])
                t = time.perf_counter()
                blob = comp.compress(text)
                t_comp += time.perf_counter() - t
                t = time.perf_counter()
                dec.decompress(blob)
                t_dec += time.perf_counter() - t
                stored += len(blob)
            print(f"{per:>14} {level:>5} {raw_total / stored:7.2f} {stored / FRAMES:7.1f} "
                  f"{t_comp / FRAMES * 1e6:16.2f} {t_dec / FRAMES * 1e6:18.2f}")

    # A dictionary trained on earlier events of the same kind (a per-queue dictionary), used on
    # later ones.
    training: list[bytes | bytearray | memoryview] = [
        encode_lines([f]) for f in head_frames(events(20_000, seed=2))]
    print("\n== zstd dictionary (trained on 20,000 other events of the same kinds), level 3")
    print(f"{'frames/segment':>14} {'dict size':>9} {'ratio plain':>11} {'ratio dict':>10} "
          f"{'saved':>6} {'train ms':>8}")
    for dict_size in (16_384, 112_640):
        t = time.perf_counter()
        d = zstandard.train_dictionary(dict_size, training)
        train_ms = (time.perf_counter() - t) * 1000
        with_dict = zstandard.ZstdCompressor(level=3, dict_data=d)
        plain = zstandard.ZstdCompressor(level=3)
        for per in (1, 10, 100, 1000):
            a = b = 0
            for start in range(0, FRAMES, per):
                text = encode_lines(frames[start:start + per])
                a += len(plain.compress(text))
                b += len(with_dict.compress(text))
            print(f"{per:>14} {dict_size:>9} {raw_total / a:11.2f} {raw_total / b:10.2f} "
                  f"{(1 - b / a) * 100:5.1f}% {train_ms:8.0f}")


# -- the database -------------------------------------------------------------------------------


async def push(db: Database, tenant: int, queue: str, payloads: list[Any]) -> None:
    for start in range(0, len(payloads), 500):
        frames = [store.NewFrame(queue, "Default", p, rules.new_transaction_id())
                  for p in payloads[start:start + 500]]
        await db.run_transaction(store.append, tenant, frames)


async def relation_bytes(db: Database, table: str) -> int:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT pg_total_relation_size(%s::regclass)", (table,))


async def partition_of(db: Database, queue: str) -> uuid.UUID:
    async with db.connection() as conn:
        return await conn.fetchval(
            "SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
            "WHERE q.name = %s", (queue,))


async def drain(db: Database, tenant: int, queue: str, group: str, batch: int, *,
                cache: SegmentCache | None, ack: bool) -> tuple[float, list[float], int]:
    """(seconds, per-call ms, messages) to read the whole queue as a new consumer group."""
    per_call: list[float] = []
    got = 0
    started = time.perf_counter()
    while True:
        t = time.perf_counter()
        req = rules.PopRequest(queue, None, group, batch, False, 0, not ack)
        outcome = await db.run_transaction(store.pop, tenant, req, cache)
        b = outcome.batch
        if b is None:
            break
        if ack:
            acks = [rules.Ack(i, m.transaction_id, b.partition_id, "completed", group,
                              b.lease_id, None) for i, m in enumerate(b.messages)]
            await db.run_transaction(store.ack, tenant, acks)
        per_call.append((time.perf_counter() - t) * 1000)
        got += len(b.messages)
    return time.perf_counter() - started, per_call, got


async def database(url: str) -> None:
    async with Database(url, max_size=2) as db:
        async with db.connection() as conn:
            tenant = await conn.fetchval(
                "SELECT tenant_id FROM queen.tenants WHERE name = 'default'")
            version = await conn.fetchval("SHOW server_version")
        print(f"\nPostgreSQL {version}")
        tag = uuid.uuid4().hex[:6]
        head_q, seg_q = f"bench.seg.head.{tag}", f"bench.seg.sealed.{tag}"
        payloads = events(FRAMES, seed=3)

        frames_before = await relation_bytes(db, "queen.frames")
        await push(db, tenant, head_q, payloads)
        head_bytes = await relation_bytes(db, "queen.frames") - frames_before
        segments_before = await relation_bytes(db, "queen.segments")
        await push(db, tenant, seg_q, payloads)
        pid = await partition_of(db, seg_q)
        seal_ms: list[float] = []
        sealed = []
        while True:
            t = time.perf_counter()
            one = await db.run_transaction(housekeeping.seal_partition, pid, SEAL_ALL)
            if one is None:
                break
            seal_ms.append((time.perf_counter() - t) * 1000)
            sealed.append(one)
        segment_bytes = await relation_bytes(db, "queen.segments") - segments_before
        raw = sum(s.raw_bytes for s in sealed)
        stored = sum(s.stored_bytes for s in sealed)
        print(f"\n== storage per message in PostgreSQL ({FRAMES:,} messages; table + TOAST + "
              "indexes)")
        print(f"head (queen.frames):       {head_bytes / FRAMES:7.1f} B/msg")
        print(f"segments (queen.segments): {segment_bytes / FRAMES:7.1f} B/msg "
              f"(of which zstd data {stored / FRAMES:.1f}; payload JSON {raw / FRAMES:.1f}; "
              f"ratio {raw / stored:.2f})")

        print(f"\n== sealing: {len(seal_ms)} seals of {SEGMENT:,} frames, one transaction each "
              "(read head rows, compress, insert segment, delete rows, usage); ms per 1,000 frames")
        print(f"{'':>10} {'p50':>8} {'p90':>8} {'p99':>8}")
        print(f"{'seal':>10} {pcts(seal_ms)}")
        comp = zstandard.ZstdCompressor(level=3)
        lines = encode_lines(head_frames(payloads[:SEGMENT]))
        t = time.perf_counter()
        for _ in range(20):
            comp.compress(lines)
        print(f"(of which zstd level 3 alone: {(time.perf_counter() - t) / 20 * 1000:.2f} ms)")

        print(f"\n== pop: read all {FRAMES:,} messages as a new consumer group, {REPEATS} times "
              "per row, rows interleaved; median msgs/s, ms per call over all runs "
              "(p50 / p90 / p99)")
        print(f"{'source':<22} {'call':<16} {'msgs/s':>8} {'p50':>8} {'p90':>8} {'p99':>8}")
        warm = SegmentCache(64 << 20)
        await drain(db, tenant, seg_q, "warmup", 100, cache=warm, ack=False)  # fill the cache
        cases: list[tuple[str, str, Callable[[], SegmentCache | None]]] = [
            ("head", head_q, lambda: None),
            ("segments, warm cache", seg_q, lambda: warm),
            ("segments, no cache", seg_q, lambda: None),
        ]
        for batch, ack in ((100, False), (10, False), (100, True)):
            call = f"{'pop+ack' if ack else 'pop autoAck'} b={batch}"
            rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            calls: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            for rep in range(REPEATS):
                # Rotate the order so no row always runs first (or last) in a noisy spell.
                for name, queue, cache in cases[rep % 3:] + cases[:rep % 3]:
                    seconds, per_call, got = await drain(
                        db, tenant, queue, f"g-{batch}-{ack}-{rep}-{name}", batch,
                        cache=cache(), ack=ack)
                    assert got == FRAMES, (name, got)
                    rates[name].append(got / seconds)
                    calls[name].extend(per_call)
            for name, _, _ in cases:
                print(f"{name:<22} {call:<16} {median(rates[name]):8.0f} "
                      f"{pcts(calls[name])}")
        s = warm.statistics()
        print(f"(warm cache: {s.segments} segments, {s.bytes / 1e6:.1f} MB held)")


async def measure(url: str) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"platform {platform.platform()}, {os.cpu_count()} CPUs, "
          f"zstandard {zstandard.__version__}, load average at start {load}")
    compression()
    await database(url)


if __name__ == "__main__":
    measure_on_scratch(measure, "queen-bench-segments-")
