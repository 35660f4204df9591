"""schema/snapshot.sql is the schema a fresh database gets.

Regenerate it after a schema change: python -m tests.schema_snapshot (tests/schema_snapshot.py).
"""

from __future__ import annotations

from ..schema_snapshot import assert_matches_snapshot


def test_a_fresh_database_matches_the_snapshot(database_url: str) -> None:
    assert_matches_snapshot(database_url)
