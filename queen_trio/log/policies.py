"""The consumer groups' stored delivery policies (conflation), remembered by this broker.

A policy is fixed once its group registers it (store.group_conflation), so a pop needs the
database only for a group this broker has not seen lately. Entries age out after
``TTL_S``: a group deleted with its metadata through another broker (then registered again,
maybe the other way) is read afresh within that time; one deleted through this broker is
forgotten at once (:meth:`GroupPolicies.forget`).
"""

from __future__ import annotations

import threading
import time

TTL_S = 10.0

_Key = tuple[int, str, str]  # tenant, queue, consumer group


class GroupPolicies:
    def __init__(self, ttl_s: float = TTL_S) -> None:
        self._ttl_s = ttl_s
        self._known: dict[_Key, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def get(self, tenant_id: int, queue: str, group: str) -> bool | None:
        """The group's conflation, or None when this broker must read it."""
        with self._lock:
            entry = self._known.get((tenant_id, queue, group))
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def put(self, tenant_id: int, queue: str, group: str, conflation: bool) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._known) > 100_000:  # bounded: drop what has aged out
                self._known = {k: v for k, v in self._known.items() if v[1] >= now}
            self._known[(tenant_id, queue, group)] = (conflation, now + self._ttl_s)

    def forget(self, tenant_id: int, group: str, queue: str | None = None) -> None:
        """The group was deleted (on one queue, or everywhere)."""
        with self._lock:
            for key in [k for k in self._known
                        if k[0] == tenant_id and k[2] == group and queue in (None, k[1])]:
                del self._known[key]

    def clear(self, tenant_id: int, queue: str) -> None:
        """The queue was deleted: its groups register again."""
        with self._lock:
            for key in [k for k in self._known if k[0] == tenant_id and k[1] == queue]:
                del self._known[key]
