"""Migration discovery: naming, ordering, gaps — and what ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from queen_trio.db.migrations import discover, latest_version, schema_dir
from queen_trio.errors import MigrationError


def _write(tmp_path: Path, names: list[str]) -> Path:
    for name in names:
        (tmp_path / name).write_text(f"-- {name}\nSELECT 1;\n")
    return tmp_path


def test_files_are_applied_in_numeric_order(tmp_path: Path) -> None:
    found = discover(_write(tmp_path, ["002_second.sql", "001_first.sql", "README.md"]))
    assert [(m.version, m.name) for m in found] == [(1, "first"), (2, "second")]
    assert found[0].checksum != found[1].checksum


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


def test_the_shipped_schema_starts_with_the_foundation() -> None:
    found = discover()
    assert found[0].name == "foundation"
    assert latest_version() == len(found)
    assert schema_dir().joinpath("001_foundation.sql").is_file()
