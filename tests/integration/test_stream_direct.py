"""A streaming pop's WebSocket read and written on hypercorn's side (api/connections.py
DirectWebSocket, api/stream.py DIRECT): batches, settlements (taken as they are read, or
settled in order by the stream's reader task), refusals, a stop and a malformed message are
answered the same as through Quart's websocket, over a raw stream against a real broker; and
with it no message of the stream goes through Quart's websocket (its signals stay silent)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from quart import signals
from wsproto.events import BytesMessage, CloseConnection, Ping, Pong, TextMessage

from queen_trio.api import stream as stream_module
from queen_trio.client import Client
from queen_trio.client.stream import FromBroker, PopStream
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk_consume import _acks_applied
from .test_stream_settlements import _compact, _next

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures


async def _settle_and_stop(stream: PopStream, got: FromBroker) -> None:
    """Settle the batch ``got`` whole, stop the stream and read it to its end."""
    assert got.seq is not None and got.pop is not None
    await stream._write(BytesMessage(_compact(
        got.seq, got.pop, [m.transactionId for m in got.pop.messages])))
    await stream.stop()
    with trio.fail_after(10):
        while await stream.receive() is not None:
            pass


@pytest.fixture(params=[True, False], ids=["direct", "quart"])
def direct(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(stream_module, "DIRECT", request.param)
    return bool(request.param)


@pytest.fixture
def through_quart() -> Iterator[collections.Counter[str]]:
    """How many messages of a websocket went through Quart's websocket, each way."""
    seen: collections.Counter[str] = collections.Counter()

    async def received(sender: Any, **kwargs: Any) -> None:
        seen["received"] += 1

    async def sent(sender: Any, **kwargs: Any) -> None:
        seen["sent"] += 1

    signals.websocket_received.connect(received, weak=False)
    signals.websocket_sent.connect(sent, weak=False)
    try:
        yield seen
    finally:
        signals.websocket_received.disconnect(received)
        signals.websocket_sent.disconnect(sent)


async def test_a_stream_answers_the_same_read_and_written_on_hypercorns_side(
    direct: bool, through_quart: collections.Counter[str], queen: Client, broker: BrokerHandle
) -> None:
    queue = f"direct-{direct}"
    await queen.push_many(queue, list(range(6)))
    before = _acks_applied(broker).get("completed", 0)
    stream = await PopStream.open(broker.url, queue, None,
                                  {"batch": 2, "inflight": 1, "timeout": 2000}, {}, 10)
    try:
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        assert [m.data for m in got.pop.messages] == [0, 1]
        # Whole, as the pop loop waits for it: its next pop settles it.
        await stream._write(BytesMessage(
            _compact(got.seq, got.pop, [m.transactionId for m in got.pop.messages])))
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        assert [m.data for m in got.pop.messages] == [2, 3]
        # Naming a transactionId the batch does not hold (settled by the reader task), and
        # at once a stop, taken after it.
        await stream._write(BytesMessage(_compact(
            got.seq, got.pop, [*(m.transactionId for m in got.pop.messages), "not-this-batch"])))
        await stream.stop()
        refused = []
        with trio.fail_after(10):  # the broker closes once its pop in progress has answered
            while (answer := await stream.receive()) is not None:
                if answer.ackRefused is not None:
                    assert answer.seq == got.seq
                    refused += [r.transactionId for r in answer.ackRefused]
        assert refused == ["not-this-batch"]
    finally:
        await stream.aclose()
    assert _acks_applied(broker)["completed"] - before == 4
    # What the stream did not settle (a batch popped before the stop) is back at once.
    with trio.fail_after(10):
        while not len(popped := await queen.pop(queue, batch=10)):
            await trio.sleep(0.1)
    assert [m.data for m in popped] == [4, 5]
    if direct:
        assert through_quart == {}, through_quart
    else:
        assert through_quart["received"] == 3 and through_quart["sent"] >= 3, through_quart


async def test_a_malformed_message_ends_the_stream_the_same_way(
    direct: bool, through_quart: collections.Counter[str], queen: Client, broker: BrokerHandle
) -> None:
    queue = f"direct-bad-{direct}"
    await queen.push_many(queue, [1, 2])
    stream = await PopStream.open(broker.url, queue, None,
                                  {"batch": 2, "inflight": 1, "timeout": 2000}, {}, 10)
    try:
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        await stream._write(BytesMessage(b"not json"))
        answer = await _next(stream)
        assert (answer.error, answer.message) == ("invalid_json",
                                                  "a stream message must be JSON")
        with trio.fail_after(10):  # then the broker closes the stream
            while await stream.receive() is not None:
                pass
    finally:
        await stream.aclose()
    # The batch it held goes back at once, not when its lease ends.
    with trio.fail_after(10):
        while not len(popped := await queen.pop(queue, batch=2)):
            await trio.sleep(0.1)
    assert [m.data for m in popped] == [1, 2]
    assert (through_quart["received"] == 0) is direct


async def test_a_batch_larger_than_the_socket_takes_at_once_arrives_whole(
    direct: bool, queen: Client, broker: BrokerHandle
) -> None:
    """A WebSocket message the connection's socket cannot take at once (a consumer that reads
    it later): what the socket took is followed by the rest, written as room comes."""
    queue = f"direct-big-{direct}"
    payloads = [f"{i}:" + "x" * 400_000 for i in range(12)]  # one batch of ~4.8 MB
    for payload in payloads:
        await queen.push(queue, payload)
    stream = await PopStream.open(broker.url, queue, None,
                                  {"batch": 12, "inflight": 1, "timeout": 2000}, {}, 10)
    try:
        await trio.sleep(0.5)  # (the broker writes meanwhile, until the socket is full)
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        assert [m.data for m in got.pop.messages] == payloads
        await _settle_and_stop(stream, got)
    finally:
        await stream.aclose()
    assert len(await queen.pop(queue, batch=12)) == 0


async def test_a_settlement_in_fragments_pieces_and_text_is_read_as_one(
    direct: bool, queen: Client, broker: BrokerHandle
) -> None:
    """What the connection reads is handed to the WebSocket straight away, a message whole in
    one frame read without wsproto's parser (api/connections.py _whole_message): a settlement
    sent in two fragments with a ping between them, its bytes split over two writes, and one
    sent as a text message are each read as the one settlement they are, and the ping is
    answered."""
    queue = f"direct-frag-{direct}"
    await queen.push_many(queue, list(range(6)))
    before = _acks_applied(broker).get("completed", 0)
    stream = await PopStream.open(broker.url, queue, None,
                                  {"batch": 2, "inflight": 1, "timeout": 2000}, {}, 10)
    pongs = 0
    original = stream.ws.events

    def counting() -> Any:
        nonlocal pongs
        for event in original():
            pongs += isinstance(event, Pong)
            yield event

    stream.ws.events = counting  # type: ignore[method-assign]
    try:
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        body = _compact(got.seq, got.pop, [m.transactionId for m in got.pop.messages])
        wire = (stream.ws.send(BytesMessage(body[:7], message_finished=False))
                + stream.ws.send(Ping(b"hi"))
                + stream.ws.send(BytesMessage(body[7:], message_finished=True)))
        await stream._send_raw(wire[:5])
        await trio.sleep(0.05)  # (two reads on the broker's side)
        await stream._send_raw(wire[5:])
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        assert [m.data for m in got.pop.messages] == [2, 3]
        body = _compact(got.seq, got.pop, [m.transactionId for m in got.pop.messages])
        await stream._write(TextMessage(body.decode()))
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        assert [m.data for m in got.pop.messages] == [4, 5]
        await _settle_and_stop(stream, got)
    finally:
        await stream.aclose()
    assert pongs == 1
    assert _acks_applied(broker)["completed"] - before == 6


async def test_a_text_message_not_in_utf8_closes_the_stream(
    direct: bool, queen: Client, broker: BrokerHandle
) -> None:
    """A text frame whose bytes are not UTF-8, whole in one frame, is judged by wsproto as
    before: the connection ends (hypercorn closes it without a close frame of its own), and
    the batch out goes back at once."""
    queue = f"direct-utf8-{direct}"
    await queen.push_many(queue, [1, 2])
    stream = await PopStream.open(broker.url, queue, None,
                                  {"batch": 2, "inflight": 1, "timeout": 2000}, {}, 10)
    codes = []
    original = stream.ws.events

    def closes() -> Any:
        for event in original():
            if isinstance(event, CloseConnection):
                codes.append(event.code)
            yield event

    stream.ws.events = closes  # type: ignore[method-assign]
    try:
        got = await _next(stream)
        assert got.seq is not None
        mask = b"\x01\x02\x03\x04"
        payload = b'{"seq":\xff}'
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        await stream._send_raw(bytes((0x81, 0x80 | len(payload))) + mask + masked)
        with trio.fail_after(10):
            while await stream.receive() is not None:
                pass
    finally:
        await stream.aclose()
    assert len(codes) == 1  # (the connection's end, as the client's wsproto reports it)
    with trio.fail_after(10):
        while not len(popped := await queen.pop(queue, batch=2)):
            await trio.sleep(0.1)
    assert [m.data for m in popped] == [1, 2]
