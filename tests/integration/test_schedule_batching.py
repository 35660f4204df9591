"""Concurrent single-timer PUTs share statements (queen_trio/timers/batcher.py): what a client
sees must be what it would see if every PUT had gone alone."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import trio

from queen_trio.server import BrokerHandle

from ..timer_ops import timer_op
from .test_tenancy import auth_broker, client, tokens  # noqa: F401 - fixtures
from .test_timers import TIMERS, settings, sql  # noqa: F401 - fixture

CLIENTS = 48


async def put_all(http: httpx.AsyncClient, requests: list[tuple[str, str, Any]]
                  ) -> list[httpx.Response]:
    answers: list[httpx.Response | None] = [None] * len(requests)

    async def one(i: int, queue: str, key: str, payload: Any) -> None:
        answers[i] = await http.put(f"{TIMERS}/{queue}/{key}",
                                    json={"delayMs": 60_000, "payload": payload})

    async with trio.open_nursery() as nursery:
        for i, (queue, key, payload) in enumerate(requests):
            nursery.start_soon(one, i, queue, key, payload)
    return [a for a in answers if a is not None]


async def test_concurrent_puts_share_statements_and_each_gets_its_own_answer(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str,
) -> None:
    limits = httpx.Limits(max_connections=CLIENTS)
    # The first statement is held behind a lock on the table for a while, so the PUTs are
    # really concurrent at the broker: one client process's requests otherwise arrive about as
    # fast as a lone statement is answered (once that got faster, most went alone).
    with psycopg.connect(database_url, autocommit=True) as locker:
        async with httpx.AsyncClient(base_url=broker.url, timeout=30, limits=limits) as many, \
                trio.open_nursery() as nursery:
            locker.execute("BEGIN; LOCK TABLE queen.timers IN SHARE MODE")

            async def release_later() -> None:
                await trio.sleep(2.0)
                locker.execute("COMMIT")

            nursery.start_soon(release_later)
            answers = await put_all(many, [("batched", f"k{i}", {"i": i}) for i in range(240)])
    assert [a.status_code for a in answers] == [200] * 240
    bodies = [a.json() for a in answers]
    assert [(b["status"], b["timerKey"]) for b in bodies] == [
        ("scheduled", f"k{i}") for i in range(240)]
    assert len({b["txn"] for b in bodies}) == 240
    rows = sql(database_url, "SELECT timer_key, txn, convert_from(payload, 'UTF8') AS p "
                             "FROM queen.timers WHERE queue = 'batched'")
    assert {r["timer_key"]: (r["txn"], r["p"]) for r in rows} == {
        b["timerKey"]: (b["txn"], f'{{"i":{int(b["timerKey"][1:])}}}') for b in bodies}
    batcher = broker.context.schedules
    # They were sent together: far fewer statements than timers.
    assert batcher.scheduled >= 240 and batcher.batches < 200, (batcher.batches, batcher.scheduled)


async def test_the_same_key_from_many_clients_at_once_is_one_timer_scheduled_once(
    broker: BrokerHandle, database_url: str,
) -> None:
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=broker.url, timeout=10, limits=limits) as many:
        answers = await put_all(many, [("same", "one-key", {"n": i}) for i in range(CLIENTS)])
    statuses = sorted(a.json()["status"] for a in answers)
    assert statuses == ["rescheduled"] * (CLIENTS - 1) + ["scheduled"]
    (row,) = sql(database_url, "SELECT txn, convert_from(payload, 'UTF8') AS p "
                               "FROM queen.timers WHERE queue = 'same'")
    # The timer that stands is one PUT's whole: its txn and the payload that PUT sent.
    sent = {a.json()["txn"]: i for i, a in enumerate(answers)}
    assert row["p"] == f'{{"n":{sent[row["txn"]]}}}'


async def test_one_failing_timer_does_not_fail_the_timers_batched_with_it(
    broker: BrokerHandle, database_url: str,
) -> None:
    # A real failure inside PostgreSQL for one key only: a trigger refuses it.
    sql(database_url, """
        CREATE FUNCTION pg_temp_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.timer_key = 'poison' THEN RAISE EXCEPTION 'refused by the test'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON queen.timers
            FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse();
    """)
    requests: list[tuple[str, str, Any]] = [("mixed", f"ok{i}", i) for i in range(30)]
    requests.insert(15, ("mixed", "poison", "x"))
    limits = httpx.Limits(max_connections=len(requests))
    async with httpx.AsyncClient(base_url=broker.url, timeout=10, limits=limits) as many:
        answers = await put_all(many, requests)
    by_key = {r.request.url.path.rsplit("/", 1)[1]: r for r in answers}
    assert by_key.pop("poison").status_code == 500
    assert {k: r.status_code for k, r in by_key.items()} == {f"ok{i}": 200 for i in range(30)}
    keys = {r["timer_key"] for r in sql(database_url,
                                        "SELECT timer_key FROM queen.timers WHERE queue = 'mixed'")}
    assert keys == {f"ok{i}" for i in range(30)}


async def test_concurrent_batches_share_statements_and_a_failing_one_fails_alone(
    broker: BrokerHandle, database_url: str,
) -> None:
    """POST /api/v1/timers batches ride the same statements (queen_trio/timers/batcher.py):
    each is answered its own results in its own order, and one that PostgreSQL refuses fails
    whole (nothing of it written) without failing the batches it shared a statement with."""
    sql(database_url, """
        CREATE FUNCTION pg_temp_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.timer_key = 'b7-poison' THEN RAISE EXCEPTION 'refused by the test'; END IF;
            -- Each row takes a few ms, so a statement is still running when the next batches
            -- arrive (a fast statement left each batch alone, on a quick broker, in CI once).
            PERFORM pg_sleep(0.003);
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON queen.timers
            FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse();
    """)
    batches = [[f"b{b}-{i}" for i in range(10)] for b in range(40)]
    batches[7][4] = "b7-poison"
    answers: dict[int, httpx.Response] = {}

    async def post(b: int, keys: list[str]) -> None:
        answers[b] = await many.post(TIMERS, json=[timer_op("batched", k, 60_000, {"k": k})
                                                   for k in reversed(keys)])

    batcher = broker.context.schedules
    before, scheduled_before, retried_before = batcher.batches, batcher.scheduled, batcher.retried
    limits = httpx.Limits(max_connections=len(batches))
    async with httpx.AsyncClient(base_url=broker.url, timeout=10, limits=limits) as many:
        async with trio.open_nursery() as nursery:
            for b, keys in enumerate(batches):
                nursery.start_soon(post, b, keys)
    assert answers.pop(7).status_code == 500
    for b, r in answers.items():
        assert r.status_code == 200, r.text
        assert [t["timerKey"] for t in r.json()["results"]] == list(reversed(batches[b]))
    stored = {r["timer_key"] for r in sql(database_url, "SELECT timer_key FROM queen.timers")}
    assert stored == {k for b, keys in enumerate(batches) if b != 7 for k in keys}
    # They went through the batcher, in fewer statements than batches. The failed statement's
    # batches were each sent again alone: not counted, since how many shared the poisoned
    # statement is up to timing (with most of them in it, retries alone made 40).
    assert batcher.scheduled - scheduled_before == 390
    retried = batcher.retried - retried_before
    shared = batcher.batches - before - retried
    assert shared < len(batches), (batcher.batches - before, retried)


async def test_two_tenants_scheduling_one_name_at_once_get_a_timer_each(
    auth_broker: BrokerHandle, tokens: dict[str, str], database_url: str,  # noqa: F811
) -> None:
    """A shared batch never mixes tenants: the same queue and key from alpha and beta,
    interleaved, make two timers, each tenant's own."""
    clients = {t: client(auth_broker, tokens[t]) for t in ("A", "B")}
    answers: list[tuple[str, int, httpx.Response]] = []

    async def put(t: str, i: int) -> None:
        r = await clients[t].put(f"{TIMERS}/shared/same-key",
                                 json={"delayMs": 60_000, "payload": {"tenant": t, "i": i}})
        answers.append((t, i, r))

    async with clients["A"], clients["B"], trio.open_nursery() as nursery:
        for i in range(20):
            for t in ("A", "B"):
                nursery.start_soon(put, t, i)
    assert all(r.status_code == 200 for _, _, r in answers)
    for t in ("A", "B"):
        statuses = sorted(r.json()["status"] for tt, _, r in answers if tt == t)
        assert statuses == ["rescheduled"] * 19 + ["scheduled"], (t, statuses)
    rows = sql(database_url, """
        SELECT tn.name, convert_from(t.payload, 'UTF8')::jsonb->>'tenant' AS sent_by
        FROM queen.timers t JOIN queen.tenants tn USING (tenant_id)
        WHERE t.queue = 'shared' AND t.timer_key = 'same-key' ORDER BY 1""")
    assert [(r["name"], r["sent_by"]) for r in rows] == [("alpha", "A"), ("beta", "B")]


async def test_large_batches_each_go_alone_and_are_answered_in_full(
    broker: BrokerHandle, database_url: str,
) -> None:
    """A batch of batcher.ALONE (64) timers or more is its own statement, sent at once:
    concurrent 100-op batches are never merged into one statement (each would then wait for
    all the others' timers to be written), and each is answered its own results."""
    size, count = 100, 8
    answers: dict[int, httpx.Response] = {}

    async def post(b: int) -> None:
        answers[b] = await many.post(TIMERS, json={"operations": [
            timer_op("alone", f"a{b}-{i}", 60_000, {"i": i}) for i in range(size)]})

    batcher = broker.context.schedules
    before, scheduled_before = batcher.batches, batcher.scheduled
    async with httpx.AsyncClient(base_url=broker.url, timeout=30,
                                 limits=httpx.Limits(max_connections=count)) as many:
        async with trio.open_nursery() as nursery:
            for b in range(count):
                nursery.start_soon(post, b)
    for b, r in answers.items():
        assert r.status_code == 200, r.text
        assert [t["timerKey"] for t in r.json()["results"]] == [f"a{b}-{i}" for i in range(size)]
        assert {t["status"] for t in r.json()["results"]} == {"scheduled"}
    (row,) = sql(database_url, "SELECT count(*) AS n FROM queen.timers WHERE queue = 'alone'")
    assert row["n"] == size * count
    assert batcher.scheduled - scheduled_before == size * count
    assert batcher.batches - before == count  # one statement each, none merged


async def test_a_lone_schedule_is_written_at_once_from_its_own_task(
    broker: BrokerHandle, database_url: str,
) -> None:
    """Issue 32: no waiting in a single schedule beyond its commit. With nothing else being
    written, a schedule does not wait for a writer task to take it: a batcher whose writers
    never started still answers it."""
    from queen_trio.timers.batcher import ScheduleBatcher
    from queen_trio.timers.rules import Schedule

    (tenant,) = sql(database_url, "SELECT tenant_id FROM queen.tenants WHERE name = 'default'")
    idle = ScheduleBatcher(broker.context.db, notify_within_ms=0)  # (its run() never started)
    with trio.fail_after(30):
        outcome = await idle.schedule(tenant["tenant_id"], Schedule(
            queue="lone", key="k", delay_ms=60_000, payload={"v": 1}, partition="Default",
            txn=None))
    assert (outcome.status, idle.batches) == ("scheduled", 1)
    assert sql(database_url, "SELECT timer_key FROM queen.timers WHERE queue = 'lone'") == [
        {"timer_key": "k"}]
