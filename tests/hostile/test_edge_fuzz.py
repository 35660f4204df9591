"""Edge values on every route: nothing answers 5xx, and the broker stays healthy.

Every operation of the OpenAPI description (which tests/integration/test_http_ops.py holds to
cover every route the app serves, so a new route is fuzzed as soon as it exists) gets requests
whose path parameters, query parameters and JSON body carry what schemathesis never sends:

* JSON values: NaN, ±Infinity, 1e999, -0.0, integers past a double and past Python's 4,300
  digits, "\\u0000" in strings and member names, lone and reversed surrogates, escaped pairs,
  deep nesting, long strings, odd unicode (bidi overrides, BOMs, zero-width characters);
* timestamps: the extremes of years 1 and 9999 with offsets that push them out of range,
  impossible dates, malformed text, generated instants with any offset;
* encodings: bytes that are not UTF-8, a UTF-8 BOM, UTF-16 bodies, surrogates written in
  UTF-8, a body cut short;
* sizes: long names, long strings, wide and deep documents.

A body follows the operation's schema (so the edge values land in the fields the broker
reads: ``items[0].payload``, ``acknowledgments[0].error``, ``timestamp``…), or is any JSON, or
raw bytes. Runs are derandomized (the same requests on every run, for CI);
``QUEEN_FUZZ_EXAMPLES`` (default 25 per operation) and ``QUEEN_FUZZ_SEED=random`` (new
ground) tune them, as for test_openapi_fuzz.py.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from queen_trio.api.openapi import openapi_document

from ..brokers import BrokerProcess

pytestmark = pytest.mark.slow

DOCUMENT = openapi_document()
OPERATIONS = [(method.upper(), path) for path, item in DOCUMENT["paths"].items()
              for method in item if method in ("get", "put", "post", "delete", "patch")]
EXAMPLES = int(os.environ.get("QUEEN_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("QUEEN_FUZZ_SEED") != "random",
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])

# -- JSON edge values, as raw JSON text ---------------------------------------------------------

EDGE_NUMBERS = [
    "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E+400", "-0.0", "0.0", "-0", "1e-400",
    "5e-324", "1.7976931348623157e308", "1.8e308", "9" * 308, "9" * 309, "-" + "9" * 400,
    "7" * 4301, "1" + "0" * 250 + "e99", "18446744073709551616", "-9223372036854775809",
    "2147483648", "0", "-1", "1.5", "1e2",
]
EDGE_STRINGS = [
    '"\\u0000"', '"a\\u0000b"', '"\\ud800"', '"x\\udfff"', '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"', '"\\\\u0000"', '"\\\\ud800"', '""', '" "', '"\\u202e\\u200b\\ufeff"',
    '"\\u0001\\u001f\\u007f"', '"é😀\\u00e9"', '"\\uffff\\ufffe"', '"' + "x" * 70_000 + '"',
    '"' + "é" * 20_000 + '"', '"' + "1" * 400 + '"', '"NaN"', '"Infinity"',
]
NESTED = ["[" * 64 + "]" * 64, "[" * 1000 + "]" * 1000, "[" * 100_000 + "]" * 100_000,
          '{"a":' * 900 + "1" + "}" * 900, "[" + ",".join(["1"] * 20_000) + "]",
          "{" + ",".join(f'"k{i}":{i}' for i in range(5_000)) + "}"]

TIMESTAMP_EDGES = [
    "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00-23:59", "9999-12-31T23:59:59+23:59",
    "2026-02-30T00:00:00Z", "2026-01-01T25:00:00Z", "2026-01-01T00:00:00+24:00", "2026-01-01",
    "2026-01-01T00:00:00", "20260101T000000Z", "now", "beginning", "", " ", "-1", "1e999",
    "10000-01-01T00:00:00Z", "2026-01-01T00:00:00\x00Z", "2026-01-01T00:00:00Z" + "0" * 80,
]
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda m: timezone(timedelta(minutes=m)))
timestamp_edges = st.sampled_from(TIMESTAMP_EDGES)
timestamps = st.one_of(timestamp_edges, timestamp_edges, st.builds(
    lambda at, tz: at.replace(tzinfo=tz).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    offsets | st.just(UTC)))
TIME_NAMES = {"timestamp", "from", "to", "subscriptionFrom"}  # (and format: date-time)


def _text_token(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)


scalars = (st.sampled_from(EDGE_NUMBERS + EDGE_STRINGS + ["null", "true", "false"])
           | st.builds(_text_token, any_text | timestamps, st.booleans())
           | st.integers().map(str) | st.floats(allow_nan=False, allow_infinity=False).map(repr))
keys = st.sampled_from(['"\\u0000"', '"k\\u0000"', '"\\ud800"', '""', '"payload"']) | st.builds(
    _text_token, any_text, st.booleans())


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in members) + "}"


json_texts = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4).map(_array)
    | st.lists(st.tuples(keys, inner), max_size=4).map(_object), max_leaves=12,
) | st.sampled_from(NESTED)

# -- one edge at a time: everything else in the request is well-formed ---------------------------


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = DOCUMENT
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in map(_resolve, schema["allOf"]):
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
        return merged
    return schema


SANE_STRINGS = {"partitionId": str(uuid.UUID(int=1)), "leaseId": str(uuid.UUID(int=2)),
                "transactionId": "fz-txn", "timestamp": "2026-01-01T00:00:00Z",
                "status": "failed", "type": "push", "action": "schedule"}
SANE_SEGMENTS = {"lease_id": str(uuid.UUID(int=2)), "partition_id": str(uuid.UUID(int=1)),
                 "dead_letter_id": "1"}


ANY_JSON = '{"a": 1}'  # where a schema allows any JSON (a payload, a value)


class Slot:
    """A place in a request where one edge value goes: ``text`` is the well-formed value."""

    def __init__(self, text: str, kind: str, name: str = "") -> None:
        self.text, self.kind, self.name = text, kind, name

    def __str__(self) -> str:
        return self.text


def _sane_leaf(schema: dict[str, Any], name: str) -> str:
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if kinds & {"integer", "number"}:
        return "1"
    if "boolean" in kinds:
        return "false"
    enum = [v for v in schema.get("enum", []) if isinstance(v, str)]
    if enum or "string" in kinds:
        return json.dumps(enum[0] if enum else SANE_STRINGS.get(name, "fz"))
    return ANY_JSON


@st.composite
def skeleton(draw: Callable[[Any], Any], schema: dict[str, Any], slots: list[Slot],
             name: str = "", depth: int = 0) -> Any:
    """A well-formed value of ``schema`` (its required members and some optional ones), as
    nested lists of text and :class:`Slot`; every leaf and member name is a slot."""
    schema = _resolve(schema)
    properties = schema.get("properties")
    if properties and depth < 4:
        required = set(schema.get("required", []))
        chosen = [k for k in properties if k in required or draw(st.booleans())]
        parts: list[Any] = ["{"]
        for i, key in enumerate(chosen):
            slots.append(Slot(json.dumps(key), "name"))
            parts += [","] * (i > 0) + [slots[-1], ":",
                                        draw(skeleton(properties[key], slots, key, depth + 1))]
        return [*parts, "}"]
    if schema.get("type") == "array" and depth < 4:
        return ["[", draw(skeleton(schema.get("items", {}), slots, name, depth + 1)), "]"]
    slots.append(Slot(_sane_leaf(schema, name), "value", name))
    return slots[-1]


def _flatten(node: Any) -> str:
    return str(node) if isinstance(node, Slot | str) else "".join(map(_flatten, node))


edge_tokens = st.sampled_from(EDGE_NUMBERS + EDGE_STRINGS + NESTED)
# (one_of picks a branch evenly: the edge tokens, listed thrice, come up half the time)
edge_values = st.one_of(edge_tokens, edge_tokens, edge_tokens,
                        st.builds(_text_token, timestamps, st.just(True)),
                        st.builds(_text_token, any_text, st.booleans()), json_texts)
edge_names = st.sampled_from(['"\\u0000"', '"k\\u0000"', '"\\ud800"', '"\\udc00"', '""',
                              '"' + "n" * 10_000 + '"']) | st.builds(_text_token, any_text,
                                                                      st.booleans())


def _encodings(text: str) -> list[bytes]:
    utf8 = text.encode("utf-8", "surrogatepass")  # (a raw lone surrogate: CESU bytes)
    return [b"\xef\xbb\xbf" + utf8, text.encode("utf-16", "surrogatepass"),
            text.encode("utf-16-le", "surrogatepass"), text.encode("utf-32"),
            utf8[: len(utf8) // 2], utf8.replace(b'"', b'"\xff', 1),
            utf8.replace(b'"', b'"\xed\xa0\x80', 1), utf8.replace(b'"', b'"\xc0\xaf', 1),
            b"", b"\x00", b"null", b"[]"]


HOSTILE_SEGMENTS = ["%00", "a%00b", "%ED%A0%80", "%FF", "%C0%AF", "%0A", "x" * 600,
                    "%F0%9F%98%80", "%E2%80%AE", "9" * 30, "-1", "1e999", "NaN", "%20",
                    "0001-01-01T00%3A00%3A00%2B01%3A00", "%25", "%", "%2F", "a%2Fb", "%EF%BB%BF"]


def _quoted(text: str) -> str:
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


hostile_segments = (st.sampled_from(HOSTILE_SEGMENTS) | timestamps.map(_quoted)
                    | any_text.filter(lambda t: t not in ("", ".", "..")).map(_quoted))
# (and cursors: base64url of NUL bytes, of a byte that is not UTF-8, of a control character)
hostile_query_values = hostile_segments | st.sampled_from(
    ["9" * 25, "-9", "1.5", "true%00", "", "AA", "AAAA", "YQBi", "_w", "Cg", "=="])
time_values = st.one_of(timestamps.map(json.dumps), timestamps.map(json.dumps), edge_values)


@st.composite
def requests(draw: Callable[[Any], Any], method: str, path: str) -> tuple[str, bytes | None]:
    """One request to the operation with exactly one edge in it: in a path parameter, in a
    query parameter, in the body's value or member name at one place, or in the body's
    encoding; the rest well-formed, so the edge reaches the code that reads it."""
    operation = DOCUMENT["paths"][path][method.lower()]
    parameters = operation.get("parameters", [])
    segments = {p["name"]: SANE_SEGMENTS.get(p["name"], "fz")
                for p in parameters if p["in"] == "path"}
    queries = [p for p in parameters if p["in"] == "query" and p["name"] != "wait"]
    query = {"wait": "false"} if any(p["name"] == "wait" for p in parameters) else {}
    slots: list[Slot] = []
    body = operation.get("requestBody")
    tree = (draw(skeleton(body["content"]["application/json"]["schema"], slots))
            if body is not None else None)
    # Values weigh more than member names, and places that take any JSON (payloads, values:
    # what the broker stores as it is) most.
    weight = {"name": 1, "value": 3}
    targets = ([f"segment:{n}" for n in segments] + [f"query:{p['name']}" for p in queries]
               + [f"slot:{i}" for i, s in enumerate(slots)
                  for _ in range(6 if s.text == ANY_JSON else weight[s.kind])]
               + ["encoding"] * (tree is not None))
    target = draw(st.sampled_from(targets)) if targets else "none"
    kind, _, which = target.partition(":")
    if kind == "segment":
        segments[which] = draw(hostile_segments)
    elif kind == "query":
        timely = which in TIME_NAMES
        query[which] = draw(timestamps.map(_quoted) | hostile_query_values if timely
                            else hostile_query_values)
    elif kind == "slot":
        slot = slots[int(which)]
        slot.text = draw(edge_names if slot.kind == "name"
                         else time_values if slot.name in TIME_NAMES
                         else edge_values)
    for p in queries:  # the others: now and then a well-formed value
        if p["name"] not in query and draw(st.booleans()):
            schema = p.get("schema", {})
            query[p["name"]] = ("1" if schema.get("type") == "integer"
                                else "false" if schema.get("type") == "boolean"
                                else "2026-01-01T00%3A00%3A00Z" if p["name"] in ("from", "to")
                                else schema["enum"][0] if schema.get("enum") else "fz")
    target_path = path
    for name, value in segments.items():
        target_path = target_path.replace(f"{{{name}}}", value)
    if query:
        target_path += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    if tree is None:
        return target_path, None
    text = _flatten(tree)
    if kind == "encoding":
        return target_path, draw(st.sampled_from(_encodings(text)))
    return target_path, text.encode("utf-8", "surrogatepass")


# -- the tests ----------------------------------------------------------------------------------

SENT: dict[int, int] = {}  # answers by status class, for the summary


@pytest.fixture(scope="module")
def http(live_broker: BrokerProcess) -> Any:
    with httpx.Client(base_url=live_broker.url, timeout=15) as client:
        yield client


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_edge_values_never_get_a_server_error(
    http: httpx.Client, live_broker: BrokerProcess, method: str, path: str
) -> None:
    @FUZZ
    @given(request=requests(method, path))
    def run(request: tuple[str, bytes | None]) -> None:
        target, body = request
        assume("/./" not in target and "/../" not in target)
        headers = {} if body is None else {"Content-Type": "application/json"}
        r = http.request(method, target, content=body, headers=headers)
        SENT[r.status_code // 100] = SENT.get(r.status_code // 100, 0) + 1
        assert r.status_code < 500, (method, target, (body or b"")[:300], r.status_code,
                                     r.text[:300])
        if r.status_code >= 400:
            answer = r.json()
            assert answer["ok"] is False and {"error", "message"} <= set(answer), answer

    run()
    assert live_broker.alive, live_broker.stderr()


def test_the_broker_is_healthy_after_the_fuzz(http: httpx.Client,
                                              live_broker: BrokerProcess) -> None:
    print(f"\nedge fuzz: {sum(SENT.values())} requests over {len(OPERATIONS)} operations, "
          + ", ".join(f"{n} {k}xx" for k, n in sorted(SENT.items())))
    assert live_broker.alive, live_broker.stderr()
    assert http.get("/health").status_code == 200
    assert "Traceback" not in live_broker.stderr(200_000), live_broker.stderr()
