"""The SDK's side of the broker's streaming pop (queen_trio/api/stream.py; the wire:
docs/http-api.md#streaming-pop): one WebSocket (wsproto on an anyio socket, so under trio and
asyncio) that brings a consumer's batches and takes their settlements back.

:meth:`PopStream.open` raises :class:`StreamUnsupported` when the broker answers the upgrade
404 (a broker without streams, or with QUEEN_STREAM_POP=off): the consumer then pops over
HTTP. Plain ``http://`` only; an ``https://`` broker is popped over HTTP.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import anyio.abc
import msgspec
import sniffio
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from .. import strict_json, wsframe
from ..models import codec
from ..models import log as wire_log
from . import calls
from .errors import BrokerUnreachable, error_from_response
from .models import AckStatus
from .models import Message as Handled
from .wire import Answer, Headers

_CHUNK = 65536
HANDSHAKE_S = 10.0
_ENCODE = msgspec.json.Encoder()


class FromBroker(msgspec.Struct):
    """One message of the broker (queen_trio/api/stream.py): a batch (``seq``, ``pop``), the
    refused settlements of a batch (``seq``, ``ackRefused``), a heartbeat (``idle``) or an
    ``error``."""

    seq: int | None = None
    pop: wire_log.PopResponse | None = None
    ackRefused: list[wire_log.AckResult] | None = None  # noqa: N815 - the wire's name
    idle: bool = False
    error: str | None = None
    message: str | None = None


_DECODE = msgspec.json.Decoder(FromBroker)


# What a consumer owes for a message it handled: its ``ack_entry`` dict, or the message itself
# for a plain completion (queen_trio/client/consumer.py builds no dict for those).
Owed = dict[str, Any] | Handled


def _settle_body(seq: int, owed: Sequence[Owed]) -> bytes:
    """Batch ``seq``'s settlement message: the common completion in one pass, else each
    owed acknowledgement as :func:`calls.compact_acks` writes them."""
    raw = _completed_body(seq, owed)
    if raw is None:
        body = calls.compact_acks([
            calls.ack_entry(o, AckStatus.COMPLETED, None) if isinstance(o, Handled) else o
            for o in owed])
        body["seq"] = seq
        raw = _ENCODE.encode(body)
    return raw


def _completed_body(seq: int, owed: Sequence[Owed]) -> bytes | None:
    """The common settlement, every message completed under one lease (each owed as the
    message itself), as :func:`calls.compact_acks` writes it (partitionId, leaseId and
    consumerGroup once, each message by its transactionId) in one pass; None for any
    other."""
    if not owed:
        return None
    first = owed[0]
    if type(first) is not Handled or first.lease_id is None:
        return None
    pid, lease, group = first.partition_id, first.lease_id, first.consumer_group
    txns = []
    for m in owed:
        if (type(m) is not Handled or m.lease_id != lease or m.partition_id != pid
                or m.consumer_group != group):
            return None
        txns.append({"transactionId": m.transaction_id})
    return _ENCODE.encode({"partitionId": pid, "leaseId": lease, "consumerGroup": group,
                           "acknowledgments": txns, "seq": seq})


class StreamUnsupported(Exception):
    """The broker offers no streaming pop."""


class PopStream:
    """One open stream. ``receive`` from one task; ``send`` from any."""

    def __init__(self, sock: anyio.abc.SocketStream | None, ws: wsproto.WSConnection) -> None:
        self.sock, self.ws = sock, ws
        self.lock = anyio.Lock()
        self.parts: list[bytes | str] = []
        self.events: collections.deque[Any] = collections.deque()
        self.closed = False
        self.stop_sent = False

    @classmethod
    async def open(cls, base_url: str, queue: str, partition: str | None,
                   params: dict[str, Any], headers: dict[str, str],
                   connect_timeout: float | None) -> PopStream:
        url = urlsplit(base_url)
        if url.scheme != "http" or url.hostname is None:
            raise StreamUnsupported(f"{base_url}: streams are plain http:// only")
        path = calls._pop_path(queue, partition).replace("/pop/", "/stream/", 1)
        target = f"{url.path.rstrip('/')}{path}?{urlencode(params)}"
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        stream: PopStream
        try:
            with anyio.fail_after(connect_timeout):
                if cls is PopStream and sniffio.current_async_library() == "asyncio":
                    native = stream = NativePopStream(ws)
                    await asyncio.get_running_loop().create_connection(
                        lambda: native, url.hostname, url.port or 80)
                else:
                    sock = await anyio.connect_tcp(url.hostname, url.port or 80)
                    stream = cls(sock, ws)
        except (OSError, TimeoutError) as exc:
            raise BrokerUnreachable(f"{base_url}: {exc}", [exc]) from exc
        try:
            # A broker that takes the connection but never answers the upgrade is a dead one.
            with anyio.fail_after(max(connect_timeout or 0, HANDSHAKE_S)):
                await stream._handshake(url.netloc, target, headers)
        except TimeoutError as exc:
            await stream.aclose()
            raise BrokerUnreachable(f"{base_url}: the stream's upgrade went unanswered",
                                    [exc]) from exc
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def _handshake(self, host: str, target: str, headers: dict[str, str]) -> None:
        extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await self._send_raw(self.ws.send(Request(host=host, target=target,
                                                  extra_headers=extra)))
        reject: RejectConnection | None = None
        body = bytearray()
        while True:
            event = await self._next_event()
            if isinstance(event, AcceptConnection):
                return
            if isinstance(event, RejectConnection):
                reject = event
                if not event.has_body:
                    break
            elif isinstance(event, RejectData):
                body += event.data
                if event.body_finished:
                    break
            elif event is None:
                raise BrokerUnreachable("the broker closed the stream's connection", [])
        assert reject is not None
        if reject.status_code in (404, 405):
            raise StreamUnsupported(f"the broker answered the stream {reject.status_code}")
        raise error_from_response(Answer(reject.status_code, Headers(list(reject.headers)),
                                         bytes(body)))

    async def _send_raw(self, data: bytes) -> None:
        assert self.sock is not None
        await self.sock.send(data)

    async def _next_event(self) -> Any:
        """The next wsproto event, or None once the connection has ended."""
        while not self.events:
            if self.closed:
                return None
            assert self.sock is not None
            try:
                data = await self.sock.receive(_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                data = None
            self.ws.receive_data(data)
            self.events.extend(self.ws.events())
            if data is None:
                self.closed = True
        return self.events.popleft()

    async def receive(self) -> FromBroker | None:
        """The broker's next message, or None once the stream has ended."""
        while True:
            event = await self._next_event()
            if event is None:
                return None
            if isinstance(event, Message):
                assert isinstance(event, TextMessage | BytesMessage)
                self.parts.append(bytes(event.data) if isinstance(event.data, bytearray)
                                  else event.data)
                if not event.message_finished:
                    continue
                parts, self.parts = self.parts, []
                raw = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
                decoded = codec.fast(raw, _DECODE)
                if decoded is codec.FALLBACK:  # refused, naming why, or taken precisely
                    decoded = msgspec.convert(strict_json.loads(raw), FromBroker)
                return decoded
            if isinstance(event, Ping):
                await self._write(event.response())
            elif isinstance(event, CloseConnection):
                if self.ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    await self._write(event.response())
                self.closed = True
                return None

    async def settle(self, seq: int, owed: Sequence[Owed]) -> None:
        """Batch ``seq`` is done: its settlements (``ack_entry`` dicts, or a message for its
        completion; may be empty)."""
        await self._write(BytesMessage(_settle_body(seq, owed)))

    async def stop(self) -> None:
        """Ask for no more batches (once); the broker closes when its pop has answered."""
        if not self.stop_sent and not self.closed:
            self.stop_sent = True
            await self._write(BytesMessage(b'{"stop":true}'))

    async def _write(self, event: Any) -> None:
        lock = self.lock
        if not lock.locked():
            # Free (the common case): taken without the trips through the event loop that
            # ``async with`` makes.
            lock.acquire_nowait()
            try:
                await self._write_locked(event)
            finally:
                lock.release()
            return
        async with lock:
            await self._write_locked(event)

    async def _write_locked(self, event: Any) -> None:
        if self.closed:
            raise BrokerUnreachable("the stream has ended", [])
        assert self.sock is not None
        try:
            await self.sock.send(self.ws.send(event))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise BrokerUnreachable(f"the stream broke: {exc}", [exc]) from exc

    async def aclose(self) -> None:
        self.closed = True
        assert self.sock is not None
        with anyio.CancelScope(shield=True):
            try:
                await self.sock.aclose()
            except (OSError, anyio.BrokenResourceError):
                pass


# -- under asyncio: the socket's own protocol, no reader task ---------------------------------

_OP_CONTINUATION, _OP_TEXT, _OP_BINARY = 0x0, 0x1, 0x2
_OP_CLOSE, _OP_PING, _OP_PONG = 0x8, 0x9, 0xA
_PROTOCOL_ERROR = 1002


def _frame(opcode: int, payload: bytes) -> bytes:
    """One whole client frame (RFC 6455 5.2): FIN, ``opcode``, masked ``payload``."""
    key = os.urandom(4)  # a fresh key per frame, as the RFC asks of a client
    return wsframe.head(0x80 | opcode, len(payload), masked=True) + key + wsframe.xor(payload, key)


class NativePopStream(PopStream, asyncio.Protocol):
    """A :class:`PopStream` under asyncio: the connection's own :class:`asyncio.Protocol`.

    The upgrade goes through wsproto as :class:`PopStream`'s does; after it, the broker's
    frames are parsed as they arrive (``data_received``, called by the event loop itself:
    no reader task, no anyio socket, no wsproto per frame) and each message is decoded there.
    A consumer may take them there too (``on_message``, called in order with each message),
    else they wait for :meth:`receive`. Writes are whole frames given to the transport, so a
    settlement does not suspend (unless the transport asks to wait for its buffer to drain).
    """

    def __init__(self, ws: wsproto.WSConnection) -> None:
        super().__init__(None, ws)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.upgraded = self.refused = False
        self.head = b""  # the upgrade's answer until it is whole
        self.rest = bytearray()  # a frame not yet whole
        self.needed = 0  # how long it must be before it is looked at again
        self.fragments: list[bytes] = []  # a message's frames before its last
        self.received: collections.deque[FromBroker] = collections.deque()
        self.on_message: Callable[[NativePopStream, FromBroker], None] | None = None
        self.heard = self.loop.time()  # the last message's instant
        self.ended = False  # the connection is gone (or ended by a close or an error)
        self.error: BaseException | None = None  # a message that could not be read
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None  # set while writing is paused

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = self.closed = True
        if not self.upgraded:  # the upgrade's answer ends with the connection
            with contextlib.suppress(wsproto.utilities.ProtocolError):  # cut short
                self.ws.receive_data(None)
                self.events.extend(self.ws.events())
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self.upgraded:
            data = self._upgrade(data)
            if not data:
                return
        rest = self.rest
        if rest:
            rest += data
            if len(rest) < self.needed:  # (a large frame: not looked at again per read)
                return
            data, self.rest = bytes(rest), bytearray()
        try:
            self._frames(data)
        except BaseException as exc:  # a bug of ours or a message not read: end, then raise
            self.error = exc
            self._end()

    # -- the upgrade (wsproto) ----------------------------------------------------------

    def _upgrade(self, data: bytes) -> bytes:
        """The upgrade's answer to wsproto, as :meth:`PopStream._next_event` reads it; what
        follows an accepted upgrade (frames already) is answered, for the frame parser."""
        if self.refused:  # a refusal's body: wsproto reads it
            self._to_wsproto(data)
            return b""
        head = self.head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self.head = head
            return b""
        self.head, rest = b"", head[end + 4:]
        self._to_wsproto(head[:end + 4])
        if any(isinstance(e, AcceptConnection) for e in self.events):
            self.upgraded = True
            return rest
        self.refused = True
        if rest:
            self._to_wsproto(rest)
        return b""

    def _to_wsproto(self, data: bytes) -> None:
        self.ws.receive_data(data)
        self.events.extend(self.ws.events())
        self._wake()

    async def _send_raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def _next_event(self) -> Any:
        """The upgrade's next wsproto event, or None once the connection has ended."""
        while not self.events:
            if self.ended:
                return None
            await self._wait()
        return self.events.popleft()

    # -- frames -------------------------------------------------------------------------

    def _frames(self, data: bytes) -> None:
        """Each whole frame of ``data`` (RFC 6455 5.2; a server's frames are not masked);
        what is left of it waits for the next bytes."""
        at, size = 0, len(data)
        needed = 0
        while size - at >= 2 and not self.ended:
            b0, b1 = data[at], data[at + 1]
            length, start = b1 & 0x7F, at + 2
            if length == 126:
                if size - start < 2:
                    break
                length, start = int.from_bytes(data[start:start + 2], "big"), start + 2
            elif length == 127:
                if size - start < 8:
                    break
                length, start = int.from_bytes(data[start:start + 8], "big"), start + 8
            if size - start < length:
                needed = start + length - at
                break
            at = start + length
            if b1 & 0x80 or b0 & 0x70:  # masked by the server, or an extension's bits
                self._fail()
                return
            self._frame(b0, data[start:at])
        if at < size and not self.ended:
            self.rest, self.needed = bytearray(data[at:]), needed

    def _frame(self, b0: int, payload: bytes) -> None:
        opcode, fin = b0 & 0x0F, b0 & 0x80
        if opcode in (_OP_TEXT, _OP_BINARY):
            if self.fragments:  # a new message inside another
                self._fail()
            elif fin:
                self._message(payload)
            else:
                self.fragments.append(payload)
        elif opcode == _OP_CONTINUATION:
            if not self.fragments:
                self._fail()
                return
            self.fragments.append(payload)
            if fin:
                parts, self.fragments = self.fragments, []
                self._message(b"".join(parts))
        elif not fin or len(payload) > 125:  # control frames are whole and short
            self._fail()
        elif opcode == _OP_PING:
            self._reply(_OP_PONG, payload)
        elif opcode == _OP_CLOSE:
            # Answered as wsproto answers it (its code echoed), then the connection ends.
            self._reply(_OP_CLOSE, payload[:2] if len(payload) >= 2 else b"")
            self._end()
        elif opcode != _OP_PONG:
            self._fail()

    def _message(self, raw: bytes) -> None:
        decoded = codec.fast(raw, _DECODE)
        if decoded is codec.FALLBACK:  # refused, naming why, or taken precisely
            decoded = msgspec.convert(strict_json.loads(raw), FromBroker)
        self.heard = self.loop.time()
        take = self.on_message
        if take is not None:
            take(self, decoded)
        else:
            self.received.append(decoded)
            self._wake()

    def _fail(self) -> None:
        """A frame no broker sends: closed as wsproto closes it (1002), then ended."""
        self._reply(_OP_CLOSE, _PROTOCOL_ERROR.to_bytes(2, "big"))
        self._end()

    def _end(self) -> None:
        self.ended = self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._wake()

    # -- waiting ------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, within: float | None = None) -> None:
        """Until something happens (a message, the end), or ``within`` seconds."""
        waiter = self.waiter = self.loop.create_future()
        timer = None if within is None else self.loop.call_later(within, self._wake)
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    async def wait_ended(self, within: float) -> bool:
        """Whether the stream ends within ``within`` seconds (a message also wakes it: the
        caller looks again)."""
        if not self.ended:
            await self._wait(within)
        return self.ended

    async def receive(self) -> FromBroker | None:
        while True:
            if self.received:
                return self.received.popleft()
            if self.error is not None:
                error, self.error = self.error, None
                raise error
            if self.ended:
                return None
            await self._wait()

    # -- writing ------------------------------------------------------------------------

    def _send(self, opcode: int, payload: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            raise BrokerUnreachable("the stream has ended", [])
        transport.write(_frame(opcode, payload))

    def _reply(self, opcode: int, payload: bytes) -> None:
        """A control frame's answer, unless the connection is going already."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_frame(opcode, payload))

    def settle_nowait(self, seq: int, owed: Sequence[Owed]) -> None:
        """:meth:`settle`, written at once (the transport buffers it)."""
        self._send(_OP_BINARY, _settle_body(seq, owed))

    async def settle(self, seq: int, owed: Sequence[Owed]) -> None:
        if self.ended:
            raise BrokerUnreachable("the stream has ended", [])
        self.settle_nowait(seq, owed)
        await self._drained()

    async def stop(self) -> None:
        if not self.stop_sent and not self.closed:
            self.stop_sent = True
            self._send(_OP_BINARY, b'{"stop":true}')
            await self._drained()

    async def _write(self, event: Any) -> None:
        if self.ended:
            raise BrokerUnreachable("the stream has ended", [])
        assert isinstance(event, BytesMessage | TextMessage)
        if isinstance(event, TextMessage):
            self._send(_OP_TEXT, event.data.encode())
        else:
            self._send(_OP_BINARY, bytes(event.data))
        await self._drained()

    async def _drained(self) -> None:
        """Whatever was written is on its way: wait only while the transport asks to."""
        drained = self.drained
        if drained is not None:
            await asyncio.shield(drained)

    async def aclose(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
