"""Schema migrations: numbered files ``schema/NNN_name.sql``, then ``schema/functions/*.sql``.

Numbered migrations hold the tables, indexes, types and data: forward-only, each applied in its
own transaction together with its row in ``queen.schema_migrations``, so a migration is either
fully applied and recorded or not at all. A recorded migration whose file has since changed
stops the run (shipped migrations are immutable; add a new file instead).

Function files hold every function, trigger function and trigger, each as ``CREATE OR
REPLACE`` with its current body, so a function's body lives in exactly one file and changing
it is an edit of that file. After the numbered migrations, under the same lock, every function
file whose checksum differs from the one in ``queen.schema_functions`` is applied again (all
of them after a run that applied a numbered migration), in one transaction with their new
checksums. What ``CREATE OR REPLACE`` cannot do (drop or rename a function or trigger, change
its arguments or its result) takes a numbered migration as well: schema/README.md has the rules.

A session-level advisory lock serialises brokers that start together: the second one waits,
then finds every version recorded and every function file current, and applies nothing.

This runs with a plain synchronous psycopg connection: it is start-up work, done once, from
``queen-trio migrate`` or from a worker thread before the broker's nursery starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

import psycopg

from ..errors import MigrationError
from . import queries
from .conninfo import broker_conninfo

log = logging.getLogger(__name__)
Q = queries.load("migrations")

_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_FUNCTIONS_FILE_RE = re.compile(r"^[a-z0-9_]+\.sql$")
FUNCTIONS_DIR = "functions"
SNAPSHOT_FILE = "snapshot.sql"  # the dumped live schema, for review and tests; never applied

# The unreleased history that 001_baseline.sql squashed (tests/fixtures/schema_v15 keeps its
# files). A database that recorded exactly these has the baseline's tables: the migrator
# replaces these rows with the baseline's and applies the function files.
_LEGACY_HISTORY = {
    1: ("foundation", "06397b506e5ba4a2a3a2d68c5692b3e8179a2cca678b2869d0e3893dc22bafc4"),
    2: ("log", "35af8acf9972e181ed119af042c3667b0565637d91741214ffedf25d77964498"),
    3: ("tenants_kv", "60005d2b82e25c8996ff5f9045e64d00d889ce155bca279d67445775d082f032"),
    4: ("timers", "1846831e90453fdda29e9eb516a6a7164fb243996c02239c0a9a8fd971cd93d7"),
    5: ("timer_fire", "dde771e846caa1d8bddb9551adbbe06b219ce47aa93b9a5f8585a327ec0945c9"),
    6: ("segments", "e595dc581cbaaead43669dc56a08eb7efed40e1737176d6231812b7bd3fc38d5"),
    7: ("pop_head", "d51f4e3b212ee17ecf92b1c8f89daef70cc5c2af75be267a3ec94769fe1d14cd"),
    8: ("sweep_waits", "69cc7ba82fec9aa5170feaec8c0b39ffca3f72fe589474131babb49c91507058"),
    9: ("timer_name_locks", "c19ffe19fc6e051b47e914c530236751c34a3858bfa02a9276e9451f31642418"),
    10: ("pop_after_fire", "0e5c5f20bc4a5207ce95b052d20873fdb0ce7a021cd969f0dcdd0abd5838b6eb"),
    11: ("sweep_leaves_killable_rows",
         "4adf217289c66a00f5fc60b9491127ee13cb99f0af13764882f2c04f92e37e88"),
    12: ("schedule_probes_use_the_index",
         "19aed5df154f103962982aee3b52089ba09cd354d7bd216722a96a489ee6ff9b"),
    13: ("analyze_grown_tables",
         "847fc4e997635034b36dfd9406d65b1bc2631377fd3412015bb674be9193906f"),
    14: ("fire_staged_before_its_instant",
         "b786ebec8834b6d604aeec9d7f7c4bf820ecc74b49da8b66ad2b1acdaf740a47"),
    15: ("claims_found_by_token",
         "5e889c50464402d4f2fffbf5e76e2727f51519b3badebbc3e4f6dcee215a1aff"),
}
_BASELINE = "baseline"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return _sha256(self.sql)


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionFile:
    name: str  # the file's name in schema/functions/, e.g. "timers.sql"
    sql: str

    @property
    def checksum(self) -> str:
        return _sha256(self.sql)


def schema_dir() -> Traversable:
    """Where the migration files are: inside the installed wheel, or the source checkout."""
    packaged = resources.files("queen_trio").joinpath("schema")
    if packaged.is_dir():
        return packaged
    # Editable installs import queen_trio from the checkout, where schema/ sits beside it.
    return Path(__file__).resolve().parents[2] / "schema"


def discover(directory: Traversable | None = None) -> list[Migration]:
    directory = directory or schema_dir()
    found: list[Migration] = []
    for entry in directory.iterdir():
        if not entry.name.endswith(".sql") or entry.name == SNAPSHOT_FILE:
            continue
        match = _FILE_RE.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} is not named NNN_name.sql")
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    expected = list(range(1, len(found) + 1))
    if [m.version for m in found] != expected:
        raise MigrationError(
            f"migration versions must run 1..N without gaps, found {[m.version for m in found]}"
        )
    return found


def discover_functions(directory: Traversable | None = None) -> list[FunctionFile]:
    """The function files, in the order they are applied (by name)."""
    directory = directory or schema_dir().joinpath(FUNCTIONS_DIR)
    if not directory.is_dir():
        return []
    found: list[FunctionFile] = []
    for entry in directory.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        if _FUNCTIONS_FILE_RE.match(entry.name) is None:
            raise MigrationError(f"function file {entry.name!r} is not named area.sql")
        found.append(FunctionFile(entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda f: f.name)


def latest_version() -> int:
    return len(discover())


def apply_migrations(
    conninfo: str,
    migrations: list[Migration] | None = None,
    functions: list[FunctionFile] | None = None,
) -> list[int]:
    """Bring the database up to date; return the versions this call applied."""
    # Short of the shipped head (a test migrating to an older version), the function files,
    # which hold the bodies for the newest schema, are created unchecked (see _apply_functions).
    partial = migrations is not None and (
        max((m.version for m in migrations), default=0) < latest_version())
    migrations = discover() if migrations is None else migrations
    functions = discover_functions() if functions is None else functions
    applied_now: list[int] = []
    with psycopg.connect(broker_conninfo(conninfo), autocommit=True,
                         application_name="queen-trio-migrate") as conn:
        conn.execute(Q.lock)
        try:
            conn.execute(Q.bootstrap)
            recorded = {row[0]: (row[1], row[2]) for row in conn.execute(Q.applied)}
            adopted = _adopt_legacy_history(conn, recorded, migrations)
            if adopted:
                recorded = {1: (migrations[0].name, migrations[0].checksum)}
            unknown = set(recorded) - {m.version for m in migrations}
            if unknown:
                # Before anything is applied: an older broker must not put back older bodies.
                raise MigrationError(
                    f"the database has migrations this broker does not know: {sorted(unknown)}; "
                    "it was migrated by a newer queen-trio"
                )
            for migration in migrations:
                if migration.version in recorded:
                    name, checksum = recorded[migration.version]
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:03d}_{name} was changed after it was "
                            "applied; add a new migration instead of editing a shipped one"
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql)
                    conn.execute(Q.record, (migration.version, migration.name, migration.checksum))
                log.info("applied migration %03d_%s", migration.version, migration.name)
                applied_now.append(migration.version)
            _apply_functions(conn, functions, every_file=adopted or bool(applied_now),
                             check_bodies=not partial)
        finally:
            if not conn.closed and not conn.broken:
                conn.execute(Q.unlock)
    return applied_now


def _adopt_legacy_history(
    conn: psycopg.Connection,
    recorded: dict[int, tuple[str, str]],
    migrations: list[Migration],
) -> bool:
    """Replace a complete pre-baseline history by the baseline's row; True if it did."""
    if recorded.get(1, ("",))[0] != _LEGACY_HISTORY[1][0]:
        return False
    if not migrations or migrations[0].name != _BASELINE:
        return False  # migrating with the old files themselves (tests only)
    if recorded != _LEGACY_HISTORY:
        raise MigrationError(
            "the database carries the migration history from before schema/001_baseline.sql "
            f"(versions {sorted(recorded)}), and only the complete one (1..15, unedited) is "
            "adopted; migrate it with the queen-trio that wrote it first, or recreate it"
        )
    baseline = migrations[0]
    with conn.transaction():
        conn.execute(Q.forget_migrations)
        conn.execute(Q.record, (baseline.version, baseline.name, baseline.checksum))
    log.info("adopted the pre-baseline history 001..015 as %03d_%s", baseline.version,
             baseline.name)
    return True


def _apply_functions(
    conn: psycopg.Connection, functions: list[FunctionFile], *, every_file: bool,
    check_bodies: bool = True,
) -> list[str]:
    """Apply the function files that changed (or all of them); return their names."""
    recorded = {name: checksum for name, checksum in conn.execute(Q.functions_applied)}
    due = [f for f in functions if every_file or recorded.get(f.name) != f.checksum]
    stale = set(recorded) - {f.name for f in functions}
    if not due and not stale:
        return []
    with conn.transaction():
        if not check_bodies:
            # A LANGUAGE sql body is checked against the tables when it is created, which
            # fails on a database migrated only part of the way: there, as in pg_restore,
            # bodies are checked when they run.
            conn.execute("SET LOCAL check_function_bodies = off")
        for function_file in due:
            conn.execute(function_file.sql)
            conn.execute(Q.record_function, (function_file.name, function_file.checksum))
        if stale:
            conn.execute(Q.forget_functions, ([f.name for f in functions],))
    for function_file in due:
        log.info("applied functions/%s", function_file.name)
    return [f.name for f in due]
