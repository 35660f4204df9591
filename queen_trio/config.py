"""Settings: every ``QUEEN_*`` variable declared once, parsed and validated in one place.

Each field of :class:`Settings` is one setting's whole declaration (its variable, type,
default, bounds and help), made by :func:`integer`, :func:`optional_integer`, :func:`choice` or
:func:`value`. :func:`load_settings`, ``queen-trio serve --help`` (:func:`help_text`) and
docs/configuration.md (:func:`reference_markdown`, checked by tests/unit/test_config.py) all
read the declarations; nothing else names a default.

``load_settings(environ)`` returns a frozen :class:`Settings` or raises :class:`ConfigError`
naming the first variable that is wrong and what it expects. A variable unset or blank takes
its default. Units are part of the field names (``lease_ms``, ``max_horizon_s``) so a reader
never has to guess them.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from .errors import ClientError, ConfigError

ONE_MIB = 1024 * 1024
# QUEEN_MAX_MESSAGE_BYTES at most: a message is one JSON value in one row (PostgreSQL's jsonb
# tops out near 256 MiB) and is read whole into the broker's memory on every push and pop.
MAX_MESSAGE_BYTES_LIMIT = 64 * ONE_MIB
DEFAULT_MAX_MESSAGE_BYTES = 16 * ONE_MIB

T = TypeVar("T")


class Invalid(ValueError):
    """A parser's refusal: what the variable expects (and the value to show, if not the raw
    one: a secret is shown by its length only)."""

    def __init__(self, expected: str, shown: str | None = None) -> None:
        super().__init__(expected)
        self.expected = expected
        self.shown = shown


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One setting's declaration (in the metadata of its :class:`Settings` field)."""

    help: str
    #: The variable's text (never blank, as set) to the value; raises :class:`Invalid`.
    parse: Callable[[str], Any]
    #: The default as the reference shows it (its value in backquotes unless given).
    default_text: str
    #: The variable, when it is not QUEEN_ + the field's name in capitals.
    env: str | None = None
    #: Kept out of reprs and never echoed.
    secret: bool = False
    #: What values are accepted, as the reference shows it ("1 … 65535", "`on`, `off`").
    allowed: str = ""


def _declare(default: Any, setting: Setting, **field: Any) -> Any:
    return dataclasses.field(default=default, metadata={"setting": setting},
                             repr=not setting.secret, **field)


def _parse_int(text: str, lo: int, hi: int) -> int:
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?\d+", stripped) or not lo <= int(stripped) <= hi:
        raise Invalid(f"an integer from {lo} to {hi}")
    return int(stripped)


def integer(default: int, *, lo: int, hi: int, help: str, default_text: str | None = None,
            env: str | None = None) -> int:
    """An integer setting from ``lo`` to ``hi``."""
    return cast(int, _declare(default, Setting(
        help, lambda text: _parse_int(text, lo, hi),
        default_text or f"`{default}`", env, allowed=f"{lo} … {hi}")))


def optional_integer(*, lo: int, hi: int, help: str, default_text: str,
                     env: str | None = None) -> int | None:
    """An integer setting from ``lo`` to ``hi`` whose absence (None) means what
    ``default_text`` says."""
    return cast(int | None, _declare(None, Setting(
        help, lambda text: _parse_int(text, lo, hi), default_text, env,
        allowed=f"{lo} … {hi}")))


def choice(default: str, values: Mapping[str, T], *, help: str, env: str | None = None,
           normalise: Callable[[str], str] = str.lower) -> T:
    """One of the words ``values`` names (after ``normalise``), to its value."""
    expected = " or ".join(f"'{w}'" for w in values) if len(values) == 2 else (
        " or ".join(values))

    def parse(text: str) -> T:
        word = normalise(text.strip())
        if word not in values:
            raise Invalid(expected)
        return values[word]

    return cast(T, _declare(values[default], Setting(
        help, parse, f"`{default}`", env, allowed=", ".join(f"`{w}`" for w in values))))


def value(default: T, parse: Callable[[str], T], *, help: str, default_text: str,
          env: str | None = None, secret: bool = False, allowed: str = "") -> T:
    """A setting with a parser of its own."""
    return cast(T, _declare(default, Setting(help, parse, default_text, env, secret, allowed)))


# -- parsers of the settings that are not integers or words ---------------------------------

_HOST_RE = re.compile(r"^[A-Za-z0-9.:\-\[\]]+$")
_HOST_NAME_RE = re.compile(r"^(\*|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)$")
_KEY = "64 hexadecimal digits (a 32-byte AES-256 key, e.g. `openssl rand -hex 32`)"


def _database_url(text: str) -> str:
    # Imported here: psycopg is heavy, and only needed when a URL is given.
    from .db.conninfo import problem, redacted

    url = text.strip()
    wrong = problem(url)
    if wrong is not None:
        raise Invalid(wrong, shown=redacted(url))
    return url


def _host(text: str) -> str:
    host = text.strip()
    if not _HOST_RE.fullmatch(host):
        raise Invalid("a host name or IP address", shown=host)
    return host


def _allowed_hosts(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    for name in names:
        if not _HOST_NAME_RE.fullmatch(name):
            raise Invalid("host names (no port) separated by commas, or *")
    return names


def _tenant_name(text: str) -> str:
    from .tenants.store import check_name  # psycopg is heavy: only when it is set

    name = text.strip()
    try:
        check_name(name)
    except ClientError:
        raise Invalid("a tenant name", shown=name) from None
    return name


def _key(text: str) -> bytes:
    from .sealing import parse_key  # cryptography is imported only when keys are used

    key = parse_key(text.strip())
    if key is None:
        raise Invalid(_KEY, shown=f"<{len(text.strip())} characters>")
    return key


def _old_keys(text: str) -> tuple[bytes, ...]:
    from .sealing import parse_key

    keys = []
    for part in (p for p in text.split(",") if p.strip()):
        key = parse_key(part)
        if key is None:
            raise Invalid("keys of " + _KEY + ", separated by commas",
                          shown=f"<{len(part.strip())} characters>")
        keys.append(key)
    return tuple(keys)


_LOG_LEVELS = {level: level for level in ("DEBUG", "INFO", "WARNING", "ERROR")}
_DAY_MS = 86_400_000


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    database_url: str | None = value(
        None, _database_url, default_text="unset: embedded PostgreSQL",
        allowed="a libpq URL or `key=value` conninfo",
        help="libpq URL (or `key=value` conninfo) of the database; may name several hosts "
        "(see [high-availability.md](high-availability.md))")
    data_dir: Path = value(
        Path(".queen"), lambda text: Path(text.strip()), default_text="`./.queen`",
        allowed="a directory",
        help="embedded database and local files")
    host: str = value("127.0.0.1", _host, default_text="`127.0.0.1`",
                      allowed="a host name or IP address", help="HTTP bind address")
    port: int = integer(6632, lo=0, hi=65535, help="HTTP port (`0` picks a free port)")
    auth: bool = choice("off", {"on": True, "off": False}, help="`on` requires bearer tokens")
    allow_open: bool = choice(
        "0", {"0": False, "1": True},
        help="`1`: serve a non-loopback `QUEEN_HOST` with `QUEEN_AUTH=off` (without it, start-up "
        "refuses that combination in one line)")
    # See queen_trio/api/origin.py.
    allowed_hosts: tuple[str, ...] = value(
        (), _allowed_hosts, default_text="unset", allowed="host names, or `*`",
        help="host names (comma-separated, no port) the broker answers to besides IP "
        "addresses, `localhost`, `*.localhost` and `QUEEN_HOST`, checked with auth off (or "
        "whenever set); `*`: any. Behind a proxy that passes its public name as `Host`, list "
        "that name")
    operator_tenant: str | None = value(
        None, _tenant_name, default_text="unset", allowed="a tenant name",
        help="with auth on, the tenant whose tokens may read `/metrics` (unset: nobody)")
    auth_failures_per_s: int = integer(
        10, lo=1, hi=1_000_000,
        help="failed token lookups one client address may cause per second (bursts of twice "
        "that); past it, 429 without a lookup. All clients behind one proxy share an address")
    log_level: str = choice("INFO", _LOG_LEVELS, normalise=str.upper,
                            help="the least severe log record written")
    db_pool_size: int = integer(10, lo=1, hi=1000,
                                help="PostgreSQL connections per broker for the API")
    db_pool_wait_ms: int = integer(
        30_000, lo=1, hi=3_600_000,
        help="how long a request waits for a pool connection while all are busy; past it, "
        "503 `database_busy` with `Retry-After`, having done nothing")
    db_max_lifetime_s: int = integer(
        3600, lo=1, hi=7 * 86400,
        help="a pool connection open this long is closed when it comes back instead of being "
        "reused (a fresh one is opened on demand)")
    db_max_idle_s: int = integer(
        600, lo=1, hi=7 * 86400,
        help="a pool connection unused this long is closed at the pool's next use (the "
        "connections of a burst do not stay open)")
    # libpq's floor is 2 seconds (a smaller value would silently mean 2).
    db_connect_timeout_s: int = integer(
        5, lo=2, hi=600,
        help="how long each database connection attempt may take per host (libpq's "
        "`connect_timeout`, unless the URL sets its own): a host that accepts and never "
        "answers costs this, then the next host is tried")
    graceful_timeout_ms: int = integer(
        3000, lo=0, hi=60_000, help="how long in-flight requests may finish at shutdown")
    http_idle_timeout_s: int = integer(
        75, lo=1, hi=3600,
        help="a connection idle this long after an answer (or since it opened) is closed, and "
        "so is one that has not sent a whole request head by then, on every request of the "
        "connection (slow clients)")
    http_body_timeout_s: int = integer(
        60, lo=1, hi=3600, help="a request body not received by then is answered 408")
    http_body_buffer_bytes: int | None = optional_integer(
        lo=ONE_MIB, hi=64 * 1024 * ONE_MIB,
        default_text="2 × the body limit, at least 64 MiB (128 MiB at the default ceiling)",
        help="request body bytes one broker process holds at once (never below the body "
        "limit); a request whose body would go past it is answered 503 `overloaded` with "
        "`Retry-After: 1`, having done nothing. A body is read only once the request is "
        "admitted (token, quota) and its handler asks for it, and refused with 413 as soon as "
        "it passes the body limit, chunked or not")
    # Each worker is a whole broker with its own nursery.
    workers: int = integer(1, lo=1, hi=64,
                           help="broker processes sharing the HTTP port (see "
                           "[operations.md](operations.md#several-broker-processes-queen_workers))")
    listen_fd: int | None = optional_integer(
        lo=0, hi=1_000_000, default_text="unset",
        help="the listening socket a worker inherits from `queen-trio serve` (or from a "
        "supervisor of your own: systemd socket activation)")
    # Frames, acks and timer fires wait for the WAL flush; under async a fire that also leases
    # its frame to a parked pop does not (operations.md, what a commit waits for).
    pop_commit_sync: bool = choice(
        "async", {"async": False, "sync": True}, env="QUEEN_POP_COMMIT",
        help="`async`: a pop's commit (its lease or its cursor move) does not wait for the WAL "
        "flush (a database crash can forget the last moments of pops, which only re-delivers "
        "those messages; see [operations.md](operations.md#what-a-commit-waits-for)); `sync`: "
        "as the server is configured")
    stream_pop: bool = choice(
        "on", {"on": True, "off": False},
        help="`on`: consumers may hold one WebSocket (`/api/v1/stream/queue/<queue>`) that "
        "carries their batches and settlements, the SDK's `consume()` uses it (see "
        "[http-api.md](http-api.md#streaming-pop)); `off`: the route answers 404 "
        "`stream_disabled` and the SDK pops as before")
    # queen.pop_head_after in schema/functions/log.sql.
    pop_fire_wait_ms: int = integer(
        10, lo=0, hi=50,
        help="how long past a timer's due instant a parked pop told of its fire waits for it "
        "inside PostgreSQL; `0` also stops the sweeper handing fired frames to parked pops "
        "(see [internals.md](internals.md#how-a-timer-fires))")
    longpoll_max_parked: int = integer(
        10_000, lo=0, hi=1_000_000,
        help="pops waiting for messages at once on this broker (each holds its connection and "
        "about 34 KB); past it a pop that would wait answers 503 `broker_waiting_pops_full`. "
        "Never above half the open-file limit (`LimitNOFILE`, `ulimit -n`; the systemd unit "
        "sets 65,536)")
    longpoll_max_parked_per_tenant: int = integer(
        5_000, lo=0, hi=1_000_000,
        help="the same for one tenant: 429 `too_many_waiting_pops`. With `QUEEN_AUTH=off` "
        "every pop is the default tenant's, so this bound comes first")
    # Each cycle costs about the same whatever it fires (2.5-3 ms of CPU in all: PostgreSQL,
    # broker, consumer), so under a steady flow the floor sets the CPU per timer; 12 ms keeps
    # the lag's p99 below graphile-worker tuned's at less CPU (docs/performance.md).
    sweeper_min_sleep_ms: int = integer(
        12, lo=0, hi=60_000,
        help="floor between two timer claim cycles (at most `QUEEN_SWEEPER_MAX_SLEEP_MS`); "
        "under steady load a timer waits half of it on average, and each cycle costs about the "
        "same CPU whatever it fires. At 500 timers/s, `12` started handlers 8.1–8.4 / "
        "14.3–14.7 ms (p50 / p99) after their due instant for 0.47–0.57 ms of CPU per timer "
        "(PostgreSQL, broker and consumer); `10` 6.8–7.3 / 12.2–12.6 ms for 0.50–0.59 ms "
        "(`bench.peer_graphile --scenario steady`, [performance.md](performance.md))")
    sweeper_max_sleep_ms: int = integer(
        1000, lo=1, hi=3_600_000, help="longest the sweeper sleeps without claiming")
    sweeper_lease_ms: int = integer(30000, lo=100, hi=3_600_000,
                                    help="claim lease; bounds the `too_late` window")
    sweeper_max_attempts: int = integer(
        5, lo=1, hi=1000, help="permanent fire failures before dead-lettering")
    sweeper_batch: int = integer(500, lo=1, hi=100_000, help="timers per claim")
    sweeper_backlog_batch: int = integer(
        5000, lo=1, hi=100_000,
        help="timers per claim while a backlog drains: after a full claim the next takes 4 "
        "times as many, up to this (never fewer than `QUEEN_SWEEPER_BATCH`). A burst of "
        "50,000 fired in batches of 5,000 costs PostgreSQL about a fifth less CPU per timer "
        "than in batches of 500, and a tenth of the commits (`bench.sweep_cost`). A claim or "
        "its fire that runs longer than `QUEEN_SWEEPER_LEASE_MS` is cancelled, and the "
        "claims after it take half as many")
    sweeper_backoff_ms: int = integer(
        1000, lo=0, hi=3_600_000,
        help="first retry delay after a permanent failure (doubles, ≤ 60 s)")
    timers_max_horizon_s: int = integer(
        7_776_000, lo=1, hi=10 * 365 * 86400, default_text="`7776000` (90 days)",
        help="longest timer delay")
    timers_max_payload_bytes: int | None = optional_integer(
        lo=1, hi=ONE_MIB, default_text="1 MiB, or the tenant's message ceiling if smaller",
        help="largest timer payload: never above 1 MiB, whatever `QUEEN_MAX_MESSAGE_BYTES` "
        "says")
    max_message_bytes: int = integer(
        DEFAULT_MAX_MESSAGE_BYTES, lo=1024, hi=MAX_MESSAGE_BYTES_LIMIT,
        default_text=f"`{DEFAULT_MAX_MESSAGE_BYTES}` (16 MiB)",
        help="the message ceiling: largest serialized payload of a pushed message, KV value or "
        "transaction push (a plan's `--max-message-bytes` may lower it per tenant; over it: "
        "413). Queen has no per-message cap of its own; 16 MiB lets a Queen user push what "
        "Queen takes. The HTTP body limit follows it (4 × this, at least 8 MiB: 64 MiB by "
        "default). What a 16 MiB message costs the broker's memory: "
        "[RELIABILITY.md](../RELIABILITY.md), \"Large messages\"")
    # Log housekeeping: sealing the head into segments, retention.
    housekeeping_interval_ms: int = integer(
        1000, lo=10, hi=3_600_000,
        help="how often the log's housekeeping seals segments and applies retention")
    segment_max_frames: int = integer(1000, lo=1, hi=1_000_000,
                                      help="a segment's size in frames")
    segment_max_bytes: int = integer(4 * ONE_MIB, lo=1024, hi=256 * ONE_MIB,
                                     help="a segment's size in payload bytes")
    segment_min_age_ms: int = integer(
        60_000, lo=0, hi=30 * _DAY_MS,
        help="frames younger than this stay in the head (plain rows; consumers at the tail "
        "read them); at most `QUEEN_SEGMENT_MAX_AGE_MS`")
    segment_max_age_ms: int = integer(
        600_000, lo=0, hi=30 * _DAY_MS,
        help="a head frame this old is sealed even if its segment is not full (quiet "
        "partitions)")
    segment_zstd_level: int = integer(3, lo=1, hi=22, help="zstd level of new segments")
    segment_cache_bytes: int = integer(
        64 * ONE_MIB, lo=0, hi=64 * 1024 * ONE_MIB,
        help="memory for decompressed segments per broker (LRU by bytes; `0`: none)")
    # At-rest encryption (queen_trio/sealing.py). Secrets: kept out of repr, never echoed.
    encryption_key: bytes | None = value(
        None, _key, default_text="unset", secret=True, allowed="64 hexadecimal digits",
        help="Queen's setting: 64 hexadecimal digits (32 bytes, e.g. `openssl rand -hex 32`), "
        "the AES-256-GCM key that seals the payloads of queues configured with "
        "`encryptionEnabled`. Unset: such queues cannot be configured (400), and pushes to one "
        "already configured are refused (409 `encryption_unavailable`), never stored in "
        "clear. Any other value stops start-up with one line naming the setting (the value is "
        "not echoed). Every broker of a database needs the same keys")
    encryption_old_keys: tuple[bytes, ...] = value(
        (), _old_keys, default_text="unset", secret=True,
        allowed="keys of 64 hexadecimal digits, separated by commas",
        help="earlier keys, same format, separated by commas: they only open payloads sealed "
        "under them (key rotation, see [operations.md](operations.md#encryption-at-rest)); only "
        "beside `QUEEN_ENCRYPTION_KEY`")

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


@dataclasses.dataclass(frozen=True, slots=True)
class Declared:
    """A setting as the loader and the references see it."""

    field: str
    env: str
    setting: Setting


def declared() -> list[Declared]:
    """Every setting, in declaration order."""
    out = []
    for f in dataclasses.fields(Settings):
        setting = f.metadata["setting"]
        out.append(Declared(f.name, setting.env or f"QUEEN_{f.name.upper()}", setting))
    return out


def _no_larger(env: str, value: int, limit_env: str, limit: int) -> None:
    if value > limit:
        raise ConfigError(env, str(value), f"a value no larger than {limit_env} ({limit})")


def load_settings(env: Mapping[str, str]) -> Settings:
    """Build :class:`Settings` from an environment mapping (usually ``os.environ``)."""
    values: dict[str, Any] = {}
    for d in declared():
        raw = env.get(d.env)
        if raw is None or not raw.strip():
            continue
        try:
            values[d.field] = d.setting.parse(raw)
        except Invalid as exc:
            shown = exc.shown if exc.shown is not None else raw
            raise ConfigError(d.env, shown, exc.expected) from None
    settings = Settings(**values)
    # The settings that bound each other.
    _no_larger("QUEEN_SWEEPER_MIN_SLEEP_MS", settings.sweeper_min_sleep_ms,
               "QUEEN_SWEEPER_MAX_SLEEP_MS", settings.sweeper_max_sleep_ms)
    _no_larger("QUEEN_SEGMENT_MIN_AGE_MS", settings.segment_min_age_ms,
               "QUEEN_SEGMENT_MAX_AGE_MS", settings.segment_max_age_ms)
    if settings.encryption_old_keys and settings.encryption_key is None:
        raise ConfigError("QUEEN_ENCRYPTION_OLD_KEYS", "<set>",
                          "to be set only beside QUEEN_ENCRYPTION_KEY (the current key)")
    return settings


# -- the references: `queen-trio serve --help` and docs/configuration.md ---------------------


def _plain(text: str) -> str:
    """Markdown to terminal text: no backquotes, a link as its text."""
    def link(m: re.Match[str]) -> str:  # docs/configuration.md's links are relative to docs/
        return m[1] if m[2].startswith("../") else f"docs/{m[1]}"

    return re.sub(r"\[([^\]]*)\]\(([^)]*)\)", link, text).replace("`", "")


def help_text() -> str:
    """Every setting, one paragraph each, for ``queen-trio serve --help``."""
    lines = ["settings (environment variables; unset or blank: the default):"]
    for d in declared():
        allowed = f"; {_plain(d.setting.allowed)}" if d.setting.allowed else ""
        lines.append(f"  {d.env} (default: {_plain(d.setting.default_text)}{allowed})")
        lines += textwrap.wrap(_plain(d.setting.help), 92, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines) + "\n"


REFERENCE_HEADER = """\
# Configuration

<!-- Generated from the declarations in queen_trio/config.py by
     `python -m queen_trio.config > docs/configuration.md`; tests/unit/test_config.py checks
     that this file matches them. Edit the declarations, not this file. -->

All settings are environment variables, read when the broker starts; unset or blank, a
setting takes its default. A bad value stops start-up with one line naming the variable (exit
code 2). `queen-trio serve --help` lists them too. How several processes share a port
(`QUEEN_WORKERS`) and what a commit waits for (`QUEEN_POP_COMMIT`) are explained in
[operations.md](operations.md).

| variable | default | allowed | meaning |
|---|---|---|---|
"""


def reference_markdown() -> str:
    """docs/configuration.md: the settings' table, from their declarations."""
    rows = [f"| `{d.env}` | {d.setting.default_text} | {d.setting.allowed} | {d.setting.help} |"
            for d in declared()]
    return REFERENCE_HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
