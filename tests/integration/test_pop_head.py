"""queen.pop_head (schema/functions/log.sql): the common pop in one statement, at the store
level against a real PostgreSQL. It must answer exactly what the general pop would, and hand
every other case back ('fallback', None here) without changing anything."""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from queen_trio.db.rows import DictConnection, one
from queen_trio.log import housekeeping
from queen_trio.log import store as log_store
from queen_trio.log.housekeeping import SealPolicy
from queen_trio.log.rules import QUEUE_MODE_GROUP, Ack, PopRequest, QueueOptions

GROUP = "workers"


def connect(url: str) -> DictConnection:
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def tenant_of(conn: DictConnection) -> int:
    return conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'"
                        ).fetchone()["tenant_id"]


def push(conn: DictConnection, tenant: int, queue: str, payloads: list[Any]) -> None:
    with conn.transaction():
        log_store.append(conn, tenant, [
            log_store.NewFrame(queue, "Default", p, f"txn-{uuid.uuid4()}") for p in payloads])


def request(queue: str, batch: int = 10, auto_ack: bool = False) -> PopRequest:
    return PopRequest(queue=queue, partition=None, group=GROUP, batch=batch, wait=False,
                      timeout_ms=0, auto_ack=auto_ack)


def general_pop(conn: DictConnection, tenant: int, req: PopRequest) -> log_store.PopOutcome:
    with conn.transaction():
        return log_store.pop(conn, tenant, req)


def cursor(conn: DictConnection) -> dict[str, Any]:
    return one(conn.execute("SELECT committed, acked_ahead, lease_id, lease_expires_at, leased_to "
                        "FROM queen.cursors WHERE consumer_group = %s", (GROUP,)))


def test_a_consumer_that_keeps_up_is_served_in_one_statement(database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "q", ["a", "b"])
        first = log_store.pop_head(conn, tenant, request("q"))
        assert first is None  # no cursor yet: the general pop creates it
        first = general_pop(conn, tenant, request("q"))
        assert [log_store.payload_value(m) for m in first.batch.messages] == ["a", "b"]
        with conn.transaction():
            log_store.ack(conn, tenant, [
                Ack(i, m.transaction_id, first.batch.partition_id, "completed", GROUP,
                    first.batch.lease_id, None) for i, m in enumerate(first.batch.messages)])

        push(conn, tenant, "q", ["c", "d", "e"])
        got = log_store.pop_head(conn, tenant, request("q", batch=2))
        assert got is not None and got.batch is not None
        batch = got.batch
        assert ([m.offset for m in batch.messages],
                [log_store.payload_value(m) for m in batch.messages]) == ([2, 3], ["c", "d"])
        assert all(m.retry_count == 0 and m.created_at is not None for m in batch.messages)
        assert (batch.queue, batch.partition, batch.group) == ("q", "Default", GROUP)
        state = cursor(conn)
        assert (state["committed"], state["leased_to"], state["lease_id"]) == (
            1, 3, batch.lease_id)
        assert state["lease_expires_at"] == batch.lease_expires_at
        # The partition is leased: nothing more for the group until the lease ends.
        assert log_store.pop_head(conn, tenant, request("q")).batch is None
        # The general pop agrees.
        assert general_pop(conn, tenant, request("q")).batch is None


def test_a_pop_that_finds_nothing_says_when_to_look_again(database_url: str) -> None:
    """A parked pop needs to know when something becomes poppable unannounced (here: the lease
    holding the queue's frames ends); the one-statement pop answers it with "nothing", as the
    separate look (next_look_in_s) would, so parking costs no statement of its own."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        assert log_store.pop_head(conn, tenant, request("q")).batch is None
        push(conn, tenant, "q", ["a"])
        general_pop(conn, tenant, request("q"))  # creates the cursor
        push(conn, tenant, "q", ["b"])
        # Leased (the first batch is not acked): nothing, until the lease ends.
        empty = log_store.pop_head(conn, tenant, request("q"))
        assert empty is not None and empty.batch is None and empty.looked
        looked = log_store.next_look_in_s(conn, tenant, request("q"))
        assert looked is not None and looked > 200  # the queue's leaseTime: 300 s
        assert empty.look_in_s == pytest.approx(looked, abs=5)
        # Nothing past the cursor anywhere: nothing will become poppable unannounced.
        quiet = log_store.pop_head(conn, tenant, request("elsewhere"))
        assert quiet is not None and quiet.looked and quiet.look_in_s is None


def test_auto_ack_advances_the_cursor(database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "q", ["a"])
        general_pop(conn, tenant, request("q", auto_ack=True))  # creates the cursor
        push(conn, tenant, "q", ["b", "c"])
        got = log_store.pop_head(conn, tenant, request("q", auto_ack=True))
        assert [log_store.payload_value(m) for m in got.batch.messages] == ["b", "c"]
        assert got.batch.lease_id is None
        state = cursor(conn)
        assert (state["committed"], state["lease_expires_at"]) == (2, None)
        assert log_store.pop_head(conn, tenant, request("q", auto_ack=True)).batch is None


def test_every_other_case_falls_back_and_changes_nothing(database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = tenant_of(conn)

        def unchanged_fallback(queue: str) -> None:
            before = conn.execute("SELECT * FROM queen.cursors ORDER BY partition_id, "
                                  "consumer_group").fetchall()
            assert log_store.pop_head(conn, tenant, request(queue)) is None
            after = conn.execute("SELECT * FROM queen.cursors ORDER BY partition_id, "
                                 "consumer_group").fetchall()
            assert after == before

        # delayedProcessing
        with conn.transaction():
            log_store.configure(conn, tenant, "slow", QueueOptions(delayed_processing_s=60))
        push(conn, tenant, "slow", ["x"])
        unchanged_fallback("slow")

        # acked out of order: acked_ahead is not empty
        push(conn, tenant, "ahead", ["a", "b", "c"])
        got = general_pop(conn, tenant, request("ahead"))
        with conn.transaction():
            log_store.ack(conn, tenant, [Ack(0, got.batch.messages[1].transaction_id,
                                             got.batch.partition_id, "completed", GROUP,
                                             got.batch.lease_id, None)])
        conn.execute("UPDATE queen.cursors SET lease_expires_at = now() - interval '1 s'")
        unchanged_fallback("ahead")

        # a failed delivery: the frame has a retry history
        push(conn, tenant, "failing", ["f"])
        got = general_pop(conn, tenant, request("failing"))
        with conn.transaction():
            log_store.ack(conn, tenant, [Ack(0, got.batch.messages[0].transaction_id,
                                             got.batch.partition_id, "failed", GROUP,
                                             got.batch.lease_id, "boom")])
        unchanged_fallback("failing")

        # frames sealed into a segment
        push(conn, tenant, "sealed", ["s0"])
        got = general_pop(conn, tenant, request("sealed", auto_ack=True))
        push(conn, tenant, "sealed", [f"s{i}" for i in range(1, 6)])
        pid = got.batch.partition_id
        with conn.transaction():
            assert housekeeping.seal_partition(conn, pid, SealPolicy(
                max_frames=5, max_bytes=1 << 20, min_age_ms=0, max_age_ms=0)) is not None
        unchanged_fallback("sealed")
        assert [m.payload for m in general_pop(conn, tenant, request("sealed")).batch.messages
                ] == [f"s{i}" for i in range(1, 6)]


def test_no_queue_and_no_frames_are_empty_answers(database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        assert log_store.pop_head(conn, tenant, request("nowhere")).batch is None
        push(conn, tenant, "q", ["a"])
        general_pop(conn, tenant, request("q", auto_ack=True))
        assert log_store.pop_head(conn, tenant, request("q")).batch is None


def test_a_cursor_another_consumer_holds_sends_the_pop_on_to_the_next_partition(
    database_url: str,
) -> None:
    """Two partitions with frames for the group; another consumer's open transaction holds the
    first one's cursor. The one-statement pop skips it and answers the second partition's
    frames: it does not hand the pop to the general pop (nor answer nothing)."""
    with connect(database_url) as conn, connect(database_url) as other:
        tenant = tenant_of(conn)
        for name in ("p-a", "p-b"):
            with conn.transaction():
                log_store.append(conn, tenant, [
                    log_store.NewFrame("two", name, f"{name}-{i}", f"txn-{uuid.uuid4()}")
                    for i in range(2)])
            req = PopRequest(queue="two", partition=name, group=GROUP, batch=10, wait=False,
                             timeout_ms=0, auto_ack=True)
            general_pop(conn, tenant, req)  # the group's cursor there, past these frames
            with conn.transaction():
                log_store.append(conn, tenant, [
                    log_store.NewFrame("two", name, f"{name}-new", f"txn-{uuid.uuid4()}")])
        with other.transaction():
            other.execute("SELECT 1 FROM queen.cursors c JOIN queen.partitions p "
                          "USING (partition_id) WHERE p.name = 'p-a' AND c.consumer_group = %s "
                          "FOR UPDATE", (GROUP,))
            got = log_store.pop_head(conn, tenant, request("two"))
            assert got is not None, "fell back to the general pop"
            assert got.batch is not None
            assert got.batch.partition == "p-b"
            assert [log_store.payload_value(m) for m in got.batch.messages] == ["p-b-new"]
        # Released: the first partition is served in its turn.
        got = log_store.pop_head(conn, tenant, request("two"))
        assert got is not None and got.batch is not None and got.batch.partition == "p-a"


def test_consumers_racing_for_one_partition_get_every_message_once(database_url: str) -> None:
    """Eight connections pop (autoAck) one partition as fast as they can: a cursor another
    consumer advanced between the candidates and the lock must be skipped, not written."""
    total = 3000
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "race", [f"m{i}" for i in range(total)])
        general_pop(conn, tenant, request("race", batch=1, auto_ack=True))  # the cursor

    def consume(_: int) -> list[str]:
        got: list[str] = []
        with connect(database_url) as own:
            idle = 0
            while idle < 20:
                req = request("race", batch=1, auto_ack=True)
                outcome = log_store.pop_head(own, tenant, req)
                if outcome is None:
                    outcome = general_pop(own, tenant, req)
                if outcome.batch is None:
                    idle += 1
                    continue
                idle = 0
                got.extend(log_store.payload_value(m) for m in outcome.batch.messages)
        return got

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        received = [m for part in pool.map(consume, range(8)) for m in part]
    assert len(received) == len(set(received)) == total - 1
    assert set(received) == {f"m{i}" for i in range(1, total)}


def test_a_pop_commits_without_waiting_for_the_wal_flush_unless_asked_to(
    database_url: str,
) -> None:
    """QUEEN_POP_COMMIT: both pops set their own transaction's commit level, autoAck or
    leasing (seen here from inside an open transaction); "sync" keeps the server's setting;
    neither changes the session's."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "q", ["a", "b", "c", "d", "e", "f"])
        conn.execute("SET synchronous_commit = remote_apply")  # the operator's choice
        for sync_commit, level in ((False, "off"), (True, "remote_apply")):
            with conn.transaction():
                log_store.pop(conn, tenant, request("q", batch=1, auto_ack=True),
                              sync_commit=sync_commit)
                assert conn.execute("SHOW synchronous_commit").fetchone()[
                    "synchronous_commit"] == level
            with conn.transaction():
                got = log_store.pop_head(conn, tenant, request("q", batch=1, auto_ack=True),
                                         sync_commit=sync_commit)
                assert got is not None and got.batch is not None
                assert conn.execute("SHOW synchronous_commit").fetchone()[
                    "synchronous_commit"] == level
            assert conn.execute("SHOW synchronous_commit").fetchone()[
                "synchronous_commit"] == "remote_apply"
            # A lease commits at the same level (under sync it waits as the server does; rolled
            # back, so that the next pop finds the partition free).
            with conn.transaction(force_rollback=True):
                got = log_store.pop_head(conn, tenant, request("q", batch=1),
                                         sync_commit=sync_commit)
                assert got is not None and got.batch is not None
                assert got.batch.lease_id is not None
                assert conn.execute("SHOW synchronous_commit").fetchone()[
                    "synchronous_commit"] == level
            with conn.transaction(force_rollback=True):
                leased = log_store.pop(conn, tenant, request("q", batch=1),
                                       sync_commit=sync_commit)
                assert leased.batch is not None and leased.batch.lease_id is not None
                assert conn.execute("SHOW synchronous_commit").fetchone()[
                    "synchronous_commit"] == level


def _index_rows_read(conn: DictConnection, reader: DictConnection) -> int:
    """Index entries read from the partitions and cursors tables so far, with what ``conn``
    did counted (a backend sends its statistics in batches, at most once a second, unless
    told to send them when its transaction ends)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    return one(reader.execute(
        "SELECT coalesce(sum(idx_tup_read), 0)::bigint AS n FROM pg_stat_user_indexes "
        "WHERE schemaname = 'queen' AND relname IN ('partitions', 'cursors')"))["n"]


def test_a_stream_pop_that_took_messages_looks_again_without_reading_every_partition(
        database_url: str) -> None:
    """A stream's settlement and next pop (settle_pop_head, look_after) says whether anything
    else is poppable. While a backlog of many partitions drains, it is: the answer is 0, found
    by the pop's own walk, not by reading every partition with its cursor (queen.next_look
    read all 5,000 of Queen's bootstrap test for every message of a group's first pass)."""
    partitions = 300
    with connect(database_url) as conn, connect(database_url) as stats:
        tenant = tenant_of(conn)
        with conn.transaction():
            log_store.append(conn, tenant, [
                log_store.NewFrame("wide", f"p-{i:04d}", i, f"txn-{i}")
                for i in range(partitions)])
        req = request("wide", batch=1)
        first = general_pop(conn, tenant, req)  # the group's cursors, on every partition
        assert first.batch is not None
        handed = first.batch
        for _ in range(3):
            acks = [Ack(i, m.transaction_id, handed.partition_id, "completed", GROUP,
                        handed.lease_id, None) for i, m in enumerate(handed.messages)]
            before = _index_rows_read(conn, stats)
            settled = log_store.settle_pop_head(conn, tenant, req, handed, acks, pop=True,
                                                look_after=True)
            read = _index_rows_read(conn, stats) - before
            assert settled is not None and settled.popped is not None
            popped = settled.popped
            assert popped.batch is not None and popped.looked
            assert popped.look_in_s == 0  # another partition holds a message for the group
            assert read < partitions / 3, f"{read} index entries read for one pop"
            handed = popped.batch


def test_a_stream_pop_that_took_the_last_message_says_nothing_is_left(
        database_url: str) -> None:
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "q", ["a", "b"])
        req = request("q", batch=1)
        first = general_pop(conn, tenant, req)
        assert first.batch is not None
        acks = [Ack(0, first.batch.messages[0].transaction_id, first.batch.partition_id,
                    "completed", GROUP, first.batch.lease_id, None)]
        settled = log_store.settle_pop_head(conn, tenant, req, first.batch, acks, pop=True,
                                            look_after=True)
        assert settled is not None and settled.popped is not None
        popped = settled.popped
        assert popped.batch is not None and [log_store.payload_value(m)
                                             for m in popped.batch.messages] == ["b"]
        # Its own lease holds the last message; nothing else will become poppable
        # unannounced before that lease ends (the queue's leaseTime, 300 s).
        assert popped.looked and popped.look_in_s is not None and popped.look_in_s > 200


def test_queue_modes_first_pop_of_a_partition_creates_its_cursor(database_url: str) -> None:
    """Queue mode starts every partition before log_start: its first pop there is served by
    the one statement, which creates the cursor where the general pop would. A named group's
    first pop still goes to the general pop (its subscription decides where it starts)."""
    with connect(database_url) as conn:
        tenant = tenant_of(conn)
        push(conn, tenant, "qm", ["a", "b"])
        with conn.transaction():
            log_store.append(conn, tenant, [log_store.NewFrame("qm", "p2", "x", "txn-x")])
        queue_mode = PopRequest(queue="qm", partition=None, group=QUEUE_MODE_GROUP, batch=1,
                                wait=False, timeout_ms=0, auto_ack=False)

        got = log_store.pop_head(conn, tenant, queue_mode)

        assert got is not None and got.batch is not None
        assert [(m.offset, log_store.payload_value(m)) for m in got.batch.messages] == [
            (0, "a")]
        # A cursor on every partition of the queue (a message is owed to queue mode from its
        # first pop on), the popped one leased.
        rows = conn.execute(
            "SELECT p.name, c.committed, c.leased_to, c.lease_id, c.attempt_offset "
            "FROM queen.cursors c JOIN queen.partitions p USING (partition_id) "
            "WHERE c.consumer_group = %s ORDER BY p.name", (QUEUE_MODE_GROUP,)).fetchall()
        assert rows == [
            {"name": "Default", "committed": -1, "leased_to": 0,
             "lease_id": got.batch.lease_id, "attempt_offset": 0},
            {"name": "p2", "committed": -1, "leased_to": None, "lease_id": None,
             "attempt_offset": None}]
        # The next pop takes the other partition; the named group's first pop is the broker's.
        other = log_store.pop_head(conn, tenant, queue_mode)
        assert other is not None and other.batch is not None
        assert [log_store.payload_value(m) for m in other.batch.messages] == ["x"]
        assert log_store.pop_head(conn, tenant, request("qm")) is None
        assert conn.execute("SELECT count(*) AS n FROM queen.cursors").fetchone() == {"n": 2}
