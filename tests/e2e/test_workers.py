"""QUEEN_WORKERS: several whole brokers behind one port, supervised by `queen-trio serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import psycopg
import pytest

from tests.brokers import REPO, broker_env, free_port

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "queen_trio", "serve"]


def _workers(parent: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return [p for p in psutil.Process(parent.pid).children() if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


def _listeners(database_url: str) -> int:
    """Brokers connected to this database: each holds one LISTEN connection."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'queen-trio-listener'").fetchone()[0]


def _until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"{what} within {timeout} s")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_workers_share_one_port_are_restarted_and_stop_together(database_url: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = broker_env(database_url, port, {"QUEEN_WORKERS": "2", "QUEEN_GRACEFUL_TIMEOUT_MS": "500"})
    parent = subprocess.Popen(CLI, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _until(lambda: _healthy(url), 60, "no healthy answer")
        _until(lambda: _listeners(database_url) == 2, 30, "two brokers never connected")
        first = {p.pid for p in _workers(parent)}
        assert len(first) == 2

        # Both accept on the port: a timer scheduled through one fires once, wherever.
        with httpx.Client(base_url=url, timeout=5) as http:
            for i in range(20):
                r = http.put(f"/api/v1/timers/w/k{i}", json={"delayMs": 0, "payload": i},
                             headers={"Connection": "close"})
                assert r.status_code == 200 and r.json()["status"] == "scheduled"
            got: list[int] = []
            deadline = time.monotonic() + 10
            while len(got) < 20 and time.monotonic() < deadline:
                r = http.get("/api/v1/pop/queue/w",
                             params={"batch": 20, "wait": "true", "timeout": 1000,
                                     "autoAck": "true"})
                if r.status_code == 200:
                    got += [m["data"] for m in r.json()["messages"]]
            assert sorted(got) == list(range(20))

        # A worker that dies is replaced; the port keeps answering meanwhile.
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGKILL)
        assert _healthy(url)
        replaced = _until(lambda: (lambda now: now if len(now) == 2 and victim not in now
                                   else None)({p.pid for p in _workers(parent)}),
                          30, "the killed worker was not replaced")
        assert replaced - first and len(replaced & first) == 1
        _until(lambda: _healthy(url), 30, "no healthy answer after the restart")

        # SIGTERM to the supervisor stops every worker, gracefully, and it exits 0.
        workers = _workers(parent)
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == []
        assert not _healthy(url)
    finally:
        if parent.poll() is None:
            for p in _workers(parent):
                p.kill()
            parent.kill()
            parent.wait()


def test_workers_that_cannot_start_stop_the_supervisor_with_an_error() -> None:
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    env = broker_env(dead, free_port(), {"QUEEN_WORKERS": "2"})
    started = time.monotonic()
    proc = subprocess.run(CLI, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=60)
    assert proc.returncode == 1
    assert time.monotonic() - started < 30  # gave up, did not restart them in a loop
    assert b"right after starting" in proc.stderr
