"""The OpenAPI document's schemas are generated from the wire models (queen_trio/models): each
answer the broker gives on the timer routes validates against the schema /openapi.json
declares for it, and a body the schema declares is one the route takes."""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema
import pytest

from ..timer_ops import timer_op

API = "/api/v1"


@pytest.fixture
async def document(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def check(document: dict[str, Any], path: str, method: str, answer: httpx.Response) -> None:
    """``answer`` validates against the 200 schema ``document`` gives ``method path``, its
    $refs resolved in the document itself."""
    assert answer.status_code == 200, answer.text
    declared = document["paths"][path][method]["responses"]["200"]["content"][
        "application/json"]["schema"]
    schema = {**declared, "components": document["components"]}
    jsonschema.validate(answer.json(), schema, cls=jsonschema.Draft202012Validator)


def refuses(document: dict[str, Any], path: str, method: str, answer: Any) -> bool:
    try:
        check(document, path, method, httpx.Response(200, json=answer))
    except jsonschema.ValidationError:
        return True
    return False


async def test_timer_answers_validate_against_the_generated_schemas(
    http: httpx.AsyncClient, document: dict[str, Any],
) -> None:
    batch_body = {"operations": [timer_op("wm", "a", 60_000, {"n": 1}),
                                 timer_op("wm", "b/c", 60_000, ["x", 2.5, None]),
                                 timer_op("wm", "gone", 0, op="cancel", txn="t-1")]}
    # The body the schema declares is the one the route takes.
    body_schema = {**document["paths"][f"{API}/timers"]["post"]["requestBody"]["content"][
        "application/json"]["schema"], "components": document["components"]}
    jsonschema.validate(batch_body, body_schema, cls=jsonschema.Draft202012Validator)
    batch = await http.post(f"{API}/timers", json=batch_body)
    check(document, f"{API}/timers", "post", batch)
    assert [r["status"] for r in batch.json()["results"]] == ["scheduled", "scheduled", "absent"]

    put = await http.put(f"{API}/timers/wm/a", json={"delayMs": 60_000, "payload": {"n": 2}})
    check(document, f"{API}/timers/{{queue}}/{{key}}", "put", put)
    assert put.json()["status"] == "rescheduled"

    found = await http.get(f"{API}/timers/wm/a")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "get", found)
    assert found.json()["found"] is True and found.json()["data"] == {"n": 2}
    missing = await http.get(f"{API}/timers/wm/nothing")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "get", missing)
    assert missing.json() == {"found": False, "queue": "wm", "timerKey": "nothing"}

    page = await http.get(f"{API}/timers/wm?limit=1")
    check(document, f"{API}/timers/{{queue}}", "get", page)
    assert page.json()["truncated"] is True and page.json()["nextAfter"] == "a"
    count = await http.get(f"{API}/timers/wm?mode=count&prefix=b")
    check(document, f"{API}/timers/{{queue}}", "get", count)
    assert count.json() == {"queue": "wm", "prefix": "b", "count": 1}

    cancelled = await http.delete(f"{API}/timers/wm/a")
    check(document, f"{API}/timers/{{queue}}/{{key}}", "delete", cancelled)
    assert cancelled.json()["status"] == "cancelled"

    # The schemas are not vacuous: an answer missing a required field is refused by them.
    wrong = {k: v for k, v in cancelled.json().items() if k != "timerKey"}
    assert refuses(document, f"{API}/timers/{{queue}}/{{key}}", "delete", wrong)
    assert refuses(document, f"{API}/timers", "post", {"results": [{"ok": "yes"}]})
