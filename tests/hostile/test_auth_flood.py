"""A flood of wrong tokens does not slow the tenants who have good ones.

Each wrong token used to cost a database lookup: a client sending them as fast as it could
held the pool, and good pushes took 1.2-3.8 s. Failed lookups are now limited per client
address before the database (429 with Retry-After), wrong tokens are remembered, and a token
verified before is never held back by its address's failures.

The broker runs in a process of its own with QUEEN_AUTH=on; the flood and the good pushes come
from this process, from the same address (127.0.0.1). The bound on good pushes here is wide
(a loaded 2-core machine); RELIABILITY.md has the measured figures.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.tenants import store

from ..brokers import BrokerProcess
from ..pgserver import Databases

API = "/api/v1"
FLOODERS = 64
FLOOD_S = 6.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokens_and_broker(databases: Databases) -> Iterator[tuple[BrokerProcess, dict[str, str]]]:
    url = databases.create()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as raw:
        for name in ("alpha", "ops"):
            store.create_tenant(raw, name)
        tokens = {name: store.create_token(raw, name) for name in ("alpha", "ops")}
    broker = BrokerProcess(url, name="flooded",
                           env={"QUEEN_AUTH": "on", "QUEEN_OPERATOR_TENANT": "ops"}).start()
    try:
        deadline = time.monotonic() + 30
        while not _healthy(broker):
            assert broker.alive and time.monotonic() < deadline, broker.stderr()
            time.sleep(0.05)
        yield broker, tokens
    finally:
        broker.close()
        databases.drop(url)


def _healthy(broker: BrokerProcess) -> bool:
    try:
        return httpx.get(f"{broker.url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wrong_token() -> str:
    return f"qt_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


async def flood(port: int, until: float, answers: dict[int, int]) -> None:
    """Pushes with wrong tokens, back to back on one keep-alive connection: raw HTTP/1.1, so
    that this process spends little CPU per request and the broker is what gets loaded."""
    body = b'{"items":[{"queue":"q","payload":1}]}'
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    buffer = b""
    async with stream:
        while trio.current_time() < until:
            await stream.send_all(
                f"POST {API}/push HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {wrong_token()}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            while b"\r\n\r\n" not in buffer:
                buffer += await stream.receive_some(65536)
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            fields = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
            length = int(fields["content-length"])
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            answers[status] = answers.get(status, 0) + 1
            if status == 429:
                assert int(fields["retry-after"]) >= 1


async def test_a_flood_of_wrong_tokens_leaves_good_pushes_fast(
    tokens_and_broker: tuple[BrokerProcess, dict[str, str]],
) -> None:
    broker, tokens = tokens_and_broker
    good = {"Authorization": f"Bearer {tokens['alpha']}"}
    answers: dict[int, int] = {}
    took: list[float] = []
    async with httpx.AsyncClient(base_url=broker.url, timeout=30, headers=good) as http:
        r = await http.post(f"{API}/push", json={"items": [{"queue": "q", "payload": 0}]})
        assert r.status_code == 201, r.text
        until = trio.current_time() + FLOOD_S
        async with trio.open_nursery() as nursery:
            for _ in range(FLOODERS):
                nursery.start_soon(flood, broker.port, until, answers)
            await trio.sleep(0.5)  # the flood is on
            while trio.current_time() < until - 0.2:
                started = time.perf_counter()
                r = await http.post(f"{API}/push", json={"items": [{"queue": "q", "payload": 1}]})
                took.append(time.perf_counter() - started)
                assert r.status_code == 201, r.text
                await trio.sleep(0.05)
        # A token never seen before, from the flooded address, once its bucket refills.
        await trio.sleep(2.5)
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as ops:
            r = await ops.get("/metrics", headers={"Authorization": f"Bearer {tokens['ops']}"})
            assert r.status_code == 200, r.text
    refused = sum(float(line.split()[-1]) for line in r.text.splitlines()
                  if line.startswith("queen_auth_refused_total"))
    print(f"\nflood: {answers}; good pushes: {len(took)}, p50 "
          f"{statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms")
    # Lookups (the 401s) within the limiter's budget: a burst of 20, then 10 a second.
    assert answers.get(401, 0) <= 20 + 10 * (FLOOD_S + 1), answers
    assert answers.get(429, 0) >= FLOODERS, answers
    assert refused >= sum(answers.values())
    # Before: p50 109-146 ms here (760 ms under other load; 1.2-3.8 s reported), 2,700-3,500
    # lookups in 6 s; after: p50 7-28 ms. Wide bounds: RELIABILITY.md has the figures.
    # (One push of ~60 may meet a stall of the loaded machine: two workers beside a core
    # burner once gave p50 ~17 ms and one push of 2.0 s. The median and the 90th percentile
    # tell the flood's effect; the slowest push only that nothing waits for seconds.)
    assert len(took) >= 20, took
    assert statistics.median(took) < 0.075, took
    assert sorted(took)[int(len(took) * 0.9)] < 0.3, took
    assert max(took) < 3.0, took
