"""Named SQL queries, loaded once from ``queen_trio/sql/<area>.sql``.

A file holds blocks that each start with ``-- name: <identifier>``; everything up to the next
such line is that query's text. Python code refers to queries by name (``OPS.schema_version``)
and never holds SQL text of its own. A block may name another block of its file as
``{{<identifier>}}``: that block's text (without its leading comment lines) stands there, so
that what several queries share is written once. The named block may not name others.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")
_LEADING_COMMENTS = re.compile(r"\A(?:--[^\n]*\n)+")


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
    return Queries(area, {name: _included(area, queries, body) for name, body in queries.items()})


def _included(area: str, queries: dict[str, str], body: str) -> str:
    def text(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in queries:
            raise ValueError(f"sql/{area}.sql names {{{{{name}}}}}, which it does not define")
        part = queries[name]
        if _INCLUDE.search(part):
            raise ValueError(f"sql/{area}.sql: {name!r} is named in another block and names "
                             "others itself")
        return _LEADING_COMMENTS.sub("", part)
    return _INCLUDE.sub(text, body)


def load(area: str) -> Queries:
    text = resources.files("queen_trio.sql").joinpath(f"{area}.sql").read_text(encoding="utf-8")
    return parse(area, text)
