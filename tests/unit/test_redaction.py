"""Database URLs are shown without their secrets (queen_trio.db.conninfo.redacted): in start-up
errors, in ``queen-trio tenants``' first line, in logs.

The property: what is shown does not depend on the password at all. Redacting the URL built
with any password gives the same text as redacting it built with "x", so no password, or any
part of one, can be in it. This holds for well-formed URLs (percent-encoded userinfo,
``password`` and ``sslpassword`` query parameters, keys written with percent-escapes),
key=value conninfo (quoted and bare values, with libpq's backslash escapes), and for URLs
whose userinfo is not escaped at all (``:se/cret@``, ``:p@ss@``), which libpq accepts but
reads differently from what their writer meant.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from queen_trio.db.conninfo import redacted

# Any text a password could be (no NUL: libpq cannot hold one).
passwords = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                    min_size=1, max_size=40)
names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
hosts = st.lists(st.sampled_from(["db", "10.0.0.7", "[::1]", "db.internal:5433", "h2:6000"]),
                 min_size=1, max_size=3).map(",".join)
plain_params = st.lists(st.sampled_from(
    ["sslmode=require", "application_name=queen", "target_session_attrs=read-write",
     "connect_timeout=5"]), max_size=3)


def _libpq_quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _libpq_bare(value: str) -> str:
    return "".join("\\" + c if c in " \t\n\r\f\v\\'" else c for c in value)


@given(user=names, password=passwords, host=hosts, db=names, params=plain_params,
       raw=st.booleans())
@example(user="u", password="se/cret", host="db", db="q", params=[], raw=True)
@example(user="u", password="p@ss", host="db", db="q", params=[], raw=True)
@example(user="u", password="a@b?c", host="db", db="q", params=["sslmode=require"], raw=True)
def test_the_userinfo_password_never_shows(
    user: str, password: str, host: str, db: str, params: list[str], raw: bool
) -> None:
    def url(pw: str) -> str:
        query = ("?" + "&".join(params)) if params else ""
        return f"postgresql://{user}:{pw if raw else quote(pw, safe='')}@{host}/{db}{query}"

    if not raw:  # what libpq reads is the password that was written
        assert conninfo_to_dict(url(password))["password"] == password
    fixed = redacted(url("x"))
    assert f"{user}:***@" in fixed
    text = redacted(url(password))
    assert text == fixed
    if password not in fixed:
        assert password not in text


@given(password=passwords, other=passwords, host=hosts, db=names, params=plain_params,
       key=st.sampled_from(["password", "pass%77ord", "%70%61%73%73%77%6f%72%64"]),
       ssl_key=st.sampled_from(["sslpassword", "ssl%70assword"]))
def test_query_parameter_secrets_never_show(
    password: str, other: str, host: str, db: str, params: list[str], key: str, ssl_key: str
) -> None:
    def url(pw: str, pw2: str) -> str:
        query = "&".join([*params, f"{key}={quote(pw, safe='')}",
                          f"{ssl_key}={quote(pw2, safe='')}"])
        return f"postgresql://queen@{host}/{db}?{query}"

    parsed = conninfo_to_dict(url(password, other))
    assert (parsed["password"], parsed["sslpassword"]) == (password, other)
    fixed = redacted(url("x", "y"))
    text = redacted(url(password, other))
    assert text == fixed
    for secret in (password, other):
        if secret not in fixed:
            assert secret not in text


@given(password=passwords, host=hosts, db=names, quoted=st.booleans(),
       key=st.sampled_from(["password", "sslpassword"]),
       spaces=st.sampled_from(["=", " = ", "= ", "\t=\t"]))
def test_key_value_secrets_never_show(
    password: str, host: str, db: str, quoted: bool, key: str, spaces: str
) -> None:
    assume(not host.startswith("["))  # a URL's bracketed IPv6 form

    def dsn(pw: str) -> str:
        value = _libpq_quoted(pw) if quoted else _libpq_bare(pw)
        return f"host={host.replace(':', '')} {key}{spaces}{value} dbname={db}"

    assert conninfo_to_dict(dsn(password))[key] == password
    fixed = redacted(dsn("x"))
    text = redacted(dsn(password))
    assert text == fixed
    if password not in fixed:
        assert password not in text


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://queen:se/cret@db/q", "postgresql://queen:***@db/q"),
    ("postgresql://queen:p@ss@db:5432/q?sslmode=require",
     "postgresql://queen:***@db:5432/q?sslmode=require"),
    ("postgresql://queen:p%40ss@db/q", "postgresql://queen:***@db/q"),
    ("postgresql://queen@db/q?sslpassword=k3y&sslmode=verify-full",
     "postgresql://queen@db/q?sslpassword=***&sslmode=verify-full"),
    ("postgresql://db/q?pass%77ord=hunter2", "postgresql://db/q?pass%77ord=***"),
    ("postgresql://queen@db/q", "postgresql://queen@db/q"),
    ("host=db password='hun ter\\'2' sslpassword=k\\ 3 dbname=q",
     "host=db password=*** sslpassword=*** dbname=q"),
    ("host=db dbname='postgresql://u:hunter2@h/q'", "host=db dbname='postgresql://u:***@h/q'"),
])
def test_what_an_operator_sees(url: str, shown: str) -> None:
    assert redacted(url) == shown
