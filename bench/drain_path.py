"""CPU per message of the drain path's Python steps, without HTTP or PostgreSQL: what a
``consume()`` batch of fired timers costs the broker and the SDK besides the round trip.

One process, CPU time only (best of 5 timings, so that other work on the machine weighs
less), for a 500-message batch shaped as a burst's (timer frames, one fire instant per 100):

* ``broker encode``: the store's PopBatch to the pop answer's bytes (api/log.batch_to_wire,
  then the wire codec);
* ``broker acks``: a settle-and-pop body of 500 completions as the SDK sends it, decoded and
  read into acknowledgements (rules.ack_batch);
* ``sdk decode``: the answer's bytes to the SDK's SettledPop (what consume() hands out), as
  the SDK's transport reads it;
* ``sdk stream decode``: the same answer as the stream's message (``{"seq": n, "pop": ...}``)
  to the batch consume() hands its workers (client/stream.py ``PopStream.receive``'s decoding,
  then ``SettledPop.from_model``);
* ``sdk settle``: 500 settlements owed (calls.ack_entry) to the request body's bytes;
* ``sdk handle``: consume()'s own work around a handler that does nothing, per message of the
  batch (client/consumer.py ``handle_batch``: the handler's call, what each message is owed),
  under asyncio;
* ``broker stream settle``: the same settlement as a stream's message (``seq`` added) read by
  the stream (api/stream.py ``_Stream._settlement``) and found whole, twice, as the stream
  asks (when it arrives, and when it is applied);
* ``sdk stream settle``: 500 messages handled and completed to the stream message's bytes:
  what the consumer owes for them (``ack_entry`` dicts, or since the stream takes them, the
  messages themselves) and ``PopStream.settle``'s writing of it (client/stream.py).

Run it against two checkouts to compare (``PYTHONPATH=<checkout> python -m bench.drain_path``).

    python -m bench.drain_path [--messages 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from bench.harness.report import load, source_revision
from queen_trio import strict_json
from queen_trio.api import log as api_log
from queen_trio.api import stream as api_stream
from queen_trio.client import calls
from queen_trio.client import stream as sdk_stream
from queen_trio.client.models import AckStatus, SettledPop
from queen_trio.log import rules, store
from queen_trio.models import codec


def pop_batch(n: int) -> store.PopBatch:
    base = datetime.datetime(2026, 12, 4, 15, 0, tzinfo=datetime.UTC)
    pid = uuid.uuid4()
    messages = []
    for i in range(n):
        fired = base + datetime.timedelta(milliseconds=i // 100)  # a sweep fires 100 at once
        due = base - datetime.timedelta(milliseconds=3)
        meta = {"messageId": str(uuid.uuid4()),
                "timer": {"key": f"burst-{i}", "deliverAt": due.isoformat()}}
        messages.append(store.Message(i + 1, str(uuid.uuid4()), {"k": f"burst-{i}"}, fired, 0,
                                      meta))
    return store.PopBatch("q", "Default", pid, "__QUEUE_MODE__", uuid.uuid4(),
                          base + datetime.timedelta(seconds=300), messages)


def sdk_decode(call: calls.Call[Any], raw: bytes) -> Any:
    """As the SDK's transport reads an answer: the call's fast path first, if it has one."""
    fast = getattr(call, "fast", None)
    quick = codec.FALLBACK if fast is None else fast(raw)
    return call.parse(strict_json.loads(raw)) if quick is codec.FALLBACK else quick


class _Captured(sdk_stream.PopStream):
    """A stream without a socket: what ``settle`` would send is kept."""

    def __init__(self) -> None:  # (no socket, no connection)
        self.sent = b""

    async def _write(self, event: Any) -> None:
        self.sent = bytes(event.data)


def sdk_stream_decode(raw: bytes) -> Any:
    """A stream's batch message to what consume() hands a worker (client/stream.py
    ``PopStream.receive``, client/consumer.py ``_Streaming.take``)."""
    got = codec.fast(raw, sdk_stream._DECODE)
    assert got is not codec.FALLBACK and got.pop is not None
    return SettledPop.from_model(got.pop).batch


def owed_completed(messages: Any) -> list[Any]:
    """What the checkout's consume() owes for ``messages`` handled and completed: the messages
    themselves where the stream settles them so (``client.stream.Owed``), else their
    ``ack_entry`` dicts."""
    if hasattr(sdk_stream, "Owed"):
        return list(messages)
    return [calls.ack_entry(m, AckStatus.COMPLETED, None) for m in messages]


def sdk_stream_settle(stream: _Captured, entries: list[Any]) -> bytes:
    """``PopStream.settle``'s message for ``entries`` (its coroutine never waits here)."""
    step = stream.settle(1, entries)
    try:
        step.send(None)
    except StopIteration:
        return stream.sent
    raise RuntimeError("PopStream.settle waited")


def broker_stream(batch: store.PopBatch) -> Any:
    """A stream (api/stream.py) holding ``batch`` as its batch 1, for reading settlements."""
    stream: Any = object.__new__(api_stream._Stream)
    stream.out = {1: [batch]}
    stream.known_whole = None  # (a checkout without it ignores it)
    return stream


def broker_stream_settle(stream: Any, raw: bytes) -> bool:
    seq, acks = stream._settlement(raw)
    return bool(stream._whole(seq, acks) and stream._whole(seq, acks))


def sdk_handle_us(batch: Any, number: int) -> float:
    """Best of 5: CPU microseconds per ``handle_batch`` of ``batch`` with a no-op handler."""
    from queen_trio.client import consumer

    async def timed() -> float:
        loop = consumer._Loop(None, "q", lambda m: None,  # type: ignore[arg-type]
                              group=None, batch=len(batch), partition=None, max_messages=None,
                              idle_s=None, poll_s=2.0, renew=False)
        worker = consumer._Worker(loop)
        best = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(number):
                await worker.handle_batch(batch)
                worker.owed = []
            best = min(best, time.process_time() - t0)
        return best * 1e6 / number

    return anyio.run(timed, backend="asyncio")


def cpu_us(fn: Callable[[], Any], number: int) -> float:
    """Best of 5: CPU microseconds per call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, time.process_time() - t0)
    return best * 1e6 / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_path",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    n = args.messages
    batch = pop_batch(n)
    req = rules.pop_request("q", None, {"batch": str(n)})

    def encode() -> bytes:
        answer = api_log.batches_to_wire(req, [batch], None)  # payloads stored plain
        answer.acks = api_log.ack_summary([])
        return codec.encode(answer)

    answer_bytes = encode()
    stream_message = b'{"seq":1,"pop":%s}' % answer_bytes
    settled = calls.settle_and_pop("q", [], group=None, partition=None, batch=n, wait=None)
    got = settled.parse(strict_json.loads(answer_bytes))
    owed = [calls.ack_entry(m, AckStatus.COMPLETED, None) for m in got.batch]
    settle_bytes = strict_json.dumps(calls.compact_acks(owed))
    captured = _Captured()
    stream_bytes = sdk_stream_settle(captured, owed_completed(got.batch))
    held = broker_stream(batch)
    assert broker_stream_settle(held, stream_bytes), "the stream did not find the batch whole"

    steps: dict[str, Callable[[], Any]] = {
        "broker encode": encode,
        "broker acks": lambda: rules.ack_batch(strict_json.loads(settle_bytes)),
        "sdk decode": lambda: sdk_decode(settled, answer_bytes),
        "sdk stream decode": lambda: sdk_stream_decode(stream_message),
        "sdk settle": lambda: strict_json.dumps(calls.compact_acks(
            [calls.ack_entry(m, AckStatus.COMPLETED, None) for m in got.batch])),
        "broker stream settle": lambda: broker_stream_settle(held, stream_bytes),
        "sdk stream settle": lambda: sdk_stream_settle(captured, owed_completed(got.batch)),
    }
    print(f"drain_path at {source_revision()}, {n} messages, load {load()}")
    for r in range(args.rounds):
        cells = {name: cpu_us(fn, 20) / n for name, fn in steps.items()}
        cells["sdk handle"] = sdk_handle_us(got.batch, 20) / n
        total = sum(cells.values())
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in cells.items())
              + f"; total {total:.2f} µs per message", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
