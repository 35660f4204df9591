"""Settings parsing: defaults, every variable, and a one-line error naming the bad one; the
references (``serve --help``, docs/configuration.md) read the same declarations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from queen_trio import cli
from queen_trio.config import ONE_MIB, Settings, declared, load_settings, reference_markdown
from queen_trio.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_follow_the_spec() -> None:
    s = load_settings({})
    assert s == Settings()
    assert (s.host, s.port, s.auth, s.database_url) == ("127.0.0.1", 6632, False, None)
    assert s.data_dir == Path(".queen")
    assert (s.sweeper_min_sleep_ms, s.sweeper_max_sleep_ms) == (12, 1000)
    assert (s.sweeper_lease_ms, s.sweeper_max_attempts, s.sweeper_batch) == (30000, 5, 500)
    assert s.sweeper_backoff_ms == 1000
    assert s.timers_max_horizon_s == 7_776_000
    assert s.timers_max_payload_bytes is None


def test_every_variable_is_read() -> None:
    s = load_settings(
        {
            "QUEEN_DATABASE_URL": "postgresql://u@db:5432/q",
            "QUEEN_DATA_DIR": "/var/lib/queen",
            "QUEEN_HOST": "0.0.0.0",
            "QUEEN_PORT": "8080",
            "QUEEN_AUTH": "ON",
            "QUEEN_SWEEPER_MIN_SLEEP_MS": "5",
            "QUEEN_SWEEPER_MAX_SLEEP_MS": "250",
            "QUEEN_SWEEPER_LEASE_MS": "1500",
            "QUEEN_SWEEPER_MAX_ATTEMPTS": "3",
            "QUEEN_SWEEPER_BATCH": "2000",
            "QUEEN_SWEEPER_BACKOFF_MS": "0",
            "QUEEN_TIMERS_MAX_HORIZON_S": "3600",
            "QUEEN_TIMERS_MAX_PAYLOAD_BYTES": "4096",
            "QUEEN_DB_POOL_SIZE": "20",
            "QUEEN_DB_POOL_WAIT_MS": "250",
            "QUEEN_DB_MAX_LIFETIME_S": "60",
            "QUEEN_DB_MAX_IDLE_S": "30",
        }
    )
    assert s.database_url == "postgresql://u@db:5432/q"
    assert s.data_dir == Path("/var/lib/queen")
    assert (s.host, s.port, s.auth) == ("0.0.0.0", 8080, True)
    assert (s.sweeper_min_sleep_ms, s.sweeper_max_sleep_ms, s.sweeper_lease_ms) == (5, 250, 1500)
    assert (s.sweeper_max_attempts, s.sweeper_batch, s.sweeper_backoff_ms) == (3, 2000, 0)
    assert (s.timers_max_horizon_s, s.timers_max_payload_bytes, s.db_pool_size) == (3600, 4096, 20)
    assert (s.db_pool_wait_ms, s.db_max_lifetime_s, s.db_max_idle_s) == (250, 60, 30)


def test_settings_are_immutable() -> None:
    s = load_settings({})
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QUEEN_PORT", "abc"),
        ("QUEEN_PORT", "70000"),
        ("QUEEN_PORT", "-1"),
        ("QUEEN_PORT", "80.5"),
        ("QUEEN_AUTH", "yes"),
        ("QUEEN_SWEEPER_MIN_SLEEP_MS", "-5"),
        ("QUEEN_SWEEPER_MAX_SLEEP_MS", "0"),
        ("QUEEN_SWEEPER_LEASE_MS", "ten"),
        ("QUEEN_SWEEPER_MAX_ATTEMPTS", "0"),
        ("QUEEN_SWEEPER_BATCH", "1e3"),
        ("QUEEN_SWEEPER_BACKOFF_MS", "-1"),
        ("QUEEN_TIMERS_MAX_HORIZON_S", "0"),
        ("QUEEN_TIMERS_MAX_PAYLOAD_BYTES", str(ONE_MIB + 1)),
        ("QUEEN_DATABASE_URL", "not a url"),
        ("QUEEN_LOG_LEVEL", "LOUD"),
        ("QUEEN_HTTP_IDLE_TIMEOUT_S", "0"),
        ("QUEEN_HTTP_BODY_TIMEOUT_S", "soon"),
        ("QUEEN_HTTP_BODY_BUFFER_BYTES", "1000"),
        ("QUEEN_HTTP_BODY_BUFFER_BYTES", "64MiB"),
        ("QUEEN_MAX_MESSAGE_BYTES", "0"),
        ("QUEEN_MAX_MESSAGE_BYTES", "1023"),
        ("QUEEN_MAX_MESSAGE_BYTES", "4MiB"),
        ("QUEEN_MAX_MESSAGE_BYTES", str(64 * ONE_MIB + 1)),
        ("QUEEN_DB_CONNECT_TIMEOUT_S", "1"),  # libpq would silently make it 2
        ("QUEEN_DB_CONNECT_TIMEOUT_S", "0"),
        ("QUEEN_ALLOWED_HOSTS", "queen.example:6632"),
        ("QUEEN_ALLOWED_HOSTS", "https://queen.example"),
        ("QUEEN_OPERATOR_TENANT", "Ops Team"),
        ("QUEEN_AUTH_FAILURES_PER_S", "0"),
        ("QUEEN_DB_POOL_WAIT_MS", "0"),
        ("QUEEN_DB_MAX_LIFETIME_S", "0"),
        ("QUEEN_DB_MAX_IDLE_S", "1h"),
    ],
)
def test_bad_values_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({variable: value})
    assert info.value.variable == variable
    message = str(info.value)
    assert message.startswith(f"{variable}=")
    assert "expected" in message
    assert "\n" not in message


def test_the_message_ceiling_is_settable_and_the_body_limit_follows() -> None:
    # 16 MiB: what a Queen user pushes (Queen has no cap); the body limit leaves room for escapes.
    assert load_settings({}).max_message_bytes == 16 * ONE_MIB
    assert load_settings({}).http_body_limit() == 64 * ONE_MIB
    assert load_settings({"QUEEN_MAX_MESSAGE_BYTES": str(ONE_MIB)}
                         ).http_body_limit() == 8 * ONE_MIB  # never below
    s = load_settings({"QUEEN_MAX_MESSAGE_BYTES": str(4 * ONE_MIB)})
    assert s.max_message_bytes == 4 * ONE_MIB
    assert s.http_body_limit() > s.max_message_bytes
    # Timers keep min(1 MiB, plan ceiling), whatever the message ceiling is.
    assert s.timer_payload_ceiling(4 * ONE_MIB) == ONE_MIB


def test_the_body_budget_is_settable_and_never_below_one_body_at_the_limit() -> None:
    assert load_settings({}).http_body_budget() == 128 * ONE_MIB  # 2 bodies at the limit
    assert load_settings({"QUEEN_MAX_MESSAGE_BYTES": str(ONE_MIB)}
                         ).http_body_budget() == 64 * ONE_MIB  # the floor: 8 bodies of 8 MiB
    small = {"QUEEN_MAX_MESSAGE_BYTES": str(ONE_MIB)}  # the body limit is 8 MiB
    assert load_settings({**small, "QUEEN_HTTP_BODY_BUFFER_BYTES": str(32 * ONE_MIB)}
                         ).http_body_budget() == 32 * ONE_MIB
    assert load_settings({**small, "QUEEN_HTTP_BODY_BUFFER_BYTES": str(2 * ONE_MIB)}
                         ).http_body_budget() == 8 * ONE_MIB  # the body limit
    assert load_settings({"QUEEN_HTTP_BODY_BUFFER_BYTES": str(2 * ONE_MIB)}
                         ).http_body_budget() == 64 * ONE_MIB  # the default body limit
    bigger = load_settings({"QUEEN_MAX_MESSAGE_BYTES": str(64 * ONE_MIB)})
    assert bigger.http_body_budget() == 2 * bigger.http_body_limit()


def test_min_sleep_above_max_sleep_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"QUEEN_SWEEPER_MIN_SLEEP_MS": "500", "QUEEN_SWEEPER_MAX_SLEEP_MS": "100"})
    assert info.value.variable == "QUEEN_SWEEPER_MIN_SLEEP_MS"
    assert "QUEEN_SWEEPER_MAX_SLEEP_MS" in str(info.value)


def test_blank_values_mean_default() -> None:
    assert load_settings({"QUEEN_PORT": "  ", "QUEEN_DATABASE_URL": ""}) == Settings()


@pytest.mark.parametrize(
    ("setting", "plan", "expected"),
    [(None, 10 * ONE_MIB, ONE_MIB), (None, 1000, 1000), (4096, 10_000, 4096), (4096, 100, 100)],
)
def test_timer_payload_ceiling_is_the_smallest_limit(
    setting: int | None, plan: int, expected: int
) -> None:
    assert Settings(timers_max_payload_bytes=setting).timer_payload_ceiling(plan) == expected


def test_workers_and_the_inherited_socket() -> None:
    s = load_settings({"QUEEN_WORKERS": "4"})
    assert (s.workers, s.listen_fd) == (4, None)
    assert load_settings({"QUEEN_LISTEN_FD": "3"}).listen_fd == 3
    for bad in ("0", "-1", "two", "65"):
        with pytest.raises(ConfigError, match="QUEEN_WORKERS"):
            load_settings({"QUEEN_WORKERS": bad})


def test_pop_commit_is_async_unless_asked_for_sync() -> None:
    assert load_settings({}).pop_commit_sync is False
    assert load_settings({"QUEEN_POP_COMMIT": "async"}).pop_commit_sync is False
    assert load_settings({"QUEEN_POP_COMMIT": " SYNC "}).pop_commit_sync is True
    for bad in ("on", "off", "durable", "1"):
        with pytest.raises(ConfigError, match="QUEEN_POP_COMMIT"):
            load_settings({"QUEEN_POP_COMMIT": bad})


def test_pop_fire_wait_is_bounded() -> None:
    assert load_settings({}).pop_fire_wait_ms == 10
    assert load_settings({"QUEEN_POP_FIRE_WAIT_MS": "0"}).pop_fire_wait_ms == 0
    for bad in ("-1", "51", "ten"):
        with pytest.raises(ConfigError, match="QUEEN_POP_FIRE_WAIT_MS"):
            load_settings({"QUEEN_POP_FIRE_WAIT_MS": bad})


def test_waiting_pops_are_bounded_per_broker_and_per_tenant() -> None:
    settings = load_settings({})
    assert (settings.longpoll_max_parked, settings.longpoll_max_parked_per_tenant) == (
        10_000, 5_000)
    settings = load_settings({"QUEEN_LONGPOLL_MAX_PARKED": "30000",
                              "QUEEN_LONGPOLL_MAX_PARKED_PER_TENANT": "0"})
    assert (settings.longpoll_max_parked, settings.longpoll_max_parked_per_tenant) == (30_000, 0)
    for name in ("QUEEN_LONGPOLL_MAX_PARKED", "QUEEN_LONGPOLL_MAX_PARKED_PER_TENANT"):
        for bad in ("-1", "many", "1000001"):
            with pytest.raises(ConfigError, match=name):
                load_settings({name: bad})


# -- QUEEN_DATABASE_URL: one host or several, and a server the broker can write to ------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@db:5432/q",
        "postgres://u:secret@db/q?sslmode=require",
        # several hosts, as a URL and as key=value conninfo (libpq tries them in order)
        "postgresql://u@10.0.0.1:5432,10.0.0.2:5433/queen?target_session_attrs=read-write",
        "postgresql://u@db-a,db-b/queen",  # no target_session_attrs: read-write is used
        "host=db-a,db-b port=5432,5433 dbname=queen target_session_attrs=read-write",
        "host=db-a,db-b port=5432 dbname=queen",  # one port for every host
        "postgresql://u@[::1]:5432,[::1]:5433/q?target_session_attrs=primary",
        "host=db target_session_attrs=any dbname=q",  # one host: libpq's default, honoured
    ],
)
def test_database_urls_with_one_or_several_hosts_are_accepted(url: str) -> None:
    assert load_settings({"QUEEN_DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "postgresql://user@host:5432/db"),
        ("postgresql://a b/q", "valid libpq URL"),
        ("host=a dbname=q colour=blue", "valid libpq URL"),
        ("postgresql://u@h:99999/q", "65535"),
        ("host=a,b,c port=1,2 dbname=q", "one port per host"),
        ("postgresql://u@a,b/q?target_session_attrs=read-only", "cannot run on a read-only"),
        ("host=a,b dbname=q target_session_attrs=standby", "cannot run on a read-only"),
        ("postgresql://u@a/q?target_session_attrs=prefer-standby", "cannot run on a read-only"),
        ("host=a,b dbname=q target_session_attrs=any", "several hosts"),
        ("postgresql://u@a/q?target_session_attrs=writable", "libpq does not know"),
    ],
)
def test_database_urls_a_broker_cannot_use_stop_start_up_with_one_line(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"QUEEN_DATABASE_URL": url})
    message = str(info.value)
    assert info.value.variable == "QUEEN_DATABASE_URL"
    assert message.startswith("QUEEN_DATABASE_URL=")
    assert says in message
    assert "\n" not in message


def test_a_refused_database_url_does_not_print_its_password() -> None:
    for url in ("postgresql://queen:hunter2@a,b/q?target_session_attrs=read-only",
                "host=a,b password=hunter2 dbname=q target_session_attrs=standby"):
        with pytest.raises(ConfigError) as info:
            load_settings({"QUEEN_DATABASE_URL": url})
        assert "hunter2" not in str(info.value)
        assert "***" in str(info.value)


def test_broker_connections_ask_for_a_writable_server_unless_told_otherwise() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from queen_trio.db.conninfo import broker_conninfo

    for url in ("postgresql://u@a:5432,b:5433/queen", "host=a,b port=5432,5433 dbname=queen"):
        params = conninfo_to_dict(broker_conninfo(url))
        assert params["target_session_attrs"] == "read-write"
        assert (params["host"], params["port"], params["dbname"]) == ("a,b", "5432,5433", "queen")
    explicit = "postgresql://u@a/queen?target_session_attrs=primary&connect_timeout=9"
    assert broker_conninfo(explicit) == explicit
    assert broker_conninfo(broker_conninfo("host=a")) == broker_conninfo("host=a")


def test_every_broker_connection_has_a_connect_timeout() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from queen_trio.db.conninfo import broker_conninfo

    for url in ("postgresql://u@a,b/queen", "host=a dbname=queen"):
        assert conninfo_to_dict(broker_conninfo(url))["connect_timeout"] == "5"
        assert conninfo_to_dict(broker_conninfo(url, connect_timeout_s=2))["connect_timeout"] \
            == "2"
    # The setting, through Settings; a URL's own connect_timeout is kept.
    s = load_settings({"QUEEN_DATABASE_URL": "postgresql://u@a/q",
                       "QUEEN_DB_CONNECT_TIMEOUT_S": "3"})
    assert conninfo_to_dict(s.database_conninfo())["connect_timeout"] == "3"
    s = s.with_database_url("postgresql://u@a/q?connect_timeout=20")
    assert conninfo_to_dict(s.database_conninfo())["connect_timeout"] == "20"


def test_cross_origin_and_auth_settings() -> None:
    s = load_settings({"QUEEN_ALLOWED_HOSTS": " Queen.Example ,, api.internal ,queen.example",
                       "QUEEN_OPERATOR_TENANT": "ops", "QUEEN_AUTH_FAILURES_PER_S": "50",
                       "QUEEN_DB_CONNECT_TIMEOUT_S": "2"})
    assert s.allowed_hosts == ("queen.example", "api.internal")
    assert (s.operator_tenant, s.auth_failures_per_s, s.db_connect_timeout_s) == ("ops", 50, 2)
    assert load_settings({"QUEEN_ALLOWED_HOSTS": "*"}).allowed_hosts == ("*",)
    d = load_settings({})
    assert (d.allowed_hosts, d.operator_tenant, d.auth_failures_per_s) == ((), None, 10)
    assert d.db_connect_timeout_s == 5


# -- one declaration per setting ----------------------------------------------------------------


def test_every_field_is_one_declared_variable() -> None:
    names = [d.env for d in declared()]
    assert [d.field for d in declared()] == [f.name for f in dataclasses.fields(Settings)]
    assert len(set(names)) == len(names) and all(re.fullmatch(r"QUEEN_[A-Z_]+", n) for n in names)
    assert all(d.setting.help and d.setting.default_text for d in declared())


def test_the_configuration_reference_is_generated_from_the_declarations() -> None:
    """docs/configuration.md is `python -m queen_trio.config > docs/configuration.md`."""
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == reference_markdown(), (
        "docs/configuration.md is stale: regenerate it with "
        "`PYTHONPATH=. python -m queen_trio.config > docs/configuration.md`")
    for d in declared():
        assert f"| `{d.env}` | " in written


def test_serve_help_lists_every_setting_with_its_default() -> None:
    serve = cli._parser()._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    for d in declared():
        assert d.env in text
    assert "QUEEN_SWEEPER_BATCH (default: 500; 1 … 100000)" in text
    assert "QUEEN_POP_COMMIT (default: async; async, sync)" in text
