"""docs/queen-compatibility.md's table of Queen's v1 routes is kept true: what it calls
supported (or different) is served and in /openapi.json, what it calls not supported answers a
JSON 404."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from queen_trio.server import BrokerHandle

PAGE = Path(__file__).resolve().parents[2] / "docs" / "queen-compatibility.md"
_ROW = re.compile(r"^\| `(?P<method>[A-Z]+) (?P<path>/[^`]*)` \| (?P<here>[a-z ]+) \|")


def compat_rows() -> list[tuple[str, str, str]]:
    text = PAGE.read_text()
    table = text[text.index("<!-- queen-compat:begin -->"):text.index("<!-- queen-compat:end -->")]
    rows = [(m["method"], m["path"], m["here"].strip())
            for m in map(_ROW.match, table.splitlines()) if m]
    assert len(rows) > 20 and {h for *_, h in rows} == {"supported", "different",
                                                         "not supported"}
    return rows


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


async def test_the_readme_table_of_queen_routes_is_true(broker: BrokerHandle) -> None:
    async with httpx.AsyncClient(base_url=broker.url) as http:
        spec = (await http.get("/openapi.json")).json()
        documented = {(m.upper(), _shape(p)) for p, ops in spec["paths"].items() for m in ops}
        for method, path, here in compat_rows():
            if here == "not supported":
                concrete = re.sub(r"\{[^}]+\}", "x", path)
                r = await http.request(method, concrete)
                assert r.status_code == 404, (method, path, r.status_code)
                assert r.json()["ok"] is False, (method, path)
            elif path.startswith("/api/"):
                assert (method, _shape(path)) in documented, (method, path)
            else:  # /health, /metrics: ops routes, served
                assert (await http.request(method, path)).status_code == 200, path
