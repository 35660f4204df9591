"""Sealed segments over a real PostgreSQL: reads across the head/segment boundary, sealing under
concurrent push and pop, retention and log_start, the storage gate's bytes, resource details.

Sealing and retention are driven by calling the housekeeping steps directly (no waiting for a
round), except in the test that exercises the running service itself. Retention ages are
reached by back-dating head frames before they are sealed, never by sleeping.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.db.rows import DictConnection
from queen_trio.log import housekeeping, rules, store
from queen_trio.log.segments import SealPolicy, SegmentCache
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store as tenant_store

from ..conftest import replace_settings

API = "/api/v1"
# Seal everything at once, in segments of at most `max_frames` frames.
EAGER = SealPolicy(max_frames=5, max_bytes=1 << 20, min_age_ms=0, max_age_ms=0)
# Seal full segments only: the rest stays in the head.
FULL_ONLY = SealPolicy(max_frames=5, max_bytes=1 << 20, min_age_ms=0, max_age_ms=600_000)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The broker's own housekeeping stays out of the way: these tests seal by hand."""
    return replace_settings(settings, housekeeping_interval_ms=3_600_000)


# -- helpers ----------------------------------------------------------------------------------


def connect(url: str) -> DictConnection:
    return psycopg.connect(url, row_factory=dict_row, autocommit=True)


def sql(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with connect(url) as conn:
        return conn.execute(query, params).fetchall()


def partition_ids(url: str, queue: str) -> list[uuid.UUID]:
    rows = sql(url, "SELECT p.partition_id FROM queen.partitions p JOIN queen.queues q "
                    "USING (queue_id) WHERE q.name = %s ORDER BY p.name", (queue,))
    return [r["partition_id"] for r in rows]


def seal_all(url: str, queue: str, policy: SealPolicy = EAGER) -> int:
    """Seal every partition of the queue as far as the policy allows; segments made."""
    made = 0
    with connect(url) as conn:
        for pid in partition_ids(url, queue):
            while True:
                with conn.transaction():
                    sealed = housekeeping.seal_partition(conn, pid, policy)
                if sealed is None:
                    break
                made += 1
    return made


def apply_retention(url: str, queue: str) -> list[housekeeping.Dropped]:
    out = []
    with connect(url) as conn:
        for pid in partition_ids(url, queue):
            with conn.transaction():
                dropped = housekeeping.apply_retention(conn, pid)
            if dropped is not None:
                out.append(dropped)
    return out


def backdate(url: str, queue: str, *, below_offset: int | None = None) -> None:
    """Make head frames an hour old (they are then past any retention a test configures)."""
    sql(url, "UPDATE queen.frames f SET created_at = f.created_at - interval '1 hour' "
             "FROM queen.partitions p JOIN queen.queues q USING (queue_id) "
             "WHERE f.partition_id = p.partition_id AND q.name = %s "
             "AND (%s::bigint IS NULL OR f.\"offset\" < %s) RETURNING 1",
        (queue, below_offset, below_offset))


def where_frames_are(url: str, queue: str) -> tuple[int, list[tuple[int, int]]]:
    """(head rows, [(first, last) of each segment]) of the queue's Default partition."""
    (pid,) = partition_ids(url, queue)
    head = sql(url, "SELECT count(*) AS n FROM queen.frames WHERE partition_id = %s", (pid,))
    segs = sql(url, "SELECT first_offset, last_offset FROM queen.segments "
                    "WHERE partition_id = %s ORDER BY first_offset", (pid,))
    return head[0]["n"], [(s["first_offset"], s["last_offset"]) for s in segs]


async def push(http: httpx.AsyncClient, queue: str, payloads: list[Any], **item: Any) -> list:
    r = await http.post(f"{API}/push", json={
        "items": [{"queue": queue, "payload": p, **item} for p in payloads]})
    assert r.status_code == 201, r.text
    return r.json()


async def pop(http: httpx.AsyncClient, queue: str, **params: Any) -> Any:  # None on 204
    r = await http.get(f"{API}/pop/queue/{queue}",
                       params={k: str(v).lower() if isinstance(v, bool) else v
                               for k, v in params.items()})
    assert r.status_code in (200, 204), r.text
    return None if r.status_code == 204 else r.json()


async def ack_all(http: httpx.AsyncClient, batch: dict, status: str = "completed") -> list:
    r = await http.post(f"{API}/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"], "consumerGroup": m["consumerGroup"], "status": status}
        for m in batch["messages"]]})
    assert r.status_code == 200, r.text
    return r.json()


async def configure(http: httpx.AsyncClient, queue: str, **options: Any) -> None:
    r = await http.post(f"{API}/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


async def drain(http: httpx.AsyncClient, queue: str, group: str, batch: int = 4) -> list[dict]:
    """Pop and complete everything the group has left, in delivery order."""
    got: list[dict] = []
    while (b := await pop(http, queue, consumerGroup=group, batch=batch)) is not None:
        got.extend(b["messages"])
        await ack_all(http, b)
    return got


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


# Payloads that stress the segment format: tabs and newlines inside strings, unicode, nesting,
# every JSON type at the top level.
ODD_PAYLOADS: list[Any] = [
    {"text": "tab\there\nnewline\r\n", "emoji": "🐝", "nested": {"a": [1, 2.5, None, True]}},
    "a plain string with \\ backslash and \"quotes\"",
    [1, "two", {"three": 3}],
    12345678901234567890,
    None,
    {"big": "x" * 5000},
    {"ключ": "значение", "": ""},
    False,
    0.1,
    {"event": "order.created", "id": 7, "tags": ["a", "b"]},
    {"z": 1, "a": 2},
    [],
]


# -- reads across the boundary ----------------------------------------------------------------


async def test_sealed_frames_read_back_exactly_as_from_the_head(
    http: httpx.AsyncClient, database_url: str
) -> None:
    pushed = await push(http, "odd", ODD_PAYLOADS)
    before = await drain(http, "odd", "before", batch=5)  # all from the head
    assert [m["data"] for m in before] == ODD_PAYLOADS

    assert seal_all(database_url, "odd", FULL_ONLY) == 2  # 0-4, 5-9
    head, segments = where_frames_are(database_url, "odd")
    assert (head, segments) == (2, [(0, 4), (5, 9)])

    # Batches of 3 straddle both segment boundaries and the head.
    after = await drain(http, "odd", "after", batch=3)
    keep = ("transactionId", "offset", "data", "createdAt", "partitionId", "retryCount")
    assert [{k: m[k] for k in keep} for m in after] == [{k: m[k] for k in keep} for m in before]
    assert [m["transactionId"] for m in after] == [p["transactionId"] for p in pushed]


async def test_acks_dedupe_and_dead_letters_find_sealed_frames(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "dl", retryLimit=0)
    await push(http, "dl", [{"n": 1}], transactionId="client-txn")
    await push(http, "dl", [{"n": 2}, {"n": 3}])
    leased = await pop(http, "dl", batch=3)
    assert seal_all(database_url, "dl") == 1  # popped from the head, now sealed under the lease

    again = await push(http, "dl", [{"n": 99}], transactionId="client-txn")
    assert again[0]["status"] == "duplicate"  # de-duplication sees sealed frames

    results = await ack_all(http, {"messages": leased["messages"][:1]})
    assert results[0]["success"] is True and results[0]["alreadyAcked"] is False
    # A failure releases the lease (an offset commit stops at a nack): the rest of the batch
    # is settled in the same call. retryLimit 0: straight to dead letters, read from a segment,
    # and the completion after it goes on past it.
    r = await http.post(f"{API}/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "leaseId": m["leaseId"], "status": status}
        for m, status in zip(leased["messages"][1:], ("failed", "completed"), strict=True)]})
    assert [(v["success"], v["dlq"]) for v in r.json()] == [(True, True), (True, False)]
    dlq = (await http.get(f"{API}/dlq", params={"queue": "dl"})).json()["messages"]
    assert [(d["data"], d["offset"]) for d in dlq] == [({"n": 2}, 1)]
    replay = await http.post(f"{API}/dlq/{dlq[0]['id']}/replay")
    assert replay.status_code == 200, replay.text
    rest = await drain(http, "dl", "__QUEUE_MODE__")
    assert [(m["data"], m["offset"]) for m in rest] == [({"n": 2}, 3)]


async def test_sealed_segments_cannot_be_changed_or_removed(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await push(http, "frozen", [1, 2, 3])
    assert seal_all(database_url, "frozen") == 1
    for statement in ("UPDATE queen.segments SET raw_bytes = 0",
                      "DELETE FROM queen.segments",
                      "TRUNCATE queen.segments"):
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            sql(database_url, statement)
    assert where_frames_are(database_url, "frozen") == (0, [(0, 2)])
    # Deleting the whole queue takes its segments with it, and so does deleting a tenant.
    r = await http.delete(f"{API}/resources/queues/frozen")
    assert r.json()["existed"] is True
    assert sql(database_url, "SELECT count(*) AS n FROM queen.segments") == [{"n": 0}]
    with connect(database_url) as conn:
        other = tenant_store.create_tenant(conn, "other")
        with conn.transaction():
            store.append(conn, other, [store.NewFrame("theirs", "Default", i, f"t{i}")
                                       for i in range(3)])
    assert seal_all(database_url, "theirs") == 1
    sql(database_url, "DELETE FROM queen.tenants WHERE name = 'other' RETURNING 1")
    assert sql(database_url, "SELECT count(*) AS n FROM queen.segments") == [{"n": 0}]


# -- sealing while pushing and popping --------------------------------------------------------


@pytest.fixture
async def sealing_broker(settings: Settings) -> AsyncIterator[BrokerHandle]:
    """A broker whose housekeeping seals every few milliseconds in segments of 16 frames."""
    fast = replace_settings(settings, housekeeping_interval_ms=10, segment_max_frames=16,
                            segment_min_age_ms=0, segment_max_age_ms=30,
                            segment_cache_bytes=64 * 1024)
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(run_broker, fast)
        yield handle
        handle.shutdown()


async def test_concurrent_push_and_pop_while_the_broker_seals(
    sealing_broker: BrokerHandle, database_url: str
) -> None:
    partitions, per_pusher, pushers = ("p0", "p1"), 60, 3
    answered: dict[str, list[tuple[int, str]]] = {p: [] for p in partitions}
    done_pushing = trio.Event()
    got: dict[tuple[str, str], list[str]] = {}

    async def pusher(http: httpx.AsyncClient, n: int) -> None:
        for i in range(per_pusher):
            part = partitions[i % 2]
            (r,) = await push(http, "live", [{"pusher": n, "i": i}], partition=part)
            answered[part].append((r["offset"], r["transactionId"]))
            if i % 10 == 0:
                await trio.sleep(0.005)

    async def consumer(http: httpx.AsyncClient, group: str) -> None:
        idle = 0
        while idle < 20 or not done_pushing.is_set():
            b = await pop(http, "live", consumerGroup=group, batch=7)
            if b is None:
                idle += 1
                await trio.sleep(0.01)
                continue
            idle = 0
            got.setdefault((group, b["partition"]), []).extend(
                m["transactionId"] for m in b["messages"])
            await ack_all(http, b)

    async with httpx.AsyncClient(base_url=sealing_broker.url, timeout=10) as http:
        async with trio.open_nursery() as nursery:
            for group in ("g1", "g2"):
                nursery.start_soon(consumer, http, group)
            async with trio.open_nursery() as pushing:
                for n in range(pushers):
                    pushing.start_soon(pusher, http, n)
            done_pushing.set()
        late = await drain(http, "live", "late", batch=13)  # reads mostly from segments
        metrics = (await http.get("/metrics")).text

    # Every group sees each partition's frames exactly once, in offset order.
    expected = {p: [txn for _, txn in sorted(answered[p])] for p in partitions}
    assert [o for o, _ in sorted(answered["p0"])] == list(range(per_pusher * pushers // 2))
    for group in ("g1", "g2"):
        for part in partitions:
            assert got[(group, part)] == expected[part], (group, part)
    for part in partitions:
        assert [m["transactionId"] for m in late if m["partition"] == part] == expected[part]
    assert metric(metrics, "queen_segments_sealed_total") >= 4
    assert metric(metrics, "queen_segment_cache_hits_total") > 0
    segs = sql(database_url, "SELECT count(*) AS n, sum(frame_count) AS f FROM queen.segments")
    head = sql(database_url, "SELECT count(*) AS n FROM queen.frames")
    assert segs[0]["f"] + head[0]["n"] == per_pusher * pushers
    assert segs[0]["n"] >= 4


# -- the property: no frame lost, reordered or duplicated --------------------------------------


@pytest.fixture
def log_conn(database_url: str) -> Iterator[DictConnection]:
    with connect(database_url) as conn:
        yield conn


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(["a", "b"]), st.integers(1, 6)),
        st.tuples(st.just("pop"), st.sampled_from(["g1", "g2"]), st.integers(1, 6),
                  st.sampled_from(["ack", "fail_one", "auto"])),
        # Seal everything, or only full segments (the rest stays in the head).
        st.tuples(st.just("seal"), st.integers(1, 7), st.booleans()),
    ),
    min_size=1, max_size=30,
)


@examples(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=OPS)
def test_no_interleaving_of_push_pop_ack_and_seal_loses_reorders_or_duplicates(
    log_conn: DictConnection, ops: list[tuple]
) -> None:
    conn = log_conn
    tenant = conn.execute("SELECT tenant_id FROM queen.tenants WHERE name = 'default'"
                          ).fetchone()["tenant_id"]
    queue = f"prop-{uuid.uuid4().hex[:12]}"
    with conn.transaction():
        store.configure(conn, tenant, queue, rules.QueueOptions(retry_limit=1000))
    cache = SegmentCache(4096)  # small: segments are evicted and decoded again
    pushed: dict[str, list[tuple[str, Any]]] = {"a": [], "b": []}
    done: dict[tuple[str, str], list[str]] = {}
    failures: dict[tuple[str, str], int] = {}
    counter = 0

    def pop_once(group: str, batch: int, how: str) -> bool:
        req = rules.PopRequest(queue, None, group, batch, False, 0, how == "auto")
        with conn.transaction():
            outcome = store.pop(conn, tenant, req, cache)
        b = outcome.batch
        if b is None:
            return False
        payload_of = dict(pushed[b.partition])
        for m in b.messages:  # what comes out is what went in, with its failures counted
            assert m.payload == payload_of[m.transaction_id]
            assert m.retry_count == failures.get((group, m.transaction_id), 0)
        finished = b.messages if how != "fail_one" else b.messages[:-1]
        acks = [rules.Ack(i, m.transaction_id, b.partition_id, "completed", group, b.lease_id,
                          None) for i, m in enumerate(finished)]
        if how == "fail_one":
            last = b.messages[-1]
            acks.append(rules.Ack(len(acks), last.transaction_id, b.partition_id, "failed",
                                  group, b.lease_id, "try again"))
            failures[(group, last.transaction_id)] = failures.get(
                (group, last.transaction_id), 0) + 1
        if how != "auto":
            with conn.transaction():
                store.ack(conn, tenant, acks)
        done.setdefault((group, b.partition), []).extend(m.transaction_id for m in finished)
        return True

    for op in ops:
        if op[0] == "push":
            _, part, n = op
            frames = []
            for _ in range(n):
                counter += 1
                payload = {"n": counter, "s": "x\ty\n" * (counter % 3)}
                txn = f"t{counter}"
                frames.append(store.NewFrame(queue, part, payload, txn))
                pushed[part].append((txn, payload))
            with conn.transaction():
                store.append(conn, tenant, frames)
        elif op[0] == "pop":
            pop_once(op[1], op[2], op[3])
        else:
            policy = SealPolicy(max_frames=op[1], max_bytes=1 << 20, min_age_ms=0,
                                max_age_ms=0 if op[2] else 600_000)
            for pid in [r["partition_id"] for r in conn.execute(
                    "SELECT partition_id FROM queen.partitions p JOIN queen.queues q "
                    "USING (queue_id) WHERE q.name = %s", (queue,))]:
                while True:
                    with conn.transaction():
                        if housekeeping.seal_partition(conn, pid, policy) is None:
                            break
        # At every step, each group has completed a prefix of each partition, in order.
        for (_, part), txns in done.items():
            assert txns == [t for t, _ in pushed[part][:len(txns)]]

    for group in ("g1", "g2", "late"):
        while pop_once(group, 5, "ack"):
            pass
        for part in ("a", "b"):
            assert done.get((group, part), []) == [t for t, _ in pushed[part]], (group, part)
    # Every offset is in exactly one place: head rows and segments tile [0, next_offset).
    for row in conn.execute(
        "SELECT p.next_offset, (SELECT count(*) FROM queen.frames f "
        "WHERE f.partition_id = p.partition_id) AS head, "
        "(SELECT coalesce(sum(frame_count), 0) FROM queen.segments s "
        "WHERE s.partition_id = p.partition_id) AS sealed "
        "FROM queen.partitions p JOIN queen.queues q USING (queue_id) WHERE q.name = %s",
        (queue,),
    ):
        assert row["head"] + row["sealed"] == row["next_offset"]


# -- retention and log_start ------------------------------------------------------------------


async def test_retention_never_drops_a_segment_a_group_still_needs(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "keep", retentionSeconds=60, retainUntilConsumed=True)
    await push(http, "keep", [{"i": i} for i in range(30)])
    fast = await pop(http, "keep", consumerGroup="fast", batch=25)
    await ack_all(http, fast)  # fast committed 24
    slow = await pop(http, "keep", consumerGroup="slow", batch=8)
    await ack_all(http, slow)  # slow committed 7
    backdate(database_url, "keep")
    assert seal_all(database_url, "keep") == 6  # 0-4, 5-9, …, 25-29, all an hour old

    dropped = apply_retention(database_url, "keep")
    assert [(d.segments, d.log_start) for d in dropped] == [(1, 5)]  # only what both passed
    _, segments = where_frames_are(database_url, "keep")
    assert segments[0] == (5, 9)
    rest = await pop(http, "keep", consumerGroup="slow", batch=13)
    assert [m["data"]["i"] for m in rest["messages"]] == list(range(8, 21))
    assert rest["skipped"] is None
    await ack_all(http, rest)  # slow committed 20

    assert [(d.segments, d.log_start) for d in apply_retention(database_url, "keep")] == [(3, 20)]
    assert apply_retention(database_url, "keep") == []  # 20-24 is still needed by slow
    detail = (await http.get(f"{API}/resources/queues/keep")).json()
    assert detail["options"]["retainUntilConsumed"] is True
    assert detail["partitions"][0]["logStart"] == 20
    assert detail["partitions"][0]["storage"]["segments"] == 2


def cut_head(url: str, queue: str) -> list[housekeeping.Dropped]:
    out = []
    with connect(url) as conn:
        for pid in partition_ids(url, queue):
            with conn.transaction():
                dropped = housekeeping.cut_head(conn, pid)
            if dropped is not None:
                out.append(dropped)
    return out


def stored_bytes(url: str) -> int:
    """The default tenant's stored bytes, folded or not."""
    row = sql(url, "SELECT coalesce((SELECT sum(bytes) FROM queen.usage_deltas), 0) "
                   "+ coalesce((SELECT sum(stored_bytes) FROM queen.tenant_usage), 0) AS b")
    return int(row[0]["b"])


async def test_retention_cuts_the_head_once_no_segment_is_left_before_it(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "mixed", retentionSeconds=60)
    await push(http, "mixed", [{"i": i} for i in range(12)])
    backdate(database_url, "mixed", below_offset=10)
    assert seal_all(database_url, "mixed", FULL_ONLY) == 2  # 0-4, 5-9; 10-11 stay in the head
    backdate(database_url, "mixed")  # the head is past retention too
    # Segments still retained before the head: the head is not cut around them.
    assert cut_head(database_url, "mixed") == []
    assert where_frames_are(database_url, "mixed") == (2, [(0, 4), (5, 9)])

    assert [(d.segments, d.log_start) for d in apply_retention(database_url, "mixed")] == \
        [(2, 10)]
    assert [(d.segments, d.frames, d.log_start) for d in cut_head(database_url, "mixed")] == \
        [(0, 2, 12)]
    assert where_frames_are(database_url, "mixed") == (0, [])
    assert stored_bytes(database_url) == 0  # every byte pushed was given back
    assert await pop(http, "mixed", batch=10) is None


async def test_the_head_cut_stops_at_the_first_frame_retention_keeps(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "young", retentionSeconds=60)
    await push(http, "young", [{"i": i} for i in range(10)])
    backdate(database_url, "young", below_offset=6)
    assert [(d.frames, d.log_start) for d in cut_head(database_url, "young")] == [(6, 6)]
    assert cut_head(database_url, "young") == []
    got = await pop(http, "young", batch=10)
    assert [m["data"]["i"] for m in got["messages"]] == [6, 7, 8, 9]

    # retainUntilConsumed: only what every group committed.
    await configure(http, "needed", retentionSeconds=60, retainUntilConsumed=True)
    await push(http, "needed", [{"i": i} for i in range(10)])
    await ack_all(http, await pop(http, "needed", consumerGroup="g", batch=3))  # committed 2
    leased = await pop(http, "needed", consumerGroup="h", batch=1)  # h: nothing committed yet
    backdate(database_url, "needed")
    assert cut_head(database_url, "needed") == []
    await ack_all(http, leased)  # h committed 0
    assert [(d.frames, d.log_start) for d in cut_head(database_url, "needed")] == [(1, 1)]


async def test_without_groups_retain_until_consumed_drops_nothing(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "unread", retentionSeconds=1, retainUntilConsumed=True)
    await push(http, "unread", [1, 2, 3])
    backdate(database_url, "unread")
    seal_all(database_url, "unread")
    assert apply_retention(database_url, "unread") == []


async def test_a_group_behind_log_start_resumes_there_and_the_skip_is_reported(
    http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "old", retentionSeconds=60)
    await push(http, "old", [{"i": i} for i in range(20)])
    first = await pop(http, "old", consumerGroup="g", batch=3)
    await ack_all(http, first)  # g committed 2
    backdate(database_url, "old", below_offset=10)
    assert seal_all(database_url, "old") == 4
    assert [(d.segments, d.frames, d.log_start) for d in apply_retention(database_url, "old")] \
        == [(2, 10, 10)]

    resumed = await pop(http, "old", consumerGroup="g", batch=4)
    assert [m["offset"] for m in resumed["messages"]] == [10, 11, 12, 13]
    assert resumed["skipped"] == {"fromOffset": 3, "toOffset": 9, "count": 7}
    await ack_all(http, resumed)
    later = await pop(http, "old", consumerGroup="g", batch=4)
    assert later["skipped"] is None  # reported once
    newcomer = await pop(http, "old", consumerGroup="new", batch=1)
    assert newcomer["messages"][0]["offset"] == 10 and newcomer["skipped"] is None
    metrics = (await http.get("/metrics")).text
    assert metric(metrics, "queen_messages_skipped_total") == 7
    listing = (await http.get(f"{API}/resources/queues")).json()["queues"]
    assert [q["messages"]["total"] for q in listing if q["name"] == "old"] == [10]


# -- storage accounting and the gate ----------------------------------------------------------


def recount(url: str) -> int:
    """The default tenant's stored bytes, counted the slow way from every table."""
    return sql(url, """
        SELECT (SELECT coalesce(sum(size_bytes), 0) FROM queen.frames WHERE tenant_id = t.id)
             + (SELECT coalesce(sum(stored_bytes), 0) FROM queen.segments WHERE tenant_id = t.id)
             + (SELECT coalesce(sum(payload_bytes), 0) FROM queen.timers WHERE tenant_id = t.id)
             + (SELECT coalesce(sum(size_bytes), 0) FROM queen.dead_letters
                WHERE tenant_id = t.id)
             + (SELECT coalesce(sum(size_bytes), 0) FROM queen.kv WHERE tenant_id = t.id)
               AS bytes
        FROM (SELECT tenant_id AS id FROM queen.tenants WHERE name = 'default') t""")[0]["bytes"]


async def test_the_storage_gate_trips_and_clears_on_real_bytes(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    directory = broker.context.tenants

    async def usage() -> int:
        await directory.refresh()  # fold the deltas now rather than within the second
        return directory.plan(directory.default_tenant_id).stored_bytes

    event = {"type": "order.created", "customer": "acme", "items": ["sku-1"] * 60}
    with connect(database_url) as conn:
        tenant_store.set_plan(conn, "default", max_stored_bytes=40_000, set_stored=True)
    await configure(http, "gate", retentionSeconds=60)
    for _ in range(5):
        await push(http, "gate", [event] * 20)
    r = await http.put(f"{API}/kv/ns/k", json={"value": {"v": 1}, "forever": True})
    assert r.status_code == 200, r.text
    raw = await usage()
    assert raw == recount(database_url) > 40_000
    r = await http.post(f"{API}/push", json={"items": [{"queue": "gate", "payload": event}]})
    assert (r.status_code, r.json()["error"]) == (403, "storage_full")

    # Sealing replaces raw bytes by compressed ones: the same messages now fit under the gate.
    backdate(database_url, "gate")
    seal_all(database_url, "gate", replace(EAGER, max_frames=1000))
    sealed = await usage()
    assert sealed == recount(database_url) < 40_000 < raw
    await push(http, "gate", [event])

    # Retention gives the segment's bytes back.
    backdate(database_url, "gate")  # past retentionSeconds once sealed
    seal_all(database_url, "gate", replace(EAGER, max_frames=1000))
    assert sum(d.segments for d in apply_retention(database_url, "gate")) == 2
    assert await usage() == recount(database_url)
    assert sql(database_url, "SELECT count(*) AS n FROM queen.segments") == [{"n": 0}]
    detail = (await http.get(f"{API}/resources/queues/gate")).json()
    assert detail["partitions"][0]["logStart"] == 101


# -- resource details -------------------------------------------------------------------------


async def test_queue_detail_shows_head_segments_bytes_and_log_start(
    http: httpx.AsyncClient, database_url: str
) -> None:
    event = {"type": "page.viewed", "path": "/pricing", "ua": "Mozilla/5.0 (X11; Linux)"}
    await push(http, "shown", [event] * 12)
    await push(http, "shown", [event] * 3, partition="side")
    seal_all(database_url, "shown", FULL_ONLY)
    detail = (await http.get(f"{API}/resources/queues/shown")).json()
    by_name = {p["name"]: p for p in detail["partitions"]}
    size = len('{"ua":"Mozilla/5.0 (X11; Linux)","path":"/pricing","type":"page.viewed"}')
    default = by_name["Default"]
    assert default["logStart"] == 0 and default["nextOffset"] == 12
    storage = default["storage"]
    assert (storage["headFrames"], storage["headBytes"]) == (2, 2 * size)
    assert (storage["segments"], storage["segmentFrames"]) == (2, 10)
    assert storage["rawBytes"] == 10 * size
    assert 0 < storage["compressedBytes"] < storage["rawBytes"]
    side = by_name["side"]["storage"]
    assert (side["headFrames"], side["segments"]) == (3, 0)  # not a full segment yet
    assert (detail["storage"]["segments"], detail["storage"]["headFrames"]) == (2, 5)


# -- the service's own thresholds ---------------------------------------------------------------


async def test_young_frames_stay_in_the_head_and_quiet_partitions_seal(
    database_url: str, http: httpx.AsyncClient, broker: BrokerHandle
) -> None:
    await push(http, "quiet", [1, 2, 3])
    keeper = housekeeping.Housekeeper(broker.context.db, SealPolicy(
        max_frames=100, max_bytes=1 << 20, min_age_ms=60_000, max_age_ms=120_000))
    assert (await keeper.run_once()).sealed == []  # too young, and not a full segment
    backdate(database_url, "quiet")  # an hour old: past max_age, the partition is quiet
    sealed = (await keeper.run_once()).sealed
    assert [(s.first_offset, s.last_offset) for s in sealed] == [(0, 2)]
    await push(http, "quiet", list(range(100)))
    full = housekeeping.Housekeeper(broker.context.db, SealPolicy(
        max_frames=40, max_bytes=1 << 20, min_age_ms=0, max_age_ms=120_000))
    sealed = (await full.run_once()).sealed  # full segments go; the young rest waits
    assert [(s.first_offset, s.last_offset) for s in sealed] == [(3, 42), (43, 82)]
    by_bytes = housekeeping.Housekeeper(broker.context.db, SealPolicy(
        max_frames=1000, max_bytes=20, min_age_ms=0, max_age_ms=120_000))
    sealed = (await by_bytes.run_once()).sealed  # 2-byte payloads: ten to a segment
    assert [s.frames for s in sealed] == [10, 10]


def replace(policy: SealPolicy, **changes: Any) -> SealPolicy:
    import dataclasses

    return dataclasses.replace(policy, **changes)


async def test_one_housekeeping_round_seals_then_applies_retention(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str
) -> None:
    await configure(http, "expiring", retentionSeconds=60)
    await push(http, "expiring", [{"i": i} for i in range(12)])
    backdate(database_url, "expiring")  # an hour old: past max_age and past retention
    keeper = housekeeping.Housekeeper(broker.context.db, EAGER, metrics=broker.context.metrics)
    done = await keeper.run_once()
    assert [(s.first_offset, s.last_offset) for s in done.sealed] == [(0, 4), (5, 9), (10, 11)]
    assert [(d.segments, d.frames, d.log_start) for d in done.dropped] == [(3, 12, 12)]
    assert keeper.statistics().segments_dropped_total == 3
    metrics = (await http.get("/metrics")).text
    assert metric(metrics, "queen_segments_sealed_total") == 3
    assert metric(metrics, "queen_segment_frames_dropped_total") == 12
    assert await pop(http, "expiring") is None
    detail = (await http.get(f"{API}/resources/queues/expiring")).json()
    assert (detail["partitions"][0]["logStart"], detail["partitions"][0]["messages"]) == (12, 0)
