"""The database URL as the broker uses it: checked once at start-up, and always asking libpq
for a writable server.

``QUEEN_DATABASE_URL`` may be a URL (``postgresql://u@h1:5432,h2:5432/queen?…``) or a
key=value conninfo (``host=h1,h2 port=5432,5432 dbname=queen …``), naming one host or several.
With several, libpq (through psycopg) tries them in order until one accepts the connection.

A broker only ever writes, so every connection it opens (the pool, the LISTEN connection,
migrations, the CLI) asks for ``target_session_attrs=read-write`` unless the URL says
otherwise: libpq then refuses a standby (or a server left with
``default_transaction_read_only``) at connect and moves on to the next host. A URL that asks
for a read-only or standby server is refused at start-up, and so is ``any`` with several hosts
(the broker could settle on a standby that is listed first). ``any`` with one host is honoured
(libpq's own default: no check at connect); a connection that meets a read-only server is then
dropped at its first write (see :mod:`queen_trio.db.pool`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: The target_session_attrs a broker can work with: both refuse a hot standby.
WRITABLE = ("read-write", "primary")
_ALL_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")


def _hosts(params: Mapping[str, object]) -> list[str]:
    text = str(params.get("host") or params.get("hostaddr") or "")
    return text.split(",") if text else []


def problem(url: str) -> str | None:
    """What is wrong with ``url`` for a broker (phrased as what was expected), or None.

    Checks what can be checked without connecting: the syntax (libpq's own parser), one port
    per host (or a single one for all), ports that are numbers, and a target_session_attrs
    that lets the broker write."""
    if not url.startswith(("postgres://", "postgresql://")) and "=" not in url:
        return ("a libpq URL such as postgresql://user@host:5432/db, or key=value "
                "conninfo such as host=h1,h2 port=5432,5432 dbname=queen")
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        return f"a valid libpq URL or conninfo ({str(exc).strip()})"
    hosts = _hosts(params)
    ports_text = str(params.get("port") or "")
    ports = ports_text.split(",") if ports_text else []
    for port in ports:
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"ports from 1 to 65535 (got {port!r})"
    if len(ports) > 1 and len(ports) != max(1, len(hosts)):
        return f"one port per host, or one port for all ({len(hosts)} hosts, {len(ports)} ports)"
    attrs = params.get("target_session_attrs")
    if attrs is None or attrs in WRITABLE:
        return None
    if attrs not in _ALL_ATTRS:
        return f"target_session_attrs=read-write (got {attrs!r}, which libpq does not know)"
    if attrs == "any":
        if len(hosts) <= 1:
            return None
        return ("target_session_attrs=read-write with several hosts (with 'any' the broker "
                "could settle on a standby listed first; leave it out and read-write is used)")
    return (f"target_session_attrs=read-write, not {attrs!r}: a broker writes, so it cannot "
            "run on a read-only server")


def broker_conninfo(url: str) -> str:
    """``url`` as every broker connection uses it: ``target_session_attrs=read-write`` added
    when it names none (an explicit value is kept; :func:`problem` vets it at start-up).
    A string libpq cannot parse is returned as it is, for the connect to report."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url
    if "target_session_attrs" in params:
        return url
    return make_conninfo(url, target_session_attrs="read-write")


def redacted(url: str) -> str:
    """``url`` (a URL or key=value conninfo) without its password."""
    if url.startswith(("postgres://", "postgresql://")):
        url = re.sub(r"([?&]password=)[^&]*", r"\1***", url)
        return re.sub(r"://([^:@/]*):[^@/]*@", r"://\1:***@", url)
    return re.sub(r"\bpassword\s*=\s*('[^']*'|\S+)", "password=***", url)


def read_only_reason(info: psycopg.ConnectionInfo) -> str | None:
    """Why the server of a connection cannot take writes, from what it reported at connect
    and since (``in_hot_standby``, ``default_transaction_read_only``: PostgreSQL 14 and newer
    report both, at no cost of a round trip), or None. The check libpq's
    target_session_attrs=read-write makes, for connections made with another setting."""
    if info.parameter_status("in_hot_standby") == "on":
        return "the server is a hot standby"
    if info.parameter_status("default_transaction_read_only") == "on":
        return "the server's sessions are read-only (default_transaction_read_only)"
    return None


def is_read_only_refusal(exc: BaseException) -> bool:
    """Whether a failed connect was libpq refusing a read-only or standby server (the
    target_session_attrs check), for the metrics. libpq says so only in words."""
    text = str(exc)
    return "session is read-only" in text or "server is in hot standby mode" in text
