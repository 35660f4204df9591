"""A push's texts reach the log exactly as sent: payloads and transactionIds
with the characters that matter to PostgreSQL's array input (quotes, backslashes, braces,
commas, blanks, ``NULL``) and to JSON (escapes, control characters, non-ASCII), through the
one-statement push, whose arrays travel as texts written by the broker (db/arrays.py), and
read back by a pop as a consumer would read them."""

from __future__ import annotations

from typing import Any

import httpx

PAYLOADS: list[Any] = [
    {"s": 'a"b\\c', "t": "{x,y}", "u": "NULL", "v": None},
    'quote " backslash \\ brace } comma , blank  ',
    "NULL",
    None,
    "line\nfeed\ttab\u0001control\u001f",
    "é ü 中文 😀 \u2028",
    ["\\", '"', "", "{}", "[]"],
    {"nested": {"deep": [1, 2.5, -3e10, True, False, {"k": "\\\\u0000 as text"}]}},
    12345678901234567,
    "",
]


async def test_pushed_texts_come_back_from_the_log_as_sent(http: httpx.AsyncClient) -> None:
    items = [{"queue": "texts", "partition": "p:1@a=b+c", "payload": payload,
              "transactionId": f'txn "{i}" \\ {{,}} NULL'}
             for i, payload in enumerate(PAYLOADS)]
    r = await http.post("/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    assert [a["status"] for a in r.json()] == ["queued"] * len(PAYLOADS)
    again = await http.post("/api/v1/push", json={"items": items[:2]})
    assert [a["status"] for a in again.json()] == ["duplicate", "duplicate"]
    assert [a["messageId"] for a in again.json()] == [a["messageId"] for a in r.json()[:2]]

    popped = await http.get("/api/v1/pop/queue/texts", params={
        "batch": len(PAYLOADS) + 5, "wait": "false", "autoAck": "true"})
    assert popped.status_code == 200, popped.text
    messages = popped.json()["messages"]
    assert [m["data"] for m in messages] == PAYLOADS
    assert [m["transactionId"] for m in messages] == [i["transactionId"] for i in items]
    assert {m["partition"] for m in messages} == {"p:1@a=b+c"}
