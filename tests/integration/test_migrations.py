"""Migrations against a real database: idempotent, concurrent-safe, tamper-evident; function
files applied again when they change; a database from before the baseline adopted."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from queen_trio.db.migrations import (
    FunctionFile,
    Migration,
    apply_migrations,
    discover,
    discover_functions,
)
from queen_trio.db.rows import one
from queen_trio.errors import MigrationError
from queen_trio.kv import rules as kv_rules
from queen_trio.kv import store as kv_store

from ..schema_snapshot import assert_matches_snapshot, dump

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "schema_v15"


def _recorded(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT version, name FROM queen.schema_migrations ORDER BY 1").fetchall()


def test_applying_twice_applies_once(empty_database_url: str) -> None:
    expected = [(m.version, m.name) for m in discover()]
    assert apply_migrations(empty_database_url) == [v for v, _ in expected]
    assert apply_migrations(empty_database_url) == []
    assert _recorded(empty_database_url) == expected


def test_foundation_creates_the_default_tenant(empty_database_url: str) -> None:
    apply_migrations(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT name FROM queen.tenants").fetchall() == [("default",)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO queen.tenants (name) VALUES ('Not Valid!')")


def test_two_processes_migrating_at_once_do_not_race(empty_database_url: str) -> None:
    env = {**os.environ, "QUEEN_DATABASE_URL": empty_database_url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "queen_trio", "migrate"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    counts = sorted(out.strip().splitlines()[-1] for out, _ in outputs)
    n = len(discover())
    # Exactly one of them did the work; the other waited on the lock and found nothing to do.
    assert counts == sorted(["applied 0 migration(s)", f"applied {n} migration(s): "
                             f"{list(range(1, n + 1))}"])
    assert len(_recorded(empty_database_url)) == n


def test_an_edited_migration_is_detected(empty_database_url: str) -> None:
    migrations = discover()
    apply_migrations(empty_database_url, migrations)
    first = migrations[0]
    tampered = [Migration(first.version, first.name, first.sql + "\n-- edited"), *migrations[1:]]
    with pytest.raises(MigrationError, match="changed after it was applied"):
        apply_migrations(empty_database_url, tampered)


def test_a_database_from_a_newer_broker_is_refused(empty_database_url: str) -> None:
    migrations = discover()
    extra = Migration(len(migrations) + 1, "future", "SELECT 1;")
    apply_migrations(empty_database_url, [*migrations, extra])
    with pytest.raises(MigrationError, match="newer queen-trio"):
        apply_migrations(empty_database_url, migrations)


def test_a_failing_migration_leaves_nothing_behind(empty_database_url: str) -> None:
    migrations = discover()
    broken = Migration(
        len(migrations) + 1, "broken", "CREATE TABLE queen.half (id int); SELECT 1/0;"
    )
    with pytest.raises(psycopg.errors.DivisionByZero):
        apply_migrations(empty_database_url, [*migrations, broken])
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regclass('queen.half')").fetchone() == (None,)
    assert len(_recorded(empty_database_url)) == len(migrations)


def _functions(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, checksum FROM queen.schema_functions").fetchall())


def _probe(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT queen.probe()").fetchone()[0]


def test_every_function_file_is_applied_and_recorded(empty_database_url: str) -> None:
    apply_migrations(empty_database_url)
    assert _functions(empty_database_url) == {f.name: f.checksum for f in discover_functions()}


def test_an_edited_function_file_is_applied_again(empty_database_url: str) -> None:
    shipped = discover_functions()
    probe = "CREATE OR REPLACE FUNCTION queen.probe() RETURNS integer LANGUAGE sql AS 'SELECT {}';"
    apply_migrations(empty_database_url,
                     functions=[*shipped, FunctionFile("zz.sql", probe.format(1))])
    assert _probe(empty_database_url) == 1
    before = _functions(empty_database_url)

    # Unlike a numbered migration, an edited function file is not refused: it is applied again,
    # and only it.
    apply_migrations(empty_database_url,
                     functions=[*shipped, FunctionFile("zz.sql", probe.format(2))])
    assert _probe(empty_database_url) == 2
    after = _functions(empty_database_url)
    assert after["zz.sql"] != before["zz.sql"]
    assert {k: v for k, v in after.items() if k != "zz.sql"} == {
        k: v for k, v in before.items() if k != "zz.sql"}
    with psycopg.connect(empty_database_url) as conn:
        times: dict[str, Any] = dict(
            conn.execute("SELECT name, applied_at FROM queen.schema_functions").fetchall())
    assert times["zz.sql"] > times["timers.sql"]

    # A file no longer shipped is forgotten (its functions are another file's now).
    apply_migrations(empty_database_url, functions=shipped)
    assert set(_functions(empty_database_url)) == {f.name for f in shipped}


def test_a_failing_function_file_leaves_nothing_behind(empty_database_url: str) -> None:
    shipped = discover_functions()
    apply_migrations(empty_database_url)
    probe = FunctionFile("aa.sql", "CREATE OR REPLACE FUNCTION queen.probe() RETURNS integer "
                                   "LANGUAGE sql AS 'SELECT 1';")
    broken = FunctionFile("zz.sql", "CREATE OR REPLACE FUNCTION queen.nothing() RETURNS int "
                                    "LANGUAGE sql AS 'SELECT * FROM queen.no_such_table';")
    with pytest.raises(psycopg.errors.UndefinedTable):
        apply_migrations(empty_database_url, functions=[probe, *shipped, broken])
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT to_regproc('queen.probe')").fetchone() == (None,)
    assert _functions(empty_database_url) == {f.name: f.checksum for f in shipped}


def test_function_files_are_applied_again_after_a_new_migration(empty_database_url: str) -> None:
    # A migration that drops what a function file defines (say, a column's type change with
    # CASCADE) gets it back in the same run, although no function file changed.
    migrations = discover()
    apply_migrations(empty_database_url, migrations)
    drop = Migration(len(migrations) + 1, "drop", "DROP FUNCTION queen.sweep_lead_s() CASCADE;")
    assert apply_migrations(empty_database_url, [*migrations, drop]) == [drop.version]
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT queen.sweep_lead_s()").fetchone() == (0.001,)


# A database migrated before the baseline squashed 001..015 ---------------------------------------


def _migrate_as_before_the_baseline(url: str, files: list[Path]) -> None:
    """What the migrator did before the baseline: its bootstrap, then one transaction per file
    with its row in queen.schema_migrations (no queen.schema_functions)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""
            CREATE SCHEMA IF NOT EXISTS queen;
            CREATE TABLE IF NOT EXISTS queen.schema_migrations (
                version    integer PRIMARY KEY,
                name       text        NOT NULL,
                checksum   text        NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )""")
        for path in files:
            text = path.read_text(encoding="utf-8")
            with conn.transaction():
                conn.execute(text)
                conn.execute(
                    "INSERT INTO queen.schema_migrations (version, name, checksum) "
                    "VALUES (%s, %s, %s)",
                    (int(path.name[:3]), path.name[4:-4],
                     hashlib.sha256(text.encode()).hexdigest()),
                )


_DATA = {
    "tenants": "SELECT tenant_id, name, created_at FROM queen.tenants ORDER BY 1",
    "queues": "SELECT queue_id, tenant_id, name, created_at FROM queen.queues ORDER BY 1",
    "partitions": "SELECT partition_id, queue_id, name, next_offset FROM queen.partitions",
    "frames": 'SELECT partition_id, "offset", transaction_id, payload, created_at, meta '
              'FROM queen.frames ORDER BY 1, 2',
    "timers": "SELECT tenant_id, queue, timer_key, txn, payload, deliver_at, visible_at "
              "FROM queen.timers ORDER BY 1, 2, 3",
}


def _data(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {table: conn.execute(query).fetchall() for table, query in _DATA.items()}


def test_a_database_at_the_old_schema_15_is_adopted(
    empty_database_url: str, database_url: str
) -> None:
    legacy, fresh = empty_database_url, database_url
    _migrate_as_before_the_baseline(legacy, sorted(LEGACY.glob("*.sql")))
    with psycopg.connect(legacy, autocommit=True) as conn:
        conn.execute(
            "SELECT queen.append_timer_frames('{1,1}', '{orders,orders}', '{a,b}', '{p,p}', "
            "'{t1,t2}', %s, '{8,8}', ARRAY[now(), now()])",
            (['{"n": 1}', '{"n": 2}'],),
        )
        conn.execute(
            "SELECT * FROM queen.schedule_timers(1, '{orders}', '{later}', '{p}', '{t3}', %s, "
            "'{f}', '{8}', '{0}', 0)",
            ([b'{"n": 3}'],),
        )
    before = _data(legacy)
    assert [len(before[t]) for t in ("queues", "partitions", "frames", "timers")] == [1, 1, 2, 1]

    # The baseline is adopted (not applied); only the migrations after it run.
    later = [m for m in discover() if m.version > 1]
    assert apply_migrations(legacy) == [m.version for m in later]
    assert _recorded(legacy) == [(1, "baseline"), *((m.version, m.name) for m in later)]
    with psycopg.connect(legacy) as conn:
        (checksum,) = one(conn.execute(
            "SELECT checksum FROM queen.schema_migrations WHERE version = 1"))
    assert checksum == discover()[0].checksum
    assert _functions(legacy) == {f.name: f.checksum for f in discover_functions()}
    assert _data(legacy) == before
    assert dump(legacy) == dump(fresh)
    assert_matches_snapshot(legacy)

    # And it works as before: the timer fires into the queue behind the two frames.
    with psycopg.connect(legacy, autocommit=True) as conn:
        fired = conn.execute(
            "SELECT timer_key FROM queen.sweep_timers(%s, 'b', 10, 1000, 1048576, true, NULL) "
            "WHERE fired", (uuid.uuid4(),)).fetchall()
        offsets = conn.execute('SELECT "offset", transaction_id FROM queen.frames '
                               'ORDER BY "offset"').fetchall()
    assert len(fired) == 1
    assert offsets == [(0, "t1"), (1, "t2"), (2, "t3")]
    assert apply_migrations(legacy) == []


def test_an_incomplete_old_history_is_refused(empty_database_url: str) -> None:
    _migrate_as_before_the_baseline(empty_database_url, sorted(LEGACY.glob("*.sql"))[:14])
    with pytest.raises(MigrationError, match="before schema/001_baseline.sql"):
        apply_migrations(empty_database_url)
    assert len(_recorded(empty_database_url)) == 14


# 004: KV rows get a version each, and keep everything else -------------------------------------


def test_kv_rows_written_before_004_are_kept_whole_and_versioned(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    before_004 = [m for m in discover() if m.version < 4]
    apply_migrations(url, before_004)
    columns = "tenant_id, namespace, key, value, size_bytes, expires_at, updated_at"
    with psycopg.connect(url, autocommit=True) as conn:
        (tenant,) = one(conn.execute("SELECT tenant_id FROM queen.tenants"))
        conn.execute(f"""
            INSERT INTO queen.kv ({columns}) VALUES
                (%(t)s, 'saga', 'b-1', '{{"step": "held"}}', 16, NULL, now() - interval '1 day'),
                (%(t)s, 'saga', 'b-2', '2', 1, now() + interval '1 hour', now()),
                (%(t)s, 'saga', 'gone', '3', 1, now() - interval '1 second', now()),
                (%(t)s, 'Old:Names', 'k', '"legacy"', 8, NULL, now())""", {"t": tenant})
        old = conn.execute(f"SELECT {columns} FROM queen.kv ORDER BY namespace, key").fetchall()

    assert apply_migrations(url) == [m.version for m in discover() if m.version >= 4]
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as dict_conn:
        kept = dict_conn.execute(f"SELECT {columns}, version FROM queen.kv "
                            f"ORDER BY namespace, key").fetchall()
        assert [tuple(r[c] for c in columns.split(", ")) for r in kept] == old
        versions = [r["version"] for r in kept]
        assert all(v > 0 for v in versions) and len(set(versions)) == len(versions)

        def call(*ops: dict) -> list[dict]:
            parsed = [kv_rules.parse_op(i, op, ceiling=kv_rules.MAX_VALUE_BYTES)
                      for i, op in enumerate(ops)]
            with dict_conn.transaction():
                return kv_store.apply(dict_conn, tenant, parsed)

        by_key = {r["key"]: r for r in kept}
        # A row without a TTL reads as forever; each answers its version; the expired one is
        # still absent; a namespace of the old rule is still readable and deletable.
        b1, b2, gone, legacy = call({"op": "get", "ns": "saga", "key": "b-1"},
                                    {"op": "get", "ns": "saga", "key": "b-2"},
                                    {"op": "get", "ns": "saga", "key": "gone"},
                                    {"op": "get", "ns": "Old:Names", "key": "k"})
        assert (b1["value"], b1["expiresAt"], b1["version"]) == (
            {"step": "held"}, None, by_key["b-1"]["version"])
        assert b2["found"] and b2["expiresAt"] is not None and not gone["found"]
        assert legacy["value"] == "legacy"
        # The version is what expect names from now on; new writes take later ones.
        [moved] = call({"op": "put", "ns": "saga", "key": "b-1", "value": {"step": "paid"},
                        "forever": True, "expect": by_key["b-1"]["version"]})
        assert moved["applied"] and moved["version"] > max(versions)
        [deleted] = call({"op": "delete", "ns": "Old:Names", "key": "k"})
        assert deleted["applied"]
