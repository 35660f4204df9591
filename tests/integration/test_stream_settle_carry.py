"""A streaming consumer under a steady flow of timers: the settlement of the batch it was
handed last rides the sweep that pops its next batch (queen.sweep_settle_and_pop), so a cycle
costs one statement; every timer is still handled once and every acknowledgement counted."""

from __future__ import annotations

import trio

from queen_trio.client import Client, Message
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk_consume import _acks_applied

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures


def _fire_waits(broker: BrokerHandle) -> dict[str, float]:
    return {s.labels["result"]: s.value
            for metric in broker.context.metrics.registry.collect() for s in metric.samples
            if s.name == "queen_pop_fire_waits_total"}


async def test_a_steady_flow_settles_each_batch_in_the_sweep_that_pops_the_next(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.configure("steady")
    n = 150
    bundle = queen.transaction()
    for i in range(n):  # one every 20 ms, from 0.4 s on
        bundle = bundle.timer("steady").key(f"t{i}").delay(400 + i * 20).payload(i).schedule()
    await bundle.commit()
    acks_before = _acks_applied(broker).get("completed", 0)
    waits_before = _fire_waits(broker)
    handled: list[str] = []

    def handler(message: Message) -> None:
        assert message.timer is not None
        handled.append(message.timer.key)

    stats = await queen.consume("steady", handler, max_messages=n)
    waits = {k: v - waits_before.get(k, 0) for k, v in _fire_waits(broker).items()}
    assert sorted(handled) == sorted(f"t{i}" for i in range(n))  # each once
    assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)
    assert _acks_applied(broker)["completed"] - acks_before == n
    assert waits.get("settled_by_fire", 0) >= n // 4
    # Every settlement reached the log: nothing is left leased or poppable.
    assert len(await queen.pop("steady")) == 0


async def _leased_groups(queen: Client, broker: BrokerHandle, queue: str) -> int:
    detail = await queen._http.get(f"{broker.url}/api/v1/resources/queues/{queue}")
    return sum(1 for p in detail.json()["partitions"]
               for g in p["groups"].values() if g["leased"])


async def _fire(queen: Client, broker: BrokerHandle, on: bool) -> None:
    answer = await queen._http.post(f"{broker.url}/api/v1/system/kv-timers",
                                    json={"timersFire": on})
    assert answer.status_code == 200, answer.text


async def test_a_settlement_no_sweep_takes_is_applied_alone_soon(
    queen: Client, broker: BrokerHandle
) -> None:
    # The fire paused mid-flow: the settlement waiting for the next sweep (which does not
    # come) is applied alone within moments, not held until the fire resumes; then the rest
    # fire and are handled, each once.
    await queen.configure("paused")
    n, first = 90, 30
    bundle = queen.transaction()
    for i in range(n):  # one every 20 ms, from 0.4 s on
        bundle = bundle.timer("paused").key(f"t{i}").delay(400 + i * 20).payload(i).schedule()
    await bundle.commit()
    acks_before = _acks_applied(broker).get("completed", 0)
    handled: list[int] = []
    reached = trio.Event()

    def handler(message: Message) -> None:
        handled.append(message.data)
        if len(handled) == first:
            reached.set()

    async with trio.open_nursery() as nursery:
        async def consume() -> None:
            stats = await queen.consume("paused", handler, max_messages=n)
            assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)

        nursery.start_soon(consume)
        with trio.fail_after(30):
            await reached.wait()
        await _fire(queen, broker, False)
        try:
            # Nothing more fires; what was handled is settled (acks counted, no lease left)
            # well before the fire resumes.
            seen = -1
            with trio.fail_after(10):
                while seen != len(handled):
                    seen = len(handled)
                    await trio.sleep(0.3)
            with trio.fail_after(5):
                while (_acks_applied(broker)["completed"] - acks_before != len(handled)
                       or await _leased_groups(queen, broker, "paused")):
                    await trio.sleep(0.05)
            assert len(handled) < n
        finally:
            await _fire(queen, broker, True)
    assert sorted(handled) == list(range(n))
    assert _acks_applied(broker)["completed"] - acks_before == n
    assert len(await queen.pop("paused")) == 0
