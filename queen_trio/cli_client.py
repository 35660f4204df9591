"""Client commands of ``queen-trio``: talk to a running broker over HTTP through the SDK.

::

    queen-trio timers schedule QUEUE KEY --delay 15m [--payload JSON] [--partition P] [--txn T]
    queen-trio timers cancel|peek QUEUE KEY      queen-trio timers list QUEUE
    queen-trio push QUEUE PAYLOAD                queen-trio pop QUEUE [--wait 30s] [--auto-ack]
    queen-trio ack|nack TXN PARTITION_ID LEASE_ID [--group G]   (what pop prints)
    queen-trio configure QUEUE [--lease-time 5m] [--retry-limit 3] …   queen-trio queues
    queen-trio dlq list [QUEUE]                  queen-trio dlq replay ID
    queen-trio kv get|put|delete NAMESPACE KEY [VALUE] [--ttl 1h]

Every one takes ``--url`` (default ``QUEEN_URL``, else http://127.0.0.1:6632; a comma
separated list fails over), ``--token`` (default ``QUEEN_TOKEN``) and ``--json`` (one JSON
document on stdout, also for errors). Payloads and values are JSON; ``-`` reads stdin.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from enum import Enum
from itertools import islice
from typing import Any

import msgspec

from . import strict_json

EXIT_OK = 0
EXIT_USAGE = 2        # bad arguments: nothing was sent
EXIT_NOT_DONE = 3     # a verdict, not a failure: absent, too_late, nothing to pop, no such key
EXIT_REFUSED = 4      # the broker answered with an error (4xx/5xx)
EXIT_UNREACHABLE = 5  # no broker answered
COMMANDS = ("timers", "push", "pop", "ack", "nack", "configure", "queues", "dlq", "kv")

EXIT_CODES_HELP = """\
exit codes:
  0  done
  2  usage error (bad arguments, a malformed duration or JSON); nothing was sent
  3  not done, by verdict: a cancel answered absent or too_late, peek or kv get found
     nothing, pop found no message
  4  the broker refused the request (an HTTP error; its code is printed)
  5  no broker answered (connection refused or timed out on every URL)
"""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to the ``queen-trio`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, metavar="URL[,URL…]",
                        help="broker base URL(s) (default: $QUEEN_URL or http://127.0.0.1:6632)")
    common.add_argument("--token", default=None,
                        help="bearer token (default: $QUEEN_TOKEN)")
    common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="per-request timeout (default 10)")

    def command(group: Any, name: str, help: str) -> argparse.ArgumentParser:
        return group.add_parser(name, help=help, description=help, parents=[common],
                                epilog=EXIT_CODES_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    timers = commands.add_parser("timers", help="schedule, cancel, peek or list timers")
    actions = timers.add_subparsers(dest="action", metavar="ACTION", required=True)
    schedule = command(actions, "schedule", "schedule a timer (or replace the pending one)")
    _queue_key(schedule)
    schedule.add_argument("--delay", required=True,
                          help="250ms, 30s, 15m, 72h, 7d, 1h30m or integer milliseconds")
    schedule.add_argument("--payload", default="null", help="JSON (default null; - for stdin)")
    schedule.add_argument("--partition")
    schedule.add_argument("--txn", help="transactionId its message will carry")
    cancel = command(actions, "cancel", "cancel a pending timer by name")
    _queue_key(cancel)
    cancel.add_argument("--txn", help="echoed back: the txn to look for if it answers absent")
    _queue_key(command(actions, "peek", "show a pending timer"))
    listing = command(actions, "list", "list a queue's pending timers")
    listing.add_argument("queue")
    listing.add_argument("--limit", type=int, default=None, help="at most this many")

    push = command(commands, "push", "push a message")
    push.add_argument("queue")
    push.add_argument("payload", help="JSON (- for stdin)")
    push.add_argument("--partition")
    push.add_argument("--txn", help="transactionId (makes a repeated push a duplicate)")

    pop = command(commands, "pop", "pop messages (under a lease unless --auto-ack); settle "
                                   "each with `ack` or `nack` TXN PARTITION_ID LEASE_ID, the "
                                   "first three columns printed")
    pop.add_argument("queue")
    pop.add_argument("--group", help="consumer group (default: queue mode); give ack/nack "
                                     "the same --group")
    pop.add_argument("--partition", help="pop from this partition only (default: any "
                                         "partition with messages ready)")
    pop.add_argument("--batch", type=int, default=1, metavar="N",
                     help="up to N messages, all of one partition under one lease (default 1)")
    pop.add_argument("--wait", help="long-poll up to this long, e.g. 30s")
    pop.add_argument("--auto-ack", action="store_true", help="acknowledge on delivery")

    for name, help in (("ack", "settle a popped message as done"),
                       ("nack", "settle a popped message as failed: redelivered until the "
                                "queue's retryLimit, then dead-lettered")):
        settle = command(commands, name, help)
        settle.add_argument("transaction_id", metavar="TXN", help="as pop prints it")
        settle.add_argument("partition_id", metavar="PARTITION_ID", help="as pop prints it")
        settle.add_argument("lease_id", metavar="LEASE_ID", help="as pop prints it")
        settle.add_argument("--group", help="the consumer group it was popped with")
        if name == "nack":
            settle.add_argument("--error", help="why (kept with a dead letter)")
            how = settle.add_mutually_exclusive_group()
            how.add_argument("--retry", action="store_true",
                             help="give it back without spending a retry")
            how.add_argument("--dlq", action="store_true", help="dead-letter it now")

    configure = command(commands, "configure",
                        "create a queue or change its options (on an existing queue, options "
                        "not given keep their values; on a new one, the defaults); prints them "
                        "all")
    configure.add_argument("queue")
    for flag, what in (("--lease-time", "how long a pop's lease lasts, e.g. 5m (default 300s)"),
                       ("--delayed-processing", "hold each message back this long after its "
                                                "push, e.g. 30s"),
                       ("--retention", "drop messages older than this, e.g. 7d"),
                       ("--completed-retention", "drop consumed messages older than this"),
                       ("--ttl", "a message not consumed within this long expires"),
                       ("--max-wait", "evict messages waiting longer than this"),
                       ("--retry-delay", "wait this long before a failed message is redelivered,"
                                         " e.g. 250ms or 2s")):
        configure.add_argument(flag, metavar="DURATION", help=what)
    configure.add_argument("--retry-limit", type=int, metavar="N",
                           help="redeliveries after a failure before dead-lettering")
    configure.add_argument("--max-size", type=int, metavar="N",
                           help="most unconsumed messages held (a push past it is refused)")
    for flag, what in (("--dead-letter-queue", "dead-letter messages past their retries"),
                       ("--retention-enabled", "apply the retention options"),
                       ("--retain-until-consumed", "keep messages until every group has "
                                                   "consumed them")):
        configure.add_argument(flag, choices=("on", "off"), help=what)

    command(commands, "queues", "list the queues with their pending (not yet consumed) and "
                                "total messages")

    dlq = commands.add_parser("dlq", help="list or replay dead letters")
    dlq_actions = dlq.add_subparsers(dest="action", metavar="ACTION", required=True)
    dlq_list = command(dlq_actions, "list", "list dead letters")
    dlq_list.add_argument("queue", nargs="?")
    dlq_list.add_argument("--group", help="consumer group (__timer__: timers never fired)")
    dlq_list.add_argument("--limit", type=int, default=None)
    command(dlq_actions, "replay", "push a dead letter's message again").add_argument(
        "id", type=int)

    kv = commands.add_parser("kv", help="read and write KV state")
    kv_actions = kv.add_subparsers(dest="action", metavar="ACTION", required=True)
    _ns_key(command(kv_actions, "get", "read a key"))
    put = command(kv_actions, "put", "write a key")
    _ns_key(put)
    put.add_argument("value", help="JSON (- for stdin)")
    put.add_argument("--ttl", help="time to live, whole seconds: 3600, 1h, 7d (default: until "
                                   "deleted)")
    _ns_key(command(kv_actions, "delete", "delete a key"))


def _queue_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue")
    parser.add_argument("key")


def _ns_key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("namespace")
    parser.add_argument("key")


def run(args: argparse.Namespace) -> int:
    """Run a client command; returns the exit code (see ``EXIT_CODES_HELP``)."""
    from .client import ApiError, BrokerUnreachable, SyncClient

    out = Output(args.json)
    try:
        urls = None if args.url is None else [u.strip() for u in args.url.split(",")]
        with SyncClient(urls, token=args.token, timeout=args.timeout) as queen:
            return _HANDLERS[(args.command, getattr(args, "action", None))](queen, args, out)
    except ValueError as exc:
        return out.fail(EXIT_USAGE, {"error": "usage", "message": str(exc)})
    except ApiError as exc:
        return out.fail(EXIT_REFUSED, {"error": exc.code, "message": exc.message,
                                       "status": exc.status})
    except BrokerUnreachable as exc:
        return out.fail(EXIT_UNREACHABLE, {"error": "unreachable", "message": str(exc)})


# -- the commands -----------------------------------------------------------------------------


def _schedule(queen: Any, args: argparse.Namespace, out: Output) -> int:
    timer = queen.timer(args.queue).key(args.key).delay(_duration(args.delay)) \
                 .payload(_json_arg(args.payload, "--payload"))
    if args.partition:
        timer = timer.partition(args.partition)
    if args.txn:
        timer = timer.txn(args.txn)
    return _verdict(out, timer.schedule())


def _cancel(queen: Any, args: argparse.Namespace, out: Output) -> int:
    return _verdict(out, queen.timer(args.queue).key(args.key).cancel(txn=args.txn))


def _peek(queen: Any, args: argparse.Namespace, out: Output) -> int:
    info = queen.timer(args.queue).key(args.key).peek()
    if info is None:
        return out.nothing({"status": "absent", "queue": args.queue, "key": args.key},
                           f"absent: no pending timer {args.key!r} on {args.queue!r}")
    return out.record(info)


def _list_timers(queen: Any, args: argparse.Namespace, out: Output) -> int:
    timers = list(islice(queen.timers(args.queue).list(), args.limit))
    if out.json:  # a list carries no payload: leave the field out rather than show null
        return out.emit([{k: v for k, v in plain(t).items() if k != "payload"} for t in timers])
    return out.table(timers, ["key", "deliver_at", "state", "attempts", "partition", "txn",
                              "last_error"])


def _push(queen: Any, args: argparse.Namespace, out: Output) -> int:
    result = queen.push(args.queue, _json_arg(args.payload, "PAYLOAD"),
                        partition=args.partition, txn=args.txn)
    return out.record(result)


def _pop(queen: Any, args: argparse.Namespace, out: Output) -> int:
    batch = queen.pop(args.queue, group=args.group, partition=args.partition,
                      batch=args.batch, wait=None if args.wait is None else _duration(args.wait),
                      auto_ack=args.auto_ack)
    if not batch:
        return out.nothing({"messages": []}, "no message")
    if out.json:
        return out.emit(batch)
    return out.table(list(batch), ["transaction_id", "partition_id", "lease_id", "offset",
                                   "partition", "retry_count", "data"])


def _settle(queen: Any, args: argparse.Namespace, out: Output) -> int:
    from .client.models import QUEUE_MODE_GROUP, Message

    status = ("completed" if args.command == "ack" else "retry" if args.retry
              else "dlq" if args.dlq else "failed")
    # Only the ids an acknowledgement carries: what pop printed, and the group.
    message = Message(args.transaction_id, args.partition_id, "", "", -1, args.lease_id,
                      args.group or QUEUE_MODE_GROUP, None, datetime.now(UTC), 0)
    return out.record(queen.ack(message, status, error=getattr(args, "error", None)))


# The SDK's configure keywords, by the wire name the broker echoes each option under.
_OPTIONS = {"leaseTime": "lease_time", "delayedProcessing": "delayed_processing",
            "retentionSeconds": "retention", "completedRetentionSeconds": "completed_retention",
            "ttl": "ttl", "maxWaitTimeSeconds": "max_wait", "retryDelay": "retry_delay",
            "retryLimit": "retry_limit", "maxSize": "max_size",
            "deadLetterQueue": "dead_letter_queue", "retentionEnabled": "retention_enabled",
            "retainUntilConsumed": "retain_until_consumed"}


def _configure(queen: Any, args: argparse.Namespace, out: Output) -> int:
    def flag(value: str | None) -> bool | None:
        return None if value is None else value == "on"

    given = {
        "lease_time": _seconds(args.lease_time),
        "delayed_processing": _seconds(args.delayed_processing),
        "retention": _seconds(args.retention),
        "completed_retention": _seconds(args.completed_retention),
        "ttl": _seconds(args.ttl), "max_wait": _seconds(args.max_wait),
        "retry_delay": None if args.retry_delay is None else _duration(args.retry_delay),
        "retry_limit": args.retry_limit, "max_size": args.max_size,
        "dead_letter_queue": flag(args.dead_letter_queue),
        "retention_enabled": flag(args.retention_enabled),
        "retain_until_consumed": flag(args.retain_until_consumed)}
    # The broker's configure sets every option (those not sent take the defaults, as Queen's
    # does); on the command line an option not given keeps the queue's current value.
    current = next((q["options"] for q in queen.queues() if q["name"] == args.queue), None)
    if current is not None:
        if current.get("encryptionEnabled") or current.get("windowBuffer"):
            raise ValueError(f"{args.queue!r} has encryptionEnabled or windowBuffer set, which "
                             "this command cannot carry over: configure it through the API")
        for wire, keyword in _OPTIONS.items():
            if given[keyword] is None and wire in current:
                given[keyword] = current[wire]
    return out.record(queen.configure(args.queue, **given))


def _queues(queen: Any, args: argparse.Namespace, out: Output) -> int:
    rows = [{"queue": q["name"], "partitions": q["partitions"],
             "pending": q["messages"].get("pending"), "total": q["messages"]["total"],
             "lease_time_s": q["options"]["leaseTime"],
             "retry_limit": q["options"]["retryLimit"],
             "delayed_processing_s": q["options"]["delayedProcessing"]}
            for q in queen.queues()]
    return out.table(rows, list(rows[0]) if rows else ["queue", "partitions", "pending",
                                                       "total"])


def _dlq_list(queen: Any, args: argparse.Namespace, out: Output) -> int:
    letters = list(islice(queen.dlq.list(args.queue, group=args.group), args.limit))
    return out.table(letters, ["id", "queue", "partition", "consumer_group", "transaction_id",
                               "retry_count", "error", "data"])


def _dlq_replay(queen: Any, args: argparse.Namespace, out: Output) -> int:
    return out.record(queen.dlq.replay(args.id))


def _kv_get(queen: Any, args: argparse.Namespace, out: Output) -> int:
    entry = queen.kv.get(args.namespace, args.key)
    if entry is None:
        return out.nothing({"status": "absent", "namespace": args.namespace, "key": args.key},
                           f"absent: no key {args.key!r} in {args.namespace!r}")
    if out.json:
        return out.emit(entry)
    print(json.dumps(entry.value, ensure_ascii=False))
    return EXIT_OK


def _kv_put(queen: Any, args: argparse.Namespace, out: Output) -> int:
    ttl = None if args.ttl is None else _duration(args.ttl)
    # Without --ttl the key lives until deleted: the wire asks for `forever` to be said.
    return out.record(queen.kv.put(args.namespace, args.key, _json_arg(args.value, "VALUE"),
                                   ttl_seconds=ttl, forever=ttl is None))


def _kv_delete(queen: Any, args: argparse.Namespace, out: Output) -> int:
    return out.record(queen.kv.delete(args.namespace, args.key))


_HANDLERS: dict[tuple[str, str | None], Callable[[Any, argparse.Namespace, Output], int]] = {
    ("timers", "schedule"): _schedule, ("timers", "cancel"): _cancel,
    ("timers", "peek"): _peek, ("timers", "list"): _list_timers,
    ("push", None): _push, ("pop", None): _pop, ("ack", None): _settle,
    ("nack", None): _settle, ("configure", None): _configure, ("queues", None): _queues,
    ("dlq", "list"): _dlq_list, ("dlq", "replay"): _dlq_replay,
    ("kv", "get"): _kv_get, ("kv", "put"): _kv_put, ("kv", "delete"): _kv_delete,
}


def _verdict(out: Output, result: Any) -> int:
    """Timer answers: ok → 0; absent / too_late → 3, printed like any result."""
    out.record(result)
    return EXIT_OK if result.ok else EXIT_NOT_DONE


# -- arguments --------------------------------------------------------------------------------


def _duration(text: str) -> int | str:
    """A command-line duration: bare digits are milliseconds, anything else the SDK grammar."""
    stripped = text.strip()
    return int(stripped) if stripped.lstrip("-").isdigit() and stripped.isascii() else stripped


def _seconds(text: str | None) -> int | str | None:
    """A command-line duration in whole seconds: bare digits count seconds."""
    if text is None:
        return None
    stripped = text.strip()
    return int(stripped) if stripped.isdigit() and stripped.isascii() else stripped


def _json_arg(text: str, what: str) -> Any:
    raw = sys.stdin.read() if text == "-" else text
    try:
        return strict_json.loads(raw)
    except strict_json.JsonRefused as exc:
        if exc.code == strict_json.INVALID_VALUE:  # NaN, 1e999, "\u0000"…: the broker's 400
            raise ValueError(f"{what}: {exc.message}") from None
        raise ValueError(f"{what} must be JSON (quote text: '\"hello\"'): {raw[:60]!r}") from None


# -- output -----------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """A result as JSON-ready data: dataclass or msgspec Struct fields (``TimerResult`` is a
    Struct), enum values, ISO-8601 times."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, msgspec.Struct):
        return {name: plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class Output:
    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    def emit(self, value: Any) -> int:
        print(json.dumps(plain(value), ensure_ascii=False))
        return EXIT_OK

    def record(self, value: Any) -> int:
        """One result: JSON, or ``field: value`` lines."""
        if self.json:
            return self.emit(value)
        data = plain(value)
        width = max(map(len, data))
        for name, item in data.items():
            shown = _cell(item, limit=None)
            print(f"{name:<{width}}  {shown}")
        return EXIT_OK

    def table(self, rows: list[Any], columns: list[str]) -> int:
        if self.json:
            return self.emit(rows)
        cells = [[_cell(plain(r)[c]) for c in columns] for r in rows]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
        for line in [[c.upper() for c in columns], *cells]:
            print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
        if not rows:
            print("(none)")
        return EXIT_OK

    def nothing(self, document: dict[str, Any], text: str) -> int:
        print(json.dumps(document) if self.json else text)
        return EXIT_NOT_DONE

    def fail(self, code: int, document: dict[str, Any]) -> int:
        if self.json:
            print(json.dumps({"ok": False, **document}))
        prefix = f"{document['error']}: " if code == EXIT_REFUSED else ""
        print(f"queen-trio: {prefix}{document['message']}", file=sys.stderr)
        return code


def _cell(value: Any, limit: int | None = 48) -> str:
    """One value as text, the same in tables and records: none is ``-``, text as is, the rest
    as JSON (``--json`` prints null)."""
    text = ("-" if value is None else value if isinstance(value, str)
            else json.dumps(value, ensure_ascii=False))
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["COMMANDS", "EXIT_CODES_HELP", "add_commands", "run"]
