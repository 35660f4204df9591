"""A non-editable install must still find schema/: it ships inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from queen_trio.db.migrations import discover, discover_functions

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_schema_and_queries(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=120,
    )
    (wheel,) = tmp_path.glob("queen_trio-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for migration in discover():
        assert f"queen_trio/schema/{migration.version:03d}_{migration.name}.sql" in names
    functions = discover_functions()
    assert functions
    for function_file in functions:
        assert f"queen_trio/schema/functions/{function_file.name}" in names
    assert "queen_trio/sql/migrations.sql" in names
    assert "queen_trio/sql/ops.sql" in names
