"""Migrations against a real database: idempotent, concurrent-safe, tamper-evident."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from queen_trio.db.migrations import Migration, apply_migrations, discover
from queen_trio.errors import MigrationError


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
