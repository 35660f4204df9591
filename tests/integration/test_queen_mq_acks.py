"""Acks as offset commits, through Queen's own Python client (``queen-mq`` 2.6.0), unchanged,
against a live broker and its PostgreSQL: what a Queen 2 user relies on when acking.

- acking a message commits the group's cursor up to it (what came before is done too);
- a nack (``failed``, ``retry``) in the same call as later completions clamps the cursor:
  the nacked message and everything after it come back;
- a nack at or below the committed offset is refused ("already committed"), a completion
  there is a success flagged ``noop``;
- ``/ack/batch`` under a stale lease answers 200 with per-item results, each refused;
- a lease extension answers ``renewed``; extending a released lease is not a success;
- acking a transaction the broker does not know is refused as Queen refuses it
  ("unresolvable").

(The flows mirror queen-mq's own tests test_ack_commit.py and test_ack_window.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import trio

from queen_trio.server import BrokerHandle

from .test_queen_mq import _quiet_signals, name, run  # noqa: F401 (its autouse fixture)

pytest.importorskip("queen")

API = "/api/v1"
# Leases that must outlive a few requests on a loaded machine, and expire within a test.
LEASE_S = 3


async def push_numbered(c: Any, q: str, count: int) -> None:
    await c.queue(q).partition("Default").push(
        [{"data": {"n": n}, "transactionId": f"{q}-tx-{n}"} for n in range(1, count + 1)])


async def pop_all(c: Any, q: str, batch: int, group: str | None = None) -> list[Any]:
    builder = c.queue(q).batch(batch).wait(False)
    return await (builder.group(group) if group else builder).pop()


def txns(q: str, msgs: list[Any]) -> list[str]:
    return sorted(m["transactionId"] for m in msgs)


async def dlq_count(c: Any, q: str) -> int:
    res = await c.queue(q).dlq().limit(50).get()
    return len(res.get("messages") or []) if res else 0


async def test_acking_a_message_commits_everything_handed_out_before_it(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> list[Any]:
        await c.queue(q).config({"lease_time": LEASE_S}).create()
        await push_numbered(c, q, 5)
        msgs = await pop_all(c, q, 5)
        assert len(msgs) == 5
        mid = await c.ack(msgs[2])  # only the third: an offset commit up to it
        assert (mid["success"], mid["noop"], mid["leaseReleased"]) == (True, False, False)
        # The lease expires: only what is past the commit comes back.
        await asyncio.sleep(LEASE_S + 0.5)
        return await pop_all(c, q, 10)

    again = await run(broker, flow)
    assert txns(q, again) == [f"{q}-tx-4", f"{q}-tx-5"]


@pytest.mark.parametrize("nack", ["failed", "retry"])
async def test_a_nack_clamps_the_cursor_below_later_completions(
    broker: BrokerHandle, nack: str,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[list[Any], int]:
        await c.queue(q).config({"lease_time": 30}).create()
        await push_numbered(c, q, 5)
        msgs = await pop_all(c, q, 5)
        assert len(msgs) == 5
        for m in msgs:  # one call: #2 nacked, every other completed
            m["_status"] = "completed"
        msgs[1]["_status"], msgs[1]["_error"] = nack, "poison"
        res = await c.ack(msgs)
        assert res["success"] is True and all(r["leaseReleased"] for r in res["results"])
        # The lease is released at once: #2 and everything after it come back now.
        return await pop_all(c, q, 10), await dlq_count(c, q)

    again, dead = await run(broker, flow)
    assert txns(q, again) == [f"{q}-tx-{n}" for n in range(2, 6)]
    assert [m["retryCount"] for m in sorted(again, key=lambda m: m["offset"])] == (
        [1, 0, 0, 0] if nack == "failed" else [0, 0, 0, 0])  # retry spends no budget
    assert dead == 0


async def test_below_the_cursor_a_nack_is_refused_and_an_ack_is_a_noop(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> dict[str, Any]:
        await c.queue(q).config({"lease_time": 30}).create()
        await push_numbered(c, q, 3)
        msgs = await pop_all(c, q, 3)
        mid = await c.ack(msgs[1])  # commits #1 and #2; the lease stays (it holds #3)
        assert mid["success"] is True and mid["leaseReleased"] is False
        return {
            "late_nack": await c.ack(msgs[0], False, {"error": "too late"}),
            "late_ack": await c.ack(msgs[0]),
            "fresh": await c.ack(msgs[2]),
            "batch": await c.ack([msgs[0], msgs[1]], False),
        }

    got = await run(broker, flow)
    late_nack = got["late_nack"]
    assert late_nack["success"] is False and "committed" in late_nack["error"].lower()
    assert (got["late_ack"]["success"], got["late_ack"]["noop"]) == (True, True)
    assert (got["fresh"]["success"], got["fresh"]["noop"]) == (True, False)
    assert got["fresh"]["leaseReleased"] is True
    # In a batch, each refused nack says so.
    assert [r["code"] for r in got["batch"]["results"]] == ["already_committed"] * 2


async def test_a_nack_below_the_cursor_changes_nothing(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> tuple[list[Any], int]:
        await c.queue(q).config({"lease_time": LEASE_S, "retry_limit": 0}).create()
        await push_numbered(c, q, 2)
        msgs = await pop_all(c, q, 2)
        await c.ack(msgs[1])  # everything committed, the lease released
        late = await c.ack(msgs[0], "dlq", {"error": "too late"})
        assert late["success"] is False
        await asyncio.sleep(LEASE_S + 0.5)
        return await pop_all(c, q, 10), await dlq_count(c, q)

    assert await run(broker, flow) == ([], 0)  # no redelivery, no dead letter


async def test_a_batch_ack_under_a_stale_lease_answers_per_item_results(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
        await c.queue(q).config({"lease_time": LEASE_S}).create()
        await push_numbered(c, q, 2)
        first = await pop_all(c, q, 2)
        # The lease expires; another consumer takes the messages.
        await asyncio.sleep(LEASE_S + 0.5)
        second = await pop_all(c, q, 2)
        assert txns(q, second) == txns(q, first) and second[0]["leaseId"] != first[0]["leaseId"]
        stale = await c.ack(first)
        fresh = await c.ack(second)
        return stale, fresh, await pop_all(c, q, 2)

    stale, fresh, left = await run(broker, flow)
    # 200 with a verdict per item (queen-mq reads "results" only from a 200 array).
    assert stale["success"] is False
    assert stale["error"] == "2 of 2 acknowledgments rejected: invalid or expired lease"
    assert [(r["success"], r["code"]) for r in stale["results"]] == [(False, "lease_lost")] * 2
    assert fresh["success"] is True and left == []


async def test_a_stale_lease_ack_is_a_200_on_the_wire(broker: BrokerHandle) -> None:
    """The same, as raw HTTP: 200 (not 409), and nothing of the stale batch is committed."""
    async with httpx.AsyncClient(base_url=broker.url) as http:
        await http.post(f"{API}/configure", json={"queue": "stale",
                                                  "options": {"leaseTime": LEASE_S}})
        await http.post(f"{API}/push", json={"items": [
            {"queue": "stale", "payload": n} for n in (1, 2)]})
        first = (await http.get(f"{API}/pop/queue/stale", params={"batch": 2})).json()
        await trio.sleep(LEASE_S + 0.5)
        second = (await http.get(f"{API}/pop/queue/stale", params={"batch": 1})).json()
        r = await http.post(f"{API}/ack/batch", json={"acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
             "leaseId": first["leaseId"]} for m in first["messages"]]})
        assert r.status_code == 200
        assert [v["code"] for v in r.json()] == ["lease_lost", "lease_lost"]
        # The second consumer's lease and its message are untouched.
        ok = await http.post(f"{API}/ack", json={
            "transactionId": second["messages"][0]["transactionId"],
            "partitionId": second["partitionId"], "leaseId": second["leaseId"]})
        assert (ok.json()[0]["success"], ok.json()[0]["noop"]) == (True, False)


async def test_renew_answers_renewed_and_a_released_lease_is_not_renewed(
    broker: BrokerHandle,
) -> None:
    q = name()

    async def flow(c: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        await c.queue(q).config({"lease_time": 30}).create()
        await push_numbered(c, q, 1)
        (msg,) = await pop_all(c, q, 1)
        live = await c.renew(msg)
        await c.ack(msg)  # releases the lease
        released = await c.renew(msg)
        unknown = await c.renew("00000000-0000-0000-0000-000000000000")
        return live, released, unknown

    live, released, unknown = await run(broker, flow)
    assert (live["success"], live["renewed"]) == (True, 1) and live["newExpiresAt"]
    assert (released["success"], released["renewed"], released["newExpiresAt"]) == (
        False, 0, None)
    assert released["error"]
    assert (unknown["success"], unknown["renewed"]) == (False, 0)


async def test_acking_an_unknown_transaction_is_unresolvable(broker: BrokerHandle) -> None:
    q = name()

    async def flow(c: Any) -> tuple[Any, Any, Any, Any]:
        await c.queue(q).config({"lease_time": 30}).create()
        await push_numbered(c, q, 3)
        msgs = await pop_all(c, q, 3)
        ghost = {"transactionId": f"{q}-ghost", "partitionId": msgs[0]["partitionId"],
                 "leaseId": msgs[0]["leaseId"]}
        return (await c.ack(dict(ghost)), await c.ack(dict(ghost), False, {"error": "x"}),
                await c.ack([dict(ghost)]), await c.ack(msgs))

    single, nack, batch, real = await run(broker, flow)
    for refused in (single, nack):
        assert refused["success"] is False and "unresolv" in refused["error"].lower()
    assert [(r["success"], r["code"]) for r in batch["results"]] == [(False, "unresolvable")]
    assert real["success"] is True  # the refusals left the lease and the batch alone


async def test_each_abandons_the_batch_after_a_nack(broker: BrokerHandle) -> None:
    """queen-mq's each() stops the popped batch at a nack (its lease is released): every
    other message is handled exactly once, and the poison reaches the dead letters after
    its retry budget (retryLimit 1: delivered twice)."""
    q = name()

    async def flow(c: Any) -> tuple[dict[str, int], int]:
        await c.queue(q).config({"lease_time": 30, "retry_limit": 1}).create()
        await push_numbered(c, q, 5)
        seen: dict[str, int] = {}

        async def handler(msg: Any) -> None:
            seen[msg["transactionId"]] = seen.get(msg["transactionId"], 0) + 1
            if msg["data"]["n"] == 2:
                raise RuntimeError("poison")

        await c.queue(q).batch(5).wait(False).idle_millis(1500).each().consume(handler)
        return seen, await dlq_count(c, q)

    seen, dead = await run(broker, flow)
    assert seen == {f"{q}-tx-1": 1, f"{q}-tx-2": 2, f"{q}-tx-3": 1, f"{q}-tx-4": 1,
                    f"{q}-tx-5": 1}
    assert dead == 1


async def test_a_nack_in_a_multi_partition_pop_releases_only_its_partition(
    broker: BrokerHandle,
) -> None:
    """queen-mq's each() after a nack skips only the rest of that message's partition: the
    nack released that partition alone, and the other partition's messages are still held by
    this consumer and handled now (not after the lease runs out)."""
    q = name()

    async def flow(c: Any) -> dict[str, int]:
        await c.queue(q).config({"lease_time": 30, "retry_limit": 3}).create()
        await c.queue(q).partition("a").push([{"data": {"n": n}, "transactionId": f"a{n}"}
                                              for n in (1, 2)])
        await c.queue(q).partition("b").push([{"data": {"n": 1}, "transactionId": "b1"}])
        seen: dict[str, int] = {}

        async def handler(msg: Any) -> None:
            txn = msg["transactionId"]
            seen[txn] = seen.get(txn, 0) + 1
            if txn == "a1" and seen[txn] == 1:
                raise RuntimeError("first try fails")

        await (c.queue(q).partitions(2).batch(3).wait(False).idle_millis(1500).each()
               .consume(handler))
        return seen

    assert await run(broker, flow) == {"a1": 2, "a2": 1, "b1": 1}
