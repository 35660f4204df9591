"""Pure rules of the log: names, options and request bodies validated without I/O.

Everything here raises :class:`ValidationError` with a stable code and a message a client can
act on; the HTTP layer turns it into a 400 (or 413 for size). Nothing here touches the database,
so it is unit-tested on its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..errors import PayloadTooLarge, ValidationError
from ..text import CONTROL_RE, compact_json, encodable, utf8_len

DEFAULT_PARTITION = "Default"
QUEUE_MODE_GROUP = "__QUEUE_MODE__"
TIMER_GROUP = "__timer__"  # dead letters of timers that could not be fired
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # QUEEN_MAX_MESSAGE_BYTES's default (config.py)
MAX_PUSH_ITEMS = 10_000
MAX_POP_BATCH = 10_000
MAX_POP_TIMEOUT_MS = 300_000
DEFAULT_POP_TIMEOUT_MS = 30_000
MAX_TRANSACTION_ID_LENGTH = 256
MAX_POP_PARTITIONS = 100
MAX_LEASE_SECONDS = 86_400  # a pop's leaseSeconds, as the queue's leaseTime
CONFLATION_MAX_PARTITIONS = 64  # Queen's ceiling on a conflating pop's width
SUBSCRIBE_NOW = "now"

_QUEUE_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_PARTITION_RE = re.compile(r"^[A-Za-z0-9_.:@=+\-]{1,256}$")
_GROUP_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def is_queue_name(value: str) -> bool:
    return _QUEUE_RE.fullmatch(value) is not None


def is_partition_name(value: str) -> bool:
    return _PARTITION_RE.fullmatch(value) is not None


def queue_name(value: Any, field: str = "queue") -> str:
    if not isinstance(value, str) or not is_queue_name(value):
        raise ValidationError(
            "invalid_queue",
            f"{field} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'",
        )
    return value


def partition_name(value: Any, field: str = "partition") -> str:
    if value is None:
        return DEFAULT_PARTITION
    if not isinstance(value, str) or not is_partition_name(value):
        raise ValidationError(
            "invalid_partition",
            f"{field} must be 1-256 characters of letters, digits or '_.:@=+-'",
        )
    return value


def consumer_group(value: Any, *, for_pop: bool = True) -> str:
    if value is None or value == "":
        return QUEUE_MODE_GROUP
    if not isinstance(value, str) or not _GROUP_RE.fullmatch(value):
        raise ValidationError(
            "invalid_consumer_group",
            "consumerGroup must be 1-128 characters of letters, digits, '_', '.', ':' or '-'",
        )
    if for_pop and value == TIMER_GROUP:
        raise ValidationError(
            "reserved_consumer_group",
            f"{TIMER_GROUP} is reserved for timers that could not be fired; it cannot consume",
        )
    return value


def transaction_id(value: Any, field: str = "transactionId") -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TRANSACTION_ID_LENGTH:
        raise ValidationError(
            "invalid_transaction_id",
            f"{field} must be a non-empty string of at most {MAX_TRANSACTION_ID_LENGTH} characters",
        )
    if CONTROL_RE.search(value) or not encodable(value):
        raise ValidationError(
            "invalid_transaction_id", f"{field} must not contain control characters or surrogates"
        )
    return value



def new_transaction_id() -> str:
    """A fresh transactionId: a UUIDv7, so ids sort by creation time."""
    return new_transaction_ids(1)[0]


def new_transaction_ids(n: int) -> list[str]:
    """``n`` fresh transactionIds (uuid7's: the clock's milliseconds, version 7, 74 random
    bits), drawn at once and written as text directly: a 500-timer bundle's ids through
    ``str(uuid7())`` cost the broker more CPU than PostgreSQL spends storing the timers."""
    ms = f"{time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF:012x}"
    head = f"{ms[:8]}-{ms[8:]}-7"
    rand = os.urandom(10 * n).hex()
    # 19 random hex digits an id; the variant digit (0b10xx) takes 2 bits of its digit
    return [f"{head}{r[:3]}-{_VARIANT[r[3]]}{r[4:7]}-{r[7:19]}"
            for r in (rand[i:i + 20] for i in range(0, 20 * n, 20))]


_VARIANT = {f"{d:x}": "89ab"[d & 3] for d in range(16)}


def uuid7() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= (rand >> 68 & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF
    return uuid.UUID(int=value)


def payload_json(payload: Any, ceiling: int, where: str) -> str:
    """The payload as the compact JSON text that is stored, checked against the ceiling (the
    store writes this text rather than serialize the payload again)."""
    text = compact_json(payload)
    try:
        size = utf8_len(text)
    except UnicodeEncodeError:
        # JSON allows "\ud800" escapes that are not characters; PostgreSQL cannot store them.
        # (Request bodies never get here with one: strict_json refuses them.)
        raise ValidationError(
            "invalid_payload", f"{where}: payload contains an unpaired UTF-16 surrogate"
        ) from None
    if size > ceiling:
        raise PayloadTooLarge(
            "payload_too_large",
            f"{where}: payload is {size} bytes, above the {ceiling}-byte message ceiling",
        )
    return text


def _int_field(obj: dict[str, Any], key: str, default: int, *, lo: int, hi: int) -> int:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValidationError("invalid_option", f"{key} must be an integer from {lo} to {hi}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class QueueOptions:
    """The options of a queue this broker stores and applies (``POST /configure``)."""

    lease_time_s: int = 300
    retry_limit: int = 3
    delayed_processing_s: int = 0
    retention_s: int = 0
    dead_letter_queue: bool = True
    # Retention drops a segment only once every consumer group has committed past it.
    retain_until_consumed: bool = False
    # Queen's maxSize: the most unconsumed (queue mode) messages; a push past it is refused.
    max_size: int = 0
    # Queen's retryDelay (ms): a failed message is handed out again no sooner than this.
    retry_delay_ms: int = 0
    # Queen's ttl (s): message time-to-live, applied by retention with retentionSeconds.
    ttl_s: int = 0
    # Queen's completedRetentionSeconds: consumed segments older than this are dropped.
    completed_retention_s: int = 0
    # Queen's retentionEnabled: false stops every age-based drop of the queue.
    retention_enabled: bool = True
    # Queen's maxWaitTimeSeconds: a message older than this is evicted (dropped, not
    # dead-lettered), whatever retentionEnabled says.
    max_wait_s: int = 0
    # Queen's windowBuffer (s): a partition is not handed out until its newest message is this
    # old (a debounce: a burst is delivered whole once it has settled).
    window_buffer_s: int = 0
    # Queen's encryptionEnabled: payloads are stored sealed (queen_trio/sealing.py).
    encryption_enabled: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "leaseTime": self.lease_time_s,
            "retryLimit": self.retry_limit,
            "retryDelay": self.retry_delay_ms,
            "maxSize": self.max_size,
            "ttl": self.ttl_s,
            "deadLetterQueue": self.dead_letter_queue,
            "delayedProcessing": self.delayed_processing_s,
            "retentionSeconds": self.retention_s,
            "completedRetentionSeconds": self.completed_retention_s,
            "retentionEnabled": self.retention_enabled,
            "retainUntilConsumed": self.retain_until_consumed,
            "maxWaitTimeSeconds": self.max_wait_s,
            "windowBuffer": self.window_buffer_s,
            "encryptionEnabled": self.encryption_enabled,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueOptions:
        """The options of a ``queen.queues`` row (its columns are the field names)."""
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


# Options of Queen's configure that have no effect here. They are validated, echoed with the
# value sent (or Queen's default) and named in the answer's ``ignored`` list whenever they are
# sent with a value other than that default, which is the only value whose meaning this broker
# honours (docs/queen-compatibility.md).
#   priority            Queen serves higher-priority queues first; here every queue is equal.
#   dlqAfterMaxRetries  here deadLetterQueue alone decides (dead-lettered after retryLimit).
IGNORED_OPTIONS: dict[str, Any] = {
    "priority": 0,
    "dlqAfterMaxRetries": False,
}
_INT_MAX = 2_147_483_647
_APPLIED_OPTIONS = ("leaseTime", "retryLimit", "retryDelay", "maxSize", "ttl",
                    "deadLetterQueue", "delayedProcessing", "retentionSeconds",
                    "completedRetentionSeconds", "retentionEnabled", "retainUntilConsumed",
                    "maxWaitTimeSeconds", "windowBuffer",
                    "encryptionEnabled")


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigureRequest:
    options: QueueOptions
    echo: dict[str, Any]  # every option Queen echoes (and ours), as applied or as sent
    ignored: list[str]  # options (and unknown names) this broker did not act on
    unknown: list[str]  # option names neither Queen nor this broker knows


def _bool_field(obj: dict[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValidationError("invalid_option", f"{key} must be true or false")
    return value


def queue_options(options: Any) -> QueueOptions:
    """The stored options of ``POST /configure``. As in Queen, omitted options take their
    defaults (see :func:`configure_request` for what is ignored or refused)."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ValidationError("invalid_option", "options must be a JSON object")
    return QueueOptions(
        lease_time_s=_int_field(options, "leaseTime", 300, lo=1, hi=86_400),
        retry_limit=_int_field(options, "retryLimit", 3, lo=0, hi=1000),
        delayed_processing_s=_int_field(options, "delayedProcessing", 0, lo=0, hi=7 * 86_400),
        retention_s=_int_field(options, "retentionSeconds", 0, lo=0, hi=10 * 365 * 86_400),
        dead_letter_queue=_bool_field(options, "deadLetterQueue", True),
        retain_until_consumed=_bool_field(options, "retainUntilConsumed", False),
        max_size=_int_field(options, "maxSize", 0, lo=0, hi=_INT_MAX),
        retry_delay_ms=_int_field(options, "retryDelay", 0, lo=0, hi=3_600_000),
        ttl_s=_int_field(options, "ttl", 0, lo=0, hi=10 * 365 * 86_400),
        completed_retention_s=_int_field(options, "completedRetentionSeconds", 0, lo=0,
                                         hi=10 * 365 * 86_400),
        retention_enabled=_bool_field(options, "retentionEnabled", True),
        max_wait_s=_int_field(options, "maxWaitTimeSeconds", 0, lo=0, hi=10 * 365 * 86_400),
        window_buffer_s=_int_field(options, "windowBuffer", 0, lo=0, hi=7 * 86_400),
        encryption_enabled=_bool_field(options, "encryptionEnabled", False),
    )


def configure_request(body: dict[str, Any]) -> tuple[str, ConfigureRequest]:
    """``POST /configure``: the queue name and what to store, echo and report as ignored.
    Nothing is dropped silently: an option is applied, refused (400), or named in
    ``ignored``; so are unknown option names and Queen's ``namespace`` / ``task``."""
    name = queue_name(body.get("queue"))
    raw = body.get("options")
    options = queue_options(raw)
    given: dict[str, Any] = raw or {}
    ignored: list[str] = []
    echo = options.to_wire()
    for key, default in IGNORED_OPTIONS.items():
        value = (_bool_field(given, key, default) if isinstance(default, bool)
                 else _int_field(given, key, default, lo=0, hi=_INT_MAX))
        echo[key] = value
        if value != default:
            ignored.append(key)
    unknown = sorted(k for k in given if k not in _APPLIED_OPTIONS and k not in IGNORED_OPTIONS)
    ignored.extend(unknown)
    for key in ("namespace", "task"):
        label = body.get(key)
        if label is not None and not isinstance(label, str):
            raise ValidationError("invalid_option", f"{key} must be a string")
        if label:
            ignored.append(key)
    return name, ConfigureRequest(options, echo, ignored, unknown)


@dataclasses.dataclass(frozen=True, slots=True)
class PushItem:
    index: int
    queue: str
    partition: str
    payload: Any
    transaction_id: str
    client_transaction_id: bool  # supplied by the client: duplicates are detected
    payload_json: str  # the payload's compact JSON text, as stored


def push_items(body: dict[str, Any], ceiling: int) -> list[PushItem]:
    items = body.get("items")
    if not isinstance(items, list):  # (empty is fine: Queen answers it 201 [])
        raise ValidationError("invalid_items", "items must be an array")
    if len(items) > MAX_PUSH_ITEMS:
        raise ValidationError("invalid_items", f"at most {MAX_PUSH_ITEMS} items per push")
    parsed = []
    for i, item in enumerate(items):
        where = f"items[{i}]"
        if not isinstance(item, dict):
            raise ValidationError("invalid_items", f"{where} must be an object")
        if "payload" not in item:
            raise ValidationError("missing_field", f"{where}.payload is required")
        txn = item.get("transactionId")
        supplied = txn is not None
        txn = transaction_id(txn, f"{where}.transactionId") if supplied else new_transaction_id()
        text = payload_json(item["payload"], ceiling, where)
        parsed.append(
            PushItem(
                index=i,
                queue=queue_name(item.get("queue"), f"{where}.queue"),
                partition=partition_name(item.get("partition"), f"{where}.partition"),
                payload=item["payload"],
                transaction_id=txn,
                client_transaction_id=supplied,
                payload_json=text,
            )
        )
    return parsed


@dataclasses.dataclass(frozen=True, slots=True)
class PopRequest:
    queue: str
    partition: str | None
    group: str
    batch: int
    wait: bool
    timeout_ms: int
    auto_ack: bool
    # Up to this many partitions in one pop, all under one lease, sharing ``batch``.
    partitions: int = 1
    # Where a consumer group starts on a partition it has never popped: None, the beginning
    # of the log; SUBSCRIBE_NOW, the group's subscription instant (its first pop with this
    # mode); a datetime, the first message created at or after it. Never for queue mode.
    subscribe_from: datetime | str | None = None
    # The lease in seconds (Queen's ``leaseSeconds``); None: the queue's leaseTime.
    lease_s: int | None = None
    # Queen's pop autopilot: the broker sizes what the client left unset (``batch`` and
    # ``partitions`` absent with ``autopilot=true``); see api/log.py ``_autopilot``.
    auto_batch: bool = False
    auto_partitions: bool = False
    # Queen's conflation: each partition delivers only its newest message, and the lease
    # covers everything behind it (acking it retires them all). A policy of the consumer
    # group (store.group_conflation): ``conflation_asked`` is what this pop said (None:
    # nothing), ``conflation`` what applies once with_group_policy has resolved it.
    conflation: bool = False
    conflation_asked: bool | None = None
    # Whether the client gave ``partitions`` (a conflating group's pop is otherwise as wide
    # as its batch).
    partitions_given: bool = True

    @property
    def conflation_conflict(self) -> bool:
        """This pop asked for the policy its group does not have (the group's wins)."""
        return self.conflation_asked is not None and self.conflation_asked != self.conflation


def query_bool(args: dict[str, str], key: str) -> bool:
    return bool(query_flag(args, key))


def query_flag(args: dict[str, str], key: str) -> bool | None:
    """A true/false query parameter; None when absent."""
    raw = args.get(key)
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise ValidationError("invalid_parameter", f"{key} must be true or false")


def query_int(args: dict[str, str], key: str, default: int, *, lo: int, hi: int) -> int:
    raw = args.get(key)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"[0-9]{1,19}", raw) or not lo <= int(raw) <= hi:
        raise ValidationError("invalid_parameter", f"{key} must be an integer from {lo} to {hi}")
    return int(raw)


_TIMESTAMP_EXAMPLE = "an ISO-8601 timestamp such as 2026-01-31T12:00:00Z"


def timestamp(value: Any, field: str) -> datetime:
    """An ISO-8601 timestamp (a trailing Z allowed; without a zone: UTC), as an instant in UTC.

    Refused (400 ``invalid_timestamp``) unless that instant lies in years 1-9999 in UTC,
    which is all Python's datetime holds: ``0001-01-01T00:00:00+01:00`` would be year 0
    there, and the database driver raised OverflowError converting it (a 500).
    """
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ValidationError("invalid_timestamp", f"{field} must be {_TIMESTAMP_EXAMPLE}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError("invalid_timestamp",
                              f"{field} must be {_TIMESTAMP_EXAMPLE}") from None
    try:
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    except OverflowError:
        raise ValidationError(
            "invalid_timestamp",
            f"{field} is {value!r}, which is outside years 1-9999 once shifted to UTC",
        ) from None


# Queen's server reads every mode but new/new-only as "all"; its own clients and tests send
# from_beginning. Only these four are accepted: anything else is a typo, refused.
_SUBSCRIPTION_MODES = {"all": None, "from_beginning": None,
                       "new": SUBSCRIBE_NOW, "new-only": SUBSCRIBE_NOW}


def subscription(args: dict[str, str]) -> datetime | str | None:
    """Queen's ``subscriptionMode`` (``all`` or its alias ``from_beginning``; ``new`` or its
    alias ``new-only``) and ``subscriptionFrom`` (``beginning``, ``now`` or an ISO-8601 instant
    with a time zone). ``subscriptionFrom``, the more precise of the two, wins when both are
    given."""
    mode = args.get("subscriptionMode") or None
    if mode is not None and mode not in _SUBSCRIPTION_MODES:
        raise ValidationError(
            "invalid_subscription_mode",
            f"subscriptionMode must be one of {', '.join(_SUBSCRIPTION_MODES)}",
        )
    start = args.get("subscriptionFrom") or None
    if start is None:
        return None if mode is None else _SUBSCRIPTION_MODES[mode]
    if start == "beginning":
        return None
    if start == SUBSCRIBE_NOW:
        return SUBSCRIBE_NOW
    try:
        instant = datetime.fromisoformat(start.replace("Z", "+00:00") if start.endswith("Z")
                                         else start)
    except ValueError:
        instant = None
    # (Years far from ours are refused: shifted to UTC they may leave what Python can hold.)
    if instant is None or instant.tzinfo is None or not 1900 <= instant.year <= 9000:
        raise ValidationError(
            "invalid_subscription_from",
            "subscriptionFrom must be beginning, now or an ISO-8601 timestamp with a time "
            "zone (2025-01-01T00:00:00Z)",
        )
    return instant


def pop_request(queue: str, partition: str | None, args: dict[str, str]) -> PopRequest:
    group = consumer_group(args.get("consumerGroup"))
    since = subscription(args)
    auto_ack = query_bool(args, "autoAck")
    autopilot = query_bool(args, "autopilot")
    asked = query_flag(args, "conflation")
    conflation = bool(asked)
    if conflation and group == QUEUE_MODE_GROUP:
        raise ValidationError("conflation_requires_consumer_group",
                              "conflation is a policy of a consumer group: give consumerGroup")
    if conflation and auto_ack:
        raise ValidationError("conflation_with_auto_ack",
                              "conflation and autoAck cannot be combined: a conflated message "
                              "retires everything behind it, so it must be acknowledged")
    batch_given = args.get("batch") not in (None, "")
    partitions_given = args.get("partitions") not in (None, "")
    batch = query_int(args, "batch", 1, lo=1, hi=MAX_POP_BATCH)
    partitions = query_int(args, "partitions", 1, lo=1, hi=MAX_POP_PARTITIONS)
    lease = query_int(args, "leaseSeconds", 0, lo=0, hi=MAX_LEASE_SECONDS)
    return PopRequest(
        queue=queue_name(queue),
        partition=None if partition is None else partition_name(partition),
        group=group,
        batch=batch,
        wait=query_bool(args, "wait"),
        timeout_ms=query_int(
            args, "timeout", DEFAULT_POP_TIMEOUT_MS, lo=0, hi=MAX_POP_TIMEOUT_MS
        ),
        auto_ack=auto_ack,
        # One partition when the route names it (as Queen caps it there).
        partitions=1 if partition is not None else partitions,
        # Queue mode distributes work: starting it anywhere but the beginning would lose
        # messages, so only consumer groups subscribe (the parameters are still validated).
        subscribe_from=None if group == QUEUE_MODE_GROUP else since,
        lease_s=lease or None,  # 0, as in Queen: the queue's leaseTime
        auto_batch=autopilot and not batch_given,
        auto_partitions=autopilot and not partitions_given and partition is None,
        conflation_asked=asked,
        partitions_given=partitions_given,
    )


def with_group_policy(req: PopRequest, conflation: bool) -> PopRequest:
    """``req`` under its consumer group's stored policy (store.group_conflation)."""
    partitions = req.partitions
    if conflation and not req.partitions_given and req.partition is None:
        # A conflating pop yields at most one message per partition: the batch is the width.
        partitions = min(req.batch, CONFLATION_MAX_PARTITIONS)
    return dataclasses.replace(req, conflation=conflation, partitions=partitions)


# Pop autopilot (Queen's): the batch given to a pop that left it to the broker, and the widest
# sweep it chooses (Queen's measured checkout ceiling).
AUTOPILOT_BATCH = 100
AUTOPILOT_MAX_PARTITIONS = 64


def autopilot_sizing(req: PopRequest, lane_pops: int) -> PopRequest:
    """Size the dimensions a pop left to the broker (``autopilot=true``): the batch is
    AUTOPILOT_BATCH, and the width is the sweep ceiling shared among the pops of the same
    lane waiting on this broker (one consumer alone takes every ready partition, up to the
    batch). A dimension the client set is never changed."""
    if not (req.auto_batch or req.auto_partitions):
        return req
    batch = AUTOPILOT_BATCH if req.auto_batch else req.batch
    width = req.partitions
    if req.auto_partitions:
        width = max(1, min(AUTOPILOT_MAX_PARTITIONS // max(1, lane_pops), batch,
                           MAX_POP_PARTITIONS))
    return dataclasses.replace(req, batch=batch, partitions=width)


ACK_STATUSES = ("completed", "failed", "dlq", "retry")


class Ack(msgspec.Struct, frozen=True):
    """One acknowledgement, read. A struct, not a dataclass: a settled batch makes 500 of
    them per request, and a frozen dataclass' __init__ was most of reading an ack."""

    index: int
    transaction_id: str
    partition_id: uuid.UUID
    status: str
    group: str
    lease_id: uuid.UUID | None
    error: str | None


def _uuid(value: Any, field: str, code: str) -> uuid.UUID:
    if not isinstance(value, str):
        raise ValidationError(code, f"{field} must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationError(code, f"{field} is not a valid UUID") from None


def lease_id(value: Any, field: str = "leaseId") -> uuid.UUID:
    return _uuid(value, field, "invalid_lease_id")


def ack(obj: Any, index: int, *, group_override: str | None = None, where: str = "",
        default_partition: uuid.UUID | None = None,
        default_lease: uuid.UUID | None = None) -> Ack:
    """One acknowledgement; ``default_partition`` and ``default_lease`` (already parsed) stand
    in for a ``partitionId`` or ``leaseId`` the object leaves out."""
    if not isinstance(obj, dict):
        raise ValidationError("invalid_body", f"{where or 'the body'} must be an object")
    prefix = f"{where}." if where else ""
    status = obj.get("status") or "completed"
    if status == "success":
        status = "completed"
    if status not in ACK_STATUSES:
        raise ValidationError(
            "invalid_status", f"{prefix}status must be one of {', '.join(ACK_STATUSES)}"
        )
    if "transactionId" not in obj:
        raise ValidationError("missing_field", f"{prefix}transactionId is required")
    if "partitionId" in obj:
        partition = _uuid(obj["partitionId"], f"{prefix}partitionId", "invalid_partition_id")
    elif default_partition is not None:
        partition = default_partition
    else:
        raise ValidationError("missing_field", f"{prefix}partitionId is required")
    lease = obj.get("leaseId")
    error = obj.get("error")
    if error is not None and not isinstance(error, str):
        error = json.dumps(error)
    return Ack(
        index=index,
        transaction_id=transaction_id(obj["transactionId"], f"{prefix}transactionId"),
        partition_id=partition,
        status=status,
        group=group_override or consumer_group(obj.get("consumerGroup"), for_pop=False),
        lease_id=(default_lease if "leaseId" not in obj
                  else None if lease in (None, "") else lease_id(lease, f"{prefix}leaseId")),
        error=error[:2000] if error else None,
    )


def ack_batch(body: dict[str, Any]) -> list[Ack]:
    acks = body.get("acknowledgments")
    if not isinstance(acks, list) or not acks:
        raise ValidationError("invalid_body", "acknowledgments must be a non-empty array")
    group = body.get("consumerGroup")
    override = consumer_group(group, for_pop=False) if group else None
    # partitionId and leaseId at the top stand in for the ones an entry leaves out: a batch
    # settled whole (one partition, one lease) need not repeat them per message.
    partition, lease = body.get("partitionId"), body.get("leaseId")
    default_partition = (None if partition is None
                         else _uuid(partition, "partitionId", "invalid_partition_id"))
    default_lease = None if lease in (None, "") else lease_id(lease)
    return [
        ack(item, i, group_override=override, where=f"acknowledgments[{i}]",
            default_partition=default_partition, default_lease=default_lease)
        for i, item in enumerate(acks)
    ]
