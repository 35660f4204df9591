"""Settings: every ``QUEEN_*`` variable parsed and validated in one place.

``load_settings(environ)`` returns a frozen :class:`Settings` or raises :class:`ConfigError`
naming the first variable that is wrong and what it expects. Units are part of the field
names (``lease_ms``, ``max_horizon_s``) so a reader never has to guess them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from .errors import ClientError, ConfigError

ONE_MIB = 1024 * 1024
# QUEEN_MAX_MESSAGE_BYTES at most: a message is one JSON value in one row (PostgreSQL's jsonb
# tops out near 256 MiB) and is read whole into the broker's memory on every push and pop.
MAX_MESSAGE_BYTES_LIMIT = 64 * ONE_MIB
DEFAULT_MAX_MESSAGE_BYTES = 16 * ONE_MIB


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    database_url: str | None = None
    data_dir: Path = Path(".queen")
    host: str = "127.0.0.1"
    port: int = 6632
    auth: bool = False
    # QUEEN_ALLOW_OPEN=1: serve a non-loopback address with auth off (refused otherwise).
    allow_open: bool = False
    # Host names (besides localhost names, IP addresses and QUEEN_HOST) the broker answers to
    # when auth is off, or whenever this is set; "*": any (see queen_trio/api/origin.py).
    allowed_hosts: tuple[str, ...] = ()
    # The tenant whose tokens may read /metrics when auth is on (None: nobody may).
    operator_tenant: str | None = None
    # Failed token lookups a client address may cause per second (bursts of twice that);
    # past it: 429 with no database lookup.
    auth_failures_per_s: int = 10
    log_level: str = "INFO"
    db_pool_size: int = 10
    # Every database connection attempt, per host (libpq's connect_timeout; at least 2).
    db_connect_timeout_s: int = 5
    graceful_timeout_ms: int = 3000
    # Slow clients: a connection that has not sent a whole request head within this is closed;
    # a request body not received within the other is answered 408.
    http_idle_timeout_s: int = 75
    http_body_timeout_s: int = 60
    # Bytes of request bodies held at once by one broker process (None: 2 × the body limit,
    # at least 64 MiB); past it a request is answered 503 rather than the broker growing.
    http_body_buffer_bytes: int | None = None
    # Broker processes behind one listening socket (``queen-trio serve``); each is a whole
    # broker with its own nursery. listen_fd: the socket a worker inherits from its parent.
    workers: int = 1
    listen_fd: int | None = None
    # A pop's commit (its lease or its cursor move) does not wait for the WAL flush: a database
    # crash can forget the last moments of pops, which only re-delivers those messages. Frames,
    # acks and timer fires always wait. "sync" makes pops wait too.
    pop_commit_sync: bool = False
    # How long past a timer's due instant a pop parked on its queue waits for the frame inside
    # PostgreSQL, once the sweeper has said it is about to fire (0: never; queen.pop_head_after
    # in schema/functions/log.sql).
    pop_fire_wait_ms: int = 10
    # Pops waiting for messages at once (each holds a connection open): past these a pop that
    # would wait is refused, 503 for the broker and 429 for one tenant, with Retry-After.
    longpoll_max_parked: int = 10_000
    longpoll_max_parked_per_tenant: int = 5_000
    sweeper_min_sleep_ms: int = 10
    sweeper_max_sleep_ms: int = 1000
    sweeper_lease_ms: int = 30000
    sweeper_max_attempts: int = 5
    sweeper_batch: int = 500
    sweeper_backoff_ms: int = 1000
    timers_max_horizon_s: int = 7_776_000
    # None means "1 MiB, or the tenant plan's message ceiling if smaller".
    timers_max_payload_bytes: int | None = None
    # The message ceiling of pushes (and KV values, transaction pushes); a tenant plan's
    # maxMessageBytes may lower it. Timer payloads stay within 1 MiB whatever this says.
    # 16 MiB: what a Queen user pushes (Queen has no per-message cap of its own).
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Log housekeeping: sealing the head into segments, retention.
    housekeeping_interval_ms: int = 1000
    segment_max_frames: int = 1000
    segment_max_bytes: int = 4 * ONE_MIB
    # Frames younger than this stay in the head (consumers at the tail read plain rows); a head
    # frame older than segment_max_age_ms is sealed even when its segment is not full.
    segment_min_age_ms: int = 60_000
    segment_max_age_ms: int = 600_000
    segment_zstd_level: int = 3
    segment_cache_bytes: int = 64 * ONE_MIB
    # At-rest encryption (queen_trio/sealing.py): the key that seals payloads of queues
    # configured with encryptionEnabled, and older keys that only open (rotation). Secrets:
    # kept out of repr.
    encryption_key: bytes | None = dataclasses.field(default=None, repr=False)
    encryption_old_keys: tuple[bytes, ...] = dataclasses.field(default=(), repr=False)

    def with_database_url(self, url: str) -> Settings:
        return dataclasses.replace(self, database_url=url)

    def database_conninfo(self) -> str:
        """``database_url`` as every broker connection uses it: a writable server, and
        ``db_connect_timeout_s`` per host (unless the URL says otherwise)."""
        assert self.database_url is not None
        from .db.conninfo import broker_conninfo  # psycopg is heavy: only when connecting

        return broker_conninfo(self.database_url, connect_timeout_s=self.db_connect_timeout_s)

    def http_body_limit(self) -> int:
        """The largest request body read: room for a message at the ceiling, written with
        JSON escapes, beside others in one push (never below 8 MiB)."""
        return max(8 * ONE_MIB, 4 * self.max_message_bytes)

    def http_body_budget(self) -> int:
        """Bytes of request bodies held at once; never below one body at the limit. The
        default holds two bodies at the limit (128 MiB at the 16 MiB message ceiling), or 64
        MiB of small ones: each body held costs the broker a few times its size while its
        messages travel to PostgreSQL (RELIABILITY.md, "Large messages")."""
        return max(self.http_body_buffer_bytes
                   or max(64 * ONE_MIB, 2 * self.http_body_limit()),
                   self.http_body_limit())

    def timer_payload_ceiling(self, plan_max_message_bytes: int) -> int:
        """The largest serialized timer payload a tenant with this plan may schedule."""
        own = self.timers_max_payload_bytes or ONE_MIB
        return min(own, ONE_MIB, plan_max_message_bytes)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_HOST_RE = re.compile(r"^[A-Za-z0-9.:\-\[\]]+$")
_HOST_NAME_RE = re.compile(r"^(\*|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)$")


def _allowed_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("QUEEN_ALLOWED_HOSTS", "")
    names = tuple(dict.fromkeys(n.strip().lower() for n in raw.split(",") if n.strip()))
    for name in names:
        if not _HOST_NAME_RE.fullmatch(name):
            raise ConfigError("QUEEN_ALLOWED_HOSTS", raw,
                              "host names (no port) separated by commas, or *")
    return names


def _int(env: Mapping[str, str], name: str, default: int, *, lo: int, hi: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    expected = f"an integer from {lo} to {hi}" if hi is not None else f"an integer >= {lo}"
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ConfigError(name, raw, expected)
    value = int(text)
    if value < lo or (hi is not None and value > hi):
        raise ConfigError(name, raw, expected)
    return value


def _keys(env: Mapping[str, str]) -> tuple[bytes | None, tuple[bytes, ...]]:
    """QUEEN_ENCRYPTION_KEY and QUEEN_ENCRYPTION_OLD_KEYS; a wrong value is named by its
    length only, never echoed (it is a secret)."""
    from .sealing import parse_key  # cryptography is imported only when keys are used

    expected = "64 hexadecimal digits (a 32-byte AES-256 key, e.g. `openssl rand -hex 32`)"
    raw = env.get("QUEEN_ENCRYPTION_KEY", "").strip()
    key = parse_key(raw) if raw else None
    if raw and key is None:
        raise ConfigError("QUEEN_ENCRYPTION_KEY", f"<{len(raw)} characters>", expected)
    old = []
    for part in env.get("QUEEN_ENCRYPTION_OLD_KEYS", "").split(","):
        if not part.strip():
            continue
        parsed = parse_key(part)
        if parsed is None:
            raise ConfigError("QUEEN_ENCRYPTION_OLD_KEYS", f"<{len(part.strip())} characters>",
                              "keys of " + expected + ", separated by commas")
        old.append(parsed)
    if old and key is None:
        raise ConfigError("QUEEN_ENCRYPTION_OLD_KEYS", "<set>",
                          "to be set only beside QUEEN_ENCRYPTION_KEY (the current key)")
    return key, tuple(old)


def load_settings(env: Mapping[str, str]) -> Settings:
    """Build :class:`Settings` from an environment mapping (usually ``os.environ``)."""
    url = env.get("QUEEN_DATABASE_URL", "").strip() or None
    if url is not None:
        # Imported here: psycopg is heavy, and only needed when a URL is given.
        from .db.conninfo import problem, redacted

        wrong = problem(url)
        if wrong is not None:
            raise ConfigError("QUEEN_DATABASE_URL", redacted(url), wrong)

    data_dir = Path(env.get("QUEEN_DATA_DIR", "").strip() or ".queen")

    host = env.get("QUEEN_HOST", "").strip() or "127.0.0.1"
    if not _HOST_RE.fullmatch(host):
        raise ConfigError("QUEEN_HOST", host, "a host name or IP address")

    auth_raw = env.get("QUEEN_AUTH", "").strip().lower() or "off"
    if auth_raw not in ("on", "off"):
        raise ConfigError("QUEEN_AUTH", env["QUEEN_AUTH"], "'on' or 'off'")

    open_raw = env.get("QUEEN_ALLOW_OPEN", "").strip().lower() or "0"
    if open_raw not in ("0", "1"):
        raise ConfigError("QUEEN_ALLOW_OPEN", env["QUEEN_ALLOW_OPEN"], "1 or 0")

    operator = env.get("QUEEN_OPERATOR_TENANT", "").strip() or None
    if operator is not None:
        from .tenants.store import check_name  # psycopg is heavy: only when it is set

        try:
            check_name(operator)
        except ClientError:
            raise ConfigError("QUEEN_OPERATOR_TENANT", operator, "a tenant name") from None

    level = env.get("QUEEN_LOG_LEVEL", "").strip().upper() or "INFO"
    if level not in _LOG_LEVELS:
        raise ConfigError("QUEEN_LOG_LEVEL", env["QUEEN_LOG_LEVEL"], " or ".join(_LOG_LEVELS))

    min_sleep = _int(env, "QUEEN_SWEEPER_MIN_SLEEP_MS", 10, lo=0, hi=60_000)
    max_sleep = _int(env, "QUEEN_SWEEPER_MAX_SLEEP_MS", 1000, lo=1, hi=3_600_000)
    if min_sleep > max_sleep:
        raise ConfigError(
            "QUEEN_SWEEPER_MIN_SLEEP_MS",
            str(min_sleep),
            f"a value no larger than QUEEN_SWEEPER_MAX_SLEEP_MS ({max_sleep})",
        )

    seg_min_age = _int(env, "QUEEN_SEGMENT_MIN_AGE_MS", 60_000, lo=0, hi=30 * 86_400_000)
    seg_max_age = _int(env, "QUEEN_SEGMENT_MAX_AGE_MS", 600_000, lo=0, hi=30 * 86_400_000)
    if seg_min_age > seg_max_age:
        raise ConfigError(
            "QUEEN_SEGMENT_MIN_AGE_MS",
            str(seg_min_age),
            f"a value no larger than QUEEN_SEGMENT_MAX_AGE_MS ({seg_max_age})",
        )

    pop_commit = env.get("QUEEN_POP_COMMIT", "").strip().lower() or "async"
    if pop_commit not in ("async", "sync"):
        raise ConfigError("QUEEN_POP_COMMIT", env["QUEEN_POP_COMMIT"], "'async' or 'sync'")

    workers = _int(env, "QUEEN_WORKERS", 1, lo=1, hi=64)
    fd_raw = env.get("QUEEN_LISTEN_FD", "").strip()
    listen_fd = _int(env, "QUEEN_LISTEN_FD", 0, lo=0, hi=1_000_000) if fd_raw else None

    payload_raw = env.get("QUEEN_TIMERS_MAX_PAYLOAD_BYTES", "").strip()
    payload = (
        _int(env, "QUEEN_TIMERS_MAX_PAYLOAD_BYTES", ONE_MIB, lo=1, hi=ONE_MIB)
        if payload_raw
        else None
    )

    buffer_raw = env.get("QUEEN_HTTP_BODY_BUFFER_BYTES", "").strip()
    body_buffer = (
        _int(env, "QUEEN_HTTP_BODY_BUFFER_BYTES", 0, lo=ONE_MIB, hi=64 * 1024 * ONE_MIB)
        if buffer_raw
        else None
    )

    encryption_key, encryption_old_keys = _keys(env)

    return Settings(
        encryption_key=encryption_key,
        encryption_old_keys=encryption_old_keys,
        database_url=url,
        data_dir=data_dir,
        host=host,
        port=_int(env, "QUEEN_PORT", 6632, lo=0, hi=65535),
        auth=auth_raw == "on",
        allow_open=open_raw == "1",
        allowed_hosts=_allowed_hosts(env),
        operator_tenant=operator,
        auth_failures_per_s=_int(env, "QUEEN_AUTH_FAILURES_PER_S", 10, lo=1, hi=1_000_000),
        log_level=level,
        db_pool_size=_int(env, "QUEEN_DB_POOL_SIZE", 10, lo=1, hi=1000),
        # libpq's floor is 2 seconds (a smaller value would silently mean 2).
        db_connect_timeout_s=_int(env, "QUEEN_DB_CONNECT_TIMEOUT_S", 5, lo=2, hi=600),
        graceful_timeout_ms=_int(env, "QUEEN_GRACEFUL_TIMEOUT_MS", 3000, lo=0, hi=60_000),
        http_idle_timeout_s=_int(env, "QUEEN_HTTP_IDLE_TIMEOUT_S", 75, lo=1, hi=3600),
        http_body_timeout_s=_int(env, "QUEEN_HTTP_BODY_TIMEOUT_S", 60, lo=1, hi=3600),
        http_body_buffer_bytes=body_buffer,
        workers=workers,
        pop_commit_sync=pop_commit == "sync",
        pop_fire_wait_ms=_int(env, "QUEEN_POP_FIRE_WAIT_MS", 10, lo=0, hi=50),
        longpoll_max_parked=_int(env, "QUEEN_LONGPOLL_MAX_PARKED", 10_000, lo=0,
                                 hi=1_000_000),
        longpoll_max_parked_per_tenant=_int(env, "QUEEN_LONGPOLL_MAX_PARKED_PER_TENANT",
                                            5_000, lo=0, hi=1_000_000),
        listen_fd=listen_fd,
        sweeper_min_sleep_ms=min_sleep,
        sweeper_max_sleep_ms=max_sleep,
        sweeper_lease_ms=_int(env, "QUEEN_SWEEPER_LEASE_MS", 30000, lo=100, hi=3_600_000),
        sweeper_max_attempts=_int(env, "QUEEN_SWEEPER_MAX_ATTEMPTS", 5, lo=1, hi=1000),
        sweeper_batch=_int(env, "QUEEN_SWEEPER_BATCH", 500, lo=1, hi=100_000),
        sweeper_backoff_ms=_int(env, "QUEEN_SWEEPER_BACKOFF_MS", 1000, lo=0, hi=3_600_000),
        timers_max_horizon_s=_int(
            env, "QUEEN_TIMERS_MAX_HORIZON_S", 7_776_000, lo=1, hi=10 * 365 * 86400
        ),
        timers_max_payload_bytes=payload,
        max_message_bytes=_int(env, "QUEEN_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES, lo=1024,
                               hi=MAX_MESSAGE_BYTES_LIMIT),
        housekeeping_interval_ms=_int(
            env, "QUEEN_HOUSEKEEPING_INTERVAL_MS", 1000, lo=10, hi=3_600_000
        ),
        segment_max_frames=_int(env, "QUEEN_SEGMENT_MAX_FRAMES", 1000, lo=1, hi=1_000_000),
        segment_max_bytes=_int(
            env, "QUEEN_SEGMENT_MAX_BYTES", 4 * ONE_MIB, lo=1024, hi=256 * ONE_MIB
        ),
        segment_min_age_ms=seg_min_age,
        segment_max_age_ms=seg_max_age,
        segment_zstd_level=_int(env, "QUEEN_SEGMENT_ZSTD_LEVEL", 3, lo=1, hi=22),
        segment_cache_bytes=_int(
            env, "QUEEN_SEGMENT_CACHE_BYTES", 64 * ONE_MIB, lo=0, hi=64 * 1024 * ONE_MIB
        ),
    )
