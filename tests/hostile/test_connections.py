"""Connections end when HTTP says so, on every request of a connection.

Once, a connection that had carried one request was never closed by the broker: not
when idle, not for ``Connection: close``, not for HTTP/1.0; and the request-head deadline only
covered a connection's first request. 1,009 such connections locked every client out of a
broker with 1,024 descriptors (queen_trio/api/connections.py has the cause).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from ..brokers import BrokerProcess
from ..pgserver import Databases
from .conftest import start_broker

IDLE_S = 2  # QUEEN_HTTP_IDLE_TIMEOUT_S of these brokers (75 by default)
HEALTH = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def impatient(databases: Databases) -> Iterator[BrokerProcess]:
    yield from start_broker(databases, "impatient-connections",
                            env={"QUEEN_HTTP_IDLE_TIMEOUT_S": str(IDLE_S)})


def read_answer(s: socket.socket) -> bytes:
    """One whole answer to a GET /health (its body is a JSON object)."""
    got = b""
    while not (b"\r\n\r\n" in got and got.rstrip().endswith(b"}")):
        chunk = s.recv(65536)
        assert chunk, f"closed before the answer: {got!r}"
        got += chunk
    return got


def seconds_until_closed(s: socket.socket, limit: float) -> float | None:
    """Seconds until the broker ends the connection (EOF or reset); None if it stays open."""
    started = time.monotonic()
    s.settimeout(limit)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.parametrize("requests", [1, 3])
def test_a_connection_left_idle_after_its_requests_is_closed(
    impatient: BrokerProcess, requests: int
) -> None:
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=5) as s:
        for _ in range(requests):
            s.sendall(HEALTH)
            assert read_answer(s).startswith(b"HTTP/1.1 200")
        elapsed = seconds_until_closed(s, limit=IDLE_S + 8)
    assert elapsed is not None, "still open after the idle timeout"
    assert IDLE_S - 0.5 <= elapsed < IDLE_S + 4, elapsed
    print(f"\nidle after {requests} request(s): closed {elapsed:.2f}s after the last answer")


@pytest.mark.parametrize("request_", [
    b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    b"GET /health HTTP/1.0\r\n\r\n",  # HTTP/1.0 without keep-alive
], ids=["connection-close", "http-1.0"])
def test_a_connection_is_closed_after_the_answer_when_the_client_asks(
    impatient: BrokerProcess, request_: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=5) as s:
        s.sendall(HEALTH)  # a first request on the connection: the bug spared the first
        assert read_answer(s).startswith(b"HTTP/1.1 200")
        s.sendall(request_)
        assert b" 200 " in read_answer(s).split(b"\r\n", 1)[0]
        elapsed = seconds_until_closed(s, limit=IDLE_S + 8)
    assert elapsed is not None and elapsed < 1.0, elapsed  # at once, not at the idle timeout


def test_every_request_head_of_a_connection_has_a_deadline(impatient: BrokerProcess) -> None:
    """The slow-loris guard on the second request of a connection: its head trickles in one
    byte every 100 ms and is cut off after the idle timeout, unanswered."""
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=5) as s:
        s.sendall(HEALTH)
        read_answer(s)
        s.settimeout(0.1)
        started, got, closed = time.monotonic(), b"", False
        for byte in b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
            with contextlib.suppress(TimeoutError):
                chunk = s.recv(65536)
                if not chunk:
                    closed = True
                    break
                got += chunk
            try:
                s.send(bytes([byte]))
            except OSError:
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed, f"the head trickled for {elapsed:.1f}s and the connection stayed open"
    assert IDLE_S - 0.5 <= elapsed < IDLE_S + 4, elapsed
    assert b"HTTP/1.1 200" not in got


def broker_fds(broker: BrokerProcess) -> int:
    return len(os.listdir(f"/proc/{broker.pid}/fd"))


def test_a_client_that_closes_frees_its_descriptor_at_once(
    live_broker: BrokerProcess,
) -> None:
    """With the default 75 s idle timeout, 100 keep-alive connections the clients close after
    one request each: the broker's descriptors are back where they were within a second or
    two, not 75 s later."""
    before = broker_fds(live_broker)
    for _ in range(100):
        with socket.create_connection(("127.0.0.1", live_broker.port), timeout=5) as s:
            s.sendall(HEALTH)
            read_answer(s)
            time.sleep(0.005)  # the broker is idle on this connection when the client closes
    closed_at = time.monotonic()
    while broker_fds(live_broker) > before + 5 and time.monotonic() < closed_at + 10:
        time.sleep(0.05)
    assert broker_fds(live_broker) <= before + 5, (before, broker_fds(live_broker))
    print(f"\n100 client-closed connections: broker descriptors back to {broker_fds(live_broker)}"
          f" ({before} before) {time.monotonic() - closed_at:.2f}s after the last close")


FD_LIMIT = 256
FLOOD_IDLE_S = 5  # long enough for the whole flood to be in before the first idle close


def test_more_connections_than_descriptors_still_lets_new_clients_in(
    databases: Databases,
) -> None:
    """The broker gets 256 descriptors; 300 connections each send one request and then idle.
    Those it could not accept wait in the backlog; the idle ones are closed after the idle
    timeout, which lets the rest in, and a new client is answered within a few seconds."""
    broker = next(gen := start_broker(databases, "few-descriptors",
                                      env={"QUEEN_HTTP_IDLE_TIMEOUT_S": str(FLOOD_IDLE_S)}))
    flood: list[socket.socket] = []
    try:
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))
        for _ in range(300):
            try:
                s = socket.create_connection(("127.0.0.1", broker.port), timeout=2)
                s.sendall(HEALTH)
            except OSError:
                continue  # the backlog is full too: this one never got in
            flood.append(s)
        assert len(flood) > FD_LIMIT, len(flood)
        deadline = time.monotonic() + 5
        while "EMFILE" not in broker.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "EMFILE" in broker.stderr(), broker.stderr()  # it did run out of descriptors

        started = time.monotonic()
        r = httpx.get(f"{broker.url}/health", timeout=30)
        waited = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert waited < FLOOD_IDLE_S + 10, waited
        print(f"\n{len(flood)} flood connections on {FD_LIMIT} descriptors: a new client "
              f"answered after {waited:.1f}s (idle timeout {FLOOD_IDLE_S}s)")

        # The flood connections were answered, then closed for being idle.
        answered = 0
        for s in flood:
            s.settimeout(FLOOD_IDLE_S + 15)
            got = b""
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    got += chunk
            answered += got.startswith(b"HTTP/1.1 200")
        assert answered == len(flood), (answered, len(flood))
        assert broker.alive, broker.stderr()
    finally:
        for s in flood:
            s.close()
        with contextlib.suppress(StopIteration):
            next(gen)


def test_a_client_refused_mid_upload_reads_its_answer_and_no_reset(
    impatient: BrokerProcess,
) -> None:
    """A client still writing its body when it is refused (here 405, decided from the head)
    gets its answer with ``Connection: close``, can go on writing for a moment without being
    reset, and then sees the connection end cleanly: the broker half-closes and drops what
    still arrives (connections.py LINGER_S) instead of resetting the connection under an answer
    the client has not read."""
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=5) as s:
        s.sendall(b"PATCH /api/v1/push HTTP/1.1\r\nHost: localhost\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
                  + b"x" * 65536)
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 405"), got[:300]
        assert b"connection: close" in got.split(b"\r\n\r\n", 1)[0].lower(), got[:300]
        for _ in range(20):  # 1.3 MB more over 0.4 s, as a client finishing its write would
            s.sendall(b"x" * 65536)
            time.sleep(0.02)
        s.settimeout(5)
        rest = b""
        while chunk := s.recv(65536):  # a reset would raise ConnectionResetError here
            rest += chunk
    assert (got + rest).rstrip().endswith(b"}")  # the whole JSON answer, then a clean EOF
