"""Forward-only schema migrations from ``schema/NNN_name.sql``.

Each file is applied in its own transaction together with its row in
``queen.schema_migrations``, so a migration is either fully applied and recorded or not at all.
A session-level advisory lock serialises brokers that start together: the second one waits,
then finds every version recorded and applies nothing. A recorded migration whose file has
since changed stops the run (shipped migrations are immutable; add a new file instead).

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

log = logging.getLogger(__name__)
Q = queries.load("migrations")

_FILE_RE = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
SNAPSHOT_FILE = "snapshot.sql"  # the dumped live schema, for review and tests; never applied


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


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


def latest_version() -> int:
    return len(discover())


def apply_migrations(conninfo: str, migrations: list[Migration] | None = None) -> list[int]:
    """Bring the database up to date; return the versions this call applied."""
    migrations = discover() if migrations is None else migrations
    applied_now: list[int] = []
    with psycopg.connect(conninfo, autocommit=True, application_name="queen-trio-migrate") as conn:
        conn.execute(Q.lock)
        try:
            conn.execute(Q.bootstrap)
            recorded = {row[0]: (row[1], row[2]) for row in conn.execute(Q.applied)}
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
            unknown = set(recorded) - {m.version for m in migrations}
            if unknown:
                raise MigrationError(
                    f"the database has migrations this broker does not know: {sorted(unknown)}; "
                    "it was migrated by a newer queen-trio"
                )
        finally:
            if not conn.closed and not conn.broken:
                conn.execute(Q.unlock)
    return applied_now
