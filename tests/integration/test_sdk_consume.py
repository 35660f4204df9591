"""The consume loop against a real broker: acks, handler failures, leases kept and lost."""

from __future__ import annotations

import functools
import math
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel

from queen_trio.client import BadRequest, Client, Message
from queen_trio.client.consumer import DEFAULT_BATCH
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk import pop_one

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures


async def test_a_failing_handler_is_retried_then_completed(queen: Client) -> None:
    await queen.configure("work", retry_limit=3)
    await queen.push_many("work", [{"n": 0}, {"n": 1}, {"n": 2}])
    seen: list[tuple[int, int]] = []

    async def handler(message: Message) -> None:
        seen.append((message.data["n"], message.retry_count))
        if message.data["n"] == 1 and message.retry_count == 0:
            raise RuntimeError("flaky")

    stats = await queen.consume("work", handler, max_messages=4)
    assert seen == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert (stats.handled, stats.completed, stats.failed, stats.ack_errors) == (4, 3, 1, 0)
    assert len(await queen.pop("work")) == 0


async def test_a_handler_that_always_fails_ends_in_the_dead_letters(queen: Client) -> None:
    await queen.configure("doomed", retry_limit=1)
    await queen.push("doomed", {"poison": True})

    def handler(message: Message) -> None:  # plain functions are handlers too
        raise ValueError("cannot parse")

    # Two deliveries (retry_limit=1), then the dead letters. (An idle timeout to end the loop
    # was a race: a retry that took longer than it to come back ended the loop after one.)
    stats = await queen.consume("doomed", handler, max_messages=2, idle_timeout="20s",
                                poll="100ms")
    assert (stats.handled, stats.failed, stats.completed) == (2, 2, 0)
    [letter] = [d async for d in queen.dlq.list("doomed")]
    assert letter.data == {"poison": True}
    assert letter.error == "ValueError: cannot parse"
    assert len(await queen.pop("doomed")) == 0  # not delivered a third time


async def test_the_lease_is_renewed_while_a_slow_handler_runs(queen: Client) -> None:
    await queen.configure("slow", lease_time=1)
    await queen.push("slow", "patience")
    meanwhile: list[int] = []

    async def handler(message: Message) -> None:
        await trio.sleep(1.6)  # well past the 1 s lease
        meanwhile.append(len(await queen.pop("slow")))  # nobody else can take it
        await trio.sleep(0.5)

    stats = await queen.consume("slow", handler, max_messages=1)
    assert meanwhile == [0]
    assert (stats.completed, stats.ack_errors, stats.leases_lost) == (1, 0, 0)
    assert len(await queen.pop("slow")) == 0


async def test_without_renewal_an_expired_lease_hands_the_message_over(queen: Client) -> None:
    await queen.configure("expiring", lease_time=1)
    await queen.push("expiring", "contested")
    stolen: list[Message] = []

    async def handler(message: Message) -> None:
        await trio.sleep(1.3)
        stolen.extend(await queen.pop("expiring"))  # a second consumer, under a new lease

    # One worker: the loop's others would be consumers of the expired lease too.
    stats = await queen.consume("expiring", handler, max_messages=1, renew_leases=False,
                                concurrency=1)
    assert [m.data for m in stolen] == ["contested"]
    # The loop's ack is refused (its lease is gone); that is counted, not raised.
    assert (stats.handled, stats.completed, stats.ack_errors) == (1, 0, 1)
    assert (await queen.ack(stolen[0])).lease_released


async def test_a_crashed_consumers_message_comes_back_after_its_lease(queen: Client) -> None:
    await queen.configure("orphans", lease_time=1)
    await queen.push("orphans", "left behind")
    abandoned = await pop_one(queen, "orphans")  # popped and never acked
    got: list[Message] = []
    started = trio.current_time()
    stats = await queen.consume("orphans", got.append, max_messages=1)
    assert trio.current_time() - started > 0.5
    assert got[0].transaction_id == abandoned.transaction_id
    assert got[0].lease_id != abandoned.lease_id and stats.completed == 1


async def test_concurrent_workers_take_different_partitions(queen: Client) -> None:
    for p in ("p1", "p2"):
        await queen.push_many("parallel", [f"{p}-a", f"{p}-b"], partition=p)
    in_flight, peak, handled = 0, 0, []

    async def handler(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(0.2)
        handled.append(message.data)
        in_flight -= 1

    stats = await queen.consume("parallel", handler, concurrency=2, max_messages=4)
    assert peak == 2 and stats.completed == 4
    assert sorted(handled) == ["p1-a", "p1-b", "p2-a", "p2-b"]


async def test_a_handler_may_settle_its_message_in_a_transaction(queen: Client) -> None:
    await queen.push("settling", {"order": 9})
    await queen.push("settling", {"order": 10})

    async def handler(message: Message) -> None:
        order = message.data["order"]
        if order == 9:  # settles it with its state write, atomically
            await (queen.transaction().ack(message)
                   .kv.put("orders", str(order), "done", forever=True).commit())
        else:
            await queen.kv.put("orders", str(order), "done", forever=True)

    stats = await queen.consume("settling", handler, max_messages=2)
    assert (stats.settled_by_handler, stats.completed, stats.ack_errors) == (1, 1, 0)
    assert [(await queen.kv.get("orders", k)).value for k in ("9", "10")] == ["done", "done"]
    assert len(await queen.pop("settling")) == 0


async def test_an_api_error_on_pop_ends_the_loop(queen: Client) -> None:
    with pytest.raises(BadRequest) as bad:
        await queen.consume("not a queue name", lambda m: None, max_messages=1)
    assert bad.value.code == "invalid_queue"


async def test_idle_timeout_stops_an_idle_loop(queen: Client) -> None:
    started = trio.current_time()
    stats = await queen.consume("quiet", lambda m: None, idle_timeout="300ms",
                                concurrency=3)
    assert 0.25 < trio.current_time() - started < 2
    assert stats.handled == 0


async def test_consume_rejects_bad_arguments_before_popping(queen: Client) -> None:
    for options in ({"concurrency": 0}, {"batch": 0}, {"poll": "0s"}, {"max_messages": 0},
                    {"idle_timeout": "soon"}):
        kwargs: dict[str, Any] = {"max_messages": 1, **options}
        with pytest.raises(ValueError):
            await queen.consume("q", lambda m: None, **kwargs)


async def test_stopping_leaves_no_abandoned_poll_behind(queen: Client) -> None:
    await queen.push("after-stop", "first", partition="a")
    stats = await queen.consume("after-stop", lambda m: None, concurrency=3, max_messages=1,
                                poll="300ms")
    assert stats.handled == 1
    # Pushed the moment the loop returned: no poll of that loop can still be waiting on the
    # broker to lease it away from us.
    await queen.push("after-stop", "second", partition="b")
    got = await queen.pop("after-stop", wait="1s")
    assert [m.data for m in got] == ["second"]


async def test_a_batch_arriving_after_the_stop_is_given_back_whole(queen: Client) -> None:
    from queen_trio.client.consumer import _Loop, _Worker

    await queen.push_many("give-back", [1, 2, 3])
    batch = await queen.pop("give-back", batch=3)
    loop = _Loop(queen, "give-back", lambda m: None, group=None, batch=3, partition=None,
                 max_messages=None, idle_s=None, poll_s=1, renew=True)
    worker = _Worker(loop)
    worker.give_back(batch)
    await worker.settle_now()
    assert (loop.stats.ack_errors, loop.stats.requests) == (0, 1)
    again = await queen.pop("give-back", batch=3)
    assert [(m.data, m.retry_count) for m in again] == [(1, 0), (2, 0), (3, 0)]


# -- the consumer path: settlements in batches, one request per batch ---------------------------


def _http_requests(broker: BrokerHandle, method: str, route: str) -> float:
    """Requests the broker answered on a route (its own Prometheus counter)."""
    total = 0.0
    for metric in broker.context.metrics.registry.collect():
        for s in metric.samples:
            if (s.name == "queen_http_requests_total" and s.labels["method"] == method
                    and s.labels["route"] == route):
                total += s.value
    return total


def _acks_applied(broker: BrokerHandle) -> dict[str, float]:
    return {s.labels["status"]: s.value
            for metric in broker.context.metrics.registry.collect()
            for s in metric.samples if s.name == "queen_acks_total"}


POP_ROUTE = "/api/v1/pop/queue/<queue>"


async def test_consume_settles_every_message_once_in_one_request_per_batch(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.push_many("bulk", [{"n": n} for n in range(1000)])
    before = {m: _http_requests(broker, m, POP_ROUTE) for m in ("GET", "POST")}
    acks_before = _acks_applied(broker).get("completed", 0)
    acks_routes_before = (_http_requests(broker, "POST", "/api/v1/ack")
                          + _http_requests(broker, "POST", "/api/v1/ack/batch"))
    handled: list[int] = []
    # The HTTP pop loop (what a broker without streams gets; the stream: test_stream.py).
    stats = await queen.consume("bulk", lambda m: handled.append(m.data["n"]),
                                max_messages=1000, stream=False)
    assert handled == list(range(1000))  # one partition: in order, each once
    assert (stats.handled, stats.completed, stats.ack_errors) == (1000, 1000, 0)
    # Every message acked exactly once, by the broker's own count ...
    assert _acks_applied(broker)["completed"] - acks_before == 1000
    # ... with settlements riding the pops: no request per message (1,000 messages take
    # 1,000 / the default batch pops, plus the final settlement and polls that find nothing).
    posts = _http_requests(broker, "POST", POP_ROUTE) - before["POST"]
    acks_routes = (_http_requests(broker, "POST", "/api/v1/ack")
                   + _http_requests(broker, "POST", "/api/v1/ack/batch")) - acks_routes_before
    assert _http_requests(broker, "GET", POP_ROUTE) == before["GET"]
    batches = math.ceil(1000 / DEFAULT_BATCH)
    assert batches <= posts + acks_routes <= batches + 6 and acks_routes <= 1, (
        posts, acks_routes)
    assert stats.requests == posts + acks_routes
    assert len(await queen.pop("bulk")) == 0


async def test_a_failure_mid_batch_keeps_the_partition_in_order(queen: Client) -> None:
    await queen.configure("ordered-retry", retry_limit=2)
    await queen.push_many("ordered-retry", list(range(6)))
    seen: list[tuple[int, int]] = []

    def handler(message: Message) -> None:
        seen.append((message.data, message.retry_count))
        if message.data == 2 and message.retry_count < 2:
            raise RuntimeError("not yet")

    stats = await queen.consume("ordered-retry", handler, max_messages=8)
    # 3..5 were handed back untouched (no retry spent) and come after 2's redeliveries.
    assert seen == [(0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 0), (4, 0), (5, 0)]
    assert (stats.completed, stats.failed, stats.ack_errors) == (6, 2, 0)
    assert len(await queen.pop("ordered-retry")) == 0


async def test_poison_message_mid_batch_is_dead_lettered_and_the_rest_handled(
    queen: Client
) -> None:
    await queen.configure("poison-mid", retry_limit=1)
    await queen.push_many("poison-mid", ["ok-1", "poison", "ok-2"])
    seen: list[str] = []

    def handler(message: Message) -> None:
        seen.append(message.data)
        if message.data == "poison":
            raise ValueError("cannot parse")

    stats = await queen.consume("poison-mid", handler, max_messages=4)
    assert seen == ["ok-1", "poison", "poison", "ok-2"]
    assert (stats.completed, stats.failed) == (2, 2)
    [letter] = [d async for d in queen.dlq.list("poison-mid")]
    assert (letter.data, letter.error) == ("poison", "ValueError: cannot parse")
    assert len(await queen.pop("poison-mid")) == 0


async def test_cancelling_mid_batch_redelivers_only_unfinished_messages(queen: Client) -> None:
    await queen.push_many("crash", list(range(10)))
    finished: list[int] = []

    with trio.CancelScope() as scope:
        async def handler(message: Message) -> None:
            if message.data == 5:
                scope.cancel()  # the consumer dies while handling 5
                await trio.sleep(1)
            finished.append(message.data)

        await queen.consume("crash", handler)
    assert finished == [0, 1, 2, 3, 4]
    # At once, not after the lease: 0-4 were settled on the way out, 5-9 given back.
    again = await queen.pop("crash", batch=100)
    assert [(m.data, m.retry_count) for m in again] == [(n, 0) for n in range(5, 10)]


async def test_two_consumers_of_one_group_never_handle_a_message_twice(queen: Client) -> None:
    for p in range(6):
        await queen.push_many("shared", [f"{p}:{n}" for n in range(200)], partition=f"p{p}")
    handled: list[tuple[int, str]] = []

    started = {1: trio.Event(), 2: trio.Event()}

    def recorder(who: int) -> Any:
        async def handler(message: Message) -> None:
            handled.append((who, message.data))
            started[who].set()
            # Both take part, however slowly the other one starts on a loaded machine: the
            # first handler waits for the other's first message (each holds at most
            # DEFAULT_CONCURRENCY = 4 of the 6 partitions, so the other finds one free).
            with trio.fail_after(30):
                await started[3 - who].wait()
            await trio.lowlevel.checkpoint()  # let the other consumer in
        return handler

    async with trio.open_nursery() as nursery:
        for who in (1, 2):
            nursery.start_soon(functools.partial(queen.consume, "shared", recorder(who),
                                                 group="workers", idle_timeout="500ms"))
    data = [d for _, d in handled]
    assert len(data) == len(set(data)) == 1200
    assert {who for who, _ in handled} == {1, 2}  # both took part
    for p in range(6):  # each partition in order
        assert [int(d.split(":")[1]) for d in data if d.startswith(f"{p}:")] == list(range(200))


async def test_one_consume_serves_every_partition_in_parallel_each_in_order(
    queen: Client
) -> None:
    for n in range(20):
        for p in ("a", "b", "c", "d"):
            await queen.push("fan", {"p": p, "n": n}, partition=p)
    in_flight, peak = 0, 0
    order: dict[str, list[int]] = {}
    all_four = trio.Event()

    async def handler(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if peak == 4:
            all_four.set()
        order.setdefault(message.data["p"], []).append(message.data["n"])
        if message.data["n"] == 0:
            # Each partition's first handler waits for the others: four at once is then a
            # fact of the consumer, not of how fast a loaded machine schedules 5-ms sleeps.
            with trio.move_on_after(10):
                await all_four.wait()
        await trio.sleep(0.005)
        in_flight -= 1

    stats = await queen.consume("fan", handler, max_messages=80)
    assert stats.completed == 80
    assert order == {p: list(range(20)) for p in "abcd"}
    assert peak == 4  # the default concurrency: all four partitions at once


async def test_settle_and_pop_reports_refused_acks_and_still_pops(
    queen: Client, broker: BrokerHandle
) -> None:
    import httpx

    await queen.configure("refused", lease_time=1)
    await queen.push("refused", "first")
    first = await pop_one(queen, "refused")
    await trio.sleep(1.2)  # its lease expires ...
    again = await pop_one(queen, "refused")  # ... and another consumer has it
    async with httpx.AsyncClient(base_url=broker.url) as http:
        entry = {"transactionId": first.transaction_id, "partitionId": first.partition_id,
                 "leaseId": first.lease_id, "status": "completed"}
        r = await http.post("/api/v1/pop/queue/refused", params={"batch": 5},
                            json={"acknowledgments": [entry]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["acks"]["count"], body["acks"]["refused"]) == (1, 1)
        assert [(v["success"], v["code"]) for v in body["ackRefused"]] == [(False, "lease_lost")]
        assert body["messages"] == [] and body["partition"] is None  # leased to the other
        # The other consumer settles through the same route (partition and lease said once
        # at the top) and gets nothing more.
        r = await http.post("/api/v1/pop/queue/refused/partition/Default",
                            json={"partitionId": again.partition_id,
                                  "leaseId": again.lease_id,
                                  "acknowledgments": [{"transactionId": again.transaction_id}]})
        assert r.json()["acks"] == {"count": 1, "completed": 1, "failed": 0, "retry": 0,
                                    "dlq": 0, "alreadyAcked": 0, "refused": 0,
                                    "deadLettered": 0, "leaseReleased": True}
        assert "ackRefused" not in r.json() and r.json()["messages"] == []
        # A body that is not acknowledgements is the client's mistake: 400, nothing done.
        await queen.push("refused", "second")
        r = await http.post("/api/v1/pop/queue/refused", json={"acknowledgments": "all"})
        assert (r.status_code, r.json()["error"]) == (400, "invalid_body")
        r = await http.post("/api/v1/pop/queue/refused")  # no body: a plain pop
        assert [m["data"] for m in r.json()["messages"]] == ["second"]


async def test_timers_handed_to_parked_consumers_are_handled_exactly_once(
    queen: Client, broker: BrokerHandle,
) -> None:
    """Two consume() loops (eight workers) on one group while timers fire into their queue one
    by one and pushes land beside them: the sweeper hands most timer frames to a parked pop
    in the fire's own transaction, and races it with pops woken by the pushes. Every message
    is handled once, none twice, whichever path served it."""
    handled: list[Any] = []
    timers, pushes = 120, 240

    async def handler(message: Message) -> None:
        handled.append(message.data)

    async def schedule() -> None:
        for i in range(timers):
            await queen.timer("mixed").key(f"t{i}").delay(f"{30 + i % 7 * 11}ms").payload(
                {"timer": i}).schedule()
            await trio.sleep(0.012)

    async def push() -> None:
        for start in range(0, pushes, 8):
            await queen.push_many("mixed", [{"push": i} for i in range(start, start + 8)])
            await trio.sleep(0.02)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(functools.partial(queen.consume, "mixed", handler,
                                                     concurrency=4, idle_timeout="1500ms",
                                                     poll="200ms"))
            nursery.start_soon(schedule)
            nursery.start_soon(push)
    expected = [{"timer": i} for i in range(timers)] + [{"push": i} for i in range(pushes)]
    key = repr
    assert sorted(map(key, handled)) == sorted(map(key, expected))
    async with httpx.AsyncClient(base_url=broker.url) as http:
        metrics = (await http.get("/metrics")).text
    handed = [line for line in metrics.splitlines()
              if line.startswith('queen_pop_fire_waits_total{result="handed_over"}')]
    assert handed and float(handed[0].split()[-1]) > 0, "no frame was handed over"


async def test_settling_a_whole_batch_in_one_pop_releases_its_lease(
    queen: Client, broker: BrokerHandle
) -> None:
    """A batch settled in one settle-and-pop (the one-statement ack, queen.ack_head) says
    ``leaseReleased`` exactly when the acks cover everything the lease handed out, whatever
    order they are listed in; then the partition is free and nothing comes back."""
    import httpx

    await queen.configure("whole", lease_time=30)
    await queen.push_many("whole", [{"n": i} for i in range(6)])
    async with httpx.AsyncClient(base_url=broker.url) as http:

        async def settle(batch: Any, indexes: list[int]) -> dict[str, Any]:
            r = await http.post("/api/v1/pop/queue/whole", params={"batch": 3},
                                json={"partitionId": batch.messages[0].partition_id,
                                      "leaseId": batch.lease_id,
                                      "acknowledgments": [
                                          {"transactionId": batch.messages[i].transaction_id}
                                          for i in indexes]})
            assert r.status_code == 200, r.text
            return r.json()

        first = await queen.pop("whole", batch=3, wait="3s")
        assert [m.data["n"] for m in first] == [0, 1, 2]
        body = await settle(first, [2, 0, 1])  # all of it, out of order
        assert (body["acks"]["completed"], body["acks"]["leaseReleased"]) == (3, True)
        assert [m["data"]["n"] for m in body["messages"]] == [3, 4, 5]  # leased again at once
        second = await queen.pop("whole", batch=3, wait="3s")
        assert len(second) == 0  # held by that answer's lease
        lease = body["leaseId"]
        r = await http.post("/api/v1/pop/queue/whole", params={"batch": 3},
                            json={"partitionId": body["partitionId"], "leaseId": lease,
                                  "acknowledgments": [
                                      {"transactionId": m["transactionId"]}
                                      for m in body["messages"][:2]]})
        part = r.json()
        assert (part["acks"]["completed"], part["acks"]["leaseReleased"]) == (2, False)
        assert part["messages"] == []  # the lease still holds the last one
