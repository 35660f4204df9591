"""Requests a web page in someone's browser could make: refused unless the page is our own.

With QUEEN_AUTH=off any program that reaches the port may write, and a browser is such a
program, acting for whatever page it shows. Two checks close that, from the headers alone:

- **Cross-origin writes** (any ``/api/`` request: a pop with ``autoAck`` changes state too).
  A page of another origin can send a "simple" request without asking (``fetch`` in
  ``no-cors`` mode, a form): the broker would read its ``text/plain`` body as JSON. Browsers
  say where a request comes from: ``Sec-Fetch-Site`` (every current browser) must be
  ``same-origin`` (the dashboard) or ``none`` (typed by the user); without it, an ``Origin``
  header must name this broker's own host. A request with neither did not come from a web
  page (curl, the SDK, the CLI, Queen's clients). Refused: 403 ``cross_origin``.
- **DNS rebinding.** A page at ``http://evil.example:6632`` whose name is made to resolve to
  127.0.0.1 is same-origin with itself, so the browser lets it read and write the broker. Its
  requests say ``Host: evil.example:6632``. With auth off (or QUEEN_ALLOWED_HOSTS set) the
  Host must be an IP address (no name was resolved, so there was nothing to rebind),
  ``localhost`` or a ``*.localhost`` name (browsers resolve those to loopback themselves),
  the name QUEEN_HOST listens on, or one of QUEEN_ALLOWED_HOSTS (``*``: any). Refused: 403
  ``host_not_allowed``. The port is not checked: a proxy in front may use its own.
"""

from __future__ import annotations

import dataclasses
import ipaddress

from quart import Request
from werkzeug.datastructures import Headers

from ..config import Settings
from .errors import ApiError

_SAFE_SITES = ("same-origin", "none")


@dataclasses.dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host headers this broker answers to; ``check`` False: every one."""

    check: bool
    names: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Settings) -> HostPolicy:
        listed = frozenset(settings.allowed_hosts)
        check = (not settings.auth or bool(listed)) and "*" not in listed
        return cls(check, listed | {settings.host.strip("[]").lower()})

    def allows(self, host_header: str | None) -> bool:
        if not self.check or not host_header:  # no Host: not from a browser (HTTP/1.0)
            return True
        name = host_name(host_header)
        if name is None:
            return False
        if name == "localhost" or name.endswith(".localhost") or name in self.names:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


def host_name(host_header: str) -> str | None:
    """The name of a Host header ("[::1]:6632" → "::1", "Queen:80" → "queen"), or None if it
    is not one (two colons outside brackets, a port that is not a number)."""
    text = host_header.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return name
    name, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


def cross_origin(method: str, headers: Headers) -> str | None:
    """The header that shows a request comes from another origin's page ("Sec-Fetch-Site:
    cross-site"), or None."""
    get = headers.get
    if method == "OPTIONS":  # a preflight changes nothing (and is never answered with CORS)
        return None
    site = get("Sec-Fetch-Site")
    if site is not None:
        return None if site.strip().lower() in _SAFE_SITES else f"Sec-Fetch-Site: {site}"
    origin = get("Origin")
    if origin is None:
        return None
    # The scheme is not compared: behind a TLS proxy the page is https and we see http.
    _, sep, authority = origin.strip().lower().partition("://")
    own = (get("Host") or "").strip().lower()
    if sep and authority and _without_default_port(authority) == _without_default_port(own):
        return None
    return f"Origin: {origin}"


def _without_default_port(authority: str) -> str:
    return authority.removesuffix(":80").removesuffix(":443")


def check_request(req: Request, hosts: HostPolicy) -> None:
    """Refuse a request from another origin's page or for a host this broker is not."""
    host = req.headers.get("Host")
    if not hosts.allows(host):
        raise ApiError(403, "host_not_allowed",
                       f"the Host header ({host!r}) names a host this broker does not answer "
                       "to: use localhost or an IP address, or list the name in "
                       "QUEEN_ALLOWED_HOSTS")
    if not req.path.startswith("/api/"):
        return
    seen = cross_origin(req.method, req.headers)
    if seen is not None:
        raise ApiError(403, "cross_origin",
                       f"refused a request from another origin's web page ({seen}): the "
                       "broker takes /api/ requests from its own pages and from programs "
                       "that are not browsers")
