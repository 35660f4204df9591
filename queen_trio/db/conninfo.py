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
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: Seconds each host's connection attempt may take (QUEEN_DB_CONNECT_TIMEOUT_S).
DEFAULT_CONNECT_TIMEOUT_S = 5
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


def broker_conninfo(url: str, *, connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S) -> str:
    """``url`` as every broker connection uses it: ``target_session_attrs=read-write`` and
    ``connect_timeout`` added when it names none (explicit values are kept; :func:`problem`
    vets target_session_attrs at start-up). The timeout bounds each host's attempt: without
    one, a host that accepts the connection and never answers holds it for 130 s (psycopg's
    default) before libpq moves on to the next.
    A string libpq cannot parse is returned as it is, for the connect to report."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url
    missing: dict[str, str] = {}
    if "target_session_attrs" not in params:
        missing["target_session_attrs"] = "read-write"
    if "connect_timeout" not in params:
        missing["connect_timeout"] = str(connect_timeout_s)
    return make_conninfo(url, **missing) if missing else url


# -- redaction --------------------------------------------------------------------------------

# password, sslpassword, and whatever secret libpq learns next (oauth_client_secret).
_SECRET_KEY = re.compile(r"password|secret", re.I)
# A query parameter: "?" or "&", then key=value up to the next "&".
_QUERY_PARAM = re.compile(r"([?&])([^=&]*)=([^&]*)")
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SPACE = " \t\n\r\f\v"  # C's isspace(), which libpq's conninfo parser uses


def redacted(text: str) -> str:
    """``text`` (a URL or key=value conninfo, well-formed or not) without its secrets.

    Whatever the password, it is not in the answer, even where libpq would read the URL
    differently from what its writer meant (``postgresql://u:p@ss@h/db`` is, to libpq, the
    password "p" on the host "ss@h"). So in a URL everything from the first ":" of the user
    information to the last "@" is hidden (a host never holds "@"; a query value that does
    hides more than needed), and so is the value of every query parameter or keyword whose
    name, percent-decoded, mentions a password or secret."""
    if _URL_START.match(text):
        return _redacted_url(text)
    return _redacted_keywords(text)


def _redacted_url(text: str) -> str:
    scheme, _, rest = text.partition("://")
    if "@" in rest:
        userinfo, _, rest = rest.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        rest = f"{user}:***@{rest}" if colon else f"{userinfo}@{rest}"

    def hide(match: re.Match[str]) -> str:
        if _SECRET_KEY.search(unquote(match[2], errors="replace")):
            return f"{match[1]}{match[2]}=***"
        return match[0]

    return f"{scheme}://{_QUERY_PARAM.sub(hide, rest)}"


def _redacted_keywords(text: str) -> str:
    """key=value conninfo, read as libpq reads it (values bare with backslash escapes, or
    single-quoted with backslash escapes); secret values become ***. Total: a malformed
    string is still cut into pieces, and an unterminated value runs to the end."""
    out: list[str] = []
    i, n = 0, len(text)

    def skip_space(j: int) -> int:
        while j < n and text[j] in _SPACE:
            j += 1
        return j

    while i < n:
        j = skip_space(i)
        out.append(text[i:j])
        i = j
        while j < n and text[j] != "=" and text[j] not in _SPACE:
            j += 1
        key = text[i:j]
        j = skip_space(j)
        if j < n and text[j] == "=":
            j = skip_space(j + 1)
        out.append(text[i:j])
        i = j
        if i < n and text[i] == "'":
            j = i + 1
            while j < n and text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            while j < n and text[j] not in _SPACE:
                j += 2 if text[j] == "\\" else 1
        value = text[i:min(j, n)]
        if _SECRET_KEY.search(key):
            value = "***"
        elif "=" in value or "://" in value:
            # libpq expands a dbname that is itself a URL or conninfo.
            quoted = value[:1] == "'"
            inner = redacted(value[1:-1] if quoted and value.endswith("'") else value)
            value = f"'{inner}'" if quoted else inner
        out.append(value)
        i = min(j, n)
    return "".join(out)


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
