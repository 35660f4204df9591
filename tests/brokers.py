"""Real broker processes for tests: ``python -m queen_trio serve`` on a free port.

Each broker runs in its own process with a clean environment (every inherited ``QUEEN_*``
variable is removed, then the test's own are set), writes its stderr to a file the test can
read back when something goes wrong, and is always reaped: :func:`running_brokers` SIGKILLs
whatever is still alive when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx
import trio

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_env(database_url: str, port: int, extra: Mapping[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env.update({
        "QUEEN_DATABASE_URL": database_url,
        "QUEEN_PORT": str(port),
        "QUEEN_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    })
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


class BrokerProcess:
    """One ``queen_trio serve`` subprocess."""

    def __init__(self, database_url: str, *, name: str = "broker",
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._env = broker_env(database_url, self.port, env)
        self._stderr = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in close()
            prefix=f"queen-{name}-", suffix=".stderr", delete=False
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> BrokerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "queen_trio", "serve"],
            cwd=REPO, env=self._env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=self._stderr,
        )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def wait_healthy(self, within: float = 20.0) -> None:
        """Return once GET /health answers 200; fail with the broker's stderr otherwise."""
        deadline = trio.current_time() + within
        last = "no answer"
        async with httpx.AsyncClient(base_url=self.url, timeout=2) as http:
            while trio.current_time() < deadline:
                if not self.alive:
                    raise AssertionError(
                        f"{self.name} exited with code {self.returncode} before becoming "
                        f"healthy; stderr:\n{self.stderr()}"
                    )
                try:
                    r = await http.get("/health")
                    if r.status_code == 200:
                        return
                    last = f"{r.status_code} {r.text}"
                except httpx.HTTPError as exc:
                    last = repr(exc)
                await trio.sleep(0.05)
        raise AssertionError(f"{self.name} not healthy after {within}s ({last}); stderr:\n"
                             f"{self.stderr()}")

    async def terminate(self, within: float = 15.0) -> int | None:
        """SIGTERM, then wait (bounded) for the exit code; None if it did not exit in time
        (it is then SIGKILLed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(within):
            while True:
                if self.proc.poll() is not None:
                    return self.proc.returncode
                await trio.sleep(0.02)
        self.kill()
        return None

    def kill(self) -> None:
        """SIGKILL (no-op if it already exited) and reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stderr(self, limit: int = 6000) -> str:
        self._stderr.flush()
        try:
            text = Path(self._stderr.name).read_text(errors="replace")
        except FileNotFoundError:
            return "(no stderr file)"
        return text if len(text) <= limit else "…" + text[-limit:]

    def close(self) -> None:
        self.kill()
        self._stderr.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._stderr.name)

    # -- HTTP helpers ---------------------------------------------------------------------

    async def metric(self, http: httpx.AsyncClient, name: str) -> float:
        """The value of an unlabelled sample ``name`` on this broker's /metrics."""
        r = await http.get(f"{self.url}/metrics")
        r.raise_for_status()
        for line in r.text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{}"):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not found on {self.name}'s /metrics")


@contextlib.asynccontextmanager
async def running_brokers(
    database_url: str, n: int, *, env: Mapping[str, str] | None = None,
    names: list[str] | None = None, healthy_within: float = 30.0,
) -> AsyncIterator[list[BrokerProcess]]:
    """Start ``n`` brokers together, wait until every one is healthy, yield them, and SIGKILL
    whatever is still running at the end (a test stops them gracefully itself when it wants to
    check the exit code)."""
    brokers = [BrokerProcess(database_url, name=(names[i] if names else f"broker{i}"), env=env)
               for i in range(n)]
    try:
        for b in brokers:
            b.start()
        async with trio.open_nursery() as nursery:
            for b in brokers:
                nursery.start_soon(b.wait_healthy, healthy_within)
        yield brokers
    finally:
        for b in brokers:
            b.close()
