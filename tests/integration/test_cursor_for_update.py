"""queen.cursor_for_update: the one locked read of a group's cursor that queen.ack_head and
queen.settle_pop_head share (schema/functions/log.sql). Both must read it newest version first
(a backward scan of cursors_pkey, no sort), whatever the table's size: a plan that sorted or
walked every version of the row cost a steady 500/s 2.6 times the CPU."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg

from ..helpers import explained
from .test_cursor_updates import pop_and_ack

API = "/api/v1"


def _explained(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]
               ) -> tuple[list[Any], list[str]]:
    """The rows of ``sql`` and the plans of every statement it ran, nested ones included."""
    return explained(conn, lambda: conn.execute(sql, params).fetchall())


def _cursor_reads(plans: list[str]) -> list[str]:
    return [p for p in plans if "FROM queen.cursors c" in p and "FOR UPDATE" in p
            and "SKIP LOCKED" not in p]


async def _leased(http: httpx.AsyncClient, database_url: str, queue: str
                  ) -> tuple[int, str, str, str, int, int]:
    """A partition whose cursor has many versions, then a batch of 3 leased from it: tenant,
    partition, group, lease, first and last offset of the batch."""
    partition = await pop_and_ack(http, queue, 12)
    r = await http.post(f"{API}/push", json={
        "items": [{"queue": queue, "payload": {"more": i}} for i in range(3)]})
    assert r.status_code == 201, r.text
    r = await http.get(f"{API}/pop/queue/{queue}", params={"batch": 3, "wait": "false"})
    assert r.status_code == 200 and len(r.json()["messages"]) == 3, r.text
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT tenant_id, consumer_group, lease_id::text, committed, "
                           "leased_to FROM queen.cursors WHERE partition_id = %s",
                           (partition,)).fetchone()
    assert row is not None
    tenant, group, lease, committed, leased_to = row
    assert leased_to == committed + 3
    return tenant, partition, group, lease, committed + 1, leased_to


async def test_a_whole_settlement_reads_the_cursor_backwards_and_commits_it(
        http: httpx.AsyncClient, database_url: str) -> None:
    tenant, partition, group, lease, first, last = await _leased(http, database_url, "cfu")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows, plans = _explained(
            conn, "SELECT outcome FROM queen.settle_pop_head(%s, 'cfu', %s, %s, %s, %s, %s, "
            "NULL, 0, NULL)", (tenant, group, partition, lease, first, last))
        assert rows == [("empty",)]
        reads = _cursor_reads(plans)
        assert len(reads) == 1, plans
        assert "Index Scan Backward using cursors_pkey" in reads[0], reads[0]
        assert "Sort" not in reads[0], reads[0]
        # Committed through the batch, the lease released: the next settlement of the same
        # batch changes nothing.
        assert conn.execute("SELECT committed, lease_expires_at FROM queen.cursors "
                            "WHERE partition_id = %s", (partition,)).fetchone() == (last, None)
        again = conn.execute("SELECT outcome FROM queen.settle_pop_head(%s, 'cfu', %s, %s, %s, "
                             "%s, %s, NULL, 0, NULL)",
                             (tenant, group, partition, lease, first, last)).fetchall()
        assert again == [("unsettled",)]
    # The queue has nothing more for the group.
    r = await http.get(f"{API}/pop/queue/cfu", params={"batch": 10, "wait": "false"})
    assert r.status_code == 204, r.text


async def test_an_ack_reads_the_cursor_backwards_as_a_settlement_does(
        http: httpx.AsyncClient, database_url: str) -> None:
    tenant, partition, group, lease, _first, _last = await _leased(http, database_url, "cfa")
    with psycopg.connect(database_url, autocommit=True) as conn:
        txns = [t for (t,) in conn.execute(
            "SELECT f.transaction_id FROM queen.frames f JOIN queen.cursors c "
            "USING (partition_id) WHERE f.partition_id = %s AND f.\"offset\" > c.committed "
            "ORDER BY f.\"offset\"", (partition,)).fetchall()]
        assert len(txns) == 3
        rows, plans = _explained(
            conn, "SELECT outcome FROM queen.ack_head(%s, %s, %s, %s, %s)",
            (tenant, partition, group, lease, txns[:2]))
        assert [r[0] for r in rows] == ["acked"]
        reads = _cursor_reads(plans)
        assert len(reads) == 1, plans
        assert "Index Scan Backward using cursors_pkey" in reads[0], reads[0]
        assert "Sort" not in reads[0], reads[0]
    # The third message is still leased; after its lease it would come back, not the two.
    r = await http.get(f"{API}/pop/queue/cfa", params={"batch": 10, "wait": "false"})
    assert r.status_code == 204, r.text
