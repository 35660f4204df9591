"""The pop's choice of partition through the ready set (queen.ready,
schema/functions/ready.sql): a pop walks the group's partitions with frames past its cursor, not
every partition of the queue, and still serves the least recently served first, finds what is
pushed, registered before, seeked back or created later, and loses nothing to a race with
pushes. Against the real PostgreSQL, at the store level."""

from __future__ import annotations

import concurrent.futures
import json
import random
import threading
import time
import uuid
from typing import Any

from psycopg.rows import dict_row

from queen_trio.db.rows import DictConnection
from queen_trio.log import groups as log_groups
from queen_trio.log import store as log_store
from queen_trio.log.rules import PopRequest
from tests.integration.test_pop_head import connect, tenant_of

GROUP = "walkers"


def make_partitions(conn: DictConnection, tenant: int, queue: str, n: int) -> list[str]:
    names = [f"p-{i:05d}" for i in range(n)]
    with conn.transaction():
        conn.execute("SELECT * FROM queen.take_partitions(%s, %s, %s)",
                     (tenant, [queue] * n, names))
    return names


def push(conn: DictConnection, tenant: int, queue: str, partitions: list[str],
         payload: Any = 1) -> None:
    with conn.transaction():
        log_store.append(conn, tenant, [
            log_store.NewFrame(queue, name, payload, f"t-{uuid.uuid4()}") for name in partitions])


def request(queue: str, *, group: str = GROUP, auto_ack: bool = True, batch: int = 1,
            partition: str | None = None) -> PopRequest:
    return PopRequest(queue=queue, partition=partition, group=group, batch=batch, wait=False,
                      timeout_ms=0, auto_ack=auto_ack)


def pop(conn: DictConnection, tenant: int, req: PopRequest) -> log_store.PopBatch | None:
    """The broker's order: the one-statement pop, else the general pop."""
    outcome = log_store.pop_head(conn, tenant, req)
    if outcome is None:
        with conn.transaction():
            outcome = log_store.pop(conn, tenant, req)
    return outcome.batch


def drain(conn: DictConnection, tenant: int, req: PopRequest) -> list[str]:
    got = []
    while (batch := pop(conn, tenant, req)) is not None:
        got.append(batch.partition)
    return got


def pop_head_buffers(conn: DictConnection, tenant: int, queue: str) -> tuple[int, list[Any]]:
    """Shared buffers one pop_head touches (EXPLAIN ANALYZE runs it), and its rows."""
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        "SELECT * FROM queen.pop_head(%s, %s, %s, NULL, 1, true)",
        (tenant, queue, GROUP)).fetchone()
    top = next(iter(plan.values()))
    top = json.loads(top) if isinstance(top, str) else top
    node = top[0]["Plan"]
    return int(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)), node


def test_a_pop_over_thousands_of_partitions_reads_few_buffers(database_url: str) -> None:
    """3,000 partitions, two with a message: the one-statement pop serves one of them touching
    a few dozen buffers (walking every partition and its cursor touched some 9,000)."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = make_partitions(conn, tenant, "wide", 3000)
        push(conn, tenant, "wide", [names[1234], names[2999]])
        assert sorted(drain(conn, tenant, request("wide"))) == [names[1234], names[2999]]
        push(conn, tenant, "wide", [names[1234], names[2999]])
        buffers, _ = pop_head_buffers(conn, tenant, "wide")
        assert buffers < 300, buffers
        # (EXPLAIN ANALYZE popped one of them, autoAck: the other is what is left.)
        left = drain(conn, tenant, request("wide"))
        assert len(left) == 1 and left[0] in (names[1234], names[2999])
        empty_buffers, _ = pop_head_buffers(conn, tenant, "wide")
        assert empty_buffers < 300, empty_buffers


def test_the_least_recently_served_partition_comes_first(database_url: str) -> None:
    """Five busy partitions of 2,000, three messages each: pops rotate over all five before
    serving one again."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = make_partitions(conn, tenant, "fair", 2000)
        busy = [names[i] for i in (7, 400, 999, 1500, 1999)]
        for _ in range(3):
            push(conn, tenant, "fair", busy)
        served = drain(conn, tenant, request("fair"))
        assert len(served) == 15
        for r in range(3):
            assert sorted(served[5 * r:5 * r + 5]) == sorted(busy), served


def test_what_a_group_can_pop_is_found_however_it_came(database_url: str) -> None:
    """Messages pushed before the group's first pop, into partitions created after it, into
    partitions it drained, and behind a seek back: each is popped, and nothing else."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = make_partitions(conn, tenant, "ways", 1000)
        push(conn, tenant, "ways", [names[1], names[500]])  # before the group exists
        assert sorted(drain(conn, tenant, request("ways"))) == [names[1], names[500]]
        push(conn, tenant, "ways", ["brand-new", names[1]])  # a new partition, a drained one
        assert sorted(drain(conn, tenant, request("ways"))) == sorted(["brand-new", names[1]])
        with conn.transaction():  # back to the start of one partition
            log_groups.seek(conn, tenant, GROUP, "ways", offset=0, partition=names[500])
        assert drain(conn, tenant, request("ways")) == [names[500]]
        # Another group, registered late, sees everything; deleting it starts it afresh.
        assert len(drain(conn, tenant, request("ways", group="late"))) == 4
        with conn.transaction():
            log_groups.delete_group(conn, tenant, "late", "ways")
        assert len(drain(conn, tenant, request("ways", group="late"))) == 4
        assert drain(conn, tenant, request("ways")) == []


def test_leased_partitions_are_walked_past(database_url: str) -> None:
    """A partition under a live lease is not handed out twice; the next ready one is."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = make_partitions(conn, tenant, "leased", 500)
        push(conn, tenant, "leased", [names[3], names[300]])
        first = pop(conn, tenant, request("leased", auto_ack=False))
        second = pop(conn, tenant, request("leased", auto_ack=False))
        assert first is not None and second is not None
        assert {first.partition, second.partition} == {names[3], names[300]}
        assert pop(conn, tenant, request("leased", auto_ack=False)) is None


def test_pushes_racing_consumers_over_many_partitions_lose_nothing(database_url: str) -> None:
    """Three pushers write into 300 partitions while three consumers drain them (the ready
    rows are dropped and marked again all the while): every message is popped exactly once."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = make_partitions(conn, tenant, "race", 300)
        push(conn, tenant, "race", [names[0]], payload="warm")
        assert drain(conn, tenant, request("race")) == [names[0]]
    per_pusher = 400
    pushed_all = threading.Event()
    got: list[Any] = []
    lock = threading.Lock()

    def pusher(k: int) -> None:
        rng = random.Random(k)
        with connect(database_url) as own:
            for i in range(per_pusher):
                push(own, tenant, "race", [rng.choice(names)], payload=f"{k}-{i}")

    def consumer(_: int) -> None:
        with connect(database_url) as own:
            own.row_factory = dict_row
            idle_since = None
            while True:
                batch = pop(own, tenant, request("race", batch=5))
                if batch is None:
                    if pushed_all.is_set():
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since > 2:
                            return
                    continue
                idle_since = None
                with lock:
                    got.extend(log_store.payload_value(m) for m in batch.messages)

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        consumers = [pool.submit(consumer, c) for c in range(3)]
        pushers = [pool.submit(pusher, k) for k in range(3)]
        for f in pushers:
            f.result(timeout=300)
        pushed_all.set()
        for f in consumers:
            f.result(timeout=300)
    expected = {f"{k}-{i}" for k in range(3) for i in range(per_pusher)}
    assert len(got) == len(expected) and set(got) == expected
