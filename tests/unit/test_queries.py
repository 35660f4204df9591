"""Named SQL blocks: parsing rules, and every shipped query file loads."""

from __future__ import annotations

from importlib import resources

import pytest

from queen_trio.db import queries


def test_blocks_are_split_by_name() -> None:
    q = queries.parse("x", "-- preamble\n-- name: first\nSELECT 1;\n\n-- name: second\nSELECT 2\n")
    assert q.first == "SELECT 1"
    assert q.second == "SELECT 2"
    assert q.names() == ["first", "second"]


def test_unknown_name_is_an_attribute_error() -> None:
    q = queries.parse("x", "-- name: only\nSELECT 1")
    with pytest.raises(AttributeError, match="no query 'other' in sql/x.sql"):
        _ = q.other


def test_duplicate_and_empty_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        queries.parse("x", "-- name: a\nSELECT 1\n-- name: a\nSELECT 2")
    with pytest.raises(ValueError, match="empty"):
        queries.parse("x", "-- name: a\n\n-- name: b\nSELECT 2")


def test_every_shipped_query_file_loads() -> None:
    files = [p.name for p in resources.files("queen_trio.sql").iterdir() if p.name.endswith(".sql")]
    assert files, "no query files found"
    for name in files:
        assert queries.load(name.removesuffix(".sql")).names()


def test_a_block_named_in_another_stands_there_without_its_comments() -> None:
    q = queries.parse("x", "-- name: shared\n-- what it is\nSELECT a, b\nFROM\n\n"
                           "-- name: one\n-- the first\n{{shared}} t1\n\n"
                           "-- name: two\n{{shared}} t2")
    assert q.one == "-- the first\nSELECT a, b\nFROM t1"
    assert q.two == "SELECT a, b\nFROM t2"
    with pytest.raises(ValueError, match="does not define"):
        queries.parse("x", "-- name: a\nSELECT {{b}}")
    with pytest.raises(ValueError, match="names others"):
        queries.parse("x", "-- name: a\nSELECT 1\n-- name: b\n{{a}}\n-- name: c\n{{b}}")
