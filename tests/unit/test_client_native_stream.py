"""The SDK's stream under asyncio (client/stream.py ``NativePopStream``) parses the WebSocket
itself after the upgrade: against a scripted server (wsproto on the server's side) it reads
messages split across reads and into fragments, answers pings and closes as wsproto does,
ends on a frame no server may send, and writes frames a WebSocket server reads back intact.
(Against the real broker: tests/integration/test_sdk_consume_asyncio.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Pong,
    Request,
)

from queen_trio.client.stream import NativePopStream, PopStream

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, wsproto.WSConnection],
                  Awaitable[Any]]


def _frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = False) -> bytes:
    """A server's frame, by hand."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, mask_bit | n))
    elif n < 65536:
        head = bytes((first, mask_bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, mask_bit | 127)) + n.to_bytes(8, "big")
    return head + (b"\0\0\0\0" if masked else b"") + payload


async def _events(reader: asyncio.StreamReader, ws: wsproto.WSConnection) -> list[Any]:
    while True:
        data = await asyncio.wait_for(reader.read(65536), 5)
        ws.receive_data(data or None)
        events = list(ws.events())
        if events or not data:
            return events


def _run(script: Script, client: Callable[[PopStream], Awaitable[Any]]) -> tuple[Any, Any]:
    """The client's coroutine against a server running ``script`` after the upgrade; both
    results."""
    async def main() -> tuple[Any, Any]:
        served: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
            ws.receive_data(await reader.readuntil(b"\r\n\r\n"))
            assert any(isinstance(e, Request) for e in ws.events())
            writer.write(ws.send(AcceptConnection()))
            try:
                served.set_result(await script(reader, writer, ws))
            except Exception as exc:
                served.set_exception(exc)
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            stream = await PopStream.open(f"http://127.0.0.1:{port}", "q", None, {}, {}, 5)
            assert isinstance(stream, NativePopStream)
            try:
                got = await asyncio.wait_for(client(stream), 5)
            finally:
                await stream.aclose()
            return got, await asyncio.wait_for(served, 5)
        finally:
            server.close()

    return asyncio.run(main())


def _batch(seq: int) -> bytes:
    return json.dumps({"seq": seq, "idle": False}).encode()


def test_messages_split_across_reads_and_into_fragments_are_read_whole() -> None:
    big = json.dumps({"seq": 3, "message": "x" * 70000}).encode()  # an 8-byte length

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     ws: wsproto.WSConnection) -> None:
        frames = (_frame(0x2, _batch(1))
                  + _frame(0x1, b'{"seq": 2,', fin=False) + _frame(0x0, b' "idle"', fin=False)
                  + _frame(0x0, b": true}") + _frame(0x2, big))
        for i in range(0, 200):  # the first bytes one by one: every split of a header
            writer.write(frames[i:i + 1])
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(frames[200:])
        await writer.drain()
        await _events(reader, ws)  # until the client goes

    async def client(stream: PopStream) -> list[Any]:
        return [await stream.receive() for _ in range(3)]

    got, _ = _run(script, client)
    assert [(g.seq, g.idle) for g in got] == [(1, False), (2, True), (3, False)]
    assert got[2].message == "x" * 70000


def test_a_ping_is_answered_and_writes_reach_the_server_intact() -> None:
    settlement = json.dumps({"seq": 1, "acknowledgments": [
        {"transactionId": f"{i:036d}"} for i in range(2000)]}).encode()  # 2- and 8-byte lengths

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     ws: wsproto.WSConnection) -> list[Any]:
        writer.write(_frame(0x9, b"are you there") + _frame(0x2, _batch(1)))
        seen: list[Any] = []
        parts: list[bytes] = []
        while len(seen) < 4:
            for event in await _events(reader, ws):
                if isinstance(event, Pong):
                    seen.append(("pong", bytes(event.payload)))
                elif isinstance(event, Message):
                    parts.append(bytes(event.data))
                    if event.message_finished:
                        seen.append(("message", b"".join(parts)))
                        parts = []
        return seen

    async def client(stream: PopStream) -> Any:
        got = await stream.receive()
        await stream._write(BytesMessage(b"{}"))
        await stream._write(BytesMessage(settlement))
        await stream.stop()
        return got

    got, seen = _run(script, client)
    assert got.seq == 1
    assert seen == [("pong", b"are you there"), ("message", b"{}"), ("message", settlement),
                    ("message", b'{"stop":true}')]


def test_a_close_is_answered_with_its_code_and_ends_the_stream() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     ws: wsproto.WSConnection) -> Any:
        writer.write(_frame(0x2, _batch(1)) + _frame(0x8, (1001).to_bytes(2, "big") + b"bye"))
        return [e for e in await _events(reader, ws) if isinstance(e, CloseConnection)]

    async def client(stream: PopStream) -> list[Any]:
        return [await stream.receive(), await stream.receive()]

    got, closes = _run(script, client)
    assert got[0].seq == 1 and got[1] is None
    assert [c.code for c in closes] == [1001]


@pytest.mark.parametrize("bad", [
    _frame(0x2, _batch(1), masked=True),  # a server never masks
    _frame(0x0, b"{}"),                   # a continuation of nothing
    _frame(0x9, b"", fin=False),          # a fragmented control frame
    bytes((0xC2, 2)) + b"{}",             # an extension's bit, none agreed
])
def test_a_frame_no_server_sends_ends_the_stream_with_1002(bad: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     ws: wsproto.WSConnection) -> Any:
        writer.write(bad)
        return [e for e in await _events(reader, ws) if isinstance(e, CloseConnection)]

    async def client(stream: PopStream) -> Any:
        return await stream.receive()

    got, closes = _run(script, client)
    assert got is None
    assert [c.code for c in closes] == [1002]


def test_a_message_that_is_not_a_brokers_is_raised() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     ws: wsproto.WSConnection) -> None:
        writer.write(_frame(0x2, b'{"seq": "one"}'))
        await _events(reader, ws)

    async def client(stream: PopStream) -> Any:
        with pytest.raises(Exception) as raised:
            await stream.receive()
        return type(raised.value).__name__

    got, _ = _run(script, client)
    assert got == "ValidationError"


def test_frames_in_the_upgrades_own_packet_are_read() -> None:
    async def main() -> Any:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ws = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
            ws.receive_data(await reader.readuntil(b"\r\n\r\n"))
            list(ws.events())
            writer.write(ws.send(AcceptConnection()) + _frame(0x2, _batch(7)))
            await reader.read()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            stream = await PopStream.open(f"http://127.0.0.1:{port}", "q", None, {}, {}, 5)
            try:
                return await asyncio.wait_for(stream.receive(), 5)
            finally:
                await stream.aclose()
        finally:
            server.close()

    assert asyncio.run(main()).seq == 7


@pytest.mark.parametrize("answer", [b"", b"HTTP/1.1 101 Switching Protocols\r\n"])
def test_an_upgrade_left_unanswered_is_an_unreachable_broker(answer: bytes) -> None:
    from queen_trio.client.errors import BrokerUnreachable

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)  # then the connection ends, the answer cut short
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(BrokerUnreachable):
                await PopStream.open(f"http://127.0.0.1:{port}", "q", None, {}, {}, 5)
        finally:
            server.close()

    asyncio.run(main())
