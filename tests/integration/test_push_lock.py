"""A push in progress holds its partitions' rows, and nothing on the consuming side waits for it:
pops and acks take only the key-share locks their foreign keys need, which a push's lock leaves
free. (A push once locked FOR UPDATE: a failed ack then waited for every push into its
partition, and an ack naming partitions in another order than the push could deadlock with it,
the push answering 503.)"""

from __future__ import annotations

import httpx
import psycopg
import trio

from queen_trio.db import queries

from .test_log import API, configure, pop, push

LOG = queries.load("log")


def hold_push_lock(database_url: str, queue: str, partition: str) -> psycopg.Connection:
    """An open transaction holding the partition's row exactly as a push does (the broker's own
    statement), until the connection is closed."""
    conn = psycopg.connect(database_url)
    tenant_id = conn.execute("SELECT tenant_id FROM queen.queues WHERE name = %s",
                             (queue,)).fetchone()[0]
    rows = conn.execute(LOG.lock_partitions, {"tenant_id": tenant_id, "queues": [queue],
                                              "names": [partition]}).fetchall()
    assert len(rows) == 1
    return conn


async def test_pop_and_failed_ack_do_not_wait_for_a_push_in_progress(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    await configure(http, "pushlock", retryLimit=5, leaseTime=30)
    await push(http, "pushlock", [{"n": 1}, {"n": 2}], partition="p")
    holder = hold_push_lock(database_url, "pushlock", "p")
    try:
        with trio.fail_after(10):
            # A group that never popped this partition creates its cursor (a foreign key).
            answer = await pop(http, "pushlock", "p", consumerGroup="g", batch=1, wait=False)
            assert answer is not None, "the pop skipped a partition a push was writing to"
            [message] = answer["messages"]
            # A failure counts a retry: a row in queen.retries (a foreign key again).
            r = await http.post(f"{API}/ack", json={
                "transactionId": message["transactionId"],
                "partitionId": message["partitionId"], "leaseId": message["leaseId"],
                "consumerGroup": "g", "status": "failed", "error": "boom"})
            assert r.status_code == 200, r.text
    finally:
        holder.close()
    with psycopg.connect(database_url) as conn:
        [(count,)] = conn.execute(
            "SELECT retry_count FROM queen.retries r JOIN queen.partitions p USING (partition_id)"
            " JOIN queen.queues q USING (queue_id) WHERE q.name = 'pushlock'").fetchall()
    assert count == 1


async def test_a_push_creating_a_partition_does_not_deadlock_with_another_creating_it(
    http: httpx.AsyncClient, database_url: str,
) -> None:
    """Another writer has just created partition ``new`` (uncommitted) and next wants ``old``,
    while our push wants ``old`` and ``new``. The push must not take ``old`` and then wait for
    ``new``: the writer waiting for ``old`` would close the circle (PostgreSQL then kills one of
    the two: the push answered 503)."""
    await push(http, "crosslock", [{"n": 0}], partition="old")
    other = psycopg.connect(database_url)
    tenant_id = other.execute("SELECT tenant_id FROM queen.queues WHERE name = 'crosslock'"
                              ).fetchone()[0]
    new = {"tenant_id": tenant_id, "queues": ["crosslock"], "names": ["new"]}
    old = {"tenant_id": tenant_id, "queues": ["crosslock"], "names": ["old"]}
    other.execute(LOG.ensure_partitions, new)  # uncommitted
    answer: list[httpx.Response] = []

    async def pusher() -> None:
        answer.append(await http.post(f"{API}/push", json={"items": [
            {"queue": "crosslock", "partition": "old", "payload": {"n": 1}},
            {"queue": "crosslock", "partition": "new", "payload": {"n": 2}}]}))

    def other_takes_old() -> int:
        with other.transaction():
            return len(other.execute(LOG.lock_partitions, old).fetchall())

    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pusher)
                with psycopg.connect(database_url, autocommit=True) as watch:
                    while not watch.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%%queen.%%'").fetchone():
                        await trio.sleep(0.02)  # the push now waits for the other's insert
                locked = await trio.to_thread.run_sync(other_takes_old)
                other.commit()
    finally:
        other.close()
    assert locked == 1
    assert answer[0].status_code == 201, answer[0].text
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT p.name, count(f.*) FROM queen.partitions p JOIN queen.queues q USING (queue_id)"
            " LEFT JOIN queen.frames f USING (partition_id) WHERE q.name = 'crosslock'"
            " GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [("new", 1), ("old", 2)]
