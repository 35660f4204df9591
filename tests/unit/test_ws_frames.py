"""The streaming pop's WebSocket frames written and read without wsproto
(api/connections.py ``_binary_frame``, ``_whole_message``): byte for byte what wsproto writes,
and what hypercorn's WSStream would put for what a client sends; anything else is left to
wsproto (None)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypercorn.config import Config
from hypercorn.protocol.ws_stream import WebsocketBuffer, WSStream
from wsproto import ConnectionType
from wsproto.connection import Connection, ConnectionState
from wsproto.events import BytesMessage, Message, Ping, TextMessage

from queen_trio.api import connections


def _server() -> Connection:
    return Connection(ConnectionType.SERVER)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
def test_a_binary_frame_is_wsprotos(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert connections._binary_frame(_server(), data) == bytes(
        _server().send(BytesMessage(data=data)))


def test_a_frame_wsproto_must_write_is_left_to_it() -> None:
    server = _server()
    server._proto._outbound_opcode = object()  # type: ignore[assignment]  # (a fragment out)
    assert connections._binary_frame(server, b"x") is None
    client = Connection(ConnectionType.CLIENT)  # (masked)
    assert connections._binary_frame(client, b"x") is None
    closed = _server()
    closed._state = ConnectionState.CLOSED
    assert connections._binary_frame(closed, b"x") is None


class _Stream:
    """What _whole_message reads of hypercorn's WSStream."""

    def __init__(self, max_size: int = 16 * 1024 * 1024) -> None:
        self.connection = _server()
        self.config = Config()
        self.config.websocket_max_message_size = max_size
        self.buffer = WebsocketBuffer(max_size)


def _whole(stream: _Stream, data: bytes) -> dict[str, Any] | None:
    return connections._whole_message(cast(WSStream, stream), data)


def _from_client(*events: Any) -> bytes:
    client = Connection(ConnectionType.CLIENT)  # (open, its frames masked)
    return b"".join(client.send(e) for e in events)


def _as_hypercorn_puts(stream: _Stream, data: bytes) -> list[dict[str, Any]]:
    """What WSStream._handle_events would put for ``data`` (messages only)."""
    put = []
    stream.connection.receive_data(data)
    for event in stream.connection.events():
        assert isinstance(event, Message)
        stream.buffer.extend(event)
        if event.message_finished:
            put.append(stream.buffer.to_message())
            stream.buffer.clear()
    return put


@pytest.mark.parametrize("event", [
    BytesMessage(b'{"seq":1,"acknowledgments":[]}'), BytesMessage(b"x" * 125),
    BytesMessage(b"y" * 126), BytesMessage(b"z" * 65535), TextMessage('{"stop":true}'),
    TextMessage("é" * 100), BytesMessage(b""),
])
def test_a_whole_message_reads_as_hypercorn_puts_it(event: Any) -> None:
    data = _from_client(event)
    assert [_whole(_Stream(), data)] == _as_hypercorn_puts(_Stream(), data)


@pytest.mark.parametrize("data", [
    _from_client(BytesMessage(b"part", message_finished=False)),  # a fragment
    _from_client(Ping(b"p")),
    _from_client(BytesMessage(b"a"), BytesMessage(b"b")),  # two messages in one read
    _from_client(BytesMessage(b"a" * 70_000)),  # 64-bit length
    _from_client(BytesMessage(b"abc"))[:-1],  # not whole yet
    bytes((0x82, 3)) + b"abc",  # not masked
    bytes((0xC2, 0x83)) + b"\0\0\0\0abc",  # RSV1 (compressed) without an extension
    bytes((0x81, 0x82)) + b"\0\0\0\0\xff\xfe",  # text, not UTF-8
    bytes((0x82, 0xFE, 0, 3)) + b"\0\0\0\0abc",  # a length not in its shortest form
], ids=[  # (a client's frames carry a random mask: ids of their own, the same in every worker)
    "fragment", "ping", "two messages", "64-bit length", "partial", "unmasked", "rsv1",
    "bad utf-8", "long form of a short length",
])
def test_anything_else_is_left_to_wsproto(data: bytes) -> None:
    assert _whole(_Stream(), data) is None


def test_past_the_message_size_or_amid_a_message_it_is_left_to_wsproto() -> None:
    data = _from_client(BytesMessage(b"x" * 100))
    assert _whole(_Stream(max_size=99), data) is None
    stream = _Stream()
    _as_hypercorn_puts(stream, _from_client(BytesMessage(b"first", message_finished=False)))
    assert _whole(stream, _from_client(BytesMessage(b"x"))) is None
    stream = _Stream()
    stream.connection.receive_data(data[:3])  # (wsproto holds the start of a frame)
    list(stream.connection.events())
    assert _whole(stream, data) is None


def test_the_wsstream_parts_it_stands_in_for() -> None:
    """hypercorn's WSStream puts each whole message as WebsocketBuffer.to_message, reading
    with wsproto's connection (``connection``, set at the accept) and the configured size."""
    import inspect
    source = inspect.getsource(WSStream)
    for used in ("self.connection.receive_data(event.data)", "await self._handle_events()",
                 "await self.app_put(self.buffer.to_message())",
                 "WebsocketBuffer(config.websocket_max_message_size)"):
        assert used in source, used
