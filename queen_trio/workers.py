"""``QUEEN_WORKERS`` > 1: several whole brokers behind one listening socket.

One broker process is bound by the GIL to one core, and its HTTP stack costs most of a
millisecond of CPU per request. So ``serve`` can run N brokers: this supervisor binds the port
once, starts N ``queen-trio serve`` processes that inherit the socket (``QUEEN_LISTEN_FD``) and
accept on it, each a complete broker with its own nursery, pool, sweeper and housekeeping, as
several brokers on one database always could be. The kernel hands each new connection to
whichever worker accepts first.

A worker that dies is started again (another worker takes its claimed timers over once their
lease ends). One that exits with an error of its own within seconds of starting has met a
configuration or database problem: the supervisor stops them all and exits with an error rather
than restart in a loop. (One killed by a signal, the OOM killer or an operator, is restarted
however young.)
SIGINT, SIGTERM or SIGHUP is passed on to every worker (as SIGTERM), which shut down gracefully.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from .config import Settings
from .errors import ListenError

log = logging.getLogger(__name__)

# A worker that exits sooner than this after its start is not worth restarting.
CRASH_LOOP_S = 10.0
_POLL_S = 0.1
# On top of the graceful timeout: start-up and the last commits of a stopping worker.
_STOP_GRACE_S = 10.0


def bind(settings: Settings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        sock = socket.create_server((settings.host.strip("[]"), settings.port), family=family,
                                    backlog=1024)
    except OSError as exc:
        raise ListenError(f"cannot listen on {settings.host}:{settings.port}: "
                          f"{exc.strerror or exc}") from exc
    os.set_inheritable(sock.fileno(), True)
    return sock


class Supervisor:
    def __init__(self, settings: Settings, stop_requested: Callable[[], bool],
                 sock: socket.socket | None = None) -> None:
        assert settings.database_url is not None
        self._settings = settings
        self._stop_requested = stop_requested
        self._sock = sock  # bound already (``serve`` binds before it starts a database)
        self._workers: list[tuple[subprocess.Popen[bytes], float]] = []

    def run(self) -> int:
        sock = self._sock or bind(self._settings)
        host, port = sock.getsockname()[:2]
        env = dict(os.environ, QUEEN_DATABASE_URL=self._settings.database_url or "",
                   QUEEN_WORKERS="1", QUEEN_LISTEN_FD=str(sock.fileno()))
        try:
            self._workers = [self._start(env, sock) for _ in range(self._settings.workers)]
            log.info("queen-trio: %d workers on http://%s:%d", len(self._workers), host, port)
            failed = self._watch(env, sock)
        finally:
            sock.close()  # the workers hold their own copies
            self._stop_all()
        return 1 if failed else 0

    def _start(
        self, env: dict[str, str], sock: socket.socket
    ) -> tuple[subprocess.Popen[bytes], float]:
        process = subprocess.Popen([sys.executable, "-m", "queen_trio", "serve"], env=env,
                                   pass_fds=(sock.fileno(),))
        return process, time.monotonic()

    def _watch(self, env: dict[str, str], sock: socket.socket) -> bool:
        """Until a stop is requested (False) or a worker dies young (True)."""
        while not self._stop_requested():
            for i, (process, started) in enumerate(self._workers):
                code = process.poll()
                if code is None:
                    continue
                if code > 0 and time.monotonic() - started < CRASH_LOOP_S:
                    log.error("worker %d exited with %d right after starting; stopping",
                              process.pid, code)
                    return True
                log.warning("worker %d exited with %d; starting another", process.pid, code)
                self._workers[i] = self._start(env, sock)
            time.sleep(_POLL_S)
        return False

    def _stop_all(self) -> None:
        for process, _ in self._workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._settings.graceful_timeout_ms / 1000 + _STOP_GRACE_S
        for process, _ in self._workers:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
