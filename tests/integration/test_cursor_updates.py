"""A consumer group's cursor row behind a held snapshot (issue 31, the log side).

Every pop (which takes a lease: a new lease_id) and every ack updates the group's cursor. If an
update changes an indexed column it cannot be HOT: it adds an entry to every index of
queen.cursors, and while a snapshot is held (a long report, pg_dump, a replica with
hot_standby_feedback) none can be removed, so every later lookup of that cursor walks one more
entry per pop. These tests drive pops and acks through HTTP and look at what PostgreSQL kept."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import trio

API = "/api/v1"
CYCLES = 15  # pop + ack: 30 versions of one cursor, room for all on its page


async def pop_and_ack(http: httpx.AsyncClient, queue: str, cycles: int) -> str:
    """``cycles`` pops of one message, each acked; the partition's id."""
    r = await http.post(f"{API}/push", json={
        "items": [{"queue": queue, "payload": {"i": i}} for i in range(cycles)]})
    assert r.status_code == 201, r.text
    partition = ""
    for _ in range(cycles):
        r = await http.get(f"{API}/pop/queue/{queue}", params={"batch": 1, "wait": "false"})
        assert r.status_code == 200, r.text
        m = r.json()["messages"][0]
        partition = m["partitionId"]
        r = await http.post(f"{API}/ack", json={
            "transactionId": m["transactionId"], "partitionId": partition,
            "leaseId": m["leaseId"], "consumerGroup": m["consumerGroup"], "status": "completed"})
        assert r.status_code == 200 and r.json()[0]["success"], r.text
    return partition


def cursor_updates(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                       "WHERE schemaname = 'queen' AND relname = 'cursors'").fetchone()
    assert row is not None
    return row[0], row[1]


async def test_every_cursor_update_of_pops_and_acks_is_hot(
        http: httpx.AsyncClient, database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = cursor_updates(conn)
        await pop_and_ack(http, "hot", CYCLES)
        # The brokers' backends report their counts within seconds of going idle.
        deadline = trio.current_time() + 30
        while (after := cursor_updates(conn))[0] - before[0] < 2 * CYCLES:
            assert trio.current_time() < deadline, f"updates counted: {after} from {before}"
            await trio.sleep(0.5)
    updates, hot = after[0] - before[0], after[1] - before[1]
    assert hot == updates, f"{hot} of {updates} cursor updates were HOT"


async def test_behind_a_held_snapshot_a_cursor_is_found_through_one_index_entry(
        http: httpx.AsyncClient, database_url: str) -> None:
    with psycopg.connect(database_url) as holder:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM queen.tenants").fetchone()  # the snapshot, held
        partition = await pop_and_ack(http, "held", CYCLES)
        with psycopg.connect(database_url) as conn:
            # By its key, as every pop, ack and sweep-carried pop reads it (the table is small
            # enough here for the planner to read it whole).
            conn.execute("SET LOCAL enable_seqscan = off")
            conn.execute("SET LOCAL enable_bitmapscan = off")
            assert conn.execute("SELECT committed FROM queen.cursors WHERE partition_id = %s",
                                (partition,)).fetchone() == (CYCLES - 1,)
            # The index entries that lookup walked (this transaction's count, not yet
            # reported).
            walked = conn.execute("SELECT pg_stat_get_xact_tuples_returned("
                                  "'queen.cursors_pkey'::regclass)").fetchone()
        holder.rollback()
    # One entry, the root of the cursor's HOT chain (its versions are on one page); with an
    # entry per pop it was one more each pop (16 after 15).
    assert walked == (1,), f"{walked} index entries walked after {CYCLES} pops and acks"


async def test_behind_a_held_snapshot_an_ack_reads_only_the_cursors_newest_page(
        http: httpx.AsyncClient, database_url: str) -> None:
    cycles = 80  # 160 versions of the cursor: more than one page holds
    with psycopg.connect(database_url) as holder:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM queen.tenants").fetchone()  # the snapshot, held
        partition = await pop_and_ack(http, "deep", cycles)
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT tenant_id, consumer_group, (ctid::text::point)[0] FROM queen.cursors "
                "WHERE partition_id = %s", (partition,)).fetchone()
            assert row is not None
            tenant, group, page = row
        assert page > 0  # the versions have filled more than the cursor's first page
        # A connection whose only scan is the ack's (its index counts are its own until
        # reported): an ack of nothing the lease holds reads and locks the cursor, then hands
        # over to the general ack having changed nothing.
        with psycopg.connect(database_url) as conn:
            outcome = conn.execute("SELECT outcome FROM queen.ack_head(%s, %s, %s, NULL, "
                                   "ARRAY['no-such-txn'])", (tenant, partition, group)).fetchone()
            walked = conn.execute("SELECT pg_stat_get_xact_tuples_returned("
                                  "'queen.cursors_pkey'::regclass)").fetchone()
        holder.rollback()
    assert outcome == ("fallback",)
    # The live version is on the newest page; each page of versions before it has an index
    # entry, which a forward scan of the key walked (4 after 80 pops and acks).
    assert walked == (1,), f"{walked} index entries walked after {cycles} pops and acks"
