"""The operator's dashboard at /ui, over real HTTP: the page and its two assets, their types and
their security headers. (tests/e2e/test_ui_browser.py loads it in a real browser.)"""

from __future__ import annotations

import httpx

from queen_trio.api.ui import ASSETS


def _strict(r: httpx.Response) -> None:
    csp = r.headers["content-security-policy"]
    directives = {d.strip().split(" ", 1)[0]: d.strip() for d in csp.split(";")}
    assert directives["default-src"] == "default-src 'self'"
    assert directives["script-src"] == "script-src 'self'"
    assert directives["style-src"] == "style-src 'self'"
    assert directives["frame-ancestors"] == "frame-ancestors 'none'"
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"


async def test_the_page_is_html_with_a_strict_policy(http: httpx.AsyncClient) -> None:
    r = await http.get("/ui")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    _strict(r)
    assert '<script src="/ui/app.js" defer></script>' in r.text
    assert '<link rel="stylesheet" href="/ui/app.css">' in r.text
    # Nothing inline: the policy would block it anyway.
    assert "<style" not in r.text and " style=" not in r.text
    assert r.text.count("<script") == 1


async def test_the_address_with_a_trailing_slash_leads_to_the_page(
    http: httpx.AsyncClient,
) -> None:
    r = await http.get("/ui/")
    assert r.status_code == 308 and r.headers["location"] == "/ui"
    r = await http.get("/ui/", follow_redirects=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")


async def test_the_script_and_stylesheet_have_their_types(http: httpx.AsyncClient) -> None:
    r = await http.get("/ui/app.js")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/javascript")
    _strict(r)
    r = await http.get("/ui/app.css")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/css")
    _strict(r)
    assert (await http.get("/ui/other.js")).status_code == 404


def test_the_script_never_writes_html_from_data() -> None:
    script = (ASSETS / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    # Only relative URLs: the token never leaves this origin.
    assert "http://" not in script.replace('"http://www.w3.org/2000/svg"', "")
    assert "https://" not in script


async def test_the_page_needs_no_token_and_the_openapi_document_lists_it(
    http: httpx.AsyncClient,
) -> None:
    paths = (await http.get("/openapi.json")).json()["paths"]
    for path in ("/ui", "/ui/app.js", "/ui/app.css"):
        assert paths[path]["get"]["security"] == []
