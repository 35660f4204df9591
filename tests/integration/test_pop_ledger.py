"""The consumers' ledger with multi-partition pops under one lease: pushers and concurrent
consumers of one group, each pop taking several partitions under a single lease, acking them
in one ``/ack/batch`` with that lease, sometimes sending a partition back (a nack), and one
consumer that abandons what it pops (its short ``leaseSeconds`` runs out). Nothing is lost
(every message completed), nothing twice (no message handed to two consumers at once, none
handed out again once completed), and the cursors end where the log ends."""

from __future__ import annotations

import random

import httpx
import psycopg
import trio

from .test_log import API, configure

QUEUE = "ledger"
GROUP = "g"
PARTITIONS = [f"p{i}" for i in range(6)]
TOTAL = 360


async def test_nothing_lost_nothing_twice_with_multi_partition_leases(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    await configure(http, QUEUE, leaseTime=60, retryLimit=100)
    rng = random.Random(30)
    completed: set[int] = set()
    in_flight: dict[int, int] = {}  # message id -> consumer holding it
    deliveries: dict[int, int] = {}
    abandoned: set[int] = set()
    lease_sizes: list[int] = []

    async def pusher(first: int) -> None:
        ids = list(range(first, TOTAL, 3))
        for i in range(0, len(ids), 4):
            items = [{"queue": QUEUE, "partition": rng.choice(PARTITIONS), "payload": {"id": n},
                      "transactionId": f"ledger-{n}"} for n in ids[i:i + 4]]
            r = await http.post(f"{API}/push", json={"items": items})
            assert r.status_code == 201, r.text

    async def consumer(me: int, done: trio.Event) -> None:
        # The consumers start once the deserter holds something: started together, they had
        # been seen to take and complete all 360 before its first pop (then nothing expired).
        await deserted.wait()
        while not done.is_set():
            r = await http.get(f"{API}/pop/queue/{QUEUE}", params={
                "consumerGroup": GROUP, "batch": "25", "partitions": "3"})
            assert r.status_code in (200, 204), r.text
            if r.status_code == 204:
                await trio.sleep(0.02)
                continue
            answer = r.json()
            messages = answer["messages"]
            assert {m["leaseId"] for m in messages} == {answer["leaseId"]}  # one lease
            lease_sizes.append(len({m["partitionId"] for m in messages}))
            for m in messages:
                n = m["data"]["id"]
                assert n not in completed, f"{n} handed out again after it was completed"
                assert n not in in_flight, f"{n} handed to {me} while {in_flight[n]} holds it"
                in_flight[n] = me
                deliveries[n] = deliveries.get(n, 0) + 1
            await trio.sleep(rng.random() * 0.01)  # "work"
            by_partition: dict[str, list[dict]] = {}
            for m in messages:
                by_partition.setdefault(m["partitionId"], []).append(m)
            settle, nacked = [], []
            for part in by_partition.values():
                if rng.random() < 0.15:
                    nacked.append(part)  # the first fails: the partition goes back whole
                    settle.append({"transactionId": part[0]["transactionId"],
                                   "partitionId": part[0]["partitionId"], "status": "retry"})
                else:
                    settle += [{"transactionId": m["transactionId"],
                                "partitionId": m["partitionId"], "status": "completed"}
                               for m in part]
            r = await http.post(f"{API}/ack/batch", json={
                "consumerGroup": GROUP, "leaseId": answer["leaseId"],
                "acknowledgments": settle})
            assert r.status_code == 200, r.text
            results = r.json()
            results = results.get("results", results) if isinstance(results, dict) else results
            assert all(x["success"] for x in results), results
            for part in nacked:
                for m in part:
                    del in_flight[m["data"]["id"]]
            for part in by_partition.values():
                if part in nacked:
                    continue
                for m in part:
                    n = m["data"]["id"]
                    del in_flight[n]
                    completed.add(n)
            if len(completed) == TOTAL:
                done.set()

    async def deserter(done: trio.Event) -> None:
        """Pops with a one-second lease and never settles: what it took must come back."""
        takes = 0
        while takes < 3 and not done.is_set():
            r = await http.get(f"{API}/pop/queue/{QUEUE}", params={
                "consumerGroup": GROUP, "batch": "10", "partitions": "2", "leaseSeconds": "1"})
            if r.status_code == 200:
                takes += 1
                for m in r.json()["messages"]:
                    n = m["data"]["id"]
                    assert n not in completed and n not in in_flight
                    abandoned.add(n)
                    deliveries[n] = deliveries.get(n, 0) + 1
                deserted.set()
            await trio.sleep(0.05)

    done, deserted = trio.Event(), trio.Event()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for first in range(3):
                nursery.start_soon(pusher, first)
            nursery.start_soon(deserter, done)
            for me in range(4):
                nursery.start_soon(consumer, me, done)

    assert completed == set(range(TOTAL))  # nothing lost
    assert not in_flight
    assert abandoned, "the deserter took something (else the expiry path went untested)"
    assert any(size > 1 for size in lease_sizes), "some pops held several partitions"
    assert all(deliveries[n] >= 2 for n in abandoned)  # redelivered after the lease ran out
    with psycopg.connect(database_url) as conn:
        behind = conn.execute(
            "SELECT p.name, p.next_offset - 1 - c.committed, c.lease_expires_at > now() "
            "FROM queen.cursors c JOIN queen.partitions p USING (partition_id) "
            "WHERE c.consumer_group = %s", (GROUP,)).fetchall()
    assert behind and all(gap == 0 and not live for _, gap, live in behind), behind
