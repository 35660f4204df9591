"""How a pop of a queue with thousands of partitions chooses one (queen.pop_walk,
schema/functions/log.sql; the pointer in queen_trio/log/rotation.py): it walks the partitions
from after the one last served and stops at the first that has something, so it costs as much
at 2,000 partitions as at 50, writes nothing to choose, and still serves every partition in
turn. Against the real PostgreSQL, at the store level."""

from __future__ import annotations

import json
import uuid
from typing import Any

from queen_trio.db.rows import DictConnection
from queen_trio.log import store as log_store
from queen_trio.log.rules import Ack, PopRequest
from tests.integration.test_pop_head import connect, tenant_of

GROUP = "rotors"


def fill(conn: DictConnection, tenant: int, queue: str, n: int, per: int = 1) -> list[str]:
    """``n`` partitions of ``queue``, ``per`` messages in each; their names."""
    names = [f"p-{i:05d}" for i in range(n)]
    with conn.transaction():
        log_store.append(conn, tenant, [
            log_store.NewFrame(queue, name, {"i": i}, f"t-{uuid.uuid4()}")
            for name in names for i in range(per)])
    return names


def request(queue: str, *, auto_ack: bool = True) -> PopRequest:
    return PopRequest(queue=queue, partition=None, group=GROUP, batch=1, wait=False,
                      timeout_ms=0, auto_ack=auto_ack)


def pop(conn: DictConnection, tenant: int, req: PopRequest) -> log_store.PopBatch | None:
    """The broker's order: the one-statement pop, else the general pop."""
    outcome = log_store.pop_head(conn, tenant, req)
    if outcome is None:
        with conn.transaction():
            outcome = log_store.pop(conn, tenant, req)
    return outcome.batch


def pop_head_buffers(conn: DictConnection, tenant: int, queue: str) -> int:
    """Shared buffers one pop_head touches (EXPLAIN ANALYZE runs it: it takes a lease)."""
    [plan] = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
        "SELECT * FROM queen.pop_head(%s, %s, %s, NULL, 1, false, NULL)",
        (tenant, queue, GROUP)).fetchone().values()
    node: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return int(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0))


def test_a_pop_costs_as_much_at_2000_partitions_as_at_50(database_url: str) -> None:
    """Every partition holds a message and the group has a cursor on each (its first pop
    created them): a one-statement pop touches about as many buffers over 2,000 partitions as
    over 50. (Ordering every partition by when it was last served read all of them and their
    cursors: some 6,000 buffers at 2,000.)"""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        cost = {}
        for n in (50, 2000):
            queue = f"wide-{n}"
            fill(conn, tenant, queue, n, per=3)
            assert pop(conn, tenant, request(queue)) is not None  # creates every cursor
            pop_head_buffers(conn, tenant, queue)  # (plans cached: measure the second)
            cost[n] = pop_head_buffers(conn, tenant, queue)
        assert cost[2000] < 2 * cost[50] + 100, cost


def test_every_partition_is_served_in_turn(database_url: str) -> None:
    """300 partitions with three messages each: the first 300 pops serve each partition once,
    the next 300 each once again, and so on: no partition waits behind another's backlog."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = fill(conn, tenant, "fair", 300, per=3)
        served = []
        while (batch := pop(conn, tenant, request("fair"))) is not None:
            served.append(batch.partition)
        assert len(served) == 900
        for lap in range(3):
            assert sorted(served[300 * lap:300 * (lap + 1)]) == names, lap


def test_leased_partitions_are_stepped_over_and_served_after_their_ack(
        database_url: str) -> None:
    """Pops that take leases (no autoAck) go on to the next partition; once every partition is
    leased a pop finds nothing; acked ones are served again."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        names = fill(conn, tenant, "leases", 40, per=2)
        batches = [pop(conn, tenant, request("leases", auto_ack=False)) for _ in range(40)]
        assert sorted(b.partition for b in batches if b is not None) == names
        assert pop(conn, tenant, request("leases", auto_ack=False)) is None
        with conn.transaction():
            for b in batches[:5]:
                assert b is not None
                [m] = b.messages
                log_store.ack(conn, tenant, [Ack(0, m.transaction_id, b.partition_id,
                                                 "completed", GROUP, b.lease_id, None)])
        again = [pop(conn, tenant, request("leases", auto_ack=False)) for _ in range(6)]
        assert sorted(b.partition for b in again if b is not None) == sorted(
            b.partition for b in batches[:5] if b is not None)
        assert again[-1] is None

