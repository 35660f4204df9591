"""Named SQL queries, loaded once from ``queen_trio/sql/<area>.sql``.

A file holds blocks that each start with ``-- name: <identifier>``; everything up to the next
such line is that query's text. Python code refers to queries by name (``OPS.schema_version``)
and never holds SQL text of its own.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


class Queries:
    """The queries of one area, as attributes."""

    def __init__(self, area: str, queries: dict[str, str]) -> None:
        self._area = area
        self._queries = MappingProxyType(queries)

    def __getattr__(self, name: str) -> str:
        try:
            return self._queries[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in sql/{self._area}.sql") from None

    def names(self) -> list[str]:
        return sorted(self._queries)


def parse(area: str, text: str) -> Queries:
    parts = _NAME_LINE.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"sql/{area}.sql defines {name!r} twice")
        body = body.strip().rstrip(";").strip()
        if not body:
            raise ValueError(f"sql/{area}.sql: query {name!r} is empty")
        queries[name] = body
    return Queries(area, queries)


def load(area: str) -> Queries:
    text = resources.files("queen_trio.sql").joinpath(f"{area}.sql").read_text(encoding="utf-8")
    return parse(area, text)
