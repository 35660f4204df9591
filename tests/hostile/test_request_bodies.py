"""Request bodies are read after admission, within the body limit and the broker's body budget.

Once, 60 concurrent 50 MB chunked uploads were each answered only after 8-13 MB had
been read, without a token too, and the broker's RSS went from 68 to 1,081 MB: every body was
buffered up to the body limit before admission, and all of them at once.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.tenants import store

from ..brokers import BrokerProcess
from ..pgserver import Databases
from .conftest import start_broker

MIB = 1024 * 1024
UPLOADS = 60
SMALL_CEILING = {"QUEEN_MAX_MESSAGE_BYTES": str(MIB)}
UPLOAD_BYTES = 50 * 1000 * 1000
PIECE = b"x" * 65536
CHUNK = b"%x\r\n" % len(PIECE) + PIECE + b"\r\n"
GROWTH_BOUND_MIB = 150
ANSWER_WITHIN_S = 15.0


@pytest.fixture(scope="module")
def token_and_broker(databases: Databases) -> Iterator[tuple[str, BrokerProcess]]:
    token: list[str] = []

    def tenant_with_token(url: str) -> None:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as raw:
            store.create_tenant(raw, "uploader")
            token.append(store.create_token(raw, "uploader"))

    # A 1 MiB message ceiling: the body limit (8 MiB) and budget (64 MiB) these figures were
    # measured with; the 16 MiB default is measured by bench/large_messages.py.
    for broker in start_broker(databases, "uploads", env={"QUEEN_AUTH": "on", **SMALL_CEILING},
                               prepare=tenant_with_token):
        yield token[0], broker


def status_kib(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match, text
    return int(match.group(1))


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


async def upload(port: int, token: str | None, whole: list[bytes] | None = None
                 ) -> tuple[int, float, int]:
    """POST a 50 MB chunked body to /api/v1/push, stopping as soon as the broker answers:
    (status, seconds until the answer, bytes sent by then). With ``whole``, the answer is read
    to the end of its JSON body and appended to it."""
    auth = b"" if token is None else b"Authorization: Bearer %s\r\n" % token.encode()
    head = (b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n" + auth + b"\r\n")
    sent = 0
    started = trio.current_time()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        async def send_body() -> None:
            nonlocal sent
            try:
                await stream.send_all(head)
                while sent < UPLOAD_BYTES:
                    await stream.send_all(CHUNK)
                    sent += len(PIECE)
                await stream.send_all(b"0\r\n\r\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # refused and closed: what we wanted to know is in the answer

        answer = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_body)
            while b"\r\n" not in answer or (whole is not None and not (
                    b"\r\n\r\n" in answer and answer.rstrip().endswith(b"}"))):
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    # Reset once the broker's linger ran out (connections.py LINGER_S) while
                    # this client was still sending: what had been read is the answer.
                    if whole is None:
                        raise
                    break
                if not data:
                    break
                answer += data
            nursery.cancel_scope.cancel()
    elapsed = trio.current_time() - started
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    if whole is not None:
        whole.append(answer)
    return int(answer.split(b" ", 2)[1]), elapsed, sent


@pytest.mark.parametrize(("with_token", "statuses"), [
    (False, {401}),
    # Past the body limit (413), or past QUEEN_HTTP_BODY_BUFFER_BYTES while the others hold
    # their part of it (503 overloaded).
    (True, {413, 503}),
], ids=["no-token", "token"])
async def test_concurrent_oversized_uploads_leave_memory_bounded(
    token_and_broker: tuple[str, BrokerProcess], with_token: bool, statuses: set[int]
) -> None:
    token, broker = token_and_broker
    before = status_kib(broker.pid, "VmRSS")
    reset_peak(broker.pid)
    results: list[tuple[int, float, int]] = []

    async def one() -> None:
        results.append(await upload(broker.port, token if with_token else None))

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        for _ in range(UPLOADS):
            nursery.start_soon(one)
    wall = time.monotonic() - started
    peak = status_kib(broker.pid, "VmHWM")
    await trio.sleep(1)
    after = status_kib(broker.pid, "VmRSS")

    codes = Counter(status for status, _, _ in results)
    slowest = max(seconds for _, seconds, _ in results)
    sent = sorted(n for _, _, n in results)
    print(f"\n{UPLOADS} x 50 MB chunked uploads, {'with' if with_token else 'without'} a token: "
          f"answers {dict(sorted(codes.items()))} in {wall:.1f}s (slowest {slowest:.2f}s); "
          f"sent before the answer: "
          f"median {sent[len(sent) // 2] / MIB:.1f} MiB, max {sent[-1] / MIB:.1f} MiB; "
          f"broker RSS {before / 1024:.0f} MiB -> peak {peak / 1024:.0f} MiB -> "
          f"{after / 1024:.0f} MiB a second later")
    assert len(results) == UPLOADS
    assert set(codes) <= statuses, codes
    assert slowest < ANSWER_WITHIN_S, slowest
    assert (peak - before) / 1024 < GROWTH_BOUND_MIB, (before, peak)
    assert broker.alive, broker.stderr()


@pytest.fixture(scope="module")
def small_budget(databases: Databases) -> Iterator[BrokerProcess]:
    """QUEEN_HTTP_BODY_BUFFER_BYTES at its floor: one body at the limit (8 MiB)."""
    yield from start_broker(databases, "small-budget",
                            env={"QUEEN_HTTP_BODY_BUFFER_BYTES": str(8 * MIB), **SMALL_CEILING})


def test_a_body_past_the_budget_is_a_503_that_writes_nothing(small_budget: BrokerProcess) -> None:
    """One upload holds 6 MiB of the 8 MiB budget (its client is slow to send the rest); a
    3 MB push meanwhile is answered 503 ``overloaded`` with Retry-After and writes nothing.
    Once the slow client gives up, the same push is accepted."""
    items = [{"queue": "budget", "payload": "x" * 1_000_000} for _ in range(3)]  # 3 MB
    push = json.dumps({"items": items}).encode()
    with httpx.Client(base_url=small_budget.url, timeout=10) as http, \
            socket.create_connection(("127.0.0.1", small_budget.port), timeout=5) as slow:
        slow.sendall(b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n" % (8 * MIB - 1000))
        slow.sendall(b"x" * (6 * MIB))
        time.sleep(0.5)  # read by the broker: its handler asked for the body at once

        r = http.post("/api/v1/push", content=push,
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 503, r.text[:300]
        assert r.json()["error"] == "overloaded" and r.headers["retry-after"] == "1"
        assert http.get("/api/v1/pop/queue/budget").status_code == 204  # nothing written

        slow.close()  # the slow upload ends: its 6 MiB are given back
        time.sleep(0.5)
        r = http.post("/api/v1/push", content=push,
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 201, r.text[:300]
        popped = http.get("/api/v1/pop/queue/budget", params={"batch": 10})
        assert popped.status_code == 200 and len(popped.json()["messages"]) == 3


def test_an_early_answer_to_a_body_that_had_arrived_keeps_the_connection(
    token_and_broker: tuple[str, BrokerProcess],
) -> None:
    """A 401 to a small push whose body came with its head: the body had arrived, so the
    connection carries the client's next request (only an answer sent before the body arrived
    closes it)."""
    _, broker = token_and_broker
    body = b'{"items": [{"queue": "q", "payload": 1}]}'
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as s:
        s.sendall(b"POST /api/v1/push HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while not got.rstrip().endswith(b"}"):
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 401"), got[:300]
        assert b"connection: close" not in got.lower(), got[:300]
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = b""
        while not got.rstrip().endswith(b"}"):
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
