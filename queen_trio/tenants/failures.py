"""Failed authentications, limited before they cost a database lookup (pure, no I/O).

A token the broker has not verified in the last second is looked up in PostgreSQL. Without a
limit, a client sending wrong tokens as fast as it can took a pool connection for each and
queued every other request behind them (good pushes took 1.2-3.8 s). So:

- a token that failed is remembered for a minute (a small negative cache): sending it again
  costs nothing;
- each client address has a token bucket of lookups that may fail (``per_s`` a second,
  bursts of twice that): a lookup takes one before it starts, and gets it back if the token
  was good. An empty bucket means 429 with no lookup (the API answers it after its
  Retry-After, so that a flooding connection costs one answer a second).

A token verified before skips the bucket (re-checked every second, so that a revocation
takes effect): a client that floods wrong tokens from the address of good ones (a shared
proxy, a NAT) slows nobody who is already in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

BAD_TOKEN_TTL_S = 60.0
MAX_BAD_TOKENS = 4096
MAX_CLIENTS = 10_000


@dataclasses.dataclass
class _Bucket:
    tokens: float
    stamp: float


class FailedAuthLimiter:
    def __init__(self, per_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = float(per_s)
        self._burst = 2.0 * per_s
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._bad: dict[str, float] = {}  # token -> until (insertion order: oldest first)

    def known_bad(self, token: str) -> bool:
        until = self._bad.get(token)
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._bad[token]
        return False

    def take(self, client: str) -> float | None:
        """Take one lookup from ``client``'s bucket: None if it may look up, else the seconds
        until it may."""
        now = self._clock()
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_CLIENTS:
                self._forget_full(now)
            bucket = self._buckets[client] = _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / self._rate

    def succeeded(self, client: str) -> None:
        """The lookup ``take`` allowed found a good token: it costs the client nothing."""
        bucket = self._buckets.get(client)
        if bucket is not None:
            bucket.tokens = min(self._burst, bucket.tokens + 1.0)

    def failed(self, token: str) -> None:
        """The lookup found no such token (unknown, revoked, wrong secret)."""
        if len(self._bad) >= MAX_BAD_TOKENS:
            del self._bad[next(iter(self._bad))]
        self._bad[token] = self._clock() + BAD_TOKEN_TTL_S

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (nothing to remember); all of them if that is
        not enough (a flood from more addresses than we keep)."""
        refilled = self._burst / self._rate
        for client in [c for c, b in self._buckets.items() if now - b.stamp >= refilled]:
            del self._buckets[client]
        if len(self._buckets) >= MAX_CLIENTS:
            self._buckets.clear()
