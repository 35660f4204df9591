"""The retry and failover policy, driven step by step without any network: the policy is a
generator that says what to send and when to sleep, so each decision is visible here."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from queen_trio.client import (
    BrokerUnreachable,
    Forbidden,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServerError,
    StorageFull,
)
from queen_trio.client.blocking import run_blocking
from queen_trio.client.calls import Call
from queen_trio.client.errors import error_from_response
from queen_trio.client.transport import Endpoints, Send, Sleep, exchange
from queen_trio.strict_json import JsonRefused

TIMEOUT = httpx.Timeout(5.0)
POLICY = RetryPolicy(retries=2, base_backoff_s=0.1, max_backoff_s=1.0, max_wait_s=5)


def call(idempotent: bool = True, **options: Any) -> Call[Any]:
    return Call("GET", "/api/v1/x", lambda body: body, idempotent, **options)


def json(status: int, body: Any = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


class Run:
    """Steps through one exchange, feeding it outcomes."""

    def __init__(self, c: Call[Any], urls: list[str], policy: RetryPolicy = POLICY) -> None:
        self.endpoints = Endpoints(urls)
        self.steps = exchange(c, self.endpoints, policy, TIMEOUT)
        self.step: Any = next(self.steps)
        self.result: Any = None

    def feed(self, outcome: httpx.Response | Exception | None) -> Any:
        try:
            if isinstance(outcome, Exception):
                self.step = self.steps.throw(outcome)
            else:
                self.step = self.steps.send(outcome)
        except StopIteration as done:
            self.step, self.result = None, done.value
        return self.step


def test_a_refused_connection_moves_to_the_next_url_at_once() -> None:
    run = Run(call(idempotent=False), ["http://a", "http://b"])
    assert run.step.url == "http://a/api/v1/x"
    nxt = run.feed(httpx.ConnectError("refused"))
    assert isinstance(nxt, Send) and nxt.url == "http://b/api/v1/x"  # no sleep: b is fresh
    run.feed(json(200, {"ok": True}))
    assert run.result == {"ok": True}
    assert run.endpoints.preferred == 1  # b is kept for the next calls


def test_urls_already_tried_are_retried_after_a_backoff() -> None:
    run = Run(call(), ["http://a"])
    assert isinstance(run.feed(httpx.ReadError("reset")), Sleep)
    assert isinstance(run.feed(None), Send)


def test_every_url_gets_a_chance_even_without_retries() -> None:
    run = Run(call(), ["http://a", "http://b", "http://c"], RetryPolicy(retries=0))
    for expected in ("http://b", "http://c"):
        assert run.feed(httpx.ConnectError("refused")).url.startswith(expected)
    with pytest.raises(BrokerUnreachable) as caught:
        run.feed(httpx.ConnectError("refused"))
    assert len(caught.value.causes) == 3 and not caught.value.maybe_applied


def test_a_lost_answer_is_retried_only_for_idempotent_calls() -> None:
    run = Run(call(idempotent=False), ["http://a", "http://b"])
    with pytest.raises(BrokerUnreachable) as caught:
        run.feed(httpx.ReadTimeout("slow"))
    assert caught.value.maybe_applied and "not safe to retry" in str(caught.value)

    run = Run(call(idempotent=True), ["http://a", "http://b"])
    assert run.feed(httpx.RemoteProtocolError("dropped")).url.startswith("http://b")


def test_retries_are_bounded() -> None:
    run = Run(call(), ["http://a"])
    for _ in range(2):
        assert isinstance(run.feed(httpx.ReadError("x")), Sleep)
        assert isinstance(run.feed(None), Send)
    with pytest.raises(BrokerUnreachable) as caught:
        run.feed(httpx.ReadError("x"))
    assert len(caught.value.causes) == 3


def test_429_waits_for_retry_after_whatever_the_call() -> None:
    run = Run(call(idempotent=False), ["http://a"])
    pause = run.feed(json(429, {"ok": False, "error": "rate_limited", "message": "slow down"},
                          **{"Retry-After": "2"}))
    assert pause == Sleep(2.0)
    run.feed(None)
    run.feed(json(200, [1]))
    assert run.result == [1]


def test_429_with_a_wait_beyond_the_policy_is_raised() -> None:
    run = Run(call(), ["http://a"])
    with pytest.raises(RateLimited) as caught:
        run.feed(json(429, {"ok": False, "error": "rate_limited", "message": "m"},
                      **{"Retry-After": "60"}))
    assert caught.value.retry_after == 60 and caught.value.status == 429


def test_gateway_errors_are_retried_elsewhere_only_when_idempotent() -> None:
    body = {"ok": False, "error": "database_unavailable", "message": "retry"}
    run = Run(call(), ["http://a", "http://b"])
    assert isinstance(run.feed(json(503, body)), Sleep)
    assert run.feed(None).url.startswith("http://b")
    run = Run(call(idempotent=False), ["http://a", "http://b"])
    with pytest.raises(ServerError) as caught:
        run.feed(json(503, body))
    assert (caught.value.status, caught.value.code) == (503, "database_unavailable")


def test_a_503_retry_waits_for_its_retry_after() -> None:
    body = {"ok": False, "error": "overloaded", "detail": "retry"}
    run = Run(call(), ["http://a"])
    assert run.feed(json(503, body, **{"Retry-After": "3"})) == Sleep(3.0)
    run.feed(None)
    run.feed(json(200, [1]))
    assert run.result == [1]


def test_the_storage_gate_is_a_403_storage_full_and_detail_is_the_text() -> None:
    run = Run(call(), ["http://a"])
    with pytest.raises(StorageFull) as caught:
        run.feed(json(403, {"error": "storage_full", "detail": "at maxStoredBytes"}))
    assert (caught.value.status, caught.value.message) == (403, "at maxStoredBytes")
    assert isinstance(caught.value, Forbidden)


def test_other_errors_are_raised_with_their_code_at_once() -> None:
    run = Run(call(), ["http://a"])
    with pytest.raises(NotFound) as caught:
        run.feed(json(404, {"ok": False, "error": "lease_not_found", "message": "no lease"}))
    assert (caught.value.code, caught.value.message) == ("lease_not_found", "no lease")


def test_nothing_there_answers_none_and_no_content_answers_empty() -> None:
    run = Run(call(none_on=frozenset({"absent"})), ["http://a"])
    run.feed(json(404, {"ok": False, "error": "absent", "message": "m"}))
    assert run.result is None and run.step is None
    run = Run(call(empty=list), ["http://a"])
    run.feed(httpx.Response(204))
    assert run.result == []


def test_a_non_json_error_still_becomes_an_api_error() -> None:
    error = error_from_response(httpx.Response(502, text="<html>bad gateway</html>"))
    assert isinstance(error, ServerError)
    assert (error.status, error.code) == (502, "http_502")


def test_long_polls_extend_the_read_timeout() -> None:
    run = Run(call(extra_read_s=30), ["http://a"])
    assert run.step.timeout.read == 35 and run.step.timeout.connect == 5


def test_backoff_is_jittered_and_capped() -> None:
    rng = random.Random(7)
    delays = [POLICY.backoff(n, rng) for n in range(10) for _ in range(20)]
    assert all(0 <= d <= 1.0 for d in delays)
    assert len(set(delays)) == len(delays)  # jitter: no two clients sleep alike
    assert max(POLICY.backoff(0, rng) for _ in range(50)) <= 0.1


def test_run_blocking_refuses_a_coroutine_that_suspends() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspend"):
        run_blocking(suspends())


def test_a_body_json_cannot_carry_is_refused_before_the_first_send() -> None:
    """NaN, infinities, U+0000 and unpaired surrogates never leave the client."""
    for value, path in ((float("nan"), "items[0].payload.price"),
                        (float("inf"), "items[0].payload.price"),
                        ("a\x00b", "items[0].payload.price"), ("\udfff", "items[0].payload.price")):
        body = {"items": [{"queue": "q", "payload": {"price": value}}]}
        with pytest.raises(JsonRefused) as caught:
            Run(Call("POST", "/api/v1/push", lambda b: b, False, body=body), ["http://a"])
        assert caught.value.path == path, caught.value


def test_the_body_is_encoded_once_for_every_attempt() -> None:
    run = Run(call(body={"p": "é"}), ["http://a", "http://b"])
    assert run.step.content == '{"p":"é"}'.encode()
    assert run.feed(httpx.ConnectError("refused")).content is run.step.content


def test_an_answer_is_decoded_strictly() -> None:
    run = Run(call(), ["http://a"])
    with pytest.raises(JsonRefused) as caught:
        run.feed(httpx.Response(200, content=b'{"value": [1, NaN]}'))
    assert caught.value.path == "value[1]"
