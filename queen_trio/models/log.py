"""Queen's log wire: the request bodies of configure, push, ack, ack/batch, settle-and-pop,
lease extend, fetch and partitions/changed, and the answers of those and of the queue
resources (list, detail, delete). The routes decode the requests through these models (a body
a model refuses takes the strict decoder and :mod:`queen_trio.log.rules`, which say precisely
what is wrong); fields they do not name are ignored, as Queen ignores them. In answers, fields
that are always written (null included) have no default; the few an answer carries only
sometimes default to UNSET, which msgspec leaves out."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

Id = str  # ids travel as strings (a partition's uuid, a lease's uuid)
# (log.rules.MAX_PUSH_ITEMS, log.reads.MAX_FETCH_ENTRIES and MAX_CHANGED_ENTRIES, which the
# rules enforce)
MAX_PUSH_ITEMS = 10_000
MAX_FETCH_ENTRIES = 1024
MAX_CHANGED_ENTRIES = 64

# -- requests ---------------------------------------------------------------------------------


_YEARS_10 = 10 * 365 * 86_400
_INT_MAX = 2_147_483_647


class QueueOptions(Struct, forbid_unknown_fields=True, kw_only=True):
    """A queue's options (omitted or null: the default). Unknown names are accepted and
    listed in the answer's ``ignored`` and ``unknown`` (the route reads them from the body
    itself: a body with one skips this model)."""

    leaseTime: Annotated[int, Meta(ge=1, le=86_400, description=(
        "seconds a pop's lease lasts (default 300)"))] \
        | None | UnsetType = UNSET
    retryLimit: Annotated[int, Meta(ge=0, le=1000, description=(
        "retries before a failed message is dead-lettered (default 3)"))] \
        | None | UnsetType = UNSET
    delayedProcessing: Annotated[int, Meta(ge=0, le=7 * 86_400, description=(
        "seconds a message waits before it is handed out"))] \
        | None | UnsetType = UNSET
    retentionSeconds: Annotated[int, Meta(ge=0, le=_YEARS_10, description=(
        "drop sealed segments whose newest message is older than this (0: keep forever); "
        "log_start advances"))] \
        | None | UnsetType = UNSET
    retainUntilConsumed: Annotated[bool, Meta(description=(
        "with retentionSeconds: drop a segment only once every consumer group of its "
        "partition has committed past it (a partition no group ever read keeps it)"))] \
        | None | UnsetType = UNSET
    deadLetterQueue: Annotated[bool, Meta(description="default true")] \
        | None | UnsetType = UNSET
    maxSize: Annotated[int, Meta(ge=0, le=_INT_MAX, description=(
        "the most messages the queue holds that queue-mode consumers have not consumed; a "
        "push past it is refused whole, 409 queue_full (0: no limit)"))] \
        | None | UnsetType = UNSET
    retryDelay: Annotated[int, Meta(ge=0, le=3_600_000, description=(
        "milliseconds: a failed message (and its partition, for that consumer group) is "
        "handed out again no sooner than this (0: at once)"))] \
        | None | UnsetType = UNSET
    ttl: Annotated[int, Meta(ge=0, le=_YEARS_10, description=(
        "seconds a message lives: applied by retention like retentionSeconds (the smaller "
        "non-zero one counts; 0: none)"))] \
        | None | UnsetType = UNSET
    completedRetentionSeconds: Annotated[int, Meta(ge=0, le=_YEARS_10, description=(
        "drop sealed segments every consumer group has committed past once their newest "
        "message is this old (0: never)"))] \
        | None | UnsetType = UNSET
    retentionEnabled: Annotated[bool, Meta(description=(
        "false: no age-based drop at all for this queue (default true)"))] \
        | None | UnsetType = UNSET
    maxWaitTimeSeconds: Annotated[int, Meta(ge=0, le=_YEARS_10, description=(
        "evict (drop, not dead-letter) messages older than this, for every consumer group, "
        "whatever retentionEnabled says (0: never)"))] \
        | None | UnsetType = UNSET
    windowBuffer: Annotated[int, Meta(ge=0, le=7 * 86_400, description=(
        "seconds: a partition is not handed out until its newest message is this old"))] \
        | None | UnsetType = UNSET
    encryptionEnabled: Annotated[bool, Meta(description=(
        "payloads stored sealed with AES-256-GCM under QUEEN_ENCRYPTION_KEY; without a key "
        "on the broker true is a 400 encryption_key_missing"))] | None | UnsetType = UNSET
    priority: Annotated[int, Meta(ge=0, le=_INT_MAX, description=(
        "accepted, echoed and listed in ignored when not 0; no effect here"))] \
        | None | UnsetType = UNSET
    dlqAfterMaxRetries: Annotated[bool, Meta(description=(
        "accepted, echoed and listed in ignored when true; no effect here"))] \
        | None | UnsetType = UNSET


class ConfigureBody(Struct, kw_only=True):
    """``POST /api/v1/configure``: create or reconfigure a queue (omitted options take their
    defaults)."""

    queue: str
    options: QueueOptions | None | UnsetType = UNSET
    namespace: Annotated[str | None, Meta(description="echoed; ignored")] | UnsetType = UNSET
    task: Annotated[str | None, Meta(description="echoed; ignored")] | UnsetType = UNSET


class PushItem(Struct, kw_only=True):
    """One message to push (other fields are ignored)."""

    queue: str
    partition: Annotated[str | None, Meta(description="default: Default")] \
        | UnsetType = UNSET
    payload: Annotated[Any, Meta(description="any JSON: the message's data")]
    transactionId: Annotated[str | None, Meta(description=(
        "the client's id for the message (a repeat is a duplicate); default: one is "
        "minted"))] | UnsetType = UNSET


class PushBody(Struct, kw_only=True):
    """``POST /api/v1/push``: 0..N messages, any mix of queues and partitions, appended
    atomically."""

    items: Annotated[list[PushItem], Meta(max_length=MAX_PUSH_ITEMS)]


class _AckFields(Struct, kw_only=True):
    transactionId: str
    leaseId: Annotated[Id | None, Meta(description=(
        "the lease of the pop that delivered it; in a batch, default: the batch's "
        "leaseId; in a transaction, the bundle's one required lease"))] | UnsetType = UNSET
    status: Annotated[str | None, Meta(description=(
        "completed (default; success is the same) | failed | retry | dlq"))] | UnsetType = UNSET
    consumerGroup: str | None | UnsetType = UNSET
    error: Annotated[Any, Meta(description="a failure's reason (text; other JSON is kept as "
                                           "its text)")] | UnsetType = UNSET


class Ack(_AckFields, kw_only=True):
    """``POST /api/v1/ack``: one acknowledgement (other fields are ignored)."""

    partitionId: Id


class BatchAck(_AckFields, kw_only=True):
    """One acknowledgement of a batch (other fields are ignored)."""

    partitionId: Annotated[Id, Meta(description="default: the batch's partitionId")] \
        | UnsetType = UNSET


class _AckDefaults(Struct, kw_only=True):
    consumerGroup: Annotated[str | None, Meta(description=(
        "overrides each acknowledgement's"))] | UnsetType = UNSET
    partitionId: Annotated[Id | None, Meta(description=(
        "for the acknowledgements that name none"))] | UnsetType = UNSET
    leaseId: Annotated[Id | None, Meta(description=(
        "for the acknowledgements that name none"))] | UnsetType = UNSET


class AckBatch(_AckDefaults, kw_only=True):
    """``POST /api/v1/ack/batch``: at least one acknowledgement, each with its verdict."""

    acknowledgments: Annotated[list[BatchAck], Meta(min_length=1)]


class SettleBody(_AckDefaults, kw_only=True):
    """A settle-and-pop's body (optional): the acknowledgements to commit before the pop,
    as for ``/ack/batch``."""

    acknowledgments: list[BatchAck] | UnsetType = UNSET


class ExtendBody(Struct, kw_only=True):
    """``POST /api/v1/lease/{lease_id}/extend`` (the body is optional)."""

    seconds: Annotated[int, Meta(ge=1, le=86_400, description="default 60")] \
        | UnsetType = UNSET


class FetchEntry(Struct, forbid_unknown_fields=True, kw_only=True):
    queue: Annotated[str, Meta(min_length=1)]
    partition: Annotated[str | int | None, Meta(description=(
        "default Default; a number names the partition of its digits"))] | UnsetType = UNSET
    offset: Annotated[int, Meta(ge=0)]
    maxBytes: Annotated[int, Meta(ge=0, description=(
        "default 1 MiB, clamped to 1..8 MiB"))] | None | UnsetType = UNSET


class FetchBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /api/v1/fetch``: records by absolute offset, per entry (at most 1,024). Any
    other field is a 400."""

    entries: Annotated[list[FetchEntry], Meta(max_length=MAX_FETCH_ENTRIES)] \
        | UnsetType = UNSET
    maxBytes: Annotated[int, Meta(ge=0, description=(
        "the call's budget, at most 64 MiB"))] | None | UnsetType = UNSET
    maxWaitMs: Annotated[int, Meta(ge=0, description="at most 30000")] \
        | None | UnsetType = UNSET
    minBytes: Annotated[int, Meta(ge=0, description="default 1")] | None | UnsetType = UNSET


class ChangedEntry(Struct, forbid_unknown_fields=True, kw_only=True):
    queue: Annotated[str, Meta(min_length=1)]
    since: Annotated[str, Meta(extra_json_schema={"format": "date-time"}, description=(
        "only the partitions last written at or after it"))] | None | UnsetType = UNSET
    after: Annotated[str | None, Meta(description=(
        "the next of a previous answer"))] | UnsetType = UNSET
    limit: Annotated[int | None, Meta(description="clamped to 1..1000")] | UnsetType = UNSET


class ChangedBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /api/v1/partitions/changed``: at most 64 entries. Any other field is a 400."""

    entries: Annotated[list[ChangedEntry], Meta(max_length=MAX_CHANGED_ENTRIES)] \
        | UnsetType = UNSET


CONFIGURE_DECODER = msgspec.json.Decoder(ConfigureBody)
PUSH_DECODER = msgspec.json.Decoder(PushBody)
ACK_DECODER = msgspec.json.Decoder(Ack)
ACK_BATCH_DECODER = msgspec.json.Decoder(AckBatch)
SETTLE_DECODER = msgspec.json.Decoder(SettleBody)
EXTEND_DECODER = msgspec.json.Decoder(ExtendBody)
FETCH_DECODER = msgspec.json.Decoder(FetchBody)
CHANGED_DECODER = msgspec.json.Decoder(ChangedBody)

# -- answers ----------------------------------------------------------------------------------


class Pushed(Struct, kw_only=True):
    """One pushed item's result. Queen v1 spells some fields in snake_case on push results,
    and its clients read them so: both spellings are written."""

    index: int
    status: Literal["queued", "duplicate"]
    transactionId: str
    partitionId: Id
    queue: str
    partition: str
    offset: Annotated[int | None, Meta(description="null for a duplicate")]
    messageId: Annotated[str, Meta(description=(
        "the message's id, as a pop gives it; for a duplicate, the id of the message that "
        "holds the transactionId"))]
    message_id: str
    transaction_id: str
    partition_id: Id
    queueName: str


class Skipped(Struct):
    """Offsets a consumer group never received: retention dropped them before it read them."""

    fromOffset: int
    toOffset: Annotated[int, Meta(description="inclusive")]
    count: Annotated[int, Meta(description="messages in the range the group had not already "
                                           "completed")]


class Message(Struct, kw_only=True):
    id: str
    transactionId: str
    partitionId: Id
    partition: str
    queue: str
    offset: int
    leaseId: Id | None
    consumerGroup: str
    data: Annotated[Any, Meta(description="the payload pushed")]
    createdAt: str
    retryCount: int
    deliveryAttempt: Annotated[int, Meta(description=(
        "how many times in a row the consumer group has been handed this partition's batch "
        "(1: first delivery; a nack or an expired lease hands it out again)"))]
    timer: Annotated[dict[str, Any], Meta(description="a fired timer's key and schedule")] \
        | UnsetType = UNSET


class PopPartition(Struct, kw_only=True):
    """One partition a multi-partition pop took."""

    partition: str
    partitionId: Id
    leaseId: Id | None
    leaseExpiresAt: str | None
    messages: Annotated[int, Meta(description="how many of the answer's messages are from it")]
    skipped: Skipped | None


class Autopilot(Struct):
    """The sizes the broker chose for a pop that left them to it."""

    partitions: int
    batch: int


class AckSummary(Struct, kw_only=True):
    """What a settle-and-pop's acknowledgements did, counted."""

    count: int
    completed: int
    failed: int
    dlq: int
    retry: int
    alreadyAcked: int
    refused: int
    deadLettered: int
    leaseReleased: bool


AckCode = Literal["lease_lost", "unresolvable", "already_committed", "not_delivered"]


class AckResult(Struct, kw_only=True):
    """One acknowledgement's verdict, as Queen answers it, with ``code`` and ``detail`` saying
    precisely why a refused one was refused."""

    index: int
    transactionId: str
    partitionId: Id
    status: str
    success: Annotated[bool, Meta(description="false: the broker did not take it")]
    error: Annotated[str | None, Meta(description="Queen's text for a refused one")]
    code: AckCode | None
    detail: str | None
    queueName: str | None
    partitionName: str | None
    leaseReleased: bool
    dlq: bool
    noop: Annotated[bool, Meta(description="a completion at or below the committed offset: "
                                           "nothing to do")]
    alreadyAcked: Annotated[bool, Meta(description="noop, as earlier versions of this broker "
                                                   "named it")]


class WaitRefused(Struct, kw_only=True):
    """The acknowledgements committed but the pop found nothing and could not wait (a bound
    on waiting pops: the 429 or 503 it would have answered)."""

    status: int
    error: str
    message: str
    limit: int | UnsetType = UNSET


class PopResponse(Struct, kw_only=True):
    """A pop's answer (a settle-and-pop adds acks, ackRefused and waitRefused)."""

    success: bool
    queue: str
    partition: Annotated[str | None, Meta(description="null: no message, or several "
                                                      "partitions")]
    partitionId: Id | None
    leaseId: Id | None
    leaseExpiresAt: str | None
    consumerGroup: str
    messages: list[Message]
    skipped: Annotated[Skipped | None, Meta(description=(
        "the offsets this consumer group never received: retention dropped them before the "
        "group read them, and it resumed at the partition's log_start (reported once, with "
        "the first batch after the skip; also counted in queen_messages_skipped_total)"))]
    autopilot: Autopilot | UnsetType = UNSET
    conflation: Annotated[Literal[True], Meta(description=(
        "present when the consumer group's policy conflates"))] | UnsetType = UNSET
    conflationConflict: Annotated[Literal[True], Meta(description=(
        "present when the pop asked for the conflation policy its group does not have (the "
        "group's stored policy applied)"))] | UnsetType = UNSET
    partitions: Annotated[list[PopPartition], Meta(description=(
        "only when partitions > 1 was asked: the partitions this pop took, all under the one "
        "lease of the pop (top-level leaseId; the top-level partition is null when there are "
        "several)"))] | UnsetType = UNSET
    acks: AckSummary | UnsetType = UNSET
    ackRefused: Annotated[list[AckResult], Meta(description=(
        "the verdicts of the refused acknowledgements"))] | UnsetType = UNSET
    waitRefused: WaitRefused | UnsetType = UNSET


class LeaseExtended(Struct, kw_only=True):
    """Queen's answer to a lease extension, 200 whether or not anything was renewed."""

    leaseId: Id
    success: bool
    renewed: Annotated[int, Meta(description="the partitions held under the lease that were "
                                             "extended")]
    newExpiresAt: str | None
    expiresAt: str | None
    lease_expires_at: str | None
    error: str | None
    code: Literal["lease_expired", "lease_not_found"] | None


class QueueSettings(Struct, kw_only=True):
    """A queue's options as applied (every one, defaults included)."""

    leaseTime: int
    retryLimit: int
    retryDelay: int
    maxSize: int
    ttl: int
    deadLetterQueue: bool
    delayedProcessing: int
    retentionSeconds: int
    completedRetentionSeconds: int
    retentionEnabled: bool
    retainUntilConsumed: bool
    maxWaitTimeSeconds: int
    windowBuffer: int
    encryptionEnabled: bool


class ConfiguredOptions(QueueSettings, kw_only=True):
    """Every option Queen echoes, as applied, and the two it takes that have no effect here,
    as sent (or their default)."""

    priority: int
    dlqAfterMaxRetries: bool


class Configured(Struct, kw_only=True):
    """``POST /api/v1/configure``'s answer: Queen's, plus ``created``, ``queueId``,
    ``ignored`` and ``unknown``."""

    configured: Literal[True]
    created: Annotated[bool, Meta(description="false: it existed and was reconfigured")]
    queue: str
    queueId: Id
    partitionId: Annotated[Id, Meta(description="the Default partition")]
    namespace: Annotated[str, Meta(description="echoed (empty when none was sent)")]
    task: Annotated[str, Meta(description="echoed (empty when none was sent)")]
    options: ConfiguredOptions
    ignored: Annotated[list[str], Meta(description=(
        "options sent that have no effect here (see docs/http-api.md, Queue options), unknown "
        "names, and namespace and task when sent"))]
    unknown: Annotated[list[str], Meta(description="option names neither Queen nor this "
                                                   "broker knows")]


FetchError = Literal["OFFSET_OUT_OF_RANGE", "UNKNOWN_TOPIC_OR_PARTITION"]


class FetchedRecord(Struct, kw_only=True):
    offset: int
    transactionId: str
    payload: Annotated[Any, Meta(description="the payload pushed")]
    ts: Annotated[str, Meta(extra_json_schema={"format": "date-time"}, description=(
        "when the push that wrote it was stored"))]


class FetchedEntry(Struct, kw_only=True):
    """One entry's records, in the order asked, and the partition's bounds."""

    queue: str
    partition: str
    records: list[FetchedRecord]
    highWatermark: Annotated[int, Meta(description="the next offset to be assigned")]
    logStartOffset: Annotated[int, Meta(description="the oldest offset retention kept")]
    error: Annotated[FetchError, Meta(description=(
        "OFFSET_OUT_OF_RANGE: below the log start or past the high watermark; "
        "UNKNOWN_TOPIC_OR_PARTITION: no such queue"))] | UnsetType = UNSET


class Fetched(Struct, kw_only=True):
    """``POST /api/v1/fetch``'s answer: an entry per entry asked, in order."""

    entries: list[FetchedEntry]


ChangedError = Literal["UNKNOWN_TOPIC_OR_PARTITION", "BAD_CURSOR"]


class ChangedPartition(Struct, kw_only=True):
    name: str
    id: Id
    lastOffset: Annotated[int, Meta(description="the offset of its last record (-1: none)")]
    logStart: int
    lastWriteAt: Annotated[str, Meta(extra_json_schema={"format": "date-time"})]


class ChangedQueue(Struct, kw_only=True):
    """One entry's page of partitions (or its error)."""

    queue: str
    partitions: list[ChangedPartition] | UnsetType = UNSET
    next: Annotated[str | None, Meta(description=(
        "the cursor to pass as after (null: the end)"))] | UnsetType = UNSET
    error: Annotated[ChangedError, Meta(description=(
        "UNKNOWN_TOPIC_OR_PARTITION: no such queue; BAD_CURSOR: after is not a cursor of "
        "this mode"))] | UnsetType = UNSET


class PartitionsChanged(Struct, kw_only=True):
    """``POST /api/v1/partitions/changed``'s answer."""

    safeTime: Annotated[str, Meta(extra_json_schema={"format": "date-time"}, description=(
        "no write can still land at or before it: pass it as the next since"))]
    safeTimeDegraded: Annotated[bool, Meta(description=(
        "the broker could not see every session: safeTime is now less a margin"))]
    entries: list[ChangedQueue]


# -- queue resources --------------------------------------------------------------------------


class MessageCounts(Struct, kw_only=True):
    total: Annotated[int, Meta(description="retained")]
    pending: Annotated[int, Meta(description=(
        "not yet done by the slowest consumer group (all of them while no group has read the "
        "partition)"))]
    processing: Annotated[int, Meta(description="leased")]


class QueueSummary(Struct, kw_only=True):
    name: str
    createdAt: str
    partitions: int
    messages: MessageCounts
    options: QueueSettings


class QueueList(Struct, kw_only=True):
    """``GET /api/v1/resources/queues``: the tenant's queues (Queen's shape)."""

    queues: list[QueueSummary]


class PartitionStorage(Struct, kw_only=True):
    """Where a partition's retained messages are stored: the head (recent, plain rows) and
    sealed zstd segments."""

    headFrames: int
    headBytes: Annotated[int, Meta(description="payload JSON bytes in the head")]
    segments: int
    segmentFrames: int
    rawBytes: Annotated[int, Meta(description="payload JSON bytes sealed in segments")]
    compressedBytes: Annotated[int, Meta(description="what those segments store")]


class GroupPosition(Struct, kw_only=True):
    """A consumer group on one partition."""

    committed: Annotated[int, Meta(description="the last offset done (-1: none)")]
    lag: Annotated[int, Meta(description="messages after the cursor")]
    leased: bool


class PartitionDetail(Struct, kw_only=True):
    id: Id
    name: str
    createdAt: str
    logStart: Annotated[int, Meta(description="first retained offset")]
    nextOffset: int
    messages: Annotated[int, Meta(description="nextOffset - logStart")]
    storage: PartitionStorage
    groups: Annotated[dict[str, GroupPosition], Meta(description=(
        "the consumer groups that have a cursor on it, by name"))]


class QueueTotals(Struct, kw_only=True):
    messages: int
    deadLetters: int


class QueueTimers(Struct, kw_only=True):
    pending: Annotated[int, Meta(description="timers not yet fired into this queue")]
    nextDeliverAt: Annotated[str | None, Meta(description=(
        "the earliest deliverAt among them"))]


class QueueDetail(Struct, kw_only=True):
    """``GET /api/v1/resources/queues/{queue}``: options, partitions, offsets, consumer
    groups, storage."""

    name: str
    createdAt: str
    options: QueueSettings
    partitions: list[PartitionDetail]
    consumerGroups: list[str]
    totals: QueueTotals
    timers: QueueTimers
    storage: Annotated[PartitionStorage, Meta(description="the partitions' summed")]


class QueueDeleted(Struct, kw_only=True):
    """``DELETE /api/v1/resources/queues/{queue}``."""

    deleted: Literal[True]
    queue: str
    existed: Annotated[bool, Meta(description="false: there was no such queue")]
