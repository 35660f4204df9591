"""The dashboard in a real headless browser (Debian's chromium, driven over the DevTools
protocol on a pipe: tests/e2e/cdp.py) against a live broker with real data: a queue, pending
timers, a dead letter, payloads and keys holding ``<script>``. The test clicks cancel and
replay (accepting the confirmations) and checks the effect through the API, types a token on
a broker with QUEEN_AUTH=on, and saves a screenshot of each page under tests/artifacts/.
Without chromium these tests fail: they do not skip."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from queen_trio.config import Settings
from queen_trio.server import BrokerHandle, run_broker
from queen_trio.tenants import store

from ..conftest import replace_settings
from .cdp import Browser, chromium

API = "/api/v1"
EVIL = "<script>alert(1)</script><img src=x onerror=alert(2)>"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# QUEEN_UI_SCREENSHOTS=docs/screenshots: also write the README's pictures there.
DOCS = os.environ.get("QUEEN_UI_SCREENSHOTS")

pytestmark = pytest.mark.slow


@pytest.fixture
def settings(database_url: str) -> Settings:
    # A quick sweeper, so a corrupt timer spends its three attempts in well under a second.
    return Settings(database_url=database_url, port=0, graceful_timeout_ms=1000, db_pool_size=5,
                    sweeper_min_sleep_ms=5, sweeper_max_sleep_ms=500, sweeper_max_attempts=3,
                    sweeper_backoff_ms=20)


async def seed(http: httpx.AsyncClient) -> None:
    r = await http.post(f"{API}/configure", json={"queue": "orders",
                                                  "options": {"retryLimit": 0}})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "orders", "payload": {"note": EVIL}},
        {"queue": "orders", "payload": {"sku": "A-1", "qty": 2}}]})
    assert r.status_code in (200, 201), r.text
    got = (await http.get(f"{API}/pop/queue/orders", params={"batch": 1})).json()
    message = got["messages"][0]
    r = await http.post(f"{API}/ack", json={
        "transactionId": message["transactionId"], "partitionId": message["partitionId"],
        "leaseId": got["leaseId"], "status": "failed", "error": EVIL})
    assert r.status_code == 200, r.text
    for key, delay in ((f"reminder-{EVIL}", 3_600_000), ("invoice-42", 7_200_000),
                       ("soon", 600_000)):
        r = await http.put(f"{API}/timers/orders/{key}",
                           json={"delayMs": delay, "payload": {"say": EVIL}})
        assert r.status_code in (200, 201), r.text


async def timer_dead_letter(http: httpx.AsyncClient, database_url: str) -> None:
    """A timer whose payload cannot be decoded: it spends its attempts, then dead-letters
    under the group __timer__ (which cannot be replayed)."""
    r = await http.put(f"{API}/timers/bills/corrupt", json={"delayMs": 600_000, "payload": 1})
    assert r.status_code in (200, 201), r.text
    with psycopg.connect(database_url, autocommit=True) as raw:
        raw.execute("UPDATE queen.timers SET payload = '\\x00deadbeef'::bytea, "
                    "visible_at = now(), deliver_at = now() WHERE timer_key = 'corrupt'")
    with trio.fail_after(15):
        while not (await http.get(f"{API}/dlq", params={"queue": "bills"})).json()["messages"]:
            await trio.sleep(0.1)


async def shot(browser: Browser, name: str) -> None:
    await browser.screenshot(ARTIFACTS / f"ui-{name}.png")
    if DOCS:
        await browser.screenshot(Path(DOCS) / f"{name}.png")


async def no_script_ran(browser: Browser) -> None:
    assert [d for d in browser.dialogs if d["type"] == "alert"] == []
    # The page's own script is the only <script> element.
    assert await browser.evaluate(
        "[...document.scripts].map(s => s.getAttribute('src')).join(',')") == "/ui/app.js"
    assert await browser.evaluate("document.querySelectorAll('img, iframe, object').length") == 0
    assert browser.console_errors == []


async def test_the_dashboard_in_a_browser(
    broker: BrokerHandle, http: httpx.AsyncClient, tmp_path: Path, database_url: str
) -> None:
    await seed(http)
    await timer_dead_letter(http, database_url)
    ui = f"{broker.url}/ui"
    async with chromium(tmp_path / "profile") as browser:
        # Overview
        await browser.goto(f"{ui}#/overview")
        await browser.wait_for("document.querySelector('#status')?.textContent === 'live'")
        text = await browser.evaluate("document.body.innerText")
        for expected in ("healthy", "schema version", "pending timers", "next timer due",
                         "listener", "Timer fire lag", "push / s"):
            assert expected in text, expected
        assert await browser.evaluate(
            "[...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
            ".textContent === 'pending timers').querySelector('.value').textContent") == "3"
        # Timers fire while the page watches: the fire-lag p50/p99 and the rates appear.
        for i in range(5):
            r = await http.put(f"{API}/timers/pings/p{i}", json={"delayMs": 200, "payload": i})
            assert r.status_code in (200, 201), r.text
        await browser.wait_for("document.body.innerText.includes('latest: p50')")
        assert await browser.evaluate("document.querySelectorAll('svg.chart circle').length") \
            >= 2  # a p50 and a p99 dot per 2 s step with fires
        await browser.wait_for("!document.body.innerText.includes('\u2026')")  # rates known
        await shot(browser, "overview")

        # Queues, then one queue
        await browser.goto(f"{ui}#/queues")
        await browser.wait_for("document.querySelector('h2')?.textContent === 'Queues'")
        await browser.wait_for("document.body.innerText.includes('__QUEUE_MODE__')")
        await shot(browser, "queues")
        await browser.goto(f"{ui}#/queue/orders")
        await browser.wait_for("document.body.innerText.includes('Partitions')")
        text = await browser.evaluate("document.body.innerText")
        assert "Default" in text and "delayedProcessing" in text and "retryLimit" in text
        await shot(browser, "queue")

        # Timers: soonest first, keys are text, peek shows the payload as text
        await browser.goto(f"{ui}#/timers/orders")
        await browser.wait_for("document.querySelectorAll('code.timer-key').length === 3")
        keys = await browser.evaluate(
            "[...document.querySelectorAll('code.timer-key')].map(c => c.textContent)")
        assert keys == ["soon", f"reminder-{EVIL}", "invoice-42"]
        await browser.evaluate(
            "[...document.querySelectorAll('tr')].find(r => r.textContent.includes('reminder-'))"
            ".querySelector('[data-action=peek]').click()")
        payload = await browser.wait_for("document.querySelector('#peek pre')?.textContent")
        assert EVIL in payload
        await no_script_ran(browser)
        await shot(browser, "timers")

        # Cancel, confirmed in the dialog: gone from the API
        await browser.evaluate(
            "setTimeout(() => [...document.querySelectorAll('tr')].find(r => r.textContent"
            ".includes('soon')).querySelector('[data-action=cancel]').click(), 0)")
        notice = await browser.wait_for("document.querySelector('#notice')?.textContent")
        assert "cancelled" in notice
        assert [d["type"] for d in browser.dialogs] == ["confirm"]
        r = await http.get(f"{API}/timers/orders/soon")
        assert (r.status_code, r.json()["found"]) == (200, False)
        await browser.wait_for("document.querySelectorAll('code.timer-key').length === 2")
        # A cancel that finds nothing is said plainly (the page's own function, as a click on
        # a row another operator already cancelled would call it).
        await browser.evaluate("setTimeout(() => cancelTimer('orders', 'soon'), 0)")
        notice = await browser.wait_for(
            "document.querySelector('#notice')?.textContent.includes('absent') && "
            "document.querySelector('#notice').textContent")
        assert "there was no such pending timer" in notice

        # Dead letters: the error and payload are text; replay, confirmed: replayed in the API
        await browser.goto(f"{ui}#/dlq")
        await browser.wait_for("!!document.querySelector('[data-action=replay]')")
        cells = await browser.evaluate(
            "[...document.querySelectorAll('td')].map(c => c.textContent)")
        assert EVIL in cells
        assert any("cannot be decoded" in c for c in cells)
        timer_row = await browser.evaluate(
            "[...document.querySelectorAll('tr')].find(r => r.textContent.includes('__timer__'))"
            ".textContent")
        assert "not replayable" in timer_row
        assert await browser.evaluate("document.querySelectorAll('[data-action=replay]').length") \
            == 1
        await no_script_ran(browser)
        await shot(browser, "dead-letters")
        await browser.evaluate(
            "setTimeout(() => document.querySelector('[data-action=replay]').click(), 0)")
        notice = await browser.wait_for("document.querySelector('#notice')?.textContent")
        assert "replayed as message" in notice, notice
        dead = (await http.get(f"{API}/dlq", params={"queue": "orders"})).json()["messages"]
        assert dead[0]["replayedAt"] is not None
        assert [d["type"] for d in browser.dialogs] == ["confirm"] * 3

        # A phone-sized window still shows the timers
        await browser.call("Emulation.setDeviceMetricsOverride", {
            "width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
        await browser.goto(f"{ui}#/timers/orders")
        await browser.wait_for("document.querySelectorAll('code.timer-key').length === 2")
        await shot(browser, "timers-phone")


def _tokens(database_url: str) -> dict[str, str]:
    with psycopg.connect(database_url, row_factory=dict_row, autocommit=True) as raw:
        store.create_tenant(raw, "alpha")
        store.create_tenant(raw, "beta")
        return {"alpha": store.create_token(raw, "alpha"),
                "beta": store.create_token(raw, "beta")}


@pytest.fixture
async def auth_broker(settings: Settings) -> AsyncIterator[tuple[BrokerHandle, dict[str, str]]]:
    tokens = _tokens(settings.database_url or "")
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(
            run_broker, replace_settings(settings, auth=True))
        yield handle, tokens
        handle.shutdown()


async def test_the_dashboard_asks_for_a_token(
    auth_broker: tuple[BrokerHandle, dict[str, str]], tmp_path: Path
) -> None:
    broker, tokens = auth_broker
    headers: dict[str, Any] = {"Authorization": f"Bearer {tokens['beta']}"}
    async with httpx.AsyncClient(base_url=broker.url, timeout=10, headers=headers) as beta:
        r = await beta.post(f"{API}/configure", json={"queue": "beta-only"})
        assert r.status_code == 200, r.text
    async with chromium(tmp_path / "profile") as browser:
        await browser.goto(f"{broker.url}/ui#/queues")
        await browser.wait_for("!!document.querySelector('#token-form')")
        assert await browser.evaluate("document.querySelector('#status').textContent") \
            == "token needed"
        await shot(browser, "token")
        await browser.evaluate("document.querySelector('#token').value = 'not-a-token';"
                               "document.querySelector('#token-form').requestSubmit()")
        await browser.wait_for("document.body.innerText.includes('That token was refused')")
        await browser.evaluate(
            f"document.querySelector('#token').value = {tokens['alpha']!r};"
            "document.querySelector('#token-form').requestSubmit()")
        await browser.wait_for("document.querySelector('h2')?.textContent === 'Queues'")
        # alpha's data only: beta's queue is not shown
        assert "beta-only" not in await browser.evaluate("document.body.innerText")
        assert await browser.evaluate("sessionStorage.getItem('queen-trio-token')") \
            == tokens["alpha"]
        await browser.evaluate("document.querySelector('#forget-token').click()")
        await browser.wait_for("!!document.querySelector('#token-form')")


CARD = ("[...document.querySelectorAll('.card')].find(c => c.querySelector('.label')"
        ".textContent === {label!r})?.querySelector('.value').textContent")


async def test_a_tenants_dashboard_counts_only_its_own_traffic(
    auth_broker: tuple[BrokerHandle, dict[str, str]], tmp_path: Path
) -> None:
    """Rates and fire lag come from the tenant's own /api/v1/stats, not from /metrics (every
    tenant's traffic together, and the operator's only when auth is on)."""
    broker, tokens = auth_broker
    beta_pushing = trio.Event()

    async def beta_pushes(stop: trio.Event) -> None:
        async with httpx.AsyncClient(base_url=broker.url, timeout=10, headers={
                "Authorization": f"Bearer {tokens['beta']}"}) as beta:
            while not stop.is_set():
                r = await beta.post(f"{API}/push", json={"items": [
                    {"queue": "beta-q", "payload": n} for n in range(20)]})
                assert r.status_code == 201, r.text
                r = await beta.put(f"{API}/timers/beta-q/t{trio.current_time()}",
                                   json={"delayMs": 0, "payload": 1})
                assert r.status_code == 200, r.text
                beta_pushing.set()
                await trio.sleep(0.1)

    stop = trio.Event()
    async with trio.open_nursery() as nursery, chromium(tmp_path / "profile") as browser:
        nursery.start_soon(beta_pushes, stop)
        await beta_pushing.wait()
        await browser.goto(f"{broker.url}/ui#/overview")
        await browser.wait_for("!!document.querySelector('#token-form')")
        await browser.evaluate(
            f"document.querySelector('#token').value = {tokens['alpha']!r};"
            "document.querySelector('#token-form').requestSubmit()")
        await browser.wait_for("document.querySelector('#status')?.textContent === 'live'")
        # Rates are known after two samples; beta pushes about 200 messages a second meanwhile.
        push_rate = CARD.format(label="push / s")
        await browser.wait_for(f"({push_rate} || '\u2026') !== '\u2026'", timeout=15)
        await trio.sleep(4.5)  # two more samples, while beta keeps pushing
        assert await browser.evaluate(push_rate) == "0.0"
        assert "no timer fired since this page opened" in await browser.evaluate(
            "document.body.innerText")
        # alpha's own pushes do show.
        async with httpx.AsyncClient(base_url=broker.url, timeout=10, headers={
                "Authorization": f"Bearer {tokens['alpha']}"}) as alpha:
            for _ in range(5):
                r = await alpha.post(f"{API}/push", json={"items": [
                    {"queue": "alpha-q", "payload": n} for n in range(50)]})
                assert r.status_code == 201, r.text
                await trio.sleep(0.5)
        await browser.wait_for(f"Number({push_rate}) > 0", timeout=10)
        stop.set()


ROW = ("[...document.querySelectorAll('tr')].filter(r => r.querySelector('td'))"
       ".map(r => [...r.querySelectorAll('td')].map(c => c.textContent))")


async def test_the_dashboard_shows_the_backlog(
    broker: BrokerHandle, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Messages nobody popped are pending, not hidden: a queue never consumed shows all 20
    pending with its 2 timers; a partition the queue's group never read shows its 3 messages
    as lag with no committed offset ("none", not -1); consumed messages count in the total
    only."""
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "backlog", "payload": {"n": n}} for n in range(20)]})
    assert r.status_code == 201, r.text
    for key in ("a", "b"):
        r = await http.put(f"{API}/timers/backlog/{key}", json={"delayMs": 600_000,
                                                                "payload": 1})
        assert r.status_code in (200, 201), r.text
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "orders", "payload": {"n": n}} for n in range(4)]})
    assert r.status_code == 201, r.text
    r = await http.get(f"{API}/pop/queue/orders", params={"batch": 4, "autoAck": "true"})
    assert len(r.json()["messages"]) == 4, r.text
    r = await http.post(f"{API}/push", json={"items": [
        {"queue": "orders", "partition": "eu", "payload": {"n": n}} for n in range(3)]})
    assert r.status_code == 201, r.text

    ui = f"{broker.url}/ui"
    async with chromium(tmp_path / "profile") as browser:
        await browser.goto(f"{ui}#/queues")
        await browser.wait_for("document.querySelector('h2')?.textContent === 'Queues'"
                               " && document.body.innerText.includes('__QUEUE_MODE__')")
        headers = await browser.evaluate(
            "[...document.querySelector('table').querySelectorAll('th')].map(h => h.textContent)")
        assert headers[:5] == ["queue", "partitions", "pending messages", "total messages",
                               "pending timers"]
        rows = {r[0]: r for r in await browser.evaluate(ROW) if r[0] in ("backlog", "orders")}
        assert rows["backlog"][1:5] == ["1", "20", "20", "2"]
        assert rows["orders"][1:5] == ["2", "3", "7", "0"]
        groups = [r for r in await browser.evaluate(ROW) if r[0] == "__QUEUE_MODE__"]
        assert [g[1:3] for g in groups] == [["orders", "3"]]
        await shot(browser, "queues-backlog")

        await browser.goto(f"{ui}#/queue/orders")
        await browser.wait_for("document.querySelector('h2')?.textContent === 'Queue orders'")
        assert await browser.evaluate(CARD.format(label="pending messages")) == "3"
        cursors = [r for r in await browser.evaluate(ROW) if r[0] == "__QUEUE_MODE__"]
        assert sorted(c[1:4] for c in cursors) == [["Default", "3", "0"], ["eu", "none", "3"]]
        await browser.goto(f"{ui}#/queue/backlog")
        await browser.wait_for("document.querySelector('h2')?.textContent === 'Queue backlog'")
        assert await browser.evaluate(CARD.format(label="pending messages")) == "20"
        assert await browser.evaluate(CARD.format(label="pending timers")) == "2"
        assert browser.console_errors == []
