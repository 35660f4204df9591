"""What consume() owes the broker for a batch, settled over the stream (client/consumer.py,
client/stream.py), against a real broker: a completed message is owed as itself and a batch
completed whole goes back by transactionIds alone; a batch mixing completions with messages
its handler settled itself and a failure is settled on the stream all the same, each message
exactly as its handler left it."""

from __future__ import annotations

from queen_trio.client import Client, Message
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk_consume import POP_ROUTE, _acks_applied, _http_requests

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures
ACK_ROUTES = ("/api/v1/ack", "/api/v1/ack/batch")


def _requests(broker: BrokerHandle) -> float:
    return (sum(_http_requests(broker, m, POP_ROUTE) for m in ("GET", "POST"))
            + sum(_http_requests(broker, "POST", r) for r in ACK_ROUTES))


async def test_completions_handler_settlements_and_a_failure_settle_on_the_stream(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.configure("mixed", retry_limit=2)
    await queen.push_many("mixed", list(range(8)))
    seen: list[tuple[int, int]] = []
    requests = _requests(broker)

    async def handler(message: Message) -> None:
        seen.append((message.data, message.retry_count))
        if message.data == 2:  # settled by the handler itself, in its own transaction
            await queen.transaction().ack(message).commit()
        if message.data == 5 and message.retry_count == 0:
            raise RuntimeError("not yet")

    stats = await queen.consume("mixed", handler, max_messages=9)
    # One batch 0..7: 5 fails, so 6 and 7 go back untouched and come after 5's redelivery;
    # nothing completed or settled by the handler is handed out again.
    assert seen == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (5, 1), (6, 0), (7, 0)]
    assert (stats.handled, stats.completed, stats.settled_by_handler, stats.failed,
            stats.ack_errors) == (9, 7, 1, 1, 0)
    # Every settlement on the stream: no pop or ack request (the handler's transaction goes
    # to its own route).
    assert _requests(broker) == requests
    assert len(await queen.pop("mixed")) == 0


async def test_a_backlog_drained_over_the_stream_is_acked_once_per_message_in_order(
    queen: Client, broker: BrokerHandle
) -> None:
    n = 2_000
    await queen.push_many("drained", list(range(n)))
    completed_before = _acks_applied(broker).get("completed", 0)
    handled: list[int] = []
    stats = await queen.consume("drained", lambda m: handled.append(m.data), max_messages=n)
    assert handled == list(range(n))  # one partition: in order, each once
    assert (stats.handled, stats.completed, stats.ack_errors) == (n, n, 0)
    assert _acks_applied(broker)["completed"] - completed_before == n
    assert len(await queen.pop("drained")) == 0
