"""The consumer our users run, as a process of its own: ``Client.consume(queue, handler)`` at
its defaults, under asyncio (``--sync``: ``SyncClient.consume`` with a plain function).

``bench.fire_lag`` starts it beside the broker, as it starts the peer's worker beside the
peer, and reads the handler starts from its stdout: one line per handler call,
``key<TAB>deliverAt<TAB>started<TAB>createdAt`` (started in epoch seconds, taken as the handler
begins; the handler writes and flushes its line, as the peer's job does). So the lag it reports
is what a user feels: due instant to handler start, through the SDK's own pop, settle and
dispatch.

    python -m bench.sdk_consumer --url http://127.0.0.1:6632 --queue q [--sync]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import queen_trio

REPO = Path(__file__).resolve().parent.parent


def _line(message: queen_trio.Message, started: float) -> str:
    timer = message.timer
    key = timer.key if timer else "-"
    due = timer.deliver_at.isoformat() if timer and timer.deliver_at else "-"
    return f"{key}\t{due}\t{started:.6f}\t{message.created_at.isoformat()}\n"


def handler(message: queen_trio.Message) -> None:
    started = time.time()
    sys.stdout.write(_line(message, started))
    sys.stdout.flush()  # the suite watches arrivals live


def consumer_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sdk_consumer")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--sync", action="store_true", help="SyncClient.consume")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    if args.sync:
        with queen_trio.SyncClient(args.url) as queen:
            queen.consume(args.queue, handler)
        return 0

    async def run() -> None:
        async with queen_trio.Client(args.url) as queen:
            await queen.consume(args.queue, handler)

    asyncio.run(run())
    return 0


# -- the suite's side (trio) --------------------------------------------------------------


class SdkConsumer:
    """The consumer subprocess; ``on_start(message_like, started)`` for every handler call,
    with the record in the shape of a popped frame (``bench.timer_lag.Delivery`` reads it)."""

    def __init__(self, url: str, queue: str, *, sync: bool = False) -> None:
        self.url, self.queue, self.sync = url, queue, sync
        self.process: trio.Process | None = None
        self.ready = trio.Event()
        self.on_start: Callable[[dict[str, Any], float], None] = lambda *_: None
        self.stderr_path = Path(tempfile.mkstemp(prefix="queen-bench-consumer-",
                                                 suffix=".log")[1])

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        cmd = [sys.executable, "-m", "bench.sdk_consumer", "--url", self.url,
               "--queue", self.queue, *(["--sync"] if self.sync else [])]
        with open(self.stderr_path, "wb") as err:  # noqa: ASYNC230 - a local file, once
            self.process = await trio.lowlevel.open_process(
                cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read)
                with trio.fail_after(30):
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
            raise RuntimeError(f"consumer exited before it was ready: {self.log_tail()}")

    def _line(self, line: str) -> None:
        if line == "READY":
            self.ready.set()
            return
        parts = line.split("\t")
        if len(parts) == 4:
            key, due, started, created = parts
            frame = {"timer": {"key": key, "deliverAt": _wire_time(due)},
                     "createdAt": _wire_time(created)}
            self.on_start(frame, float(started))

    async def _stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await self.process.wait()
            return
        self.process.kill()
        await self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _wire_time(iso: str) -> str:
    """The broker's spelling of an instant (``…Z``), from Python's isoformat."""
    return iso.replace("+00:00", "Z")


if __name__ == "__main__":
    sys.exit(consumer_main())
