"""Losing the database server: a primary with a streaming standby, two brokers on the multi-host
URL, the primary SIGKILLed mid-fire and the standby promoted.

Synchronous replication (``synchronous_standby_names`` naming the standby,
``synchronous_commit=on``): nothing a client was told is lost. Every timer answered
``scheduled`` is in the log exactly once or still pending, never both and never neither
(the :class:`TimerBook` over the burst and a schedule/cancel storm); every push answered 201
is in the log exactly once; no message is delivered again after its ack was answered. The
brokers follow the new primary by themselves; the old one rejoins as a read-only standby
listed first in the URL, and nothing is written to it.

Asynchronous replication: the same ledger, with replication cut (a stalled proxy) for a
second before the kill, shows what that setting gives up: writes acknowledged after the last
replicated commit are gone, the ones before it are all there, and still nothing is doubled.

``QUEEN_FAILOVERS=5`` runs five failovers in a row (the figures in RELIABILITY.md); CI runs one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ..brokers import BrokerProcess, running_brokers
from ..timer_ops import timer_op
from .harness import PgProxy, TimerBook, asql, assert_ledger, pending_txns, poll_until
from .replication import ReplicatedPostgres
from .traffic import payload_for, storm, wait_drained

API = "/api/v1"
LOG_QUEUE = "fo-log"
GROUP = "fo"
ROUNDS = int(os.environ.get("QUEEN_FAILOVERS", "1"))
ENV = {"QUEEN_LOG_LEVEL": "ERROR"}  # every other setting at its default
pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(memory_path: Path) -> Iterator[ReplicatedPostgres]:
    c = ReplicatedPostgres(memory_path, synchronous=True)
    try:
        c.start()
        yield c
    finally:
        c.stop()


# -- the ledger of pushes and acks --------------------------------------------------------------


@dataclasses.dataclass
class LogBook:
    """Pushes and acks as the clients saw them (``time.time()`` of each answer)."""

    pushed: dict[str, float] = dataclasses.field(default_factory=dict)  # answered 201
    sent: dict[str, float] = dataclasses.field(default_factory=dict)  # request sent at
    push_unknown: set[str] = dataclasses.field(default_factory=set)  # 503 or no answer
    deliveries: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    acked: dict[str, float] = dataclasses.field(default_factory=dict)  # ack answered 200
    ack_unknown: set[str] = dataclasses.field(default_factory=set)  # ack sent, 503 or no answer
    answers: Counter[str] = dataclasses.field(default_factory=Counter)

    def redelivered_after_ack(self) -> list[str]:
        return [txn for at, txn in self.deliveries if txn in self.acked and at > self.acked[txn]]


async def pusher(brokers: list[BrokerProcess], book: LogBook, stop: trio.Event, c: int,
                 queue: str = LOG_QUEUE) -> None:
    https = [httpx.AsyncClient(base_url=b.url, timeout=5) for b in brokers]
    try:
        i = 0
        while not stop.is_set():
            items: list[dict[str, Any]] = [
                {"queue": queue, "partition": f"p{c}", "payload": {"c": c, "i": i + k},
                      "transactionId": f"push-{queue}-{c}-{i + k}"} for k in range(10)]
            i += 10
            txns = [x["transactionId"] for x in items]
            log_sent = time.time()
            book.sent.update(dict.fromkeys(txns, log_sent))
            try:
                r = await https[i // 10 % len(https)].post(f"{API}/push", json={"items": items})
            except httpx.TransportError:
                book.answers["push:transport"] += 1
                book.push_unknown.update(txns)
                continue
            book.answers[f"push:{r.status_code}"] += 1
            if r.status_code == 201:
                book.pushed.update(dict.fromkeys(txns, time.time()))
            else:
                assert r.status_code == 503, r.text
                book.push_unknown.update(txns)
                await trio.sleep(0.05)
            await trio.sleep(0.02)
    finally:
        for h in https:
            await h.aclose()


async def consumer(brokers: list[BrokerProcess], book: LogBook, stop: trio.Event, *,
                   commit_last: bool = False) -> None:
    """Pops and acks every message of each batch; or, ``commit_last``, acks only the last
    message of the batch's partition, an offset commit that completes the batch (Queen 2's
    ack), so every message of it counts as acked once that ack is taken."""
    https = [httpx.AsyncClient(base_url=b.url, timeout=5) for b in brokers]
    n = 0
    try:
        while not stop.is_set():
            n += 1
            http = https[n % len(https)]
            try:
                r = await http.get(f"{API}/pop/queue/{LOG_QUEUE}", params={
                    "consumerGroup": GROUP, "batch": 50, "wait": "true", "timeout": 200})
                book.answers[f"pop:{r.status_code}"] += 1
                if r.status_code != 200:
                    assert r.status_code in (204, 503), r.text
                    await trio.sleep(0.05 if r.status_code == 503 else 0)
                    continue
                got = r.json()["messages"]
            except httpx.TransportError:
                book.answers["pop:transport"] += 1
                await trio.sleep(0.05)
                continue
            now = time.time()
            book.deliveries += [(now, m["transactionId"]) for m in got]
            txns = [m["transactionId"] for m in got]
            # What each acknowledgement sent settles when it is taken.
            covers: dict[str, list[str]] = {t: [t] for t in txns}
            sent = got
            if commit_last:
                last: dict[str, dict[str, Any]] = {}
                for m in got:
                    if m["offset"] > last.get(m["partitionId"], {"offset": -1})["offset"]:
                        last[m["partitionId"]] = m
                sent = list(last.values())
                covers = {m["transactionId"]: [o["transactionId"] for o in got
                                               if o["partitionId"] == m["partitionId"]]
                          for m in sent}
            try:
                r = await http.post(f"{API}/ack/batch", json={
                    "consumerGroup": GROUP, "acknowledgments": [
                        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                         "leaseId": m["leaseId"], "status": "completed"} for m in sent]})
            except httpx.TransportError:
                book.answers["ack:transport"] += 1
                book.ack_unknown.update(txns)  # it may have been applied
                continue
            book.answers[f"ack:{r.status_code}"] += 1
            if r.status_code == 200:
                now = time.time()
                for a in r.json():
                    if a["success"]:
                        for t in covers[a["transactionId"]]:
                            book.acked.setdefault(t, now)
                    else:  # the lease ran out meanwhile: not applied, the messages come again
                        assert a["code"] == "lease_lost", a
                        book.answers["ack:lease_lost"] += 1
            else:  # the database went away: applied or not, unknown
                assert r.status_code == 503, r.text
                book.ack_unknown.update(txns)
    finally:
        for h in https:
            await h.aclose()


def first_push_after(log: LogBook, kill_at: float) -> float:
    """Milliseconds from the kill to the first 201 for a push sent after it."""
    return (min(at for t, at in log.pushed.items() if log.sent.get(t, 0) > kill_at)
            - kill_at) * 1000


SDK_QUEUE = "fo-sdk"


async def sdk_consumer(brokers: list[BrokerProcess], handled: Counter[str], scope: trio.CancelScope,
                       *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """What most users run: ``Client.consume()`` at its defaults, given both brokers' URLs. It
    has to ride the failover out by itself (until cancelled)."""
    from queen_trio.client import Client

    async with Client([b.url for b in brokers]) as queen:
        task_status.started()
        with scope:
            await queen.consume(SDK_QUEUE, lambda m: handled.update([m.transaction_id]))


async def push_log(url: str) -> Counter[str]:
    rows = await asql(url, "SELECT transaction_id AS txn, count(*) AS n FROM queen.frames "
                           "WHERE transaction_id LIKE 'push-%%' GROUP BY 1")
    return Counter({r["txn"]: r["n"] for r in rows})


# -- one failover ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Failover:
    kill_at: float
    kill_to_promoted_ms: float  # until ``pg_ctl promote -w`` returned (it polls every 100 ms)
    kill_to_first_fire_ms: float  # the first timer committed on the new primary
    in_log_at_promotion: int  # of the burst
    pending_at_promotion: int
    claimed_at_promotion: int  # timers under a live claim on the new primary
    # the first push sent after the kill and answered 201
    kill_to_first_push_ms: float = float("nan")
    rejoin_s: float = float("nan")  # the lost node rebuilt as a standby, streaming
    settled_s: float = float("nan")  # then both brokers on the new primary, writes checked


async def schedule_burst(brokers: list[BrokerProcess], book: TimerBook, tag: str, n: int,
                         first_ms: int, per_ms: float) -> None:
    """``n`` timers due from ``first_ms`` on, ``per_ms`` a millisecond, both fire paths."""
    async with httpx.AsyncClient(base_url=brokers[0].url, timeout=30) as http:
        for start in range(0, n, 500):
            timers = [timer_op("burst", f"{tag}-{i}", first_ms + int(i / per_ms),
                               payload_for(f"{tag}-{i}", "broker" if i % 3 else "postgres"),
                               txn=f"{tag}-{i}")
                      for i in range(start, min(n, start + 500))]
            r = await http.post(f"{API}/transaction", json={"timers": timers})
            assert r.status_code == 200, r.text
            for t in r.json()["results"]:
                book.scheduled(t["timerKey"], t["txn"], t["status"], t["txn"])


async def burst_frames(url: str, tag: str) -> int:
    rows = await asql(url, "SELECT count(*) AS n FROM queen.frames WHERE meta ? 'timer' "
                           "AND transaction_id LIKE %s", (f"{tag}-%",))
    return rows[0]["n"]


async def fail_over(cluster: ReplicatedPostgres, tag: str) -> Failover:
    """Wait until the burst ``tag`` is firing, SIGKILL the primary, promote the standby."""
    old = cluster.primary
    await poll_until(lambda: _at_least(old.url, tag, 150), 20, every=0.01)
    kill_at = await trio.to_thread.run_sync(cluster.kill_primary)
    # Transactions numbered from here on were committed by the new primary: a fire committed
    # by the old one in the instant of the kill (and replicated) does not count as first.
    first_xid = (await asql(cluster.standby.admin_url,
                            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
                            "AS x"))[0]["x"]
    promoted_at = await trio.to_thread.run_sync(cluster.promote)
    new = cluster.primary
    fired_before = await burst_frames(new.url, tag)
    pending = (await asql(new.url, "SELECT count(*) AS n FROM queen.timers WHERE txn LIKE %s",
                          (f"{tag}-%",)))[0]["n"]
    claimed = (await asql(new.url, "SELECT count(*) AS n FROM queen.timers WHERE claim_token "
                                   "IS NOT NULL AND visible_at > now()"))[0]["n"]

    async def first_fire() -> Any:
        rows = await asql(new.url, "SELECT extract(epoch FROM min(created_at))::float8 AS t "
                                   "FROM queen.frames WHERE meta ? 'timer' AND "
                                   "xmin::text::bigint >= %s", (first_xid,))
        return rows[0]["t"]

    first = await poll_until(first_fire, 30, every=0.02)
    return Failover(kill_at, (promoted_at - kill_at) * 1000, (first - kill_at) * 1000,
                    fired_before, pending, claimed)


async def _at_least(url: str, tag: str, n: int) -> bool:
    return await burst_frames(url, tag) >= n


async def _health(broker: BrokerProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as http:
        r = await http.get(f"{broker.url}/health")
        return {"status": r.status_code, **r.json()}


# -- synchronous: nothing acknowledged is lost ----------------------------------------------------


async def test_failover_to_a_synchronous_standby_loses_and_doubles_nothing(
    cluster: ReplicatedPostgres,
) -> None:
    timers, log, sdk_log = TimerBook(), LogBook(), LogBook()
    handled: Counter[str] = Counter()  # by consume()
    figures: list[Failover] = []
    async with running_brokers(cluster.url, 2, env=ENV) as brokers, \
            trio.open_nursery() as sdk:
        sdk_scope = trio.CancelScope()
        await sdk.start(sdk_consumer, brokers, handled, sdk_scope)
        async with httpx.AsyncClient(base_url=brokers[0].url, timeout=10) as http:
            # A pop committed just before the kill whose answer never arrived leaves its
            # messages leased: a short lease hands them out again within the test's wait
            # (at the default 300 s they would come back after it).
            for queue in (LOG_QUEUE, SDK_QUEUE):
                r = await http.post(f"{API}/configure",
                                    json={"queue": queue, "options": {"leaseTime": 1}})
                assert r.status_code == 200, r.text
        for n in range(ROUNDS):
            tag = f"r{n}"
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                for c in range(2):
                    nursery.start_soon(pusher, brokers, log, stop, n * 10 + c)
                nursery.start_soon(pusher, brokers, sdk_log, stop, n, SDK_QUEUE)
                nursery.start_soon(consumer, brokers, log, stop)
                # Queen 2's ack-as-commit: one ack commits a whole batch.
                nursery.start_soon(functools.partial(consumer, brokers, log, stop,
                                                     commit_last=True))
                await schedule_burst(brokers, timers, tag, 2000, 800, 1.0)
                nursery.start_soon(functools.partial(
                    storm, brokers, timers, clients=4, keys=8, seconds=4.0, tolerate=(503,),
                    seed=n, prefix=f"{tag}-"))
                f = await fail_over(cluster, tag)
                await trio.sleep(1.5)  # traffic goes on against the new primary
                stop.set()
            f.kill_to_first_push_ms = first_push_after(log, f.kill_at)
            figures.append(f)
            # The lost node comes back as the new primary's standby, first in the URL.
            t0 = time.monotonic()
            await trio.to_thread.run_sync(cluster.rejoin)
            f.rejoin_s = time.monotonic() - t0
            await settled(brokers, cluster, log)
            f.settled_s = time.monotonic() - t0 - f.rejoin_s
        url = cluster.primary.url
        drain_from = time.monotonic()
        await wait_drained(url, 30, brokers)
        drained_s = time.monotonic() - drain_from
        # Every push answered 201 is delivered and acked in the end (or its ack was sent and
        # its answer lost: then it may have been applied).
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer, brokers, log, stop)
            async def all_acked() -> bool:
                return set(log.pushed) <= set(log.acked) | log.ack_unknown

            t0 = time.monotonic()
            await poll_until(all_acked, 20, every=0.1)
            stop.set()
            acked_s = time.monotonic() - t0

        async def all_handled() -> bool:
            return set(sdk_log.pushed) <= set(handled)

        # consume() came through every failover: each push it was told of reached its handler.
        await poll_until(all_handled, 20, every=0.1)
        sdk_scope.cancel()
        codes = [await b.terminate() for b in brokers]
        assert codes == [0, 0], [b.stderr() for b in brokers]

    await assert_ledger(url, timers)
    pushes = await push_log(url)
    log.pushed.update(sdk_log.pushed)
    log.push_unknown |= sdk_log.push_unknown
    lost = [t for t in log.pushed if pushes[t] != 1]
    doubled = [t for t, k in pushes.items() if k > 1]
    strangers = [t for t in pushes if t not in log.pushed and t not in log.push_unknown]
    assert not (lost or doubled or strangers), (lost[:5], doubled[:5], strangers[:5])
    assert log.redelivered_after_ack() == []
    _report("synchronous", figures, timers, log, len(lost), len(doubled))
    print(f"  the last timer fired {drained_s:.1f} s after the traffic stopped; the last push "
          f"acked {acked_s:.1f} s later")
    print(f"  consume(): {len(sdk_log.pushed)} acknowledged pushes all handled "
          f"({sum(handled.values())} handler calls, {len(handled)} distinct)")


async def settled(brokers: list[BrokerProcess], cluster: ReplicatedPostgres, log: LogBook
                  ) -> None:
    """After a failover and the old node's return as a read-only standby (first in the URL):
    each broker reports the new primary, and every write through it succeeds."""
    for b in brokers:
        await poll_until(functools.partial(_on, b, cluster.primary.port), 15, every=0.1)
    async with httpx.AsyncClient(timeout=10) as http:
        for b in brokers:
            for _ in range(5):
                items: list[dict[str, Any]] = [
                    {"queue": LOG_QUEUE, "partition": "settled", "payload": k,
                          "transactionId": f"push-settled-{len(log.pushed)}-{k}"}
                         for k in range(10)]
                r = await http.post(f"{b.url}{API}/push", json={"items": items})
                assert r.status_code == 201, r.text
                log.pushed.update(dict.fromkeys((x["transactionId"] for x in items), time.time()))
    assert cluster.standby.in_recovery()


async def _on(broker: BrokerProcess, port: int) -> bool:
    try:
        h = await _health(broker)
    except httpx.HTTPError:
        return False
    server = h.get("server") or {}
    return h["status"] == 200 and server.get("port") == port and not server.get("inRecovery")


def _report(mode: str, figures: list[Failover], timers: TimerBook, log: LogBook, lost: int,
            doubled: int) -> None:
    print(f"\n{mode}: {len(figures)} failover(s)")
    for f in figures:
        print(f"  kill->promoted {f.kill_to_promoted_ms:.0f} ms, kill->first fire on the new "
              f"primary {f.kill_to_first_fire_ms:.0f} ms, kill->first push answered "
              f"{f.kill_to_first_push_ms:.0f} ms (burst at promotion: {f.in_log_at_promotion} "
              f"fired, {f.pending_at_promotion} pending, {f.claimed_at_promotion} claimed)"
              + ("" if f.rejoin_s != f.rejoin_s else
                 f"; rejoined in {f.rejoin_s:.1f} s, settled in {f.settled_s:.1f} s"))
    print(f"  timers: {sum(timers.answers.values())} answers {dict(timers.answers)}")
    print(f"  pushes: {len(log.pushed)} acknowledged, {len(log.push_unknown)} unanswered, "
          f"{lost} lost, {doubled} doubled; acks {len(log.acked)}; {dict(log.answers)}")


# -- asynchronous: what is acknowledged after the last replicated commit is gone -----------------


@pytest.fixture
async def async_cluster(memory_path: Path, nursery: trio.Nursery
                        ) -> AsyncIterator[tuple[ReplicatedPostgres, PgProxy]]:
    c = ReplicatedPostgres(memory_path, synchronous=False)
    try:
        await trio.to_thread.run_sync(c.primary.server.start)
        proxy: PgProxy = await nursery.start(PgProxy(c.primary.url).run)
        c.replication_port = proxy.port
        await trio.to_thread.run_sync(c.start)
        yield c, proxy
        proxy.resume()
    finally:
        await trio.to_thread.run_sync(c.stop)


async def test_failover_to_an_asynchronous_standby_loses_what_was_not_replicated(
    async_cluster: tuple[ReplicatedPostgres, PgProxy],
) -> None:
    cluster, proxy = async_cluster
    timers, log = TimerBook(), LogBook()
    # A timer claimed before the cut and fired after it: the fire is lost with the old primary,
    # the claim (replicated) is not, and the broker that was told its fire committed has no
    # reason to hand it back. It fires again once the claim's lease has run out: keep it short.
    env = {**ENV, "QUEEN_SWEEPER_LEASE_MS": "2000"}
    async with running_brokers(cluster.url, 2, env=env) as brokers:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for c in range(2):
                nursery.start_soon(pusher, brokers, log, stop, c)
            await schedule_burst(brokers, timers, "a", 2000, 800, 1.0)
            await poll_until(lambda: _at_least(cluster.primary.url, "a", 150), 20, every=0.01)
            proxy.stall()  # replication stops here; the primary goes on acknowledging
            cut_at = time.time()
            late = TimerBook()  # timers answered after the cut, due after the failover
            await schedule_burst(brokers, late, "late", 300, 3000, 1.0)
            await trio.sleep(1.0)
            f = await fail_over(cluster, "a")
            await trio.sleep(1.0)
            stop.set()
        f.kill_to_first_push_ms = first_push_after(log, f.kill_at)
        url = cluster.primary.url
        await wait_drained(url, 30, brokers)
        codes = [await b.terminate() for b in brokers]
        assert codes == [0, 0], [b.stderr() for b in brokers]

    # The burst was answered before the cut: all there. The fires of the last second were
    # lost with the old primary, so those timers were pending again and fired again: once.
    fired, pending = await assert_ledger(url, timers), await pending_txns(url)
    pushes = await push_log(url)
    doubled = [t for t, k in pushes.items() if k > 1]
    lost = {t: at for t, at in log.pushed.items() if pushes[t] == 0}
    assert not doubled
    assert lost, "nothing acknowledged was lost: replication was not cut"
    assert min(lost.values()) >= cut_at, "a push acknowledged before the cut was lost"
    assert all(pushes[t] == 1 for t, at in log.pushed.items() if at < cut_at)
    late_txns = {t for txns in late.txns_of.values() for t in txns}
    late_lost = {t for t in late_txns if not fired[t] and t not in pending}
    assert late_lost == late_txns, "timers scheduled after the cut survived the failover"
    assert not [t for t in late_txns if fired[t] > 1 or (fired[t] and t in pending)]
    _report("asynchronous", [f], timers, log, len(lost), len(doubled))
    print(f"  lost: {len(late_lost)} of {len(late_txns)} timers answered 'scheduled' after "
          f"the cut; {f.claimed_at_promotion} claimed at the promotion (their fire lost, their "
          f"claim kept) fired once the 2-s lease ran out")
    print(f"  lost: {len(lost)} pushes, all acknowledged after the cut "
          f"({min(lost.values()) - cut_at:.2f}-{max(lost.values()) - cut_at:.2f} s after it)")
