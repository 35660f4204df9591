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
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from functools import partial
from typing import Any

import h11
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import Response
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask

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


async def _read_data(self: Any) -> None:
    try:
        await _ORIGINAL_READ(self)
    finally:
        # The client closed (or the connection was closed): nothing is left to time out.
        with trio.CancelScope(shield=True):
            await self.idle_task.stop()


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
