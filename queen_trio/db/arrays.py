"""Arrays as PostgreSQL's array input reads them, written in C: a statement's array parameter
as one text (the timers' bundles, the push), where psycopg would adapt each element."""

from __future__ import annotations

import re
from typing import Any

import msgspec

_ENCODE = msgspec.json.Encoder().encode
# After every escaped backslash is taken out: an escape other than \" that JSON writes and
# PostgreSQL's array input would read otherwise (\n, \u0001…: a control character).
_OTHER_ESCAPE = re.compile(rb'\\[^"]')


def pg_array(values: list[Any]) -> str:
    """``values`` (str, int, bool or None) as PostgreSQL's array input reads them, written in C:
    a JSON array is one, but for its brackets, as long as JSON escaped nothing in its strings
    but double quotes and backslashes (inside double quotes, array input takes the character
    after a backslash as it is). A string JSON escapes otherwise (a control character) has
    the array written here."""
    raw = _ENCODE(values)
    if b"\\" in raw and _OTHER_ESCAPE.search(raw.replace(b"\\\\", b"")):
        return "{" + ",".join(
            "NULL" if v is None else
            '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' if isinstance(v, str)
            else _ENCODE(v).decode() for v in values) + "}"
    return "{" + raw[1:-1].decode() + "}"
