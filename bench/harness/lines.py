"""A child process that speaks in lines: started, waited for until it prints ``READY``, every
further stdout line handed to ``on_line`` as it arrives, stopped with SIGTERM (killed if it
is still there 10 s later). Its stderr goes to a temporary file whose tail the report shows.

``bench.harness.sdk_consumer`` (our SDK's consumer) and ``bench.harness.peer_procrastinate``
(the peer's worker) run this way beside the brokers of ``bench.fire_lag``."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

from bench.harness.brokers import REPO

READY = "READY"
READY_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10


class LineProcess:
    """``python -m <module> <args>``; ``what`` names it in errors."""

    def __init__(self, module: str, args: list[str], *, what: str, log_prefix: str) -> None:
        self.cmd = [sys.executable, "-m", module, *args]
        self.what = what
        self.process: trio.Process | None = None
        self.ready = trio.Event()
        self.stderr_path = Path(tempfile.mkstemp(prefix=log_prefix, suffix=".log")[1])

    def on_line(self, line: str) -> None:
        """One stdout line after READY (without its newline)."""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        with open(self.stderr_path, "wb") as err:  # noqa: ASYNC230 - a local file, once
            self.process = await trio.lowlevel.open_process(
                self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                stdin=subprocess.DEVNULL)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                with trio.fail_after(READY_TIMEOUT_S):
                    await self.ready.wait()
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self._stop()

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._line(line.decode())
        if not self.ready.is_set():
            raise RuntimeError(f"{self.what} exited before it was ready: {self.log_tail()}")

    def _line(self, line: str) -> None:
        if line == READY:
            self.ready.set()
            return
        self.on_line(line)

    async def _stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # graceful: lets it unregister, flush
        with trio.move_on_after(STOP_TIMEOUT_S):
            await self.process.wait()
            return
        self.process.kill()
        await self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
