"""Every attack of tests/hostile/ at once, against one broker process (QUEEN_AUTH=on, short idle
timeout), while a well-behaved client keeps a ledger of what the broker acknowledged.

For ~20 s, concurrently: the ledger client pushes, schedules short timers, pops and acks;
poison rows are planted straight into queen.timers and the API is sent NaN, Infinity,
``\\u0000``, huge integers and extreme timestamps; a few hundred connections idle after one
request, some ask ``Connection: close`` or speak HTTP/1.0; 20 oversized chunked uploads come
with and without a token; a few hundred long-polls park on queues nobody pushes to; web pages
of another site POST in no-cors style; a flood of wrong tokens. Each attack has its own test
(named in RELIABILITY.md, "All at once"); this one reuses their helpers and checks that
together they still leave the broker up, lose nothing acknowledged, and answer every client
clearly. Bounds are wide (a shared 2-core machine); the figures are printed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from bench.harness.brokers import raise_fd_limit
from queen_trio.tenants import store

from ..brokers import BrokerProcess
from ..faults.harness import asql, log_by_txn
from ..faults.test_poison import POISON, HealthWatch, dead_letters, plant
from ..pgserver import Databases
from .conftest import start_broker
from .test_auth_flood import flood
from .test_request_bodies import reset_peak, status_kib, upload
from .test_strict_json import EXTREMES, REFUSED_VALUES, fill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

API = "/api/v1"
ATTACK_S = 20.0
IDLE_S = 3  # QUEEN_HTTP_IDLE_TIMEOUT_S: the idle connections are closed after it
IDLE_CONNECTIONS = 300
PARKED = 300
PARK_MS = 12_000
UPLOADS = 20  # half with a token, half without
FLOODERS = 16
MAX_ATTEMPTS = 2
RSS_BOUND_MIB = 600  # wide: 20 uploads hold at most the 64 MiB body budget
ENV = {"QUEEN_AUTH": "on", "QUEEN_OPERATOR_TENANT": "ops",
       "QUEEN_HTTP_IDLE_TIMEOUT_S": str(IDLE_S),
       "QUEEN_SWEEPER_MAX_ATTEMPTS": str(MAX_ATTEMPTS), "QUEEN_SWEEPER_BACKOFF_MS": "50",
       "QUEEN_SWEEPER_MAX_SLEEP_MS": "200",
       # The 50 MB uploads are oversized for the 8 MiB body limit of a 1 MiB ceiling (at the
       # 16 MiB default the limit is 64 MiB: bench/large_messages.py measures that).
       "QUEEN_MAX_MESSAGE_BYTES": str(1024 * 1024)}


@pytest.fixture(scope="module")
def besieged(databases: Databases) -> Iterator[tuple[BrokerProcess, str, str]]:
    raise_fd_limit(4 * (IDLE_CONNECTIONS + PARKED) + 1024)  # the broker inherits it
    token: list[str] = []
    database: list[str] = []

    def tenants(url: str) -> None:
        database.append(url)
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as raw:
            for name in ("alpha", "ops"):
                store.create_tenant(raw, name)
            token.append(store.create_token(raw, "alpha"))

    for broker in start_broker(databases, "besieged", env=ENV, prepare=tenants):
        yield broker, token[0], database[0]


class Answers:
    """What each attack was answered: ``kind -> Counter(status)``, and every answer that was
    not clear (an unexpected status, no JSON ``error``, a 429/503 without Retry-After, a
    connection dropped without an answer)."""

    def __init__(self) -> None:
        self.seen: dict[str, Counter[str]] = {}
        self.unclear: list[str] = []

    def note(self, kind: str, status: int | str, expected: set[int], *,
             body: bytes | None = None, headers: dict[str, str] | None = None) -> None:
        """``body`` None: only the status is known (a raw client read no further)."""
        self.seen.setdefault(kind, Counter())[str(status)] += 1
        if not isinstance(status, int) or status not in expected:
            self.unclear.append(f"{kind}: {status} {(body or b'')[:200]!r}")
            return
        if status in (429, 503) and headers is not None and "retry-after" not in headers:
            self.unclear.append(f"{kind}: {status} without Retry-After")
        if body is not None and status >= 400:
            try:
                error = json.loads(body)["error"]
                assert isinstance(error, str) and error
            except (ValueError, KeyError, TypeError, AssertionError):
                self.unclear.append(f"{kind}: {status} without a JSON error: {body[:200]!r}")


async def raw_request(port: int, request: bytes, sent: list[float] | None = None
                      ) -> tuple[int, dict[str, str], bytes, trio.SocketStream]:
    """Send one raw request on a new connection (``sent`` gets when it was out); its status,
    headers, body and the stream."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    if sent is not None:
        sent.append(trio.current_time())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer ({data[:80]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("closed in the middle of an answer")
        body += chunk
    return int(lines[0].split()[1]), headers, body, stream


async def seconds_until_eof(stream: trio.SocketStream, limit: float) -> float | None:
    started = trio.current_time()
    with trio.move_on_after(limit):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass  # a reset: closed all the same
        return trio.current_time() - started
    return None


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else -1.0


async def test_every_attack_at_once_leaves_the_broker_up_and_the_ledger_whole(
    besieged: tuple[BrokerProcess, str, str],
) -> None:
    broker, token, url = besieged
    auth = {"Authorization": f"Bearer {token}"}
    port = broker.port
    answers = Answers()
    pushed: dict[str, float] = {}  # txn -> when the push was answered 201
    received: Counter[str] = Counter()
    scheduled: set[str] = set()
    push_ms: list[float] = []
    ack_ms: list[float] = []
    delivery_ms: list[float] = []
    rss: list[int] = []
    idle_closed_after: list[float] = []
    poll_late: list[float] = []
    poison: set[str] = set()
    start = trio.current_time()
    stop = start + ATTACK_S
    reset_peak(broker.pid)
    rss_before = status_kib(broker.pid, "VmRSS")
    watch = HealthWatch(broker)

    async def ledger_pusher(http: httpx.AsyncClient) -> None:
        n = 0
        while trio.current_time() < stop:
            txns = [f"push-{n}-{i}" for i in range(5)]
            n += 1
            t = time.perf_counter()
            r = await http.post(f"{API}/push", json={"items": [
                {"queue": "ledger", "payload": {"txn": txn}, "transactionId": txn}
                for txn in txns]})
            push_ms.append(time.perf_counter() - t)
            assert r.status_code == 201, r.text
            for txn in txns:
                pushed[txn] = trio.current_time()
            await trio.sleep(0.02)

    async def ledger_timers(http: httpx.AsyncClient) -> None:
        n = 0
        while trio.current_time() < stop:
            txn = f"timer-{n}"
            r = await http.put(f"{API}/timers/ledger-t/k{n}", json={
                "delayMs": 100 + (n * 37) % 500, "payload": {"n": n}, "txn": txn})
            assert r.status_code == 200 and r.json()["status"] == "scheduled", r.text
            scheduled.add(txn)
            n += 1
            await trio.sleep(0.03)

    async def ledger_consumer(http: httpx.AsyncClient, until: trio.Event) -> None:
        while not until.is_set():
            r = await http.get(f"{API}/pop/queue/ledger", params={
                "batch": 50, "wait": "true", "timeout": 1000})
            assert r.status_code in (200, 204), r.text
            if r.status_code == 204:
                continue
            messages = r.json()["messages"]
            now = trio.current_time()
            for m in messages:
                received[m["transactionId"]] += 1
                if m["transactionId"] in pushed:
                    delivery_ms.append(now - pushed[m["transactionId"]])
            t = time.perf_counter()
            r = await http.post(f"{API}/ack/batch", json={"acknowledgments": [
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                 "leaseId": m["leaseId"], "status": "completed"} for m in messages]})
            ack_ms.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
            # Each acknowledgement has its verdict: every one taken (an offset commit each).
            assert all(v["success"] and not v["noop"] for v in r.json()), r.text

    async def poisoner(http: httpx.AsyncClient) -> None:
        await trio.sleep(2)
        for name, (payload, zstd) in POISON.items():
            poison.add(await plant(url, "poisoned", f"{name}-{uuid.uuid4().hex[:6]}",
                                   payload, zstd, delay_s=0.3))
        # And through the API: refused at the edge, 400 naming the field.
        while trio.current_time() < stop:
            for case, (value, _) in REFUSED_VALUES.items():
                for method, path, text in (
                    ("POST", f"{API}/push",
                     fill('{"items": [{"queue": "bad", "payload": $v}]}', v=value)),
                    ("PUT", f"{API}/timers/bad/{uuid.uuid4().hex[:8]}",
                     fill('{"delayMs": 0, "payload": $v}', v=value)),
                    ("PUT", f"{API}/kv/bad/k", fill('{"value": $v, "forever": true}', v=value)),
                ):
                    r = await http.request(method, path, content=text)
                    answers.note(f"strict-json {method}", r.status_code, {400},
                                 body=r.content, headers=dict(r.headers))
                    said = r.json() if r.status_code == 400 else {}
                    if r.status_code == 400 and "invalid_json_value" not in (
                            said.get("error"), said.get("reason")):
                        answers.unclear.append(f"{case}: {r.text[:200]}")
            for at in EXTREMES:
                for name in ("from", "to"):
                    r = await http.get(f"{API}/messages", params={name: at})
                    answers.note("extreme timestamp", r.status_code, {400}, body=r.content)
            await trio.sleep(0.2)

    async def idle_one() -> None:
        try:
            status, _, body, stream = await raw_request(
                port, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        except (OSError, trio.BrokenResourceError) as exc:
            answers.note("idle", type(exc).__name__, {200})
            return
        async with stream:
            answers.note("idle", status, {200}, body=body)
            closed = await seconds_until_eof(stream, IDLE_S + 15)
        if closed is None:
            answers.unclear.append("idle: still open after the idle timeout")
        else:
            idle_closed_after.append(closed)

    async def idlers() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(IDLE_CONNECTIONS):
                nursery.start_soon(idle_one)
                if i % 50 == 49:
                    await trio.sleep(0.5)

    async def closing_clients() -> None:
        requests = [b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                    b"GET /health HTTP/1.0\r\n\r\n"]
        while trio.current_time() < stop:
            for request in requests:
                try:
                    status, _, body, stream = await raw_request(port, request)
                except (OSError, trio.BrokenResourceError) as exc:
                    answers.note("close/1.0", type(exc).__name__, {200})
                    continue
                async with stream:
                    answers.note("close/1.0", status, {200}, body=body)
                    closed = await seconds_until_eof(stream, 10)
                if closed is None or closed > 5:
                    answers.unclear.append(f"close/1.0: not closed after the answer ({closed})")
            await trio.sleep(0.5)

    async def uploader(with_token: bool) -> None:
        await trio.sleep(3)
        whole: list[bytes] = []
        status, seconds, _ = await upload(port, token if with_token else None, whole)
        head, _, text = whole[0].partition(b"\r\n\r\n")
        body: bytes | None = text
        if not text.rstrip().endswith(b"}"):
            # The status was read, the rest lost to the reset that ends the broker's linger
            # (connections.py LINGER_S): this process, busy sending, read late. Counted.
            answers.seen.setdefault("upload cut after its status", Counter())[str(status)] += 1
            body = None
        headers = {k.strip().lower(): v.strip() for k, _, v in (
            line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:])}
        answers.note(f"upload {'token' if with_token else 'no token'}", status,
                     {413, 503} if with_token else {401, 429}, body=body, headers=headers)
        if seconds > 15:
            answers.unclear.append(f"upload answered after {seconds:.1f}s")

    async def park_one(i: int) -> None:
        queue = f"nobody-{i % 10}"
        sent: list[float] = []
        try:
            status, headers, body, stream = await raw_request(
                port, f"GET {API}/pop/queue/{queue}?wait=true&timeout={PARK_MS}&batch=1 "
                      f"HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n"
                      "\r\n".encode(), sent)
        except (OSError, trio.BrokenResourceError) as exc:
            answers.note("parked poll", type(exc).__name__, {204})
            return
        poll_late.append(trio.current_time() - sent[0] - PARK_MS / 1000)
        await stream.aclose()
        answers.note("parked poll", status, {204}, body=body, headers=headers)

    async def parkers() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(PARKED):
                nursery.start_soon(park_one, i)
                if i % 50 == 49:
                    await trio.sleep(0.2)

    async def cross_origin(http: httpx.AsyncClient) -> None:
        no_cors = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example",
                   "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
        body = json.dumps({"items": [{"queue": "evil", "payload": 1}]})
        while trio.current_time() < stop:
            for headers in (no_cors, {"Content-Type": "text/plain", "Origin": "null"}):
                r = await http.post(f"{API}/push", content=body, headers=headers)
                answers.note("cross-origin", r.status_code, {401, 403, 429}, body=r.content,
                             headers=dict(r.headers))
            await trio.sleep(0.1)

    async def sample_rss() -> None:
        while trio.current_time() < stop + 5:
            rss.append(status_kib(broker.pid, "VmRSS"))
            await trio.sleep(0.5)

    flood_answers: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=broker.url, timeout=30, headers=auth) as http, \
            httpx.AsyncClient(base_url=broker.url, timeout=30, headers=auth) as consumer, \
            httpx.AsyncClient(base_url=broker.url, timeout=30, headers=auth) as attacker, \
            httpx.AsyncClient(base_url=broker.url, timeout=30) as stranger:
        # The ledger's token is verified before the flood begins: a token never seen before,
        # from an address flooding wrong ones, waits for its bucket (429, test_auth_flood.py).
        r = await http.post(f"{API}/configure", json={"queue": "ledger"})
        assert r.status_code == 200, r.text
        drained = trio.Event()
        async with trio.open_nursery() as background:
            await background.start(watch.run)
            background.start_soon(sample_rss)
            background.start_soon(ledger_consumer, consumer, drained)
            async with trio.open_nursery() as attacks:
                attacks.start_soon(ledger_pusher, http)
                attacks.start_soon(ledger_timers, http)
                attacks.start_soon(poisoner, attacker)
                attacks.start_soon(idlers)
                attacks.start_soon(closing_clients)
                attacks.start_soon(parkers)
                attacks.start_soon(cross_origin, stranger)
                for i in range(UPLOADS):
                    attacks.start_soon(uploader, i % 2 == 0)
                for _ in range(FLOODERS):
                    attacks.start_soon(flood, port, stop, flood_answers)
            attacked_s = trio.current_time() - start
            # Everything acknowledged is delivered; timers and poison rows leave the table.
            with trio.move_on_after(30):
                while set(pushed) - set(received) or await asql(
                        url, "SELECT 1 FROM queen.timers LIMIT 1"):
                    assert broker.alive, broker.stderr()
                    await trio.sleep(0.2)
            drained.set()
            background.cancel_scope.cancel()
    peak = status_kib(broker.pid, "VmHWM")
    log = await log_by_txn(url)
    dead = await dead_letters(url)
    frames_evil = (await asql(url, "SELECT count(*) AS n FROM queen.frames f JOIN "
                                   "queen.partitions p USING (partition_id) JOIN queen.queues q "
                                   "USING (queue_id) WHERE q.name IN ('evil', 'bad')"))[0]["n"]
    late = max(poll_late, default=0.0)
    print(f"\nall at once for {attacked_s:.1f}s (drained {trio.current_time() - start:.1f}s "
          f"after the start): pushes acknowledged {len(pushed)} (p50 {p(push_ms, .5):.0f} / "
          f"p99 {p(push_ms, .99):.0f} ms), received {sum(received.values())}; acks "
          f"{len(ack_ms)} (p50 {p(ack_ms, .5):.0f} / p99 {p(ack_ms, .99):.0f} ms); push to "
          f"delivery p50 {p(delivery_ms, .5):.0f} / p99 {p(delivery_ms, .99):.0f} ms; timers "
          f"scheduled {len(scheduled)}, fired {sum(log[t] for t in scheduled)}; poison rows "
          f"{len(poison)}, dead-lettered {len(set(dead) & poison)}\n"
          f"answers: {json.dumps({k: dict(v) for k, v in sorted(answers.seen.items())})}; "
          f"flood {flood_answers}\nidle connections closed {min(idle_closed_after, default=0):.1f}"
          f"-{max(idle_closed_after, default=0):.1f}s after their answer; parked polls answered "
          f"{p(poll_late, .5) / 1000:.2f}s (median), at most {late:.2f}s past their deadline; "
          f"health {watch.checks} checks, "
          f"{len(watch.failures)} not 200; RSS {rss_before / 1024:.0f} MiB -> peak "
          f"{peak / 1024:.0f} MiB -> {rss[-1] / 1024:.0f} MiB; unclear {len(answers.unclear)}")

    watch.assert_up()
    assert not answers.unclear, answers.unclear[:20]
    # Every attack did reach the broker.
    assert answers.seen["idle"]["200"] == IDLE_CONNECTIONS, answers.seen
    assert answers.seen["parked poll"]["204"] == PARKED, answers.seen
    assert sum(answers.seen["upload token"].values()) == UPLOADS // 2, answers.seen
    assert sum(answers.seen["upload no token"].values()) == UPLOADS // 2, answers.seen
    assert set(flood_answers) <= {401, 429} and flood_answers.get(429, 0) > 0, flood_answers
    # Lookups within the limiter's budget (a burst of 20, then 10 a second).
    assert flood_answers.get(401, 0) <= 20 + 10 * (attacked_s + 1), flood_answers
    assert len(idle_closed_after) == IDLE_CONNECTIONS
    assert max(idle_closed_after) < IDLE_S + 10, idle_closed_after
    # Counted from when the request was out: 1-4 s at load 2-5 (the broker reads it, and this
    # process its answer, behind everything else), 6.8 s once at load 6.4.
    assert late < 12, late
    # Nothing acknowledged lost, nothing doubled, nothing written by an attacker.
    assert len(pushed) >= 100 and len(scheduled) >= 50, (len(pushed), len(scheduled))
    assert set(pushed) <= set(received), len(set(pushed) - set(received))
    assert max(received.values()) == 1, [t for t, n in received.items() if n > 1][:10]
    assert {t: log[t] for t in scheduled} == dict.fromkeys(scheduled, 1)
    assert set(log) == scheduled, set(log) - scheduled
    assert set(dead) == poison
    assert all(dead[t]["retry_count"] == MAX_ATTEMPTS for t in poison)
    assert frames_evil == 0
    assert (peak - rss_before) / 1024 < RSS_BOUND_MIB, (rss_before, peak)
