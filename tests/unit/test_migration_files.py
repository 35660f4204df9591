"""Migration discovery: naming, ordering, gaps — and what ships."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from queen_trio.db import migrations
from queen_trio.db.migrations import discover, discover_functions, latest_version, schema_dir
from queen_trio.errors import MigrationError

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "schema_v15"


def _write(tmp_path: Path, names: list[str]) -> Path:
    for name in names:
        (tmp_path / name).write_text(f"-- {name}\nSELECT 1;\n")
    return tmp_path


def test_files_are_applied_in_numeric_order(tmp_path: Path) -> None:
    found = discover(_write(tmp_path, ["002_second.sql", "001_first.sql", "README.md"]))
    assert [(m.version, m.name) for m in found] == [(1, "first"), (2, "second")]
    assert found[0].checksum != found[1].checksum


def test_the_snapshot_and_the_function_files_are_not_migrations(tmp_path: Path) -> None:
    _write(tmp_path, ["001_first.sql", "snapshot.sql"])
    (tmp_path / "functions").mkdir()
    _write(tmp_path / "functions", ["timers.sql", "log.sql"])
    assert [m.name for m in discover(tmp_path)] == ["first"]
    assert [f.name for f in discover_functions(tmp_path / "functions")] == ["log.sql", "timers.sql"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["001_a.sql", "003_c.sql"], "without gaps"),
        (["1_a.sql"], "NNN_name.sql"),
        (["001_Bad-Name.sql"], "NNN_name.sql"),
    ],
)
def test_bad_sets_of_files_are_refused(tmp_path: Path, names: list[str], message: str) -> None:
    with pytest.raises(MigrationError, match=message):
        discover(_write(tmp_path, names))


def test_a_badly_named_function_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="area.sql"):
        discover_functions(_write(tmp_path, ["Timers.sql"]))


def test_the_shipped_schema_starts_with_the_baseline() -> None:
    found = discover()
    assert found[0].name == "baseline"
    assert latest_version() == len(found)
    assert schema_dir().joinpath("001_baseline.sql").is_file()
    assert [f.name for f in discover_functions()] == ["log.sql", "ops.sql", "push.sql",
                                                      "segments.sql", "timers.sql"]


_STATEMENT_RE = re.compile(r"^(CREATE|ALTER|DROP|COMMENT|GRANT|REVOKE)\b[^\n]*", re.MULTILINE)
_DEFINED_RE = re.compile(r"^CREATE OR REPLACE (FUNCTION|PROCEDURE|TRIGGER) (queen\.)?(\w+)",
                         re.MULTILINE)


def test_functions_live_only_in_function_files_each_in_one() -> None:
    for migration in discover():
        assert not re.search(r"^CREATE (OR REPLACE )?(CONSTRAINT )?(FUNCTION|PROCEDURE|TRIGGER)",
                             migration.sql, re.MULTILINE | re.IGNORECASE), migration.name
    defined: dict[str, str] = {}
    for function_file in discover_functions():
        for statement in _STATEMENT_RE.finditer(function_file.sql):
            # Re-applied whenever the file changes: every statement must be repeatable.
            assert statement[0].startswith(("CREATE OR REPLACE ", "COMMENT ON ")), (
                function_file.name, statement[0])
        for kind, _, name in _DEFINED_RE.findall(function_file.sql):
            key = f"{kind} {name}"
            assert key not in defined, f"{key} in {defined.get(key)} and {function_file.name}"
            defined[key] = function_file.name
    assert "FUNCTION sweep_timers" in defined and "TRIGGER segments_immutable" in defined


def test_the_squashed_history_is_the_one_the_migrator_adopts() -> None:
    files = sorted(LEGACY.glob("*.sql"))
    history = {
        int(f.name[:3]): (f.name[4:-4], hashlib.sha256(f.read_text(encoding="utf-8").encode())
                          .hexdigest())
        for f in files
    }
    assert history == migrations._LEGACY_HISTORY
