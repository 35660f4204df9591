"""The row type of the broker's connections, and reading the one row of a statement that always
returns exactly one."""

from __future__ import annotations

from typing import Any, TypeAlias, TypeVar

import psycopg

#: Every connection of the pool makes dict rows (``row_factory=dict_row``, db/pool.py).
DictRow: TypeAlias = dict[str, Any]
DictConnection: TypeAlias = psycopg.Connection[DictRow]

Row = TypeVar("Row")


def one(cursor: psycopg.Cursor[Row]) -> Row:
    """The row of a statement that returns exactly one (an aggregate, an upsert's RETURNING, a
    function call). No row there is a bug in the statement: said so, rather than a TypeError
    on ``None`` further on."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError(f"expected one row, the statement returned none "
                           f"({cursor.statusmessage})")
    return row
