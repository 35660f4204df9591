"""The broker's HTTP API as the timer benchmarks call it: every answer is checked and a
failure is recorded with the request and the answer (``bench.harness.report.Failures``)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any

import httpx

from bench.harness.metrics import Metrics
from bench.harness.report import Failures, Reply, clip, json_or_none
from queen_trio.client.wire import LeanClient

API = "/api/v1"
REQUEST_TIMEOUT_S = 30.0


def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def pop_problem(status: int, body: Any, batch: int) -> str | None:
    """Why a pop's answer (other than 204) is wrong, or None."""
    if status != 200:
        return "expected 200 or 204"
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return "expected an object with messages"
    if not body["messages"] or len(body["messages"]) > batch:
        return f"expected 1..{batch} messages, got {len(body['messages'])}"
    return None


class Api:
    """The broker's HTTP API; every answer is checked and failures are recorded."""

    def __init__(self, client: LeanClient, failures: Failures) -> None:
        self.client = client
        self.failures = failures

    async def _call(self, scenario: str, method: str, path: str, body: Any = None,
                    limit_s: float = REQUEST_TIMEOUT_S) -> Reply | None:
        try:
            return await self.client.request(method, path, json=body, timeout=limit_s)
        except httpx.HTTPError as exc:
            self.failures.exception(scenario, method, path, clip(body), exc)
            return None

    def _bad(self, scenario: str, method: str, path: str, body: Any,
             response: Reply, why: str) -> None:
        self.failures.bad_response(scenario, method, path, clip(body), response, why)

    async def _checked(self, scenario: str, method: str, path: str, body: Any,
                       problem: Callable[[int, Any], str | None]) -> Any:
        """The answer's JSON if ``problem(status, json)`` finds nothing wrong, else None (the
        failure recorded)."""
        response = await self._call(scenario, method, path, body)
        if response is None:
            return None
        answer = json_or_none(response)
        why = problem(response.status_code, answer)
        if why:
            self._bad(scenario, method, path, body, response, why)
            return None
        return answer

    async def configure(self, scenario: str, queue: str) -> bool:
        path = f"{API}/configure"
        body = {"queue": queue}
        response = await self._call(scenario, "POST", path, body)
        if response is None:
            return False
        if response.status_code not in (200, 201):
            self._bad(scenario, "POST", path, body, response, "expected 200/201")
            return False
        return True

    async def put_timer(self, scenario: str, queue: str, key: str, delay_ms: int,
                        payload: Any) -> dict[str, Any] | None:
        """PUT one timer; the answer if it was scheduled, else None."""

        def problem(status: int, answer: Any) -> str | None:
            if status != 200:
                return "expected 200"
            if not isinstance(answer, dict) or answer.get("status") != "scheduled" \
                    or answer.get("ok") is not True:
                return "expected ok: true, status: scheduled"
            if answer.get("timerKey") != key or not isinstance(answer.get("deliverAt"), str):
                return "expected the key back and a deliverAt"
            return None

        body = {"delayMs": delay_ms, "payload": payload}
        return await self._checked(scenario, "PUT", f"{API}/timers/{queue}/{key}", body,
                                   problem)

    async def bundle(self, scenario: str, timers: list[dict[str, Any]]
                     ) -> list[dict[str, Any]] | None:
        """POST /transaction with only a timers array (Queen's timer operations); the
        per-timer answers if all were scheduled, else None."""
        body = {"operations": [], "timers": timers}
        answer = await self._checked(scenario, "POST", f"{API}/transaction", body,
                                     _all_scheduled(timers, "success"))
        return None if answer is None else answer["results"]

    async def batch(self, scenario: str, timers: list[dict[str, Any]]
                    ) -> list[dict[str, Any]] | None:
        """POST /timers (Queen's batch, at most 256 operations); the per-timer answers if all
        were scheduled, else None."""
        answer = await self._checked(scenario, "POST", f"{API}/timers", {"operations": timers},
                                     _all_scheduled(timers, None))
        return None if answer is None else answer["results"]

    async def pop(self, scenario: str, queue: str, *, batch: int,
                  timeout_ms: int) -> dict[str, Any] | None | bool:
        """Long-poll pop with autoAck: the body (200), None (204), False on failure."""
        path = (f"{API}/pop/queue/{queue}?wait=true&timeout={timeout_ms}&batch={batch}"
                "&autoAck=true")
        response = await self._call(scenario, "GET", path,
                                    limit_s=timeout_ms / 1000 + REQUEST_TIMEOUT_S)
        if response is None:
            return False
        if response.status_code == 204:
            return None
        body = json_or_none(response)
        why = pop_problem(response.status_code, body, batch)
        if why:
            self._bad(scenario, "GET", path, None, response, why)
            return False
        return body

    async def pending(self, scenario: str, queue: str) -> int | None:
        """How many timers the queue still lists as pending (at most 10 looked at)."""

        def problem(status: int, body: Any) -> str | None:
            if status != 200 or not isinstance(body, dict) \
                    or not isinstance(body.get("rows"), list):
                return "expected 200 with a rows array"
            return None

        body = await self._checked(scenario, "GET", f"{API}/timers/{queue}?limit=10", None,
                                   problem)
        return None if body is None else len(body["rows"])

    async def metrics(self) -> Metrics | None:
        try:
            response = await self.client.get("/metrics", timeout=10.0)
        except httpx.HTTPError:
            return None
        return Metrics.parse(response.text) if response.status_code == 200 else None

    async def fired_total(self) -> float | None:
        try:
            response = await self.client.get("/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        match = re.search(r"^queen_timers_fired_total (\S+)$", response.text, re.MULTILINE)
        return float(match.group(1)) if match else None


def event(seq: int, source: str) -> dict[str, Any]:
    """A ~200-byte JSON event object; ``eventId`` identifies it on the way back."""
    return {
        "eventId": f"{source}-{seq:09d}",
        "type": "order.created",
        "orderId": 1_000_000 + seq,
        "customerId": f"cust-{seq % 9973:05d}",
        "amount": round(10 + (seq % 5000) / 7, 2),
        "currency": "EUR",
        "items": [{"sku": f"SKU-{seq % 997:04d}", "qty": 1 + seq % 3}],
        "ts": "2025-01-01T12:00:00.000Z",
    }


def _all_scheduled(timers: list[dict[str, Any]], success: str | None
                   ) -> Callable[[int, Any], str | None]:
    """The check of a bundle's or a batch's answer: every timer scheduled, in order."""

    def problem(status: int, answer: Any) -> str | None:
        if status != 200:
            return "expected 200"
        if not isinstance(answer, dict) or not isinstance(answer.get("results"), list) \
                or (success is not None and answer.get(success) is not True):
            return "expected a results array" + (f" and {success}: true" if success else "")
        if len(answer["results"]) != len(timers):
            return f"expected {len(timers)} timer answers, got {len(answer['results'])}"
        bad = [t for t, sent in zip(answer["results"], timers, strict=True)
               if t.get("status") != "scheduled" or t.get("timerKey") != sent["timerKey"]
               or not isinstance(t.get("deliverAt"), str)]
        return f"{len(bad)} timer(s) not scheduled, first: {bad[0]}" if bad else None

    return problem
