"""`queen-trio tenants …` as a new user runs it: which database, and no database invented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .test_serve import _env

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "queen_trio", "tenants"]


def test_no_embedded_database_is_created_without_init(tmp_path: Path) -> None:
    data_dir = tmp_path / "elsewhere"
    result = subprocess.run(CLI + ["create", "acme"], env=_env(QUEEN_DATA_DIR=str(data_dir)),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in (str(data_dir), "QUEEN_DATA_DIR", "QUEEN_DATABASE_URL", "--init"):
        assert word in lines[0]
    assert result.stdout == ""
    assert not data_dir.exists()


def test_init_creates_it_and_says_so_quietly(memory_path: Path) -> None:
    data_dir = memory_path / "fresh"
    env = _env(QUEEN_DATA_DIR=str(data_dir))
    result = subprocess.run(CLI + ["create", "acme", "--init"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "created tenant acme"
    # One line naming the database, no INFO lines (initdb, migrations).
    assert result.stderr.strip().splitlines() == [
        f"queen-trio: database: embedded PostgreSQL in {data_dir}"]
    again = subprocess.run(CLI + ["list", "--json"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and '"acme"' in again.stdout, again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_exit_codes_are_the_documented_ones(database_url: str) -> None:
    env = _env(QUEEN_DATABASE_URL=database_url)
    result = subprocess.run(CLI + ["plan", "nobody", "--max-stored-bytes", "5"], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 4
    assert result.stderr.strip().splitlines()[1:] == [
        "queen-trio: tenant_not_found: no tenant 'nobody'"]

    dead = _env(QUEEN_DATABASE_URL="postgresql://app:s3cret@127.0.0.1:1/queen")
    result = subprocess.run(CLI + ["list"], env=dead, capture_output=True, text=True, timeout=30)
    assert result.returncode == 5
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "queen-trio: database: postgresql://app:***@127.0.0.1:1/queen"
    assert len(lines) == 2 and "cannot reach the database" in lines[1], result.stderr
    assert "s3cret" not in result.stderr
