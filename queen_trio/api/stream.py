"""The streaming pop, a queen-trio extension (Queen has none): one WebSocket carries a
consumer's batches as they become poppable and its settlements back, so that a consumer under
steady load costs no HTTP request per batch (issue 32: a request costs the broker about 1 ms of
CPU, the batch of a timer firing at 500/s is one message).

A WebSocket rather than a chunked (NDJSON) answer or server-sent events: those carry one way
only, and the settlements would each need a request of their own again. The batches are popped
by the pop's own machinery (:func:`queen_trio.log.longpoll.pop_batches`: lanes, the sweeper's
hand-over, the bounds on waiting pops) and the settlements applied by the ack's
(:func:`queen_trio.api.log.settle`), so leases, acks and their verdicts are Queen's.

Wire (docs/http-api.md#streaming-pop)::

    GET /api/v1/stream/queue/<queue>[/partition/<partition>]   (a WebSocket upgrade)
        the pop's parameters (consumerGroup, batch, timeout, subscriptionMode, ...) and
        ``inflight``: how many batches the consumer takes at once (default 1)
    broker -> consumer (text, JSON):
        {"seq": n, "pop": <a pop's answer>}        a batch, leased as by a pop
        {"seq": n, "ackRefused": [...]}            settlements of batch n refused (a lost
                                                   lease...): verdicts as a POST pop's
        {"idle": true}                             a pop's timeout passed with nothing
        {"error": code, "message": text}           then the broker closes the stream
    consumer -> broker:
        {"seq": n, "acknowledgments": [...], ...}  batch n is done: its settlements, as the
                                                   body of a POST pop; frees one of inflight
        {"stop": true}                             pop no more; the broker closes once its
                                                   pop in progress has answered

Backpressure: at most ``inflight`` batches are out (sent, their settle not received); the
broker pops the next one only then. When the consumer goes away, the batches it did not settle
are given back (``retry``: no retry spent), and a pop in progress is let finish (bounded by its
timeout) and given back too, rather than cut off inside PostgreSQL with a lease taken. At a
shutdown the broker pops no more, waits a moment for the batches out to be settled, and closes
(1001); the SDK reconnects or falls back.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import msgspec
import psycopg
import trio
from quart import Blueprint, Response, websocket

from ..errors import ApiError, DatabaseUnavailable, RequestError, ValidationError
from ..log import longpoll, rules, store
from ..log.wakeups import DeferredSettle, ParkLimit, QueueWakeups, Watch
from ..models import codec
from .common import broker as _broker
from .connections import DirectWebSocket
from .errors import error_response
from .log import _resolved, ack_result, batches_to_wire, settle
from .origin import HostPolicy, check_request
from .tenancy import admit_request, current_tenant_id

log = logging.getLogger(__name__)

stream_routes = Blueprint("stream", __name__, url_prefix="/api/v1")

MAX_INFLIGHT = 256
# A settle or a give-back runs to its end even when the consumer has gone (its acks count).
SETTLE_S = 10.0
# At a shutdown, how long batches out may take to be settled before the stream closes.
DRAIN_S = 2.0
# After sending a batch, how long the next pop waits for its settlement (the SDK's poll slot
# is held as long: queen_trio/client/consumer.py SLOT_HOLD_S).
SETTLE_HOLD_S = 0.02
# A settlement whose next pop would find nothing waits for the sweeper's next cycle into the
# queue (it applies the settlement with its pop: queen.sweep_settle_and_pop) if that cycle is
# sent within SETTLE_CARRY_S, and at most SETTLE_CARRY_GRACE_S past its planned send; then
# it is applied alone (with a look), as it would have been at once.
SETTLE_CARRY_S = 0.025
SETTLE_CARRY_GRACE_S = 0.005
_CLOSE_NORMAL, _CLOSE_GOING_AWAY, _CLOSE_POLICY, _CLOSE_TRY_LATER = 1000, 1001, 1008, 1013
# The database away (a failover, say): the stream ends, the consumer comes back after a backoff.
_DB_TROUBLE = (DatabaseUnavailable, psycopg.OperationalError)
_DB_AWAY = ("database_unavailable", "the database is unreachable; reconnect later")
# A settlement of a batch whole in the SDK's compact form says no more than these.
_WHOLE_KEYS = frozenset(("seq", "partitionId", "leaseId", "consumerGroup", "acknowledgments"))
#: Off: the stream's messages go through Quart's websocket (tests compare). On, a stream served
#: by hypercorn (api/fast.py) sends and reads its messages on hypercorn's side
#: (:class:`~.connections.DirectWebSocket`): a settlement that only hands the pop loop its
#: next pop is taken on the connection's own task, as it is read (a cycle under a steady
#: flow then wakes no reader task, nor Quart's).
DIRECT = True
# Settlements read on the connection's task and waiting for the reader task (which settles
# them in order): past this, the connection's reads wait, as Quart's queue made them.
_INBOX = 8
# A received message not read yet (_Stream._taken).
_UNREAD: Any = object()


@stream_routes.websocket("/stream/queue/<queue>")
async def stream_queue(queue: str) -> Response | None:
    return await _open(queue, None)


@stream_routes.websocket("/stream/queue/<queue>/partition/<partition>")
async def stream_partition(queue: str, partition: str) -> Response | None:
    return await _open(queue, partition)


async def _open(queue: str, partition: str | None) -> Response | None:
    """Admit the stream as a pop is admitted (host, token, quota, parameters): refused, the
    upgrade is answered with the pop's JSON error instead (a 404 ``stream_disabled`` when
    QUEEN_STREAM_POP is off, as from a broker without streams)."""
    broker = _broker()
    ws = websocket._get_current_object()  # type: ignore[attr-defined]
    try:
        check_request(ws, HostPolicy.from_settings(broker.settings))
        await admit_request(ws, broker)
        if not broker.settings.stream_pop:
            raise ApiError(404, "stream_disabled", "this broker serves no streaming pop "
                           "(QUEEN_STREAM_POP=off): pop instead")
        args = dict(ws.args)
        inflight = rules.query_int(args, "inflight", 1, lo=1, hi=MAX_INFLIGHT)
        args["wait"] = "true"
        req = rules.pop_request(queue, partition, args)
        if req.auto_ack:
            raise ValidationError("invalid_parameter",
                                  "a stream's batches are settled by the consumer: no autoAck")
        req = await _resolved(req)
    except RequestError as exc:
        return error_response(exc.status, exc.code, exc.message, headers=exc.headers,
                              **exc.extra)
    except psycopg.OperationalError:
        return error_response(503, *_DB_AWAY)
    stream = _Stream(ws, current_tenant_id(), req, inflight,
                     DirectWebSocket.of(ws.scope) if DIRECT else None)
    await ws.accept()
    await stream.run()
    return None


def _settle_whole_noted(raw: Any, wakeups: QueueWakeups, tenant: int, req: rules.PopRequest,
                        batch: store.PopBatch, acks: list[rules.Ack], pop: bool,
                        sync_commit: bool, watch: Watch | None = None
                        ) -> store.BatchSettled | None:
    """:func:`store.settle_pop_head`, its NOTIFY (sent unless the pop leased the same
    partition again) noted as this broker's own, as for an ack (api/log.py
    ``_ack_head_noted``). ``watch``: the stream's, told whether the pop drained the queue
    for the stream (:meth:`_Stream._deferral`)."""
    pid = raw.info.backend_pid
    mark = wakeups.expect_own_notify(pid)
    key, news = None, True
    try:
        settled = store.settle_pop_head(raw, tenant, req, batch, acks, pop=pop,
                                        sync_commit=sync_commit, look_after=watch is not None)
        if watch is not None and settled is not None:
            _note_drained(watch, pid, batch, settled.popped)
        if settled is not None:
            popped = settled.popped
            again = popped is not None and popped.batch is not None and any(
                b.partition_id == batch.partition_id for b in popped.batches)
            if not again:
                key = store.wake_key(tenant, batch.queue)
            # A pop after the settlement that found nothing, nor anything about to be
            # poppable, has looked for this broker's pops of the queue already: the partition
            # it freed has nothing more for the group.
            news = not (popped is not None and popped.batch is None and popped.looked
                        and (popped.look_in_s is None or popped.look_in_s > 0))
        return settled
    finally:
        wakeups.own_notify_sent(mark, key, news=news)


def _note_drained(watch: Watch, pid: int, settled: store.PopBatch,
                  popped: store.PopOutcome | None) -> None:
    """After a settlement and the pop in its statement (queen.settle_pop_head, run by backend
    ``pid``): whether that pop, taking fewer than its batch, left nothing else poppable for
    the stream. Its NOTIFY (sent when it freed the settled partition for good) is then no
    news to the stream; none is expected when it leased that partition again (-1: excuses
    none)."""
    got = None if popped is None else popped.batch
    if (got is None or popped is None or not popped.looked or popped.more
            or (popped.look_in_s is not None and popped.look_in_s <= 0)):
        return
    watch.drained_by = -1 if got.partition_id == settled.partition_id else pid


class _Stream:
    """One consumer's stream: a pop loop and the reading of its settlements."""

    def __init__(self, ws: Any, tenant: int, req: rules.PopRequest, inflight: int,
                 direct: DirectWebSocket | None = None) -> None:
        self.ws, self.tenant, self.req, self.inflight = ws, tenant, req, inflight
        # Messages go through hypercorn's side (DirectWebSocket): those received are taken
        # as they are read (_received); what the reader task must settle waits in its inbox.
        self.direct = direct
        self.inbox, self.inbox_out = trio.open_memory_channel[tuple[Any, Any]](_INBOX)
        self.inbox_pending = 0  # in the inbox, or being settled by the reader task
        self.reading = True  # the reader task goes on (not failed)
        if direct is not None:
            direct.divert(self._received)
        self.broker = _broker()
        self.out: dict[int, list[store.PopBatch]] = {}  # batches sent, not yet settled
        self.seq = 0
        self.changed = trio.Event()  # a batch settled, or the consumer said stop
        self.stopping = False
        self.close_code = _CLOSE_NORMAL
        self.abandon = longpoll.Abandon()  # the consumer stopped or left: stop waiting
        # The batch whose settlement the pop loop waits for (SETTLE_HOLD_S), and a whole one
        # handed to it (seq, acks): its next pop applies it first, in the same statement.
        self.holding: int | None = None
        self.pending: tuple[int, list[rules.Ack]] | None = None
        # The last settlement read as completing its batch whole (_read_whole): (seq, acks).
        self.known_whole: tuple[int, list[rules.Ack]] | None = None
        # What the pops of this stream know of the queue between two pops, and the
        # settlement a pop carries for the sweep (seq, acks, the carried settlement) until
        # it is applied (_carried).
        self.watch: Watch | None = None
        self.carried: tuple[int, list[rules.Ack], DeferredSettle] | None = None

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_settlements)
                with self.broker.wakeups.watching(store.wake_key(self.tenant,
                                                                 self.req.queue)) as watch:
                    self.watch = watch
                    try:
                        await self._pop_loop()
                    finally:
                        self.watch = None
                await self._settle_pending()
                with trio.move_on_after(DRAIN_S):
                    while self.out:
                        await self._wait_changed()
                nursery.cancel_scope.cancel()
            await self.ws.close(self.close_code)
        finally:
            # The consumer went away (the handler is cancelled then) or the stream ended:
            # what it did not settle goes back now rather than when its lease ends (after
            # what it did settle).
            if self.out:
                with trio.CancelScope(shield=True), trio.move_on_after(SETTLE_S):
                    try:
                        await self._settle_pending()
                        await self._give_back()
                    except _DB_TROUBLE as exc:  # the leases end by themselves
                        log.warning("stream %s: giving back failed: %s", self.req.queue, exc)

    async def _wait_changed(self) -> None:
        await self.changed.wait()
        self.changed = trio.Event()

    async def _pop_loop(self) -> None:
        wakeups = self.broker.wakeups
        timeout_s = self.req.timeout_ms / 1000
        # (abandoned: the consumer has gone, and nothing here may wait for it: a send to a
        # closed WebSocket returns at once, without a checkpoint that would cancel this loop)
        while not (self.stopping or wakeups.stopping or self.abandon.abandoned):
            if len(self.out) - (self.pending is not None) >= self.inflight:
                await self._wait_changed()
                continue
            pending, self.pending = self.pending, None
            deferral = None if pending is None else self._deferral(*pending)
            first_look = None if pending is None or deferral is not None else functools.partial(
                self._settle_then_look, *pending)
            # Not cut off by the consumer leaving: a pop cancelled inside PostgreSQL may have
            # taken a lease nobody would see; it ends when abandoned (only its sleep is cut
            # short) or by its own timeout, and what it took goes back.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout_s + 5):
                try:
                    batches = await longpoll.pop_batches(self.broker, self.tenant, self.req,
                                                         self.abandon, first_look,
                                                         watch=self.watch, deferral=deferral)
                except ParkLimit as limit:
                    await self._fail("too_many_waiting_pops", f"{limit.limit} pops wait "
                                     f"already ({limit.scope} bound); retry later",
                                     _CLOSE_TRY_LATER)
                    return
                except _DB_TROUBLE as exc:
                    log.warning("stream %s: pop failed: %s", self.req.queue, exc)
                    await self._fail(*_DB_AWAY, _CLOSE_TRY_LATER)
                    return
                if batches:
                    self.seq += 1
                    self.out[self.seq] = batches
            if not batches:
                await self._send({"idle": True})
                continue
            self.changed = trio.Event()
            self.holding = self.seq  # (before it can be settled)
            await self._send_batch(self.seq, batches)
            # A quick consumer settles within a moment, and the pop after it looks once (in
            # the settlement's own statement when the batch is settled whole); a pop at once
            # would look too, find the partition it holds still leased, and park (two
            # statements for nothing). A slow one keeps no other partition waiting long.
            with trio.move_on_after(SETTLE_HOLD_S):
                await self._wait_changed()
            self.holding = None
        if wakeups.stopping:
            self.close_code = _CLOSE_GOING_AWAY

    async def _read_settlements(self) -> None:
        try:
            await self._settle_each()
        finally:  # the consumer left (the handler is cancelled then), or misbehaved
            self.abandon.now()

    async def _received(self, raw: bytes | str | None) -> None:
        """A message the consumer sent, on the connection's own task (DirectWebSocket): a
        settlement that only hands the pop loop its next pop, or a stop, is taken here; the
        rest is settled by the reader task, in order (nothing is taken here while it has any
        to settle)."""
        if not self.reading:
            return  # the stream has failed (it closes): as Quart's queue nobody read
        taken = _UNREAD
        if not self.inbox_pending:
            taken = self._taken(raw)
            if taken is None:
                return
        self.inbox_pending += 1
        try:
            self.inbox.send_nowait((raw, taken))
        except trio.WouldBlock:
            await self.inbox.send((raw, taken))

    async def _settle_each(self) -> None:
        try:
            while True:
                if self.direct is None:
                    taken = self._taken(await self.ws.receive())
                    if taken is not None and not await self._settle_taken(taken):
                        return
                    continue
                raw, taken = await self.inbox_out.receive()
                try:
                    if taken is _UNREAD:
                        taken = self._taken(raw)
                    if taken is not None and not await self._settle_taken(taken):
                        return
                finally:
                    self.inbox_pending -= 1
        finally:
            self.reading = False

    def _taken(self, raw: bytes | str | None
               ) -> tuple[int, list[rules.Ack]] | RequestError | None:
        """A message read: None if it is taken care of here (a stop, or the settlement the
        pop loop waits for, handed to it), else what the reader task settles."""
        try:
            seq, acks = self._settlement(raw)
        except RequestError as exc:
            return exc
        if seq is None:  # stop
            self.stopping = True
            self.abandon.now()
            self.changed.set()
            return None
        if (seq == self.holding and self.pending is None and self._whole(seq, acks)
                and self._may_pop()):
            # The pop loop waits for this one: its next pop settles it first, in one
            # statement, and parks on what that look found.
            self.holding = None
            self.pending = seq, acks
            self.changed.set()
            return None
        return seq, acks

    async def _settle_taken(self, taken: tuple[int, list[rules.Ack]] | RequestError) -> bool:
        """Settle what :meth:`_taken` left to the reader task; False: the stream fails."""
        if isinstance(taken, RequestError):
            await self._fail(taken.code, taken.message, _CLOSE_POLICY)
            return False
        seq, acks = taken
        results: list[store.AckResult] = []
        popped: list[store.PopBatch] = []
        with trio.CancelScope(shield=True), trio.move_on_after(SETTLE_S):
            try:
                if acks:
                    settled = await self._settle_whole(seq, acks)
                    if settled is None:
                        results = await settle(
                            acks, sync_commit=self.broker.settings.pop_commit_sync)
                    else:
                        results = settled.results
                        if settled.popped is not None:
                            popped = settled.popped.batches
            except _DB_TROUBLE as exc:  # not applied: its leases end by themselves
                log.warning("stream %s: settling failed: %s", self.req.queue, exc)
                await self._fail(*_DB_AWAY, _CLOSE_TRY_LATER)
                return False
            self.out.pop(seq, None)
            if popped:  # the next batch, in the settled one's place
                self.seq += 1
                self.out[self.seq] = popped
                next_seq = self.seq
        if popped:
            await self._send_batch(next_seq, popped)
        else:
            self.changed.set()
        await self._send_refused(seq, results)
        return True

    async def _send_batch(self, seq: int, batches: list[store.PopBatch]) -> None:
        answer = batches_to_wire(self.req, batches, self.broker.cipher)
        await self._send_bytes(b'{"seq":%d,"pop":%s}' % (seq, codec.encode(answer)))

    async def _send_bytes(self, data: bytes) -> None:
        if self.direct is None or not await self.direct.send(data):
            await self.ws.send(data)

    def _whole(self, seq: int, acks: list[rules.Ack]) -> bool:
        """Whether ``acks`` complete batch ``seq`` whole (:func:`store.completes_whole`)."""
        known = self.known_whole
        if known is not None and known[1] is acks:
            return known[0] == seq and seq in self.out
        sent = self.out.get(seq)
        return (sent is not None and len(sent) == 1 and bool(acks)
                and store.completes_whole(sent[0], acks))

    def _may_pop(self) -> bool:
        """Whether a settlement may be followed by a pop in its statement (queen.pop_head
        serves this stream's pops, and the stream goes on)."""
        req = self.req
        return (longpoll.head_served(req) and req.subscribe_from != rules.SUBSCRIBE_NOW
                and not (self.stopping or self.abandon.abandoned
                         or self.broker.wakeups.stopping))

    async def _settle_whole(self, seq: int, acks: list[rules.Ack], *,
                            pop: bool | None = None, watch: Watch | None = None
                            ) -> store.BatchSettled | None:
        """Batch ``seq`` completed whole (the common settlement): its acknowledgement as one
        offset commit, checked against the batch this stream holds rather than looked up
        frame by frame, and with ``pop`` the next pop in the same statement
        (queen.settle_pop_head; by default when the batch was full: a backlog, there is
        likely more, and the pop is counted here). None: not that case, or the cursor is not
        as the batch's pop left it: the usual ack (:func:`settle`) decides."""
        if not self._whole(seq, acks):
            return None
        batch, req, broker = self.out[seq][0], self.req, self.broker
        counted = pop is None
        if pop is None:
            pop = len(batch.messages) >= req.batch and self._may_pop()
        tenant = self.tenant
        settled = await broker.db.run_autocommit(
            _settle_whole_noted, broker.wakeups, tenant, req, batch, acks, pop,
            broker.settings.pop_commit_sync, watch if pop else None)
        if settled is None:
            return None
        broker.metrics.count_acks(tenant, (r.status for r in settled.results))
        if pop and counted:
            got = [] if settled.popped is None else settled.popped.batches
            broker.metrics.count_pop(tenant, sum(len(b.messages) for b in got))
        return settled

    async def _settle_then_look(self, seq: int, acks: list[rules.Ack]) -> store.PopOutcome:
        """The pop loop's first look after the consumer settled batch ``seq`` whole: the
        settlement and the look in one statement; else the settlement as usual, then the
        look."""
        # (Whether the pop drains the queue for this stream: then its next settlement may
        # wait for the sweep that pops for it.)
        settled = await self._settle_whole(seq, acks, pop=True, watch=self.watch)
        if settled is None:
            results = await settle(acks, sync_commit=self.broker.settings.pop_commit_sync)
            self.out.pop(seq, None)
            await self._send_refused(seq, results)
        else:
            self.out.pop(seq, None)
            if settled.popped is not None:
                return settled.popped
        return await longpoll.look(self.broker, self.tenant, self.req)

    def _deferral(self, seq: int, acks: list[rules.Ack]) -> longpoll.Deferral | None:
        """Batch ``seq``'s settlement (completed whole), carried by the next pop for the
        sweep that pops for it, if that pop would find nothing now (the sweep that handed
        the batch drained the queue for this group, and no news came since: the watch is
        quiet) and the sweeper's next cycle into the queue is sent within SETTLE_CARRY_S.
        None: settled at once, with a look, as usual."""
        watch, wakeups = self.watch, self.broker.wakeups
        if watch is None or not watch.quiet() or seq not in self.out:
            return None
        sent_at = wakeups.fire_planned(watch.key)
        now = trio.current_time()
        if sent_at is None or sent_at > now + SETTLE_CARRY_S:
            return None
        carried = DeferredSettle(self.out[seq][0], max(sent_at, now) + SETTLE_CARRY_GRACE_S,
                                 functools.partial(self._carried_done, seq, acks))
        self.carried = seq, acks, carried
        return longpoll.Deferral(carried, functools.partial(self._carried_then_look, seq, acks),
                                 functools.partial(self._carried_alone, seq, acks))

    def _carried_done(self, seq: int, acks: list[rules.Ack], applied: bool | None) -> None:
        """What the sweep that carried batch ``seq``'s settlement did with it (as it returns):
        applied, it is settled (its acks counted as :meth:`_settle_whole` counts them)."""
        if applied is not True:
            return  # (the pop settles it as usual: longpoll.Deferral)
        broker = self.broker
        if self.carried is not None and self.carried[0] == seq:
            self.carried = None
        broker.metrics.count_acks(self.tenant, (a.status for a in acks))
        broker.metrics.pop_fire_waits.labels("settled_by_fire").inc()
        self.out.pop(seq, None)
        self.changed.set()

    async def _carried_then_look(self, seq: int, acks: list[rules.Ack]) -> store.PopOutcome:
        """No sweep applied batch ``seq``'s carried settlement: as at once, with a look."""
        self.carried = None
        self.broker.metrics.pop_fire_waits.labels("settled_alone").inc()
        return await self._settle_then_look(seq, acks)

    async def _carried_alone(self, seq: int, acks: list[rules.Ack]) -> None:
        """A sweep handed a batch without applying batch ``seq``'s carried settlement."""
        self.carried = None
        self.broker.metrics.pop_fire_waits.labels("settled_alone").inc()
        results = await settle(acks, sync_commit=self.broker.settings.pop_commit_sync)
        self.out.pop(seq, None)
        await self._send_refused(seq, results)

    async def _settle_pending(self) -> None:
        """A settlement handed to the pop loop that it did not get to, or one its pop carried
        that no sweep applied (the pop failed): applied as usual."""
        if self.carried is not None and self.carried[2].result is not True:
            seq, acks, _ = self.carried
            self.pending = seq, acks
        self.carried = None
        pending, self.pending = self.pending, None
        if pending is not None:
            seq, acks = pending
            try:
                results = await settle(acks, sync_commit=self.broker.settings.pop_commit_sync)
            except _DB_TROUBLE as exc:  # not applied: its lease ends by itself
                log.warning("stream %s: settling failed: %s", self.req.queue, exc)
                return
            self.out.pop(seq, None)
            self.changed.set()
            await self._send_refused(seq, results)

    async def _send_refused(self, seq: int, results: list[store.AckResult]) -> None:
        # Only refusals are answered: a consumer counts what it sent as taken (a message
        # per batch less each way, the common case).
        refused = [ack_result(r) for r in results if r.refused is not None]
        if refused:
            await self._send({"seq": seq, "ackRefused": refused})

    def _settlement(self, raw: str | bytes | None) -> tuple[int | None, list[rules.Ack]]:
        if not raw:  # (an empty binary message reaches us as None: Quart reads b"" as absent)
            raise ValidationError("invalid_json", "a stream message must be JSON")
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise ValidationError("invalid_json", "a stream message must be JSON") from None
        except RecursionError:  # (msgspec's own limit on nesting: a client's message)
            raise ValidationError("invalid_json", "a stream message is nested too deeply"
                                  ) from None
        if not isinstance(body, dict):
            raise ValidationError("invalid_body", "a stream message must be an object")
        if body.get("stop") is True:
            return None, []
        seq = body.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq not in self.out:
            raise ValidationError("invalid_seq", "seq must name a batch of this stream that "
                                  "is not settled yet")
        items = body.get("acknowledgments", [])
        if items == []:
            return seq, []
        acks = self._read_whole(seq, body, items)
        return seq, rules.ack_batch(body) if acks is None else acks

    def _read_whole(self, seq: int, body: dict[str, Any], items: Any) -> list[rules.Ack] | None:
        """The common settlement, read without reading each acknowledgement as a request's:
        batch ``seq`` completed whole in the SDK's compact form (partitionId, leaseId and
        consumerGroup said once, each message by its transactionId alone, in the batch's
        order). Every value equals one this stream handed out, so none needs validating;
        its acknowledgements are built from the batch (what :func:`rules.ack_batch` would
        read) and known whole (:meth:`_whole`). None: any other settlement, read as usual."""
        sent = self.out.get(seq)
        if sent is None or len(sent) != 1 or not isinstance(items, list):
            return None
        batch = sent[0]
        messages, lease, pid = batch.messages, batch.lease_id, batch.partition_id
        if (lease is None or len(items) != len(messages) or not body.keys() <= _WHOLE_KEYS
                or messages[-1].offset - messages[0].offset != len(messages) - 1
                or body.get("partitionId") != str(pid) or body.get("leaseId") != str(lease)
                or (body.get("consumerGroup") or rules.QUEUE_MODE_GROUP) != batch.group):
            return None
        group = batch.group
        acks = []
        for i, (item, message) in enumerate(zip(items, messages, strict=True)):
            txn = message.transaction_id
            if type(item) is not dict or len(item) != 1 or item.get("transactionId") != txn:
                return None
            acks.append(rules.Ack(i, txn, pid, "completed", group, lease, None))
        self.known_whole = seq, acks
        return acks

    async def _give_back(self) -> None:
        """Release the batches out, no retry spent (``retry``)."""
        out = [(b, m) for batches in self.out.values() for b in batches for m in b.messages]
        acks = [rules.Ack(index=i, transaction_id=m.transaction_id, partition_id=b.partition_id,
                          status="retry", group=b.group, lease_id=b.lease_id, error=None)
                for i, (b, m) in enumerate(out)]
        self.out.clear()
        if acks:
            await settle(acks, sync_commit=self.broker.settings.pop_commit_sync)

    async def _fail(self, code: str, message: str, close_code: int) -> None:
        await self._send({"error": code, "message": message})
        self.stopping = True
        self.abandon.now()
        self.close_code = close_code
        self.changed.set()

    async def _send(self, body: dict[str, Any]) -> None:
        await self._send_bytes(codec.encode(body))
