"""Every connection ends when HTTP says it should: idle, ``Connection: close``, HTTP/1.0.

hypercorn 0.18's trio server finishes a response inside the app's last ``send``: it restarts the
connection's idle timer, or closes the connection (``Connection: close``, HTTP/1.0, a body the
app never read). Both steps wait at checkpoints, and quart-trio cancels its request task as soon
as hypercorn reports ``http.disconnect``, which hypercorn does in that same call just before
them. So once a connection had carried one request it was never timed out nor closed, whatever
the client asked (docs/upstream/hypercorn-keep-alive.md).

:func:`install` changes hypercorn's trio ``TCPServer`` and ``H11Protocol`` (pinned in
pyproject.toml; the contract is checked by tests/unit/test_hypercorn_hooks.py):

- the connection's own steps (the idle timer, the close) are shielded from the cancellation of
  the task that asked for them;
- an answer that goes out before the request's body has all arrived (a 401 or 413 decided
  early) says ``Connection: close``: hypercorn closes such a connection after the answer, and
  the client must not send its next request on it;
- a close is a lingering one: FIN right after the answer, then what the client still sends is
  read and dropped until it closes or :data:`LINGER_S` pass. A client refused before its upload
  ended is still writing; closing at once would reset the connection under an answer it has
  not read yet;
- when the client closes, the idle timer stops, so the descriptor is released at once, not
  after ``QUEEN_HTTP_IDLE_TIMEOUT_S`` (hypercorn's own behaviour, hidden by the first bug).

Two changes make each keep-alive request cheaper (issue 32: the broker's CPU per request):

- an answer's head is written together with its body: hypercorn writes the head, the body and
  the (empty) end of a sized answer as three socket writes, each behind the send lock and a
  shielded scope; a head with a ``Content-Length`` is now held until the body (or the end)
  follows, and nothing empty is written. A streamed answer (no length) still sends its head
  at once, so that a client sees it before the first chunk;
- a write takes the connection's send lock without a trip through the scheduler when it is
  free (it nearly always is);
- the idle timer is one task per connection whose deadline each request moves (to infinity
  when a request starts, to ``QUEEN_HTTP_IDLE_TIMEOUT_S`` from now after its answer):
  hypercorn stopped the timer task at every request (a cancellation unwound through it) and
  started a new one after every answer, each behind a lock and, for the start, a round trip
  through the scheduler (``nursery.start``).

:class:`DirectWebSocket` is hypercorn's side of one WebSocket over HTTP/1.1, for the streaming
pop (api/stream.py), which sends and receives a message per batch each way: its messages are
sent and received there without Quart's wrappers and tasks in between (issue 32).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import h11
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Data, Response
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol, H11WSConnection
from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import TrioSingleTask
from wsproto import ConnectionState
from wsproto.events import BytesMessage
from wsproto.utilities import LocalProtocolError

from .. import wsframe

# Long enough for a refused client to finish writing what it has in flight and read the answer;
# short enough that a client who never stops sending holds its descriptor only briefly.
LINGER_S = 2.0

_ORIGINAL_SEND = TCPServer.protocol_send
_ORIGINAL_READ = TCPServer._read_data
_ORIGINAL_STREAM_SEND = H11Protocol.stream_send
_ORIGINAL_SEND_H11 = H11Protocol._send_h11_event
_ORIGINAL_IDLE = TCPServer._idle_timeout
_ORIGINAL_RESTART = TrioSingleTask.restart
_LINGERING = "_queen_lingering"
_CLOCK = "_queen_idle_clock"
_HELD = "_queen_held_head"  # the encoded head of a sized answer, written with what follows
_DIRECT = "_queen_direct_ws"  # the connection's WebSocket, diverted (DirectWebSocket.divert)


async def _send_h11_event(self: Any, event: Any) -> None:
    """hypercorn's ``H11Protocol._send_h11_event``, writing a sized answer's head with its body."""
    held = self.__dict__.pop(_HELD, b"")
    try:
        data = self.connection.send(event)
    except h11.LocalProtocolError:
        if self.connection.their_state != h11.ERROR:
            raise
        data = b""
    else:
        if type(event) is h11.Response and _sized(event):
            self.__dict__[_HELD] = held + data
            return
    data = held + data
    if data:
        await self.send(RawData(data=data))


def _sized(response: h11.Response) -> bool:
    return any(name == b"content-length" for name, _ in response.headers)


def _idle_clock(self: Any) -> trio.CancelScope:
    """The scope of the connection's idle timer, whose deadline is the connection's: created
    unentered (the timer task enters it once it runs) so that a request may move it first."""
    clock: trio.CancelScope | None = self.__dict__.get(_CLOCK)
    if clock is None:
        clock = self.__dict__[_CLOCK] = trio.CancelScope(
            deadline=trio.current_time() + self.config.keep_alive_timeout)
    return clock


async def _idle_timeout(self: Any) -> None:
    """hypercorn's ``TCPServer._idle_timeout`` for the whole connection: close it once idle
    past its deadline, or at shutdown if idle then (a busy one closes after its answer)."""
    with _idle_clock(self) as clock:
        await self.context.terminated.wait()
        if clock.deadline == math.inf:  # busy: its answer ends the connection (or a deadline)
            await trio.sleep_forever()
    with trio.CancelScope(shield=True):
        await self._initiate_server_close()


async def _restart_timer(self: TrioSingleTask, task_group: Any, action: Any) -> None:
    """``TrioSingleTask.restart`` without a lock or waiting for the new task: nothing here
    awaits, so no other task can interleave; a scope cancelled before its task enters it
    cancels the task as soon as it starts."""
    if self._handle is not None:
        self._handle.cancel()
    self._handle = scope = trio.CancelScope()
    task_group._nursery.start_soon(_run_timer, scope, action)


async def _stop_timer(self: TrioSingleTask) -> None:
    if self._handle is not None:
        self._handle.cancel()
    self._handle = None


async def _run_timer(scope: trio.CancelScope, action: Any) -> None:
    with scope:
        await action()


async def _stream_send(self: Any, event: StreamEvent) -> None:
    if (isinstance(event, Response) and event.status_code >= 200
            and self.connection.their_state is h11.SEND_BODY):
        event = dataclasses.replace(event, headers=[*event.headers, (b"connection", b"close")])
    await _ORIGINAL_STREAM_SEND(self, event)


async def _protocol_send(self: Any, event: Event) -> None:
    if isinstance(event, Closed):
        with trio.CancelScope(shield=True):
            await _half_close(self.stream)
            if not getattr(self, _LINGERING, False):  # the first close starts the one linger
                setattr(self, _LINGERING, True)
                await self.idle_task.restart(self._task_group, partial(_close_after_linger, self))
        await self.protocol.handle(Closed())
    elif isinstance(event, RawData):
        await _write(self, event.data)
    elif isinstance(event, Updated):
        _idle_clock(self).deadline = (trio.current_time() + self.config.keep_alive_timeout
                                      if event.idle else math.inf)
    else:
        await _ORIGINAL_SEND(self, event)


async def _write(self: Any, data: bytes) -> None:
    """hypercorn's write (under the send lock, shielded: a write cut short would corrupt the
    stream), taking a free lock without a trip through the scheduler (``Lock.acquire`` yields
    even when the lock is free; the write itself still checkpoints)."""
    lock = self.send_lock
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    try:
        with trio.CancelScope(shield=True):
            await self.stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await self.protocol.handle(Closed())
    finally:
        lock.release()


async def _write_now(self: Any, data: bytes) -> None:
    """:func:`_write` of a plain socket's connection whose send lock is free: written at once,
    without the trip through the scheduler trio's ``send_all`` makes after a write that did
    not have to wait (a WebSocket message per batch under a steady flow); what the socket does
    not take at once is written by ``send_all``, waiting for room."""
    lock, stream = self.send_lock, self.stream
    if type(stream) is not trio.SocketStream:
        await _write(self, data)
        return
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await _write(self, data)
        return
    try:
        try:
            written = os.write(stream.socket.fileno(), data)
        except BlockingIOError:
            written = 0
        except OSError as exc:  # (what trio's send_all raises then)
            raise trio.BrokenResourceError from exc
        if written < len(data):
            with trio.CancelScope(shield=True):
                await stream.send_all(memoryview(data)[written:])
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await self.protocol.handle(Closed())
    finally:
        lock.release()


async def _read_data(self: Any) -> None:
    try:
        if type(self.stream) is trio.SocketStream and not self.config.read_timeout:
            await _read_socket(self, self.stream.socket.fileno())
        else:
            await _ORIGINAL_READ(self)
    finally:
        # The client closed (or the connection was closed): nothing is left to time out.
        with trio.CancelScope(shield=True):
            await self.idle_task.stop()


async def _read_socket(self: Any, fd: int) -> None:
    """hypercorn's ``TCPServer._read_data`` for a plain socket without a read timeout (the
    default), cheaper per read: no cancel scope around each (``fail_after(inf)``), the socket
    read once it is readable (trio's ``receive_some`` first tries, fails with EAGAIN, waits,
    then reads again), and what a diverted WebSocket receives handed straight to its stream
    (:meth:`DirectWebSocket.divert`) rather than through hypercorn's protocol layers, which
    pass it through unchanged (a settlement per batch under a steady flow, issue 32). The
    end of the stream, a reset or a local close ends the loop as hypercorn's does."""
    while True:
        try:
            await trio.lowlevel.wait_readable(fd)
            data = os.read(fd, MAX_RECV)
        except BlockingIOError:
            continue  # (woken without data after all)
        except (OSError, trio.ClosedResourceError, trio.BrokenResourceError):
            break
        ws = self.__dict__.get(_DIRECT)
        if ws is not None and data and _passes_through(self.protocol, ws):
            message = _whole_message(ws, data)
            if message is not None:
                await ws.app_put(message)  # (what WSStream.handle would have put)
            else:
                await ws.handle(Data(stream_id=ws.stream_id, data=data))
        else:
            await self.protocol.handle(RawData(data))
        if not data:
            break
    await self.protocol.handle(Closed())


def _passes_through(wrapper: Any, ws: WSStream) -> bool:
    """Whether hypercorn's HTTP/1.1 protocol would hand what is read to ``ws`` unchanged:
    upgraded (its connection an ``H11WSConnection``) with nothing buffered, ``ws`` its
    stream."""
    protocol = wrapper.protocol
    return (type(protocol) is H11Protocol and protocol.stream is ws
            and type(protocol.connection) is H11WSConnection and not protocol.connection.buffer)


def _whole_message(ws: WSStream, data: bytes) -> dict[str, Any] | None:
    """The ASGI message hypercorn's ``WSStream`` puts for ``data`` when ``data`` is exactly one
    whole message in one frame from the client (FIN, no RSV bits, binary or text in valid
    UTF-8, masked, its length in 7 or 16 bits and at most the configured message size) and
    the WebSocket is open with no extension, nothing buffered by wsproto and no message in
    progress: read here without wsproto's parser (its generators and the payload's copies:
    a settlement per batch under a steady flow). None: anything else, which wsproto reads
    and judges as before (a close, a ping, a fragment, a protocol error)."""
    n = len(data)
    if n < 6 or data[0] not in _WHOLE_OPCODES or not data[1] & 0x80:
        return None
    length = data[1] & 0x7F
    if length == 126:
        if n < 8:
            return None
        length, start = (data[2] << 8) | data[3], 8
        if length < 126:
            return None
    elif length == 127:
        return None
    else:
        start = 6
    connection = getattr(ws, "connection", None)  # (set once accepted)
    proto = getattr(connection, "_proto", None)
    if (connection is None or n != start + length or length > ws.config.websocket_max_message_size
            or connection.state is not ConnectionState.OPEN or proto is None or proto.client
            or proto.extensions or ws.buffer.value is not None
            or proto._message_decoder.opcode is not None):
        return None
    decoder = proto._frame_decoder
    if decoder.header is not None or len(decoder.buffer):
        return None
    payload = wsframe.xor(data[start:], data[start - 4:start])
    if data[0] == 0x82:
        return {"type": "websocket.receive", "bytes": payload, "text": None}
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return None  # (wsproto closes with 1007)
    return {"type": "websocket.receive", "bytes": None, "text": text}


_WHOLE_OPCODES = frozenset((0x81, 0x82))  # FIN, no RSV bits, text or binary


async def _half_close(stream: Any) -> None:
    try:
        await stream.send_eof()
    except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError,
            AttributeError):  # gone already, or a TLS stream (no half-close)
        pass


async def _close_after_linger(self: Any) -> None:
    with trio.move_on_after(LINGER_S):
        await self.context.terminated.wait()  # a shutdown ends the linger
    with trio.CancelScope(shield=True):
        await self._initiate_server_close()
    # A read loop that h11 paused (the client sent another request after its last answer)
    # would never notice the socket closing: end the connection's tasks too.
    self._task_group._nursery.cancel_scope.cancel()


#: The ASGI scope's key under which api/fast.py leaves a WebSocket's ASGI ``send`` (hypercorn's
#: ``WSStream.app_send``) for :meth:`DirectWebSocket.of`.
ASGI_SEND = "queen.asgi_send"


class DirectWebSocket:
    """hypercorn's side of one WebSocket over HTTP/1.1 (its ``WSStream``), used without Quart's
    wrappers: a message sent is wsproto's frame written on the connection (:func:`_write`, as
    hypercorn writes it) rather than a trip through quart-trio's ``send_data``, its
    ``websocket_sent`` signal, hypercorn's ``app_send``, ``H11Protocol.stream_send`` and
    ``protocol_send``; a message received is handed to ``on_message`` on the connection's own
    task (:meth:`divert`) rather than through two memory channels and quart-trio's
    ``handle_messages`` task (with its ``websocket_received`` signal). Only a binary message
    is sent here, as Quart sends bytes. Anything else (the accept, the close, a disconnect)
    still goes through Quart and hypercorn as usual."""

    def __init__(self, ws_stream: WSStream, server: TCPServer) -> None:
        self._ws = ws_stream
        self._server = server

    @classmethod
    def of(cls, scope: Any) -> DirectWebSocket | None:
        """The WebSocket of this ASGI ``scope`` (api/fast.py leaves its ``send`` there), if
        hypercorn serves it over HTTP/1.1 as this module knows it; else None."""
        send = scope.get(ASGI_SEND)
        ws_stream = getattr(send, "__self__", None)
        if type(ws_stream) is not WSStream:
            return None
        protocol = getattr(ws_stream.send, "__self__", None)
        server = getattr(getattr(protocol, "send", None), "__self__", None)
        if type(protocol) is not H11Protocol or type(server) is not TCPServer:
            return None
        return cls(ws_stream, server)

    def divert(self, on_message: Callable[[bytes | str | None], Awaitable[None]]) -> None:
        """From now on, each message received is given to ``on_message`` (awaited on the
        connection's task: a slow one holds the connection's reads, which is the
        backpressure Quart's bounded queues gave); the disconnect still reaches Quart, which
        ends the handler. Call before accepting: no message can have been queued for Quart
        yet."""
        app_put = self._ws.app_put
        assert app_put is not None  # (set as the app was started, before the handler ran)

        async def put(message: Any) -> None:
            if message["type"] == "websocket.receive":
                await on_message(message.get("bytes") or message["text"])  # (as Quart reads it)
            else:
                await app_put(message)

        self._ws.app_put = put
        # (What the connection reads is handed to the WebSocket's stream directly: _read_socket.)
        self._server.__dict__[_DIRECT] = self._ws

    async def send(self, data: bytes) -> bool:
        """Send ``data`` as one binary message; False: not sent here (not connected, or closed
        already): the caller sends it through Quart, which does what it does then."""
        ws = self._ws
        if ws.closed or ws.state is not ASGIWebsocketState.CONNECTED:
            return False
        frame = _binary_frame(ws.connection, data)
        if frame is None:
            try:
                frame = ws.connection.send(BytesMessage(data=data))
            except LocalProtocolError:  # (closing: hypercorn drops it likewise)
                return True
        await _write_now(self._server, frame)
        return True


def _binary_frame(connection: Any, data: bytes) -> bytes | None:
    """The frame wsproto's server side sends for ``data`` as one whole binary message (FIN,
    opcode 2, unmasked, the length in 7, 16 or 64 bits), built without wsproto's four copies
    of the payload; None when wsproto must build it: not open, a client's side (masked), an
    extension (permessage-deflate) or a fragmented message in progress."""
    proto = getattr(connection, "_proto", None)
    if (connection.state is not ConnectionState.OPEN or proto is None or proto.client
            or proto.extensions or proto._outbound_opcode is not None):
        return None
    return wsframe.head(0x82, len(data), masked=False) + data


class _AtMostEvery(logging.Filter):
    """Let one record through per ``seconds``: trio logs a traceback every 100 ms while
    accept(2) fails for want of descriptors, and keeps retrying (what we want)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds, self.last = seconds, -seconds

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True


def install() -> None:
    """Patch hypercorn's trio TCPServer and its HTTP/1.1 protocol (idempotent)."""
    if TCPServer.protocol_send is not _protocol_send:
        TCPServer.protocol_send = _protocol_send  # type: ignore[method-assign]
        TCPServer._read_data = _read_data  # type: ignore[method-assign]
        TCPServer._idle_timeout = _idle_timeout  # type: ignore[method-assign]
        H11Protocol.stream_send = _stream_send  # type: ignore[method-assign]
        H11Protocol._send_h11_event = _send_h11_event  # type: ignore[method-assign]
        TrioSingleTask.restart = _restart_timer  # type: ignore[method-assign]
        TrioSingleTask.stop = _stop_timer  # type: ignore[method-assign]
        logging.getLogger("trio.serve_listeners").addFilter(_AtMostEvery(10.0))
