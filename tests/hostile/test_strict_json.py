"""Inputs that once answered 500, each reproduced against a live broker: values JSON or
PostgreSQL cannot carry in a push, a KV value, a bundle, a timer or an ack; extreme timestamps;
a timers-list cursor that decodes to NUL bytes. Each must be a 400 that names the field or the
parameter, with nothing written, and the broker still healthy.
"""

from __future__ import annotations

import json
import uuid
from string import Template
from typing import Any

import httpx
import pytest

from ..brokers import BrokerProcess

API = "/api/v1"

# (raw JSON text of the value, what the message must say about it)
REFUSED_VALUES = {
    "NaN": ("NaN", "NaN is not a JSON value"),
    "Infinity": ("Infinity", "Infinity is not a JSON value"),
    "-Infinity": ("-Infinity", "-Infinity is not a JSON value"),
    "1e999": ("1e999", "beyond the range of a double"),
    "-1e999": ("-1e999", "beyond the range of a double"),
    "an integer of 4,301 digits": ("7" * 4301, "4301 digits"),
    "an integer of 400 digits": ("1" + "0" * 399, "400 digits"),
    "a string holding NUL": ('"a\\u0000b"', "U+0000"),
    "a member name holding NUL": ('{"k\\u0000": 1}', "U+0000"),
    "an unpaired surrogate": ('"\\ud800x"', "unpaired UTF-16 surrogate"),
}


def fill(template: str, **values: str) -> str:
    """A JSON text with raw JSON values put in for ``$name``."""
    return Template(template).substitute(values)


def where_in(value_text: str, path: str) -> str:
    """The path a message names for a value set at ``path``: a member name holding NUL is
    itself the refused thing, one level down."""
    return f'{path}["k\\u0000"]' if value_text.startswith('{"k') else path


@pytest.fixture(scope="module")
def http(live_broker: BrokerProcess) -> Any:
    with httpx.Client(base_url=live_broker.url, timeout=10) as client:
        yield client


def refused(r: httpx.Response, field: str, says: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    body = r.json()
    # The timer routes answer Queen's surface code (timers_bad_request) with ours as reason.
    assert body["ok"] is False, body
    assert "invalid_json_value" in (body["error"], body.get("reason")), body
    assert body["field"] == field, body
    assert body["message"].startswith(f"{field}: ") and says in body["message"], body


@pytest.mark.parametrize("case", REFUSED_VALUES)
def test_a_value_json_cannot_carry_is_a_400_naming_its_field_on_every_writing_route(
    http: httpx.Client, live_broker: BrokerProcess, case: str
) -> None:
    value, says = REFUSED_VALUES[case]
    tag = uuid.uuid4().hex[:8]
    queue = f"sj-{tag}"

    push = fill('{"items": [{"queue": "$q", "payload": {"ok": 1}}, '
                '{"queue": "$q", "payload": {"price": $v}}]}', q=queue, v=value)
    refused(http.post(f"{API}/push", content=push), where_in(value, "items[1].payload.price"),
            says)
    assert http.get(f"{API}/pop/queue/{queue}").status_code == 204  # neither item was pushed

    kv = fill('{"value": [1, $v]}', v=value)
    refused(http.put(f"{API}/kv/sj/{tag}", content=kv), where_in(value, "value[1]"), says)
    assert kv_absent(http, f"sj/{tag}")

    timer = fill('{"delayMs": 0, "payload": $v}', v=value)
    refused(http.put(f"{API}/timers/{queue}/{tag}", content=timer), where_in(value, "payload"),
            says)
    assert http.get(f"{API}/timers/{queue}/{tag}").json()["found"] is False

    bundle = fill('{"operations": [{"type": "kv.put", "namespace": "sj", "key": "b-$t", '
                  '"value": 1}, {"type": "push", "items": [{"queue": "$q", "payload": $v}]}], '
                  '"timers": [{"action": "schedule", "queue": "$q", "key": "b-$t", '
                  '"delayMs": 0, "payload": 1}]}', t=tag, q=queue, v=value)
    refused(http.post(f"{API}/transaction", content=bundle),
            where_in(value, "operations[1].items[0].payload"), says)
    assert kv_absent(http, f"sj/b-{tag}")
    assert http.get(f"{API}/timers/{queue}/b-{tag}").json()["found"] is False

    assert http.get("/health").status_code == 200
    assert live_broker.alive


def test_an_ack_whose_error_holds_nul_is_a_400_and_the_message_stays_leased(
    http: httpx.Client,
) -> None:
    queue = f"sj-ack-{uuid.uuid4().hex[:8]}"
    r = http.post(f"{API}/push", json={"items": [{"queue": queue, "payload": 1}]})
    assert r.status_code == 201, r.text
    popped = http.get(f"{API}/pop/queue/{queue}").json()["messages"][0]
    ack = {"transactionId": popped["transactionId"], "partitionId": popped["partitionId"],
           "leaseId": popped["leaseId"], "status": "failed"}
    text = json.dumps({**ack, "error": "boom\u0000"})
    refused(http.post(f"{API}/ack", content=text), "error", "U+0000")
    refused(http.post(f"{API}/ack/batch", content=fill('{"acknowledgments": [$a]}', a=text)),
            "acknowledgments[0].error", "U+0000")
    # Nothing was settled: the lease still holds it, and a proper ack goes through.
    assert http.get(f"{API}/pop/queue/{queue}").status_code == 204
    r = http.post(f"{API}/ack", json={**ack, "status": "completed"})
    assert r.status_code == 200 and r.json()[0]["success"] is True, r.text


EXTREMES = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00"]


@pytest.mark.parametrize("at", EXTREMES)
def test_an_extreme_timestamp_is_a_400_naming_the_parameter(http: httpx.Client, at: str
                                                            ) -> None:
    queue = f"sj-ts-{uuid.uuid4().hex[:8]}"
    assert http.post(f"{API}/push", json={"items": [{"queue": queue, "payload": 1}]}
                     ).status_code == 201
    assert http.get(f"{API}/pop/queue/{queue}", params={"consumerGroup": "g"}).status_code == 200
    asked = [
        ("POST", f"{API}/consumer-groups/g/queues/{queue}/seek", None, {"timestamp": at},
         "timestamp"),
        *[("GET", path, {name: at}, None, name)
          for path in (f"{API}/status", f"{API}/messages", f"{API}/dlq")
          for name in ("from", "to")],
    ]
    for method, path, params, body, name in asked:
        r = http.request(method, path, params=params, json=body)
        assert r.status_code == 400, (path, name, r.status_code, r.text[:300])
        answer = r.json()
        assert answer["error"] == "invalid_timestamp" and answer["message"].startswith(name), \
            (path, answer)
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("after", ["\x00", "a\x00b", "\x00" * 40, "line\nbreak"])
def test_a_timers_list_after_holding_control_bytes_is_a_400(
    http: httpx.Client, after: str
) -> None:
    """Queen's ``after`` is the last timer key of the previous page: a key no timer can
    have (a NUL reached PostgreSQL's text and answered 500) is refused."""
    r = http.get(f"{API}/timers/sj-cursor", params={"after": after})
    assert r.status_code == 400, r.text[:300]
    body = r.json()
    assert body["reason"] == "invalid_key" and body["message"].startswith("after "), body


def test_values_at_the_edge_of_what_is_refused_are_stored_and_given_back(
    http: httpx.Client,
) -> None:
    """The largest double, an integer of 308 digits, -0.0, an escaped surrogate pair and a
    literal backslash-u0000 (an escaped backslash) are all JSON anyone can read back."""
    text = fill('{"value": {"max": 1.7976931348623157e308, "int": $n, "neg0": -0.0, '
                '"emoji": "\\ud83d\\ude00", "literal": "\\\\u0000", "tiny": 5e-324}, '
                '"forever": true}',
                n="9" * 308)
    r = http.put(f"{API}/kv/sj/edges", content=text)
    assert r.status_code == 200, r.text[:300]
    got = http.get(f"{API}/kv/sj/edges").json()["value"]
    # (jsonb writes a number back in full: the largest double comes back as 309 digits.)
    assert float(got.pop("max")) == 1.7976931348623157e308
    assert got == {"int": int("9" * 308), "neg0": 0.0, "emoji": "😀", "literal": "\\u0000",
                   "tiny": 5e-324}


def kv_absent(http: httpx.Client, path: str) -> bool:
    """Nothing was written under ``ns/key`` (a KV read miss is 200 ``found: false``)."""
    r = http.get(f"{API}/kv/{path}")
    return r.status_code == 200 and r.json()["found"] is False


@pytest.mark.parametrize(("body", "why"), [
    ('{"value": 1}'.encode("utf-16"), "UTF-16 with its byte order mark"),
    ('{"value": 1}'.encode("utf-16-le"), "UTF-16 without one"),
    (b'{"value": "\xed\xa0\x80"}', "a surrogate encoded in UTF-8"),
    (b'{"value": "\xff"}', "a byte that is not UTF-8"),
])
def test_a_body_that_is_not_utf8_is_malformed_json(http: httpx.Client, body: bytes,
                                                   why: str) -> None:
    key = uuid.uuid4().hex
    r = http.put(f"{API}/kv/sj/{key}", content=body)
    assert r.status_code == 400, (why, r.text[:300])
    # Queen's KV family code, the precise one as reason.
    assert (r.json()["error"], r.json()["reason"]) == ("kv_bad_request", "malformed_json"), why
    assert kv_absent(http, f"sj/{key}")


def test_a_utf8_byte_order_mark_is_ignored(http: httpx.Client) -> None:
    r = http.put(f"{API}/kv/sj/bom", content=b'\xef\xbb\xbf{"value": "ok", "forever": true}')
    assert r.status_code == 200, r.text[:300]
    assert http.get(f"{API}/kv/sj/bom").json()["value"] == "ok"
