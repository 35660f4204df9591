"""The pure parts of queen_trio.api.origin: reading a Host header, which hosts a broker
answers to, and which headers show another origin's page."""

from __future__ import annotations

import pytest
from werkzeug.datastructures import Headers

from queen_trio.api.origin import HostPolicy, cross_origin, host_name
from queen_trio.config import Settings


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:6632", "localhost"), ("Queen.Example", "queen.example"), ("[::1]:6632", "::1"),
    ("[::1]", "::1"), ("10.0.0.1:80", "10.0.0.1"), ("a:b", None), ("a:1:2", None),
    ("[::1", None), ("[::1]x", None), ("[::1]:", None), (":80", None),
])
def test_host_names(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_with_auth_off_a_broker_answers_to_local_names_ip_addresses_and_its_list() -> None:
    policy = HostPolicy.from_settings(Settings(host="0.0.0.0", allowed_hosts=("q.example",)))
    for ok in ("localhost", "localhost:1", "x.localhost", "127.0.0.1:6632", "[::1]:6632",
               "192.168.1.20:6632", "q.example:6632", "Q.EXAMPLE", None, ""):
        assert policy.allows(ok), ok
    for no in ("evil.example", "q.example.evil.example", "localhost.", "localhostx", "a:b"):
        assert not policy.allows(no), no
    # The name it listens on.
    assert HostPolicy.from_settings(Settings(host="queen.internal")).allows("queen.internal:80")
    # Auth on: no check, unless a list is configured ("*": none either way).
    assert HostPolicy.from_settings(Settings(auth=True)).allows("evil.example")
    assert not HostPolicy.from_settings(
        Settings(auth=True, allowed_hosts=("q.example",))).allows("evil.example")
    assert HostPolicy.from_settings(Settings(allowed_hosts=("*",))).allows("evil.example")


@pytest.mark.parametrize(("method", "headers", "seen"), [
    ("POST", {}, None),
    ("POST", {"Sec-Fetch-Site": "same-origin", "Origin": "http://evil"}, None),
    ("POST", {"Sec-Fetch-Site": "none"}, None),
    ("POST", {"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
    ("GET", {"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site: same-site"),
    ("OPTIONS", {"Sec-Fetch-Site": "cross-site"}, None),
    ("POST", {"Origin": "http://h:6632", "Host": "h:6632"}, None),
    ("POST", {"Origin": "https://h", "Host": "h:443"}, None),
    ("POST", {"Origin": "http://h:6633", "Host": "h:6632"}, "Origin: http://h:6633"),
    ("POST", {"Origin": "null", "Host": "h"}, "Origin: null"),
    ("POST", {"Origin": "http://evil", "Host": "h"}, "Origin: http://evil"),
])
def test_what_shows_another_origin(method: str, headers: dict[str, str], seen: str | None
                                   ) -> None:
    assert cross_origin(method, Headers(headers)) == seen
