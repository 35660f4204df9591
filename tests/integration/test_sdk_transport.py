"""Failover, retries and refusals as SDK users see them, against real brokers (and, for an
answer lost mid-request, a server that drops every connection once it has the request)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.client import (
    BrokerUnreachable,
    Client,
    RateLimited,
    RetryPolicy,
    StorageFull,
    TimerStatus,
    Unauthorized,
)
from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store

from ..brokers import free_port
from ..conftest import replace_settings
from .test_plans import plan_loaded, set_plan
from .test_sdk import FAST_RETRY

RETRY_3 = RetryPolicy(retries=3, base_backoff_s=0.01, max_backoff_s=0.02)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


class Dropper:
    """Reads each request whole, then hangs up without answering (or after sending
    ``answer``)."""

    def __init__(self, answer: bytes = b"") -> None:
        self.requests = 0
        self.url = ""
        self.answer = answer

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some()
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += await stream.receive_some()
        self.requests += 1
        if self.answer:
            await stream.send_all(self.answer)
        await stream.aclose()


@pytest.fixture
async def dropper() -> AsyncIterator[Dropper]:
    server = Dropper()
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


# -- failover ---------------------------------------------------------------------------------


async def test_a_dead_first_url_fails_over_to_the_next(broker: BrokerHandle) -> None:
    async with Client([dead_url(), broker.url], retry=FAST_RETRY) as queen:
        # A push without txn is not safe to repeat, but a refused connection never sent it.
        pushed = await queen.push("failover", "once")
        assert pushed.offset == 0
        assert queen.url == broker.url  # and it stays there
        r = await queen.timer("failover").key("k").delay("1m").payload(None).schedule()
        assert r.status is TimerStatus.SCHEDULED
        assert len(await queen.pop("failover", batch=10, auto_ack=True)) == 1


async def test_no_broker_at_all_raises_broker_unreachable() -> None:
    async with Client([dead_url(), dead_url()], retry=RETRY_3) as queen:
        with pytest.raises(BrokerUnreachable) as caught:
            await queen.kv.get("ns", "k")
    assert len(caught.value.causes) == 4 and not caught.value.maybe_applied


async def test_only_calls_safe_to_repeat_are_retried_after_a_lost_answer(
    dropper: Dropper, broker: BrokerHandle
) -> None:
    async with Client(dropper.url, retry=RETRY_3) as queen:
        with pytest.raises(BrokerUnreachable) as push:
            await queen.push("lost", "no txn")
        assert dropper.requests == 1 and push.value.maybe_applied

        with pytest.raises(BrokerUnreachable) as pop:
            await queen.pop("lost")
        assert dropper.requests == 2 and pop.value.maybe_applied

        for safe in (queen.push("lost", "with txn", txn="t-1"),
                     queen.timer("lost").key("k").delay(10).payload(1).schedule(),
                     queen.timer("lost").key("k").cancel(),
                     queen.kv.put("ns", "k", 1, forever=True)):
            before = dropper.requests
            with pytest.raises(BrokerUnreachable) as repeated:
                await safe
            assert dropper.requests - before == 4 and not repeated.value.maybe_applied

    # With a healthy broker behind it, a safe call survives the dropping one.
    async with Client([dropper.url, broker.url], retry=RETRY_3) as queen:
        r = await queen.timer("lost").key("k").delay("1m").payload(1).schedule()
        assert r.status is TimerStatus.SCHEDULED and queen.url == broker.url


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 1\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\ncontent-length: -2\r\n\r\n{}",
], ids=["chunk-size-not-hex", "no-crlf-after-chunk", "two-lengths", "negative-length"])
async def test_a_malformed_answer_is_judged_by_the_retry_policy(answer: bytes) -> None:
    server = Dropper(answer)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        async with Client(server.url, retry=RETRY_3) as queen:
            with pytest.raises(BrokerUnreachable) as push:
                await queen.push("garbled", "no txn")  # may have been applied: not repeated
            assert server.requests == 1 and push.value.maybe_applied
            with pytest.raises(BrokerUnreachable) as get:
                await queen.kv.get("ns", "k")  # safe to repeat: repeated
            assert server.requests == 5 and not get.value.maybe_applied
            assert all(isinstance(cause, httpx.RemoteProtocolError)
                       for cause in (*push.value.causes, *get.value.causes))
        nursery.cancel_scope.cancel()


# -- refusals ---------------------------------------------------------------------------------


async def test_rate_limits_are_waited_out_or_reported(
    broker: BrokerHandle, database_url: str
) -> None:
    set_plan(database_url, requests_per_second=2, set_rate=True)
    await plan_loaded(broker, requests_per_second=2)
    async with Client(broker.url, retry=RetryPolicy(retries=0)) as impatient:
        with pytest.raises(RateLimited) as limited:
            for _ in range(10):
                await impatient.kv.get("ns", "k")
        assert limited.value.code == "rate_limited" and (limited.value.retry_after or 0) >= 1
    # The default policy honours Retry-After, so a burst gets through, just slower.
    async with Client(broker.url) as patient:
        for n in range(4):
            await patient.push("burst", n)


async def test_a_full_storage_gate_refuses_writes_but_never_a_cancel(
    broker: BrokerHandle, database_url: str
) -> None:
    async with Client(broker.url, retry=FAST_RETRY) as queen:
        await queen.timer("gated").key("k").delay("10m").payload(1).schedule()
        set_plan(database_url, max_stored_bytes=0, set_stored=True)
        await plan_loaded(broker, max_stored_bytes=0)
        with pytest.raises(StorageFull) as full:
            await queen.push("gated", 1)
        assert (full.value.status, full.value.code) == (403, "storage_full")
        cancelled = await queen.timer("gated").key("k").cancel()
        assert cancelled.status is TimerStatus.CANCELLED


@pytest.fixture
def token(database_url: str) -> str:
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as raw:
        store.create_tenant(raw, "acme")
        return store.create_token(raw, "acme")


@pytest.fixture
async def auth_broker(settings: Settings, token: str) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(run_broker, replace_settings(settings, auth=True))
        yield handle
        handle.shutdown()


async def test_the_bearer_token_selects_the_tenant(auth_broker: BrokerHandle,
                                                   token: str) -> None:
    async with Client(auth_broker.url, retry=FAST_RETRY) as anonymous:
        with pytest.raises(Unauthorized) as refused:
            await anonymous.kv.get("ns", "k")
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    async with Client(auth_broker.url, token=token, retry=FAST_RETRY) as acme:
        await acme.kv.put("ns", "k", "acme's", forever=True)
        assert (await acme.kv.get("ns", "k")).value == "acme's"
