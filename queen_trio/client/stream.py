"""The SDK's side of the broker's streaming pop (queen_trio/api/stream.py; the wire:
docs/http-api.md#streaming-pop): one WebSocket (wsproto on an anyio socket, so under trio and
asyncio) that brings a consumer's batches and takes their settlements back.

:meth:`PopStream.open` raises :class:`StreamUnsupported` when the broker answers the upgrade
404 (a broker without streams, or with QUEEN_STREAM_POP=off): the consumer then pops over
HTTP. Plain ``http://`` only; an ``https://`` broker is popped over HTTP.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import anyio.abc
import msgspec
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

from .. import strict_json
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

    def __init__(self, sock: anyio.abc.SocketStream, ws: wsproto.WSConnection) -> None:
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
        try:
            with anyio.fail_after(connect_timeout):
                sock = await anyio.connect_tcp(url.hostname, url.port or 80)
        except (OSError, TimeoutError) as exc:
            raise BrokerUnreachable(f"{base_url}: {exc}", [exc]) from exc
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        stream = cls(sock, ws)
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
        await self.sock.send(self.ws.send(Request(host=host, target=target,
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

    async def _next_event(self) -> Any:
        """The next wsproto event, or None once the connection has ended."""
        while not self.events:
            if self.closed:
                return None
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
        raw = _completed_body(seq, owed)
        if raw is None:
            body = calls.compact_acks([
                calls.ack_entry(o, AckStatus.COMPLETED, None) if isinstance(o, Handled) else o
                for o in owed])
            body["seq"] = seq
            raw = _ENCODE.encode(body)
        await self._write(BytesMessage(raw))

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
        try:
            await self.sock.send(self.ws.send(event))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise BrokerUnreachable(f"the stream broke: {exc}", [exc]) from exc

    async def aclose(self) -> None:
        self.closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self.sock.aclose()
            except (OSError, anyio.BrokenResourceError):
                pass
