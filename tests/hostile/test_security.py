"""Security against a live broker with QUEEN_AUTH=on.

- Two tenants on the timer routes (peek, list, cancel, reschedule, bundles), resources and
  the log the timers fire into; the log, KV, DLQ and transaction routes are covered by
  tests/integration/test_tenancy.py::test_two_tenants_never_see_each_other.
- /metrics names no tenant, queue, key, namespace or token.
- Token brute force: always the same 401, no lock-out of the real token, and no timing
  difference between a wrong prefix (no such token) and a wrong secret (a real prefix).
- Nothing secret in the broker's log: run at DEBUG, through good and bad credentials, errors
  and a database URL carrying a password, then read its stderr.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Generator, Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from queen_trio.tenants import store

from ..brokers import BrokerProcess
from ..pgserver import Databases
from ..timer_ops import timer_op

API = "/api/v1"
DB_PASSWORD = "db-pw-" + secrets.token_hex(8)
QUEUE = "secretq-a1b2"  # names a scrape of /metrics must never show
KEY = "key-alpha-9"
NAMESPACE = "ns-alpha-77"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tenants_db(databases: Databases) -> Iterator[tuple[str, dict[str, str]]]:
    url = databases.create()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as raw:
        store.create_tenant(raw, "alpha")
        store.create_tenant(raw, "beta")
        store.create_tenant(raw, "operators")
        tokens = {"A": store.create_token(raw, "alpha"), "B": store.create_token(raw, "beta"),
                  "ops": store.create_token(raw, "operators")}
    yield url, tokens
    databases.drop(url)


@pytest.fixture(scope="module")
def secure(databases: Databases, tenants_db: tuple[str, dict[str, str]]
           ) -> Iterator[tuple[BrokerProcess, dict[str, str]]]:
    url, tokens = tenants_db
    # The server trusts local connections, so the password is never used; the broker must
    # still never print it.
    with_password = make_conninfo("", **{**conninfo_to_dict(url), "password": DB_PASSWORD})
    # The brute-force timing test measures the database lookups of wrong tokens: the limit on
    # failed lookups (tests/hostile/test_auth_flood.py) is lifted here.
    env = {"QUEEN_AUTH": "on", "QUEEN_LOG_LEVEL": "DEBUG", "QUEEN_OPERATOR_TENANT": "operators",
           "QUEEN_AUTH_FAILURES_PER_S": "1000000"}
    gen = _broker_on(databases, with_password, env)
    yield next(gen), tokens
    gen.close()


def _broker_on(databases: Databases, url: str, env: dict[str, str]
               ) -> Generator[BrokerProcess]:
    broker = BrokerProcess(url, name="secure", env=env).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            assert broker.alive, broker.stderr()
            try:
                if httpx.get(f"{broker.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, broker.stderr()
            time.sleep(0.05)
        yield broker
    finally:
        broker.close()




def client(broker: BrokerProcess, token: str | None) -> httpx.Client:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=broker.url, timeout=10, headers=headers)


# -- isolation on the timer routes --------------------------------------------------------------


def test_a_tenant_cannot_see_cancel_replace_or_count_another_tenants_timers(
    secure: tuple[BrokerProcess, dict[str, str]],
) -> None:
    broker, tokens = secure
    with client(broker, tokens["A"]) as a, client(broker, tokens["B"]) as b:
        r = a.put(f"{API}/timers/{QUEUE}/{KEY}", json={"delayMs": 60_000,
                                                        "payload": {"s": "alpha-secret"}})
        assert r.status_code == 200 and r.json()["status"] == "scheduled", r.text
        a_txn = r.json()["txn"]
        r = a.post(f"{API}/timers", json=[timer_op(QUEUE, "soon", 200, "for alpha")])
        assert r.status_code == 200, r.text

        # What B gets for A's timer is exactly what it gets for a name nobody uses.
        def b_view(key: str) -> list[Any]:
            return [
                (r.status_code, {k: v for k, v in r.json().items() if k != "timerKey"})
                for r in (b.get(f"{API}/timers/{QUEUE}/{key}"),
                          b.delete(f"{API}/timers/{QUEUE}/{key}"),
                          b.delete(f"{API}/timers/{QUEUE}/{key}", params={"txn": a_txn}))]
        assert b_view(KEY) == b_view("never-used")
        assert b_view(KEY)[0] == (200, {"found": False, "queue": QUEUE})
        assert b_view(KEY)[1][1]["status"] == "absent" and b_view(KEY)[1][1]["txn"] is None
        assert b_view(KEY)[2][1]["txn"] == a_txn  # the caller's own txn, echoed
        r = b.post(f"{API}/transaction", json={"timers": [timer_op(QUEUE, KEY, 0, op="cancel")]})
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "absent", r.text
        r = b.post(f"{API}/timers", json=[timer_op(QUEUE, KEY, 0, op="cancel")])
        assert r.status_code == 200 and r.json()["results"][0]["status"] == "absent", r.text
        assert b.get(f"{API}/timers/{QUEUE}").json() == {"rows": [], "truncated": False,
                                                         "nextAfter": None}
        count = b.get(f"{API}/timers/{QUEUE}", params={"mode": "count", "prefix": KEY[:3]})
        assert count.json()["count"] == 0
        assert b.get(f"{API}/resources/queues").json() == {"queues": []}
        assert b.get(f"{API}/resources/queues/{QUEUE}").status_code == 404

        # B scheduling the same name makes B's own timer; A's is untouched.
        r = b.put(f"{API}/timers/{QUEUE}/{KEY}", json={"delayMs": 60_000, "payload": "beta"})
        assert r.json()["status"] == "scheduled", r.text
        assert r.json()["txn"] != a_txn
        peek = a.get(f"{API}/timers/{QUEUE}/{KEY}").json()
        assert (peek["txn"], peek["data"]) == (a_txn, {"s": "alpha-secret"})
        assert [t["timerKey"] for t in b.get(f"{API}/timers/{QUEUE}").json()["rows"]] == [KEY]
        listed = a.get(f"{API}/timers/{QUEUE}").json()["rows"]
        assert {t["timerKey"] for t in listed} <= {KEY, "soon"}

        # A's "soon" fires into A's queue only.
        deadline = time.monotonic() + 5
        while True:
            r = a.get(f"{API}/pop/queue/{QUEUE}", params={"batch": 10})
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, "A's timer never arrived"
            time.sleep(0.05)
        assert [m["data"] for m in r.json()["messages"]] == ["for alpha"]
        assert b.get(f"{API}/pop/queue/{QUEUE}", params={"batch": 10}).status_code == 204

        # KV under a distinctive namespace, for the metrics check below.
        assert a.put(f"{API}/kv/{NAMESPACE}/k",
                     json={"value": 1, "forever": True}).status_code == 200
        assert b.get(f"{API}/kv/{NAMESPACE}/k").json()["found"] is False


def test_metrics_name_no_tenant_queue_key_or_token(
    secure: tuple[BrokerProcess, dict[str, str]],
) -> None:
    broker, tokens = secure
    with client(broker, tokens["A"]) as a:
        a.put(f"{API}/timers/{QUEUE}/{KEY}-m", json={"delayMs": 0, "payload": 1})
        a.get(f"{API}/timers/{QUEUE}/{KEY}-m")
        a.put(f"{API}/kv/{NAMESPACE}/m", json={"value": 1, "forever": True})
    with client(broker, tokens["ops"]) as operator, client(broker, None) as anon:
        text = operator.get("/metrics").text + operator.get("/metrics/prometheus").text
        health = anon.get("/health").text
    assert "queen_http_requests" in text  # the scrape is the real one
    for secret in ("alpha", "beta", "operators", QUEUE, KEY, NAMESPACE, *tokens.values(),
                   *(t.split("_")[1] for t in tokens.values())):
        assert secret not in text, f"/metrics shows {secret!r}"
        assert secret not in health


# -- brute force --------------------------------------------------------------------------------


def _fake(prefix: str) -> str:
    return f"qt_{prefix}_{secrets.token_urlsafe(32)}"


def test_token_brute_force_gets_the_same_401_in_the_same_time(
    secure: tuple[BrokerProcess, dict[str, str]],
) -> None:
    """Wrong prefix (no row: a dummy hash) against a real prefix with a wrong secret (the row
    is read and the hash compared in constant time), 300 pairs, each pair's order drawn at
    random: the same answer, and the median of the pairs' differences within noise (10 % of
    a request or 0.3 ms). Measured again, twice at most, if it is not: a real difference is
    there every time, a loaded machine's noise is not."""
    broker, tokens = secure
    real_prefix = tokens["A"].split("_")[1]
    bodies = set()
    rounds: list[dict[str, float]] = []
    with httpx.Client(base_url=broker.url, timeout=10) as anon:

        def took(kind: str) -> float:
            token = _fake(secrets.token_hex(6) if kind == "wrong_prefix" else real_prefix)
            started = time.perf_counter()
            r = anon.get(f"{API}/resources/queues", headers={"Authorization": f"Bearer {token}"})
            elapsed = time.perf_counter() - started
            assert r.status_code == 401, r.text
            bodies.add((r.text, r.headers.get("www-authenticate")))
            return elapsed

        for i in range(40):  # warm-up
            took(("wrong_prefix", "wrong_secret")[i % 2])
        for _ in range(3):
            # A paired comparison: whatever slows the machine down for a while (the other
            # test worker, a benchmark) slows both of a pair, and cancels out of its difference.
            pairs: list[dict[str, float]] = []
            for _ in range(300):
                kinds = ["wrong_prefix", "wrong_secret"]
                secrets.SystemRandom().shuffle(kinds)
                pairs.append({kind: took(kind) for kind in kinds})
            med = {k: statistics.median(p[k] for p in pairs) for k in pairs[0]}
            diff = statistics.median(p["wrong_secret"] - p["wrong_prefix"] for p in pairs)
            bound = max(0.0003, 0.10 * min(med.values()))
            rounds.append({**med, "difference": diff, "bound": bound})
            print(f"\nmedian 401: wrong prefix {med['wrong_prefix'] * 1000:.2f} ms, wrong secret "
                  f"{med['wrong_secret'] * 1000:.2f} ms (paired difference {diff * 1e6:.0f} µs)")
            if abs(diff) < bound:
                break
        # No lock-out: the real token works at once.
        r = anon.get(f"{API}/resources/queues", headers={"Authorization": f"Bearer {tokens['A']}"})
        assert r.status_code == 200
    assert len(bodies) == 1, bodies
    assert abs(rounds[-1]["difference"]) < rounds[-1]["bound"], rounds


# -- logs -----------------------------------------------------------------------------------------


def test_no_secret_or_token_reaches_the_log(
    secure: tuple[BrokerProcess, dict[str, str]],
) -> None:
    broker, tokens = secure
    wrong = _fake(tokens["B"].split("_")[1])
    with httpx.Client(base_url=broker.url, timeout=10) as anon:
        for token in (tokens["A"], tokens["B"], wrong, "garbage"):
            headers = {"Authorization": f"Bearer {token}"}
            anon.get(f"{API}/resources/queues", headers=headers)
            anon.post(f"{API}/push", headers=headers, content=b"{not json")
            anon.put(f"{API}/timers/q/%FF", headers=headers, json={"delayMs": 1, "payload": 1})
            anon.post(f"{API}/transaction", headers=headers, json={"operations": [
                {"type": "ack", "transactionId": "x", "partitionId": "1"}]})
    time.sleep(0.3)
    log = broker.stderr(10_000_000)
    assert log.strip(), "the broker logged nothing at DEBUG: the check would be empty"
    for token in (*tokens.values(), wrong):
        secret_part = token.split("_", 2)[2]
        assert secret_part not in log, "a token's secret is in the log"
    assert DB_PASSWORD not in log, "the database password is in the log"
