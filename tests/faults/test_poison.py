"""Poison rows against real broker processes: rows no background service can process must
never stop the broker.

Timers are planted straight into queen.timers, bypassing the API (which may refuse such payloads
at its edge): payloads PostgreSQL's jsonb refuses although Python's json accepts them (NaN,
Infinity, a \\u0000 escape), bytes that are not UTF-8, a zstd blob that cannot be decompressed.
Each spends its attempts and ends in the dead letters, every other timer fires exactly once, and
the broker answers /health all along, including one started on such a row (the restart that used
to crash again). A failure nobody foresaw (a trigger raising its own SQLSTATE for one timer, for
one partition's segment) is permanent for that row or partition only.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import zstandard

from ..brokers import BrokerProcess, running_brokers
from ..timer_ops import timer_op
from .harness import asql, log_by_txn, poll_until
from .traffic import schedule_burst

API = "/api/v1"
pytestmark = pytest.mark.slow

MAX_ATTEMPTS = 2
ENV = {"QUEEN_SWEEPER_MAX_ATTEMPTS": str(MAX_ATTEMPTS), "QUEEN_SWEEPER_BACKOFF_MS": "50",
       "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}


def _zstd(text: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(text)


# name: (the stored payload, payload_zstd). The compressed ones that Python's json accepts reach
# PostgreSQL only in the broker's own fire (queen.fire_claimed_timers); the plain ones already in
# the sweep statement's.
POISON: dict[str, tuple[bytes, bool]] = {
    "nan": (b"NaN", False),
    "infinity": (b"Infinity", False),
    "minus-infinity": (b'{"amount":-Infinity}', False),
    "nul-escape": (b'"a\\u0000b"', False),
    "not-utf8": (b'"\xff\xfe"', False),
    "corrupt-zstd": (b"\x28\xb5\x2f\xfd not really zstd", True),
    "nan-zstd": (_zstd(b'{"amount":NaN,"padding":"' + b"abcdefgh" * 16 + b'"}'), True),
    "nul-zstd": (_zstd(b'{"note":"\\u0000","padding":"' + b"abcdefgh" * 16 + b'"}'), True),
}

PLANT = """
INSERT INTO queen.timers (tenant_id, queue, timer_key, partition, txn, payload, payload_zstd,
                          payload_bytes, deliver_at, visible_at, attempts, claim_token,
                          claimed_by)
SELECT tenant_id, %(queue)s, %(key)s, 'Default', %(txn)s, %(payload)s, %(zstd)s, %(bytes)s,
       now() + make_interval(secs => %(delay_s)s), now() + make_interval(secs => %(delay_s)s),
       0, %(claim)s, CASE WHEN %(claim)s::uuid IS NULL THEN NULL ELSE 'a broker that died' END
FROM queen.tenants WHERE name = 'default'
"""


async def plant(url: str, queue: str, key: str, payload: bytes, zstd: bool, *,
                delay_s: float = 0.0, claimed_by_the_dead: bool = False) -> str:
    """Insert a timer row as it would sit in the table; answers its txn."""
    txn = f"poison-{key}"
    await asql(url, PLANT, {
        "queue": queue, "key": key, "txn": txn, "payload": payload, "zstd": zstd,
        "bytes": len(payload), "delay_s": delay_s,
        # A broker that claimed the row and died before firing it: its claim has expired.
        "claim": "00000000-0000-4000-8000-000000000000" if claimed_by_the_dead else None,
    })
    return txn


async def dead_letters(url: str) -> dict[str, dict[str, Any]]:
    rows = await asql(url, "SELECT transaction_id, consumer_group, retry_count, error, "
                           "payload::text AS payload FROM queen.dead_letters")
    return {r["transaction_id"]: r for r in rows}


async def metric(broker: BrokerProcess, sample: str) -> float:
    """One sample of the broker's /metrics, labels included in ``sample``."""
    async with httpx.AsyncClient(timeout=5) as http:
        r = await http.get(f"{broker.url}/metrics")
    r.raise_for_status()
    for line in r.text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not found on {broker.name}'s /metrics")


class HealthWatch:
    """Asks /health every 50 ms while a test runs; every answer that is not 200 is kept."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.checks = 0
        self.failures: list[str] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with httpx.AsyncClient(base_url=self.broker.url, timeout=5) as http:
            task_status.started()
            while True:
                try:
                    r = await http.get("/health")
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.checks += 1
                await trio.sleep(0.05)

    def assert_up(self) -> None:
        assert_alive(self.broker)
        assert self.checks > 0 and not self.failures, (
            f"{len(self.failures)} of {self.checks} health checks failed, e.g. "
            f"{self.failures[:3]}; stderr:\n{self.broker.stderr()}")


@pytest.fixture
async def watched(database_url: str, nursery: trio.Nursery
                  ) -> AsyncIterator[tuple[BrokerProcess, HealthWatch]]:
    async with running_brokers(database_url, 1, env=ENV) as (broker,):
        watch = HealthWatch(broker)
        await nursery.start(watch.run)
        yield broker, watch


def assert_alive(broker: BrokerProcess) -> None:
    assert broker.alive, (f"the broker exited with code {broker.returncode}; "
                          f"stderr:\n{broker.stderr()}")


async def drained(url: str, broker: BrokerProcess, within: float) -> None:
    """Wait until no timer is left; fail at once if the broker exits meanwhile."""
    async def empty() -> bool:
        assert_alive(broker)
        return not await asql(url, "SELECT 1 FROM queen.timers LIMIT 1")
    await poll_until(empty, within, every=0.1)


async def still_serving(broker: BrokerProcess, queue: str) -> None:
    """A timer scheduled now fires, and its message is popped: the broker keeps serving."""
    async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
        r = await http.put(f"{API}/timers/{queue}/after", json={"delayMs": 0, "payload": 1})
        assert r.status_code == 200, r.text
        with trio.fail_after(15):
            while True:
                r = await http.get(f"{API}/pop/queue/{queue}",
                                   params={"wait": "true", "timeout": 1000, "autoAck": "true"})
                assert r.status_code in (200, 204), r.text
                if r.status_code == 200:
                    break
    assert [m["data"] for m in r.json()["messages"]] == [1]


# -- poison payloads --------------------------------------------------------------------------


async def test_poison_rows_are_dead_lettered_and_every_other_timer_fires_once(
    database_url: str, watched: tuple[BrokerProcess, HealthWatch],
) -> None:
    broker, watch = watched
    # Ordinary timers due with the poison, in the same queue: some fired by PostgreSQL in the
    # sweep, some (compressed) by the broker.
    ordinary = (await schedule_burst(broker, "mixed", 30, 400, "postgres")
                | await schedule_burst(broker, "mixedz", 30, 400, "broker"))
    poison = {await plant(database_url, "mixed" if not zstd else "mixedz", name, payload, zstd,
                          delay_s=0.4)
              for name, (payload, zstd) in POISON.items()}
    planted_at = trio.current_time()
    # And more ordinary ones due after the poison has begun to fail.
    ordinary |= await schedule_burst(broker, "later", 20, 1500, "postgres")

    await drained(database_url, broker, within=30)
    print(f"\n{len(POISON)} poison rows, {len(ordinary)} other timers: none left "
          f"{trio.current_time() - planted_at:.2f} s after planting; {watch.checks} health "
          f"checks, {len(watch.failures)} failed")

    watch.assert_up()
    fired = await log_by_txn(database_url)
    assert fired == {txn: 1 for txn in ordinary}, "each ordinary timer fires exactly once"
    dead = await dead_letters(database_url)
    assert set(dead) == poison
    for name, (payload, _) in POISON.items():
        letter = dead[f"poison-{name}"]
        assert (letter["consumer_group"], letter["retry_count"]) == ("__timer__", MAX_ATTEMPTS)
        assert letter["error"], name
        # What the dead letter holds in place of a payload jsonb cannot hold.
        assert json.loads(letter["payload"])["undecodablePayloadBytes"] == len(payload), name
    assert "SQLSTATE 22P02" in dead["poison-nan"]["error"]  # PostgreSQL was the judge
    assert "payloadPreview" in json.loads(dead["poison-nan"]["payload"])
    assert await metric(broker, "queen_timers_dead_lettered_total") == len(POISON)
    await still_serving(broker, "after")
    watch.assert_up()


async def test_a_broker_started_on_a_poison_row_survives_it(database_url: str) -> None:
    """The restart case: a poison row left claimed (0 attempts) by a broker that crashed on it,
    and another not yet claimed, both due before this broker starts."""
    poison = {await plant(database_url, "boot", "left-claimed", b"NaN", False,
                          delay_s=-5, claimed_by_the_dead=True),
              await plant(database_url, "boot", "unclaimed", b'"\\u0000"', False, delay_s=-5)}
    async with running_brokers(database_url, 1,
                               env={**ENV, "QUEEN_SWEEPER_MAX_ATTEMPTS": "1"}) as (broker,):
        assert broker.started_at is not None
        watch = HealthWatch(broker)
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)
            await drained(database_url, broker, within=20)
            print(f"\nstarted on 2 poison rows: both dead-lettered "
                  f"{time.monotonic() - broker.started_at:.2f} s after the process started")
            await still_serving(broker, "boot")
            watch.assert_up()
            nursery.cancel_scope.cancel()
    assert set(await dead_letters(database_url)) == poison


# -- failures nobody foresaw --------------------------------------------------------------------


CURSE_TIMER = """
CREATE FUNCTION public.curse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.meta -> 'timer' ->> 'key' LIKE 'cursed%' THEN
        RAISE EXCEPTION 'this timer is cursed' USING ERRCODE = 'QX001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cursed BEFORE INSERT ON queen.frames FOR EACH ROW EXECUTE FUNCTION public.curse();
"""


async def test_a_failure_nobody_foresaw_is_permanent_for_its_row_only(
    database_url: str, watched: tuple[BrokerProcess, HealthWatch],
) -> None:
    broker, watch = watched
    await asql(database_url, CURSE_TIMER)
    async with httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
        timers = [timer_op(queue, key, 300,
                           {"key": key, "padding": "abcdefgh" * 16 if queue == "z" else ""},
                           txn=f"{queue}-{key}")
                  for queue in ("plain", "z") for key in ("a", "cursed", "b", "c")]
        r = await http.post(f"{API}/transaction", json={"timers": timers})
        assert r.status_code == 200, r.text

    await drained(database_url, broker, within=30)

    watch.assert_up()
    assert await log_by_txn(database_url) == {f"{q}-{k}": 1 for q in ("plain", "z")
                                               for k in ("a", "b", "c")}
    dead = await dead_letters(database_url)
    assert set(dead) == {"plain-cursed", "z-cursed"}
    for letter in dead.values():
        assert letter["retry_count"] == MAX_ATTEMPTS
        assert "this timer is cursed" in letter["error"] and "QX001" in letter["error"]
        assert json.loads(letter["payload"])["padding"] is not None  # the payload itself
    # Logged at ERROR and counted: nobody foresaw it.
    assert await metric(
        broker, 'queen_background_errors_total{service="sweeper"}') >= 2
    assert "this timer is cursed" in broker.stderr(limit=200_000)


CURSE_SEGMENT = """
CREATE FUNCTION public.curse_segment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.partition_id IN (SELECT p.partition_id FROM queen.partitions p
                            JOIN queen.queues q USING (queue_id) WHERE q.name = 'stuck') THEN
        RAISE EXCEPTION 'this partition cannot be sealed' USING ERRCODE = 'QX002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cursed BEFORE INSERT ON queen.segments
    FOR EACH ROW EXECUTE FUNCTION public.curse_segment();
"""
SEALED = """
SELECT q.name, count(s.*) AS segments FROM queen.queues q
JOIN queen.partitions p USING (queue_id)
LEFT JOIN queen.segments s ON s.partition_id = p.partition_id
WHERE q.name IN ('stuck', 'fine', 'fine2') GROUP BY q.name
"""


async def test_housekeeping_goes_on_past_a_partition_it_cannot_seal(database_url: str) -> None:
    env = {"QUEEN_HOUSEKEEPING_INTERVAL_MS": "100", "QUEEN_SEGMENT_MIN_AGE_MS": "0",
           "QUEEN_SEGMENT_MAX_AGE_MS": "0"}
    await asql(database_url, CURSE_SEGMENT)
    async with running_brokers(database_url, 1, env=env) as (broker,):
        watch = HealthWatch(broker)
        async with trio.open_nursery() as nursery, \
                httpx.AsyncClient(base_url=broker.url, timeout=10) as http:
            await nursery.start(watch.run)
            for queue in ("stuck", "fine", "fine2"):
                r = await http.post(f"{API}/push", json={
                    "items": [{"queue": queue, "payload": i} for i in range(5)]})
                assert r.status_code == 201, r.text

            async def sealed() -> dict[str, int]:
                assert_alive(broker)
                return {r["name"]: r["segments"] for r in await asql(database_url, SEALED)}

            # The others are sealed although the first partition in line fails every round.
            await poll_until(lambda: _all_but_stuck_sealed(sealed), within=15, every=0.1)
            assert (await sealed())["stuck"] == 0
            assert await metric(
                broker, 'queen_background_errors_total{service="housekeeping"}') >= 1
            # Once the partition can be sealed again, it is, after its back-off.
            await asql(database_url, "DROP TRIGGER cursed ON queen.segments")
            await poll_until(lambda: _sealed(sealed, "stuck"), within=15, every=0.1)
            watch.assert_up()
            assert "this partition cannot be sealed" in broker.stderr(limit=200_000)
            nursery.cancel_scope.cancel()


async def _all_but_stuck_sealed(sealed: Any) -> bool:
    s = await sealed()
    return s.get("fine", 0) > 0 and s.get("fine2", 0) > 0


async def _sealed(sealed: Any, queue: str) -> bool:
    return (await sealed()).get(queue, 0) > 0
