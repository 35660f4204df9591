"""The consumer our users run, as a process of its own: ``Client.consume(queue, handler)`` at
its defaults, under asyncio (``--sync``: ``SyncClient.consume`` with a plain function).

``bench.fire_lag`` and ``bench.peer_graphile`` start it (:class:`SdkConsumer`) beside the
broker, as they start the peer's worker beside the peer, and read the handler starts from its
stdout: one line per handler call, ``key<TAB>deliverAt<TAB>started<TAB>createdAt`` (started in
epoch seconds, taken as the handler begins; the handler writes and flushes its line, as the
peer's job does). So the lag it reports is what a user feels: due instant to handler start,
through the SDK's own pop, settle and dispatch.

    python -m bench.harness.sdk_consumer --url http://127.0.0.1:6632 --queue q [--sync]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import queen_trio
from bench.harness.lines import LineProcess


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
    parser = argparse.ArgumentParser(prog="python -m bench.harness.sdk_consumer")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--sync", action="store_true", help="SyncClient.consume")
    args = parser.parse_args(argv)
    if args.sync:
        stopping = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        try:
            with queen_trio.SyncClient(args.url) as queen:
                queen.consume(args.queue, handler)
        except BaseExceptionGroup:
            # The exit SIGTERM raises can land inside the consume loop's task group (in a read,
            # say) and come out wrapped in a group: a consumer told to stop, not a crash.
            if not stopping:
                raise
        return 0

    async def run() -> None:
        # SIGTERM cancels the consume loop: an exit raised inside its task groups would come
        # out wrapped in an exception group, as a crash (exit 1) of a consumer told to stop.
        main_task = asyncio.current_task()
        assert main_task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        try:
            async with queen_trio.Client(args.url) as queen:
                await queen.consume(args.queue, handler)
        except asyncio.CancelledError:
            return

    asyncio.run(run())
    return 0


# -- the suite's side (trio) --------------------------------------------------------------


class SdkConsumer(LineProcess):
    """The consumer subprocess; ``on_start(message_like, started)`` for every handler call,
    with the record in the shape of a popped frame (``bench.harness.timers.Delivery`` reads
    it)."""

    def __init__(self, url: str, queue: str, *, sync: bool = False) -> None:
        super().__init__("bench.harness.sdk_consumer",
                         ["--url", url, "--queue", queue, *(["--sync"] if sync else [])],
                         what="consumer", log_prefix="queen-bench-consumer-")
        self.url, self.queue, self.sync = url, queue, sync
        self.on_start: Callable[[dict[str, Any], float], None] = lambda *_: None

    def on_line(self, line: str) -> None:
        parts = line.split("\t")
        if len(parts) == 4:
            key, due, started, created = parts
            frame = {"timer": {"key": key, "deliverAt": _wire_time(due)},
                     "createdAt": _wire_time(created)}
            self.on_start(frame, float(started))


def _wire_time(iso: str) -> str:
    """The broker's spelling of an instant (``…Z``), from Python's isoformat."""
    return iso.replace("+00:00", "Z")


if __name__ == "__main__":
    sys.exit(consumer_main())
