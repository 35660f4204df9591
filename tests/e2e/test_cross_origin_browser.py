"""Attacks on a broker running with auth off, from a real browser (headless chromium, through
tests/e2e/cdp.py). Without chromium these tests fail: they do not skip.

- A page served from another origin (another port of 127.0.0.1: same-site; and localhost:
  cross-site) sends every write a page can send without asking: ``fetch(url, {mode:
  "no-cors", method: "POST", body})`` with a JSON text (sent as text/plain), and a pop with
  autoAck (a GET). None may land: the tables are checked.
- DNS rebinding: chromium is told that ``rebind.test`` is 127.0.0.1 (as an attacker's DNS
  server would say once the page has loaded). A page at ``http://rebind.test:<port>`` is
  same-origin with the broker, so the browser lets its script write and read; the broker
  must refuse it for its Host.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from queen_trio.server import BrokerHandle

from .cdp import chromium

API = "/api/v1"
pytestmark = pytest.mark.slow

ATTACK = """<!doctype html><title>cute cats</title><script>
const broker = %(broker)r;
const writes = [
  ["/api/v1/push", {items: [{queue: "q", payload: {evil: 1}}]}],
  ["/api/v1/transaction",
   {operations: [], kv: [{op: "put", ns: "ns", key: "k", value: 1, forever: true}]}],
  ["/api/v1/timers", {queue: "q", key: "evil", delayMs: 0, payload: 1}],
  ["/api/v1/transaction", {operations: [], timers: [{action: "cancel", queue: "q", key: "keep"}]}],
  ["/api/v1/configure", {queue: "q", options: {retryLimit: 0}}],
];
window.sent = [];
(async () => {
  for (const [path, body] of writes) {
    try {
      await fetch(broker + path, {mode: "no-cors", method: "POST", body: JSON.stringify(body)});
      window.sent.push(path);
    } catch (e) { window.sent.push("failed " + path + ": " + e); }
  }
  await fetch(broker + "/api/v1/pop/queue/kept?autoAck=true", {mode: "no-cors"});
  window.done = true;
})();
</script>"""


@contextmanager
def attacker_site(broker_url: str) -> Iterator[int]:
    page = (ATTACK % {"broker": broker_url}).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def state(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url, autocommit=True) as raw:
        def n(sql: str) -> int:
            row = raw.execute(sql).fetchone()
            assert row is not None
            return int(row[0])
        return {
            "frames": n("SELECT count(*) FROM queen.frames"),
            "kv": n("SELECT count(*) FROM queen.kv"),
            "timers": n("SELECT count(*) FROM queen.timers"),
            "keep": n("SELECT count(*) FROM queen.timers WHERE timer_key = 'keep'"),
            "cursors": n("SELECT count(*) FROM queen.cursors"),
            "queues": n("SELECT count(*) FROM queen.queues"),
        }


async def seed(http: httpx.AsyncClient) -> None:
    r = await http.put(f"{API}/timers/q/keep", json={"delayMs": 3_600_000, "payload": 1})
    assert r.status_code == 200, r.text
    r = await http.post(f"{API}/push", json={"items": [{"queue": "kept", "payload": 1}]})
    assert r.status_code == 201, r.text


async def test_no_cors_writes_from_another_origins_page_land_nothing(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str, tmp_path: Path
) -> None:
    await seed(http)
    before = state(database_url)
    assert before["keep"] == 1 and before["frames"] == 1
    with attacker_site(broker.url) as port:
        async with chromium(tmp_path / "profile") as browser:
            # localhost is another site than 127.0.0.1; another port of 127.0.0.1 is the same
            # site but another origin. Both are refused.
            for page in (f"http://localhost:{port}/", f"http://127.0.0.1:{port}/"):
                await browser.goto(page)
                await browser.wait_for("window.done === true", timeout=20)
                sent = await browser.evaluate("window.sent")
                assert len(sent) == 5 and not any(s.startswith("failed") for s in sent), sent
    await trio.sleep(0.5)  # the timer "evil" was due at once: give a fire the time to happen
    assert state(database_url) == before


async def test_a_rebound_name_can_neither_write_nor_read(
    broker: BrokerHandle, http: httpx.AsyncClient, database_url: str, tmp_path: Path
) -> None:
    await seed(http)
    before = state(database_url)
    port = broker.url.rsplit(":", 1)[1]
    rules = "--host-resolver-rules=MAP rebind.test 127.0.0.1"
    async with chromium(tmp_path / "profile", extra_args=(rules,)) as browser:
        await browser.goto(f"http://rebind.test:{port}/ui")
        await browser.wait_for("document.readyState === 'complete'")
        # The page's own script, same-origin with the broker as far as the browser knows.
        answer = await browser.evaluate(
            "fetch('/api/v1/push', {method: 'POST', headers: {'Content-Type': "
            "'application/json'}, body: JSON.stringify({items: [{queue: 'q', payload: 1}]})})"
            ".then(async r => [r.status, (await r.json()).error])")
        assert answer == [403, "host_not_allowed"], answer
        answer = await browser.evaluate(
            "fetch('/api/v1/resources/queues').then(async r => [r.status, await r.text()])")
        assert answer[0] == 403 and "kept" not in answer[1], answer
        # The dashboard itself is not served under that name either.
        assert "host_not_allowed" in await browser.evaluate("document.body.innerText")
    assert state(database_url) == before
