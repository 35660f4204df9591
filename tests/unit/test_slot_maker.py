"""Frozen dataclasses made by setting their slots (queen_trio/slots.py) rather than by their
``__init__``: the SDK's messages as consume() makes them from a pop's answer (client/models.py
``Message.from_model``) and the broker's frames of a one-statement pop's answer
(log/store.py ``_head_answer``) are the same, field for field, as their class's own
constructor makes, and as frozen."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from datetime import UTC, datetime

import msgspec
import pytest

from queen_trio.client.models import Batch, Message, TimerMark
from queen_trio.log import rules, store
from queen_trio.models import log as wire_log
from queen_trio.slots import slot_maker

ANSWER = {
    "success": True, "queue": "q", "partition": "Default",
    "partitionId": "c4356f26-e682-4944-a4b8-e25ec321ed32",
    "leaseId": "9531468e-6b00-47ba-a658-3ee266a5cea4",
    "leaseExpiresAt": "2026-12-04T15:05:00.000000Z", "consumerGroup": "__QUEUE_MODE__",
    "skipped": None,
    "messages": [
        {"id": "58d2834c-2c77-4ace-8f9f-a3fb5b6ac805",
         "transactionId": "53330587-17bc-40dc-a144-65e5af9d68a7",
         "partitionId": "c4356f26-e682-4944-a4b8-e25ec321ed32", "partition": "Default",
         "queue": "q", "offset": 1, "leaseId": "9531468e-6b00-47ba-a658-3ee266a5cea4",
         "consumerGroup": "__QUEUE_MODE__", "data": {"k": "burst-0"},
         "createdAt": "2026-12-04T15:00:00.000000Z", "retryCount": 2, "deliveryAttempt": 3,
         "timer": {"key": "burst-0", "deliverAt": "2026-12-04T14:59:59.997000+00:00"}},
        {"id": "m-2", "transactionId": "t-2", "partitionId": "c4356f26-e682-4944-a4b8-e25ec321ed32",
         "partition": "Default", "queue": "q", "offset": 2, "leaseId": None,
         "consumerGroup": "g", "data": [1, None], "createdAt": "2026-12-04T15:00:00.001Z",
         "retryCount": 0, "deliveryAttempt": 1},
    ],
}


def test_a_popped_message_is_the_one_its_constructor_makes() -> None:
    got = Batch.from_model(msgspec.convert(ANSWER, wire_log.PopResponse)).messages
    expected = (
        Message("53330587-17bc-40dc-a144-65e5af9d68a7", "c4356f26-e682-4944-a4b8-e25ec321ed32",
                "q", "Default", 1, "9531468e-6b00-47ba-a658-3ee266a5cea4", "__QUEUE_MODE__",
                {"k": "burst-0"}, datetime(2026, 12, 4, 15, tzinfo=UTC), 2,
                TimerMark("burst-0", datetime(2026, 12, 4, 14, 59, 59, 997000, tzinfo=UTC)),
                "58d2834c-2c77-4ace-8f9f-a3fb5b6ac805"),
        Message("t-2", "c4356f26-e682-4944-a4b8-e25ec321ed32", "q", "Default", 2, None, "g",
                [1, None], datetime(2026, 12, 4, 15, 0, 0, 1000, tzinfo=UTC), 0, None, "m-2"),
    )
    assert got == expected
    for message, made in zip(got, expected, strict=True):
        assert type(message) is Message
        assert dataclasses.astuple(message) == dataclasses.astuple(made)
        assert repr(message) == repr(made) and hash(message.timer) == hash(made.timer)
        assert pickle.loads(pickle.dumps(message)) == made
        assert dataclasses.replace(message, offset=9).offset == 9
        with pytest.raises(dataclasses.FrozenInstanceError):
            message.offset = 5  # type: ignore[misc]
    assert got[0].timer is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].timer.key = "other"  # type: ignore[misc]


def test_a_frame_of_a_one_statement_pop_is_the_one_its_constructor_makes() -> None:
    created = datetime(2026, 12, 4, 15, tzinfo=UTC)
    pid, lease = uuid.uuid4(), uuid.uuid4()
    meta = '{"messageId": "m-1", "timer": {"key": "k", "deliverAt": "2026-12-04T15:00:00Z"}}'
    rows = [("messages", pid, "Default", lease, created, 7, "t-1", '{"k": 1}', created, meta,
             None),
            ("messages", None, None, None, None, 8, "t-2", None, created, None, None)]
    outcome = store._head_answer(rules.pop_request("q", None, {}), rows)
    assert outcome is not None and outcome.batch is not None
    got = outcome.batch.messages
    assert got == [
        store.Message(7, "t-1", msgspec.Raw(b'{"k": 1}'), created, 0,
                      {"messageId": "m-1", "timer": {"key": "k",
                                                     "deliverAt": "2026-12-04T15:00:00Z"}}),
        store.Message(8, "t-2", None, created, 0, None),
    ]
    assert all(type(m) is store.Message for m in got)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].offset = 1  # type: ignore[misc]


def test_a_maker_takes_every_field_in_order_and_no_more() -> None:
    make = slot_maker(TimerMark)
    assert make("k", None) == TimerMark("k", None)
    with pytest.raises(TypeError):
        make("k")
    with pytest.raises(TypeError):
        make("k", None, "extra")
