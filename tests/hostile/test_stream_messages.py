"""Hostile messages on the streaming pop (``GET /api/v1/stream/queue/{q}``, a WebSocket): a
consumer's settlement generated from JSON edge values, raw bytes, deep nesting and the real
batch's own fields mixed with wrong ones, against a live broker process.

The contract: the broker answers a message it cannot take with ``{"error", "message"}`` and
closes 1008 (policy), or takes it (refusing what it must in ``ackRefused``); never a close as
its own failure (1011), never a traceback in its log, and it stays healthy."""

from __future__ import annotations

import itertools
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    RejectConnection,
    Request,
    TextMessage,
)

from ..brokers import BrokerProcess
from ..pgserver import Databases
from .conftest import start_broker
from .test_hostile_input import json_values

API = "/api/v1"
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
_queues = itertools.count()
_last_sent: list[bytes | str] = []  # (named in a failure)


@pytest.fixture(scope="module")
def stream_broker(databases: Databases) -> Iterator[BrokerProcess]:
    yield from start_broker(databases, "hostile-stream")


class _Stream:
    """A blocking WebSocket client of the streaming pop, enough to settle one batch."""

    def __init__(self, broker: BrokerProcess, queue: str) -> None:
        host, port = broker.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.close_code: int | None = None
        self.parts: list[bytes] = []
        self.sock.sendall(self.ws.send(Request(
            host=f"{host}:{port}", target=f"{API}/stream/queue/{queue}?batch=2&timeout=300")))

    def receive(self, within_s: float = 10.0) -> dict[str, Any] | None:
        """The broker's next message, or None once it has closed or said nothing for
        ``within_s``."""
        self.sock.settimeout(within_s)
        while self.close_code is None:
            for event in self.ws.events():
                if isinstance(event, TextMessage | BytesMessage):
                    data = event.data
                    self.parts.append(data.encode() if isinstance(data, str) else bytes(data))
                    if event.message_finished:
                        raw, self.parts = b"".join(self.parts), []
                        message = json.loads(raw)
                        assert isinstance(message, dict), raw[:200]
                        return message
                elif isinstance(event, CloseConnection):
                    self.close_code = event.code
                    return None
                elif isinstance(event, RejectConnection):
                    raise AssertionError(f"upgrade refused: {event.status_code}")
                else:
                    assert isinstance(event, AcceptConnection), event
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not data:
                self.close_code = -1  # gone without a close frame
                return None
            self.ws.receive_data(data)
        return None

    def send(self, message: bytes | str) -> None:
        event = TextMessage(message) if isinstance(message, str) else BytesMessage(message)
        self.sock.sendall(self.ws.send(event))

    def close(self) -> None:
        self.sock.close()


def _settle_with(broker: BrokerProcess, make: Callable[[dict[str, Any]], bytes | str],
                 quiet_s: float = 0.3) -> tuple[list[dict[str, Any]], int | None]:
    """Push two messages to a fresh queue, take them on a stream, send ``make(batch message)``;
    the broker's messages after it until it closes or says nothing for ``quiet_s`` (then this
    client goes away: what the broker holds goes back), and its close code (None: open)."""
    queue = f"hs-{next(_queues)}"
    with httpx.Client(base_url=broker.url, timeout=10) as http:
        pushed = http.post(f"{API}/push", json={"items": [
            {"queue": queue, "payload": {"i": i}} for i in range(2)]})
        assert pushed.status_code in (200, 201), pushed.text
    stream = _Stream(broker, queue)
    try:
        first = stream.receive()
        while first is not None and first.get("idle"):
            first = stream.receive()
        assert first is not None and "pop" in first, first
        sent = make(first)
        _last_sent[:] = [sent]
        stream.send(sent)
        answers: list[dict[str, Any]] = []
        while (got := stream.receive(quiet_s)) is not None:
            if not got.get("idle"):
                answers.append(got)
        return answers, stream.close_code
    finally:
        stream.close()


def _real(first: dict[str, Any]) -> dict[str, Any]:
    """The settlement the SDK would send for this batch, completed whole."""
    messages = first["pop"]["messages"]
    return {"seq": first["seq"], "partitionId": messages[0]["partitionId"],
            "leaseId": messages[0]["leaseId"], "consumerGroup": messages[0]["consumerGroup"],
            "acknowledgments": [{"transactionId": m["transactionId"]} for m in messages]}


_FIELDS = ("seq", "partitionId", "leaseId", "consumerGroup", "acknowledgments", "status",
           "stop", "error")


@st.composite
def _settlements(draw: st.DrawFn) -> Callable[[dict[str, Any]], bytes | str]:
    kind = draw(st.sampled_from(("mutated", "item", "any_json", "bytes", "deep")))
    if kind == "any_json":
        value = draw(json_values)
        return lambda first: json.dumps(value)
    if kind == "bytes":
        raw = draw(st.binary(max_size=300))
        return lambda first: raw
    if kind == "deep":
        depth = draw(st.integers(min_value=500, max_value=20_000))
        opener = draw(st.sampled_from(("[", '{"a":')))
        closer = "]" if opener == "[" else "}"
        return lambda first: (f'{{"seq": {first["seq"]}, "acknowledgments": '
                              f'{opener * depth}0{closer * depth}}}')
    if kind == "item":  # the real settlement with one acknowledgement's field replaced
        field = draw(st.sampled_from(("transactionId", "status", "partitionId", "leaseId",
                                      "error", "extra")))
        value = draw(json_values)

        def item(first: dict[str, Any]) -> str:
            body = _real(first)
            body["acknowledgments"][0][field] = value
            return json.dumps(body)
        return item
    # the real settlement with fields replaced or dropped
    changes = draw(st.dictionaries(st.sampled_from(_FIELDS), json_values, min_size=1,
                                   max_size=3))
    dropped = draw(st.sets(st.sampled_from(_FIELDS[:5]), max_size=2))

    def mutated(first: dict[str, Any]) -> str:
        body = {k: v for k, v in _real(first).items() if k not in dropped}
        body.update(changes)
        return json.dumps(body)
    return mutated


@FUZZ
@given(make=_settlements())
def test_generated_settlements_are_taken_or_refused_never_a_broker_failure(
        stream_broker: BrokerProcess, make: Callable[[dict[str, Any]], bytes | str]) -> None:
    answers, code = _settle_with(stream_broker, make)
    assert code in (None, 1008), (code, answers, repr(_last_sent)[:300])
    for answer in answers:
        if "error" in answer:
            assert isinstance(answer["error"], str) and isinstance(answer["message"], str)
            assert code in (None, 1008), (code, answers)  # (the close may come later)
        else:
            assert set(answer) == {"seq", "ackRefused"}, answer
    assert stream_broker.alive, stream_broker.stderr()


def test_after_the_fuzzing_the_broker_is_healthy_and_logged_no_failure(
        stream_broker: BrokerProcess) -> None:
    # (Runs after the generated test in this module: what the log says about all of it.)
    answers, code = _settle_with(stream_broker, lambda first: json.dumps(_real(first)))
    assert (answers, code) == ([], None)  # taken whole: nothing refused, the stream goes on
    assert httpx.get(f"{stream_broker.url}/health", timeout=10).status_code == 200
    log = stream_broker.stderr()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
