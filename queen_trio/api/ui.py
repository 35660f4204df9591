"""The operator's dashboard: one HTML page, one script and one stylesheet, served at /ui.

The page holds no secret: it reads the broker's own JSON API with relative URLs (so only from
this origin), with the token the operator types kept in sessionStorage when QUEEN_AUTH=on.
Every answer carries a strict Content-Security-Policy (no inline script or style, nothing from
another origin, no framing) and X-Content-Type-Options: nosniff.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from quart import Blueprint, Response

ui_routes = Blueprint("ui", __name__)

ASSETS = Path(__file__).resolve().parent.parent / "ui"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)

_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


@cache
def _read(name: str) -> bytes:
    return (ASSETS / name).read_bytes()


def _asset(name: str) -> Response:
    response = Response(_read(name), content_type=_TYPES[name])
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-cache"
    return response


@ui_routes.get("/ui")
async def page() -> Response:
    return _asset("index.html")


@ui_routes.get("/ui/")
async def page_with_slash() -> Response:
    """``/ui/`` as typed or bookmarked: the page's one address is ``/ui``."""
    return Response("", status=308, headers={"Location": "/ui"})


@ui_routes.get("/ui/app.js")
async def script() -> Response:
    return _asset("app.js")


@ui_routes.get("/ui/app.css")
async def stylesheet() -> Response:
    return _asset("app.css")
