"""A stream's settlements as the broker reads them (queen_trio/api/stream.py): the SDK's compact
form of a batch completed whole, read straight against the batch the stream holds, and every
other form as a POST pop's acknowledgements; whichever form, what is acked and what is refused
is the same, over a raw stream (the SDK's PopStream) against a real broker."""

from __future__ import annotations

import collections
from typing import Any

import msgspec
import trio
from wsproto.events import BytesMessage

from queen_trio.client import Client
from queen_trio.client.stream import FromBroker, PopStream
from queen_trio.server import BrokerHandle

from . import test_sdk
from .test_sdk_consume import _acks_applied
from .test_stream import _Statements

settings, queen = test_sdk.settings, test_sdk.queen  # the same fixtures


async def _next(stream: PopStream) -> FromBroker:
    with trio.fail_after(10):
        while True:
            got = await stream.receive()
            assert got is not None, "the stream ended"
            if not got.idle:
                return got


def _compact(seq: int, pop: Any, txns: list[str]) -> bytes:
    first = pop.messages[0]
    return msgspec.json.encode({
        "seq": seq, "partitionId": first.partitionId, "leaseId": first.leaseId,
        "consumerGroup": first.consumerGroup,
        "acknowledgments": [{"transactionId": t} for t in txns]})


async def test_every_form_of_a_settlement_acks_and_refuses_as_before(
    queen: Client, broker: BrokerHandle
) -> None:
    await queen.push_many("forms", list(range(9)))
    before = _acks_applied(broker).get("completed", 0)
    stream = await PopStream.open(broker.url, "forms", None,
                                  {"batch": 3, "inflight": 1, "timeout": 2000}, {}, 10)
    try:
        with _Statements(broker) as statements:
            # The SDK's compact form, in the batch's order: the one-statement settlement,
            # and (a full batch: a backlog) the next batch in the same statement.
            got = await _next(stream)
            assert got.seq is not None and got.pop is not None
            txns = [m.transactionId for m in got.pop.messages]
            assert [m.data for m in got.pop.messages] == [0, 1, 2]
            await stream._write(BytesMessage(_compact(got.seq, got.pop, txns)))
            got = await _next(stream)
            assert got.seq is not None and got.pop is not None
            assert [m.data for m in got.pop.messages] == [3, 4, 5]
            whole = collections.Counter(statements.calls)
            assert whole["_settle_whole_noted"] == 1 and whole["ack"] == 0, whole
            # The same messages named in another order: the whole batch all the same.
            txns = [m.transactionId for m in got.pop.messages]
            await stream._write(BytesMessage(_compact(got.seq, got.pop, txns[::-1])))
            got = await _next(stream)
            assert got.seq is not None and got.pop is not None
            assert [m.data for m in got.pop.messages] == [6, 7, 8]
            # One transactionId the batch does not hold: that one refused, the rest acked.
            txns = [m.transactionId for m in got.pop.messages]
            await stream._write(BytesMessage(
                _compact(got.seq, got.pop, [txns[0], txns[1], "not-this-batch"])))
            refused = await _next(stream)
            assert refused.seq == got.seq and refused.ackRefused is not None
            assert [r.transactionId for r in refused.ackRefused] == ["not-this-batch"]
        assert _acks_applied(broker)["completed"] - before == 8
    finally:
        await stream.aclose()
    # The one left unacked comes back once its lease ends, not before; nothing else does.
    assert len(await queen.pop("forms", batch=10)) == 0


async def test_a_settlement_nested_too_deeply_is_refused_and_its_batch_given_back(
    queen: Client, broker: BrokerHandle, caplog: Any
) -> None:
    # msgspec's decoder gives up on deep nesting with a RecursionError, not a DecodeError:
    # it closed the stream as the broker's own failure (1011, a traceback logged).
    await queen.push_many("deep", [1, 2])
    stream = await PopStream.open(broker.url, "deep", None,
                                  {"batch": 2, "inflight": 1, "timeout": 2000}, {}, 10)
    try:
        got = await _next(stream)
        assert got.seq is not None and got.pop is not None
        deep = b'{"seq": %d, "acknowledgments": %s%s}' % (got.seq, b"[" * 5000, b"]" * 5000)
        await stream._write(BytesMessage(deep))
        with trio.fail_after(10):
            answer = await stream.receive()
        assert answer is not None and answer.error == "invalid_json", answer
        assert answer.message == "a stream message is nested too deeply"
        with trio.fail_after(10):  # then the broker closes the stream
            while await stream.receive() is not None:
                pass
    finally:
        await stream.aclose()
    # The batch it held goes back at once, not when its lease ends.
    with trio.fail_after(10):
        while True:
            popped = await queen.pop("deep", batch=2)
            if len(popped):
                break
            await trio.sleep(0.1)
    assert [m.data for m in popped] == [1, 2]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
