"""A new database connection's fire and pop paths, run once before it carries a user's.

PostgreSQL keeps a compiled PL/pgSQL function, the plans of its statements and the catalog
entries of the tables they touch per backend, and builds them the first time that backend
runs them. On a fresh broker that first time was the user's: the first timer it fired took
10-12 ms more than the later ones, the second 3-5 ms more (bench.first_fires, issue 32), and
every pool connection the broker replaces for its age starts cold again.

So each new connection runs the paths once, in a transaction rolled back whole: three timers on
a queue of its own (the first fire, which creates the queue's partition and the consumer's
cursor, then the common fire into a partition that exists), a streaming consumer's pop and
settlement in the sweep, the pops and settlements of the API, a lone schedule and its cancel,
and the look-up of the next timer. Nothing of it is ever visible: rows, frames, NOTIFYs and
usage all go with the rollback.

Its sweeps leave other queues' timers alone, and the sweep floor too. They run under
``queen.warm_up_queue`` (queen.sweep_run): each takes only what is due between the first and
the last of the warm-up's own timers, scheduled in one statement, microseconds apart. A user's
timer due within those microseconds may be taken with them; it is put back at the rollback,
milliseconds later, and the sweeper fires it then. The floor is the one thing a rolled-back
sweep would leave behind (a sequence): set above rows the transaction had deleted, it would
hide them from every later sweep once the rollback put them back.

A warm-up that fails leaves the connection as it found it, and the connection is used all the
same.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import psycopg

from ..db import queries
from ..db.rows import DictConnection
from ..log import rotation
from ..log import store as log_store
from ..log.rules import QUEUE_MODE_GROUP, PopRequest
from . import store
from .rules import Schedule

log = logging.getLogger(__name__)

TENANTS = queries.load("tenants")
# (The queue's name is new for each warm-up: two connections warming at once never wait for
# each other's queue row.)
QUEUE_PREFIX = "queen-trio.warm-up."
_PARTITION = "Default"
_OWNER = "queen-trio:warm-up"
_LEASE_MS = 30_000
_BOUNDS = ("SELECT set_config('lock_timeout', '500ms', true), "
           "set_config('statement_timeout', '5s', true)")
_FLOOR = "SELECT queen.advance_sweep_floor()"
_SCOPE = "SELECT set_config('queen.warm_up_queue', %(scope)s, true)"


def warm(raw: psycopg.Connection[Any]) -> float:
    """Run the fire and pop paths once on ``raw`` (an autocommit connection, outside any
    transaction), leaving nothing: the seconds it took. Never raises: a warm-up the database
    refused (a read-only server, a lock timeout) is logged at DEBUG, anything else at
    WARNING with its traceback, and the connection is used all the same."""
    started = time.perf_counter()
    try:
        with raw.transaction(force_rollback=True):
            _paths(raw)
    except psycopg.Error as exc:
        log.debug("warm-up of a new connection failed: %s", exc)
    except Exception:
        log.warning("warm-up of a new connection failed", exc_info=True)
    took = time.perf_counter() - started
    log.debug("warmed a new connection in %.1f ms", took * 1000)
    return took


def _paths(raw: DictConnection) -> None:
    # Bounded: nothing here should wait for anyone (a tenant being deleted might hold its row).
    raw.execute(_BOUNDS)
    tenant = raw.execute(TENANTS.tenant_id_by_name, {"name": "default"}).fetchone()
    if tenant is None:
        return
    tenant_id = tenant["tenant_id"]
    queue = QUEUE_PREFIX + uuid.uuid4().hex
    try:
        _fire_and_pop(raw, tenant_id, queue)
    finally:
        rotation.forget(tenant_id, queue, QUEUE_MODE_GROUP)


def _fire_and_pop(raw: DictConnection, tenant_id: int, queue: str) -> None:
    # The floor first, while nothing is deleted here: a floor is only ever set from the rows
    # as they are. Then the sweeps below take only what is due between this queue's first and
    # last timer, and leave the floor alone (queen.sweep_run).
    raw.execute(_FLOOR)
    raw.execute(_SCOPE, {"scope": f"{tenant_id}:{queue}"})
    keys = ("first", "second", "third")
    # One statement: the three come due microseconds apart. (Told to NOTIFY as the API's
    # schedules are: the NOTIFY goes with the rollback.)
    store.schedule_many(raw, tenant_id, [Schedule(queue, key, 0, {"warm": True}, _PARTITION,
                                                  None) for key in keys],
                        notify_within_ms=1000)
    # A lone schedule, and its cancel, on a queue of their own (outside the sweeps' scope).
    lone = Schedule(queue + ".lone", "lone", 60_000, {"warm": True}, _PARTITION, None)
    store.schedule(raw, tenant_id, lone, notify_within_ms=1000)
    lock = store.NextDue(tenant_id, queue, _PARTITION, time.time())
    req = PopRequest(queue=queue, partition=None, group=QUEUE_MODE_GROUP, batch=1,
                     wait=False, timeout_ms=0, auto_ack=False)

    def sweep(settle: log_store.PopBatch | None = None) -> log_store.PopBatch | None:
        # (As the sweeper's cycle for a streaming consumer parked on the queue.)
        swept = store.sweep(raw, uuid.uuid4(), _OWNER, 1, _LEASE_MS, max_payload=1 << 20,
                            fire_lock=lock, pop=req, settle=settle, drained=settle is None)
        return None if swept.popped is None else swept.popped.batch

    # The first fire creates the partition, and the stream's pop creates its cursor there
    # (queue mode) and takes the frame. The API's pops (the common one, and the general one
    # a named group's first pop takes) find it leased; its settlement completes it.
    first = sweep()
    log_store.pop_head(raw, tenant_id, req)
    log_store.pop(raw, tenant_id, req)
    if first is not None:
        log_store.settle_pop_head(raw, tenant_id, req, first,
                                  log_store.batch_acks(first, "completed"), pop=True)
    # The common fire, into a partition that exists, popping its frame; then one that settles
    # that batch and pops the next in the same statement.
    second = sweep()
    if second is not None:
        sweep(settle=second)
    store.next_due(raw)
    store.cancel(raw, tenant_id, lone.queue, lone.key, None)
