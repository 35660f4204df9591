"""What the HTTP API and the background services share inside one broker process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .config import Settings
from .db import Database, Listener
from .db.notifier import Notifier
from .log.policies import GroupPolicies
from .log.segments import SegmentCache
from .log.wakeups import QueueWakeups
from .metrics import BrokerMetrics
from .sealing import PayloadCipher
from .switches import RuntimeSwitches
from .tenants.directory import TenantDirectory
from .timers.batcher import ScheduleBatcher


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerContext:
    settings: Settings
    db: Database
    listener: Listener
    metrics: BrokerMetrics
    tenants: TenantDirectory
    wakeups: QueueWakeups
    # Schedules of PUT and POST /api/v1/timers, sent to PostgreSQL in shared statements.
    schedules: ScheduleBatcher
    # kv_enabled, timers_schedule_enabled, timers_fire_enabled: read on every call.
    switches: RuntimeSwitches
    # name -> "is it alive right now?"; every long-lived service registers itself here and
    # /health reports them all.
    services: dict[str, Callable[[], bool]] = dataclasses.field(default_factory=dict)
    # Decoded sealed segments, shared by every read of this broker (QUEEN_SEGMENT_CACHE_BYTES).
    segment_cache: SegmentCache = dataclasses.field(default_factory=lambda: SegmentCache(0))
    # The consumer groups' stored conflation policies, as this broker last read them.
    group_policies: GroupPolicies = dataclasses.field(default_factory=GroupPolicies)
    # At-rest encryption (QUEEN_ENCRYPTION_KEY); None: queues cannot be encrypted.
    cipher: PayloadCipher | None = None
    # Wake-up NOTIFYs sent after their commit (db/notifier.py); None: inside the transaction.
    notifier: Notifier | None = None
