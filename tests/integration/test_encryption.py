"""At-rest encryption: a queue configured with ``encryptionEnabled`` stores its
payloads sealed (AES-256-GCM under QUEEN_ENCRYPTION_KEY) in every table that holds them, and
every read a client makes opens them. Driven through Queen's own client where it has the call.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import zstandard

from queen_trio.config import Settings, load_settings
from queen_trio.errors import ConfigError
from queen_trio.server import BrokerHandle, run_broker

from ..conftest import replace_settings
from .test_queen_mq import _quiet_signals, name, run  # noqa: F401 (_quiet_signals: a fixture)
from .test_segments import seal_all
from .test_timers_queen_wire import pop_until, sql

API = "/api/v1"
KEY = "11" * 32
NEW_KEY = "22" * 32
SECRET = "plaintext-marker-4f1c"  # in every payload; must never be found in a table


def _key(text: str) -> bytes:
    return bytes.fromhex(text)


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=500,
                    encryption_key=_key(KEY))


async def start(nursery: trio.Nursery, settings: Settings) -> BrokerHandle:
    handle: BrokerHandle = await nursery.start(run_broker, settings)
    return handle


def stored_texts(url: str, queue: str) -> list[str]:
    """Every place a payload of ``queue`` rests, as text: head frames, sealed segments
    (decompressed), dead letters, pending timers (decompressed when zstd)."""
    out = [r["t"] for r in sql(url, (
        "SELECT f.payload::text AS t FROM queen.frames f JOIN queen.partitions p "
        "USING (partition_id) JOIN queen.queues q USING (queue_id) WHERE q.name = %s"), (queue,))]
    for r in sql(url, (
            "SELECT s.data FROM queen.segments s JOIN queen.partitions p USING (partition_id) "
            "JOIN queen.queues q USING (queue_id) WHERE q.name = %s"), (queue,)):
        out.append(zstandard.ZstdDecompressor().decompressobj().decompress(bytes(r["data"]))
                   .decode())
    out += [r["t"] for r in sql(
        url, "SELECT d.payload::text AS t FROM queen.dead_letters d JOIN queen.queues q "
             "USING (queue_id) WHERE q.name = %s", (queue,))]
    for r in sql(url, "SELECT payload, payload_zstd FROM queen.timers WHERE queue = %s",
                 (queue,)):
        blob = bytes(r["payload"])
        if r["payload_zstd"]:
            blob = zstandard.ZstdDecompressor().decompressobj().decompress(blob)
        out.append(blob.decode())
    return out


def assert_only_ciphertext(url: str, queue: str, at_least: int) -> None:
    texts = stored_texts(url, queue)
    assert len(texts) >= at_least
    for text in texts:
        assert SECRET not in text
        assert '"authTag"' in text and '"keyId"' in text


# -- start-up and configure --------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "zz" * 32, "11" * 31, "11" * 33])
def test_a_bad_key_is_refused_naming_the_setting_and_not_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"QUEEN_ENCRYPTION_KEY": value})
    assert caught.value.variable == "QUEEN_ENCRYPTION_KEY"
    assert value not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_settings({"QUEEN_ENCRYPTION_KEY": KEY, "QUEEN_ENCRYPTION_OLD_KEYS": f"{KEY},{value}"})
    assert caught.value.variable == "QUEEN_ENCRYPTION_OLD_KEYS"


def test_settings_read_the_keys_and_keep_them_out_of_repr() -> None:
    s = load_settings({"QUEEN_ENCRYPTION_KEY": KEY.upper(),
                       "QUEEN_ENCRYPTION_OLD_KEYS": f" {NEW_KEY} ,"})
    assert (s.encryption_key, s.encryption_old_keys) == (_key(KEY), (_key(NEW_KEY),))
    assert KEY not in repr(s).lower() and NEW_KEY not in repr(s)


def test_serve_refuses_a_bad_key_in_one_line(database_url: str) -> None:
    env = {**os.environ, "QUEEN_DATABASE_URL": database_url, "QUEEN_PORT": "0",
           "QUEEN_ENCRYPTION_KEY": "not-a-key"}
    done = subprocess.run([sys.executable, "-m", "queen_trio", "serve"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "QUEEN_ENCRYPTION_KEY" in lines[0], done.stderr
    assert "not-a-key" not in done.stderr


async def test_configure_with_encryption_needs_a_key(settings: Settings) -> None:
    async with trio.open_nursery() as nursery:
        keyless = await start(nursery, replace_settings(settings, encryption_key=None))
        async with httpx.AsyncClient(base_url=keyless.url) as http:
            r = await http.post(f"{API}/configure", json={
                "queue": "sealed", "options": {"encryptionEnabled": True}})
            assert r.status_code == 400, r.text
            assert r.json()["error"] == "encryption_key_missing"
            assert "QUEEN_ENCRYPTION_KEY" in r.json()["message"]
        keyless.shutdown()


# -- round trips through queen-mq, and what the tables hold -------------------------------------


async def test_queen_mq_round_trip_stores_only_ciphertext(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()
    payloads = [{"n": i, "secret": SECRET} for i in range(3)]

    async def flow(c: Any) -> tuple[Any, list[Any]]:
        created = await c.queue(q).config({"encryption_enabled": True}).create()
        await c.queue(q).push([{"data": p} for p in payloads])
        return created, await c.queue(q).batch(3).wait(False).pop()

    created, messages = await run(broker, flow)
    assert created["options"]["encryptionEnabled"] is True
    assert [m["data"] for m in messages] == payloads
    assert_only_ciphertext(database_url, q, at_least=3)

    # Sealed into a segment: still ciphertext, and a new group reads it back opened.
    assert seal_all(database_url, q) >= 1
    assert sql(database_url, "SELECT count(*) AS n FROM queen.frames f JOIN queen.partitions p "
                             "USING (partition_id) JOIN queen.queues q USING (queue_id) "
                             "WHERE q.name = %s", (q,)) == [{"n": 0}]
    assert_only_ciphertext(database_url, q, at_least=1)

    async def again(c: Any) -> list[Any]:
        return await c.queue(q).group("g2").batch(3).wait(False).pop()

    assert [m["data"] for m in await run(broker, again)] == payloads


async def test_a_16_mib_message_round_trips_sealed(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()
    big = {"secret": SECRET, "blob": "y" * (16 * 1024 * 1024 - 64)}  # 16 MiB of JSON

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).config({"encryption_enabled": True}).create()
        await c.queue(q).push([{"data": big}])
        return await c.queue(q).batch(1).wait(False).pop()

    (m,) = await run(broker, flow)
    assert m["data"] == big
    assert_only_ciphertext(database_url, q, at_least=1)


async def test_dead_letters_stay_sealed_and_read_opened(
    http: httpx.AsyncClient, database_url: str
) -> None:
    r = await http.post(f"{API}/configure", json={"queue": "dl", "options": {
        "encryptionEnabled": True, "retryLimit": 0}})
    assert r.status_code == 200, r.text
    assert r.json()["options"]["encryptionEnabled"] is True
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "dl", "payload": {"secret": SECRET}}]})
    assert r.status_code == 201, r.text
    m = (await http.get(f"{API}/pop/queue/dl")).json()["messages"][0]
    r = await http.post(f"{API}/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"],
        "leaseId": m["leaseId"], "status": "failed", "error": "boom"})
    assert r.status_code == 200, r.text
    dlq = (await http.get(f"{API}/dlq", params={"queue": "dl"})).json()["messages"]
    assert [d["data"] for d in dlq] == [{"secret": SECRET}]
    assert_only_ciphertext(database_url, "dl", at_least=2)  # the frame and its dead letter
    # A replay stays sealed (never sealed twice) and pops opened.
    r = await http.post(f"{API}/dlq/{dlq[0]['id']}/replay")
    assert r.status_code == 200, r.text
    again = (await http.get(f"{API}/pop/queue/dl")).json()["messages"]
    assert [x["data"] for x in again] == [{"secret": SECRET}]
    assert_only_ciphertext(database_url, "dl", at_least=3)
    # The message read route opens it too, and says it is stored encrypted.
    r = await http.get(f"{API}/messages/{again[0]['partitionId']}/{again[0]['transactionId']}")
    assert r.status_code == 200, r.text
    assert (r.json()["data"], r.json()["isEncrypted"]) == ({"secret": SECRET}, True)


async def test_timers_of_an_encrypted_queue_are_stored_sealed(
    broker: BrokerHandle, database_url: str
) -> None:
    q = name()
    big = {"secret": SECRET, "pad": "z" * 4000}  # large enough to be stored zstd'd if plain

    async def schedule(c: Any) -> tuple[Any, Any]:
        await c.queue(q).config({"encryption_enabled": True}).create()
        await c.timers.schedule(q, "later", big, delay_ms=600_000)
        await c.timers.schedule(q, "soon", {"secret": SECRET, "n": 1}, delay_ms=1500)
        return await c.timers.peek(q, "later"), await c.timers.peek(q, "soon")

    later, soon = await run(broker, schedule)
    assert_only_ciphertext(database_url, q, at_least=2)
    # Peek opens what the fire will deliver, and says it is stored encrypted.
    assert (later["encrypted"], later["data"]) == (True, big)
    assert base64.b64decode(soon["payload"]) == b'{"secret":"%s","n":1}' % SECRET.encode()

    async def fired(c: Any) -> list[Any]:
        return await pop_until(c, q)

    (m,) = await run(broker, fired)
    assert m["data"] == {"secret": SECRET, "n": 1}
    assert_only_ciphertext(database_url, q, at_least=2)  # the fired frame and "later"


async def test_a_broker_without_the_key_stores_nothing_for_an_encrypted_queue(
    broker: BrokerHandle, settings: Settings, database_url: str
) -> None:
    async with httpx.AsyncClient(base_url=broker.url) as http:
        r = await http.post(f"{API}/configure", json={
            "queue": "sealed", "options": {"encryptionEnabled": True}})
        assert r.status_code == 200, r.text
    async with trio.open_nursery() as nursery:
        keyless = await start(nursery, replace_settings(settings, encryption_key=None))
        async with httpx.AsyncClient(base_url=keyless.url) as http:
            r = await http.post(f"{API}/push", json={"items": [
                {"queue": "sealed", "payload": {"secret": SECRET}}]})
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "encryption_unavailable"
        keyless.shutdown()
    assert stored_texts(database_url, "sealed") == []


# -- key rotation -------------------------------------------------------------------------------


@pytest.fixture
async def rotated(settings: Settings) -> AsyncIterator[tuple[BrokerHandle, BrokerHandle]]:
    """The broker of before (KEY) and the one of after (NEW_KEY current, KEY only opens)."""
    async with trio.open_nursery() as nursery:
        before = await start(nursery, settings)
        after = await start(nursery, replace_settings(
            settings, encryption_key=_key(NEW_KEY), encryption_old_keys=(_key(KEY),)))
        yield before, after
        before.shutdown()
        after.shutdown()


async def test_key_rotation_reads_old_payloads_and_seals_new_ones_under_the_new_key(
    rotated: tuple[BrokerHandle, BrokerHandle], settings: Settings, database_url: str
) -> None:
    before, after = rotated
    async with httpx.AsyncClient(base_url=before.url) as http:
        await http.post(f"{API}/configure", json={
            "queue": "rot", "options": {"encryptionEnabled": True}})
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "rot", "payload": {"secret": SECRET, "n": 1}}]})
        assert r.status_code == 201, r.text
    async with httpx.AsyncClient(base_url=after.url) as http:
        r = await http.post(f"{API}/push", json={"items": [
            {"queue": "rot", "payload": {"secret": SECRET, "n": 2}}]})
        assert r.status_code == 201, r.text
        got = (await http.get(f"{API}/pop/queue/rot", params={"batch": 2})).json()["messages"]
        assert [m["data"] for m in got] == [{"secret": SECRET, "n": 1}, {"secret": SECRET, "n": 2}]
    key_ids = [r["k"] for r in sql(database_url, (
        "SELECT f.payload->>'keyId' AS k FROM queen.frames f JOIN queen.partitions p "
        "USING (partition_id) JOIN queen.queues q USING (queue_id) WHERE q.name = 'rot' "
        "ORDER BY f.\"offset\""))]
    assert len(set(key_ids)) == 2  # one per key: which key sealed each payload is on record


async def test_a_transaction_seals_its_pushes_and_timers(
    http: httpx.AsyncClient, database_url: str
) -> None:
    r = await http.post(f"{API}/configure", json={
        "queue": "txq", "options": {"encryptionEnabled": True}})
    assert r.status_code == 200, r.text
    payload = base64.b64encode(b'{"secret":"%s"}' % SECRET.encode()).decode()
    r = await http.post(f"{API}/transaction", json={
        "operations": [{"type": "push", "items": [{"queue": "txq", "payload": {"s": SECRET}}]}],
        "timers": [{"op": "schedule", "queue": "txq", "timerKey": "k", "payload": payload,
                    "delayMs": 600_000, "txn": "tx-timer-1"}],
    })
    assert r.status_code == 200, r.text
    assert_only_ciphertext(database_url, "txq", at_least=2)  # the frame and the timer row
    got = (await http.get(f"{API}/pop/queue/txq")).json()["messages"]
    assert [m["data"] for m in got] == [{"s": SECRET}]
