"""queen_trio.strict_json: JSON by the standard, and only what PostgreSQL can store.

The decoder must agree with ``json.loads`` on every document it accepts, refuse exactly the
values the module's description lists (naming their path), and the encoder must refuse what
the decoder would.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queen_trio import strict_json
from queen_trio.strict_json import INVALID_VALUE, MALFORMED, JsonRefused

DOUBLE_MAX = int(sys.float_info.max)


def refusal(data: bytes | str) -> JsonRefused:
    with pytest.raises(JsonRefused) as caught:
        strict_json.loads(data)
    return caught.value


@pytest.mark.parametrize(("text", "path", "says"), [
    ('{"items": [{"payload": {"price": NaN}}]}', "items[0].payload.price", "NaN"),
    ("[1, Infinity]", "[1]", "Infinity is not"),
    ("-Infinity", "", "-Infinity is not"),
    ('{"a": 1e999}', "a", "1e999 is beyond"),
    ('{"a": -1E+400}', "a", "-1E+400 is beyond"),
    ('{"a": 1.8e308}', "a", "beyond the range of a double"),
    ('{"a": ' + "1" + "0" * 250 + "e99}", "a", "beyond the range of a double"),
    ('{"n": ' + "7" * 4301 + "}", "n", "4301 digits"),
    ('{"n": -' + "9" * 309 + "}", "n", "309 digits"),
    ('{"a": "x\\u0000"}', "a", "a string holding U+0000"),
    ('{"a\\u0000b": 1}', '["a\\u0000b"]', "a member name holding U+0000"),
    ('{"a": ["ok", "\\ud800"]}', "a[1]", "unpaired UTF-16 surrogate (\\ud800)"),
    ('{"a": "\\udc00\\ud800"}', "a", "unpaired"),  # the wrong way round: two lone halves
    ('{"odd key": [{"": NaN}]}', '["odd key"][0][""]', "NaN"),
    ('{"$ok_1": {"x-y": NaN}}', '$ok_1["x-y"]', "NaN"),
])
def test_refused_values_name_their_path(text: str, path: str, says: str) -> None:
    exc = refusal(text.encode())
    assert (exc.code, exc.path) == (INVALID_VALUE, path)
    assert exc.message.startswith(f"{path or 'the document'}: ") and says in exc.message, exc


def test_a_huge_integer_is_not_echoed_whole() -> None:
    exc = refusal(b"[" + b"12345" * 1000 + b"]")
    assert len(exc.message) < 200, exc.message


@pytest.mark.parametrize("text", [
    '{"max": 1.7976931348623157e308, "min": -1.7976931348623157e308}',
    '{"n": ' + str(DOUBLE_MAX) + ', "m": -' + str(DOUBLE_MAX) + "}",  # 309 digits, in range
    '{"n": ' + "9" * 308 + "}",
    '{"tiny": 1e-400, "neg0": -0.0, "e": 1E2, "big": 123456789012345678901234567890}',
    '{"emoji": "\\ud83d\\ude00", "literal": "\\\\u0000", "text": "\\\\ud800", "hangul": "\\ud7a3"}',
    '{"digits in a string": "' + "1" * 1000 + '"}',  # a long run of digits, not a number
    '{"nul-free control": "\\u0001\\u001f", "é": "\\u00e9"}',
])
def test_what_json_can_carry_decodes_as_json_loads_does(text: str) -> None:
    assert strict_json.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(("data", "says"), [
    (b"", "not valid JSON"),
    (b"{not json", "not valid JSON"),
    (b'{"a": "\x01"}', "not valid JSON"),  # a raw control character
    (b"\xff\xfe", "not UTF-8"),
    ('{"a": 1}'.encode("utf-16"), "not UTF-8"),
    ('{"a": 1}'.encode("utf-16-le"), "not valid JSON"),  # NUL bytes are UTF-8, not JSON
    (b'{"a": "\xed\xa0\x80"}', "not UTF-8"),  # a surrogate written in UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_text_that_is_not_utf8_json_is_malformed(data: bytes, says: str) -> None:
    exc = refusal(data)
    assert exc.code == MALFORMED and says in exc.message and exc.path == "", exc


def test_a_utf8_byte_order_mark_is_ignored_and_text_is_accepted() -> None:
    assert strict_json.loads(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}
    assert strict_json.loads('{"a": "é"}') == {"a": "é"}
    assert refusal('{"a": "\udcff"}').code == MALFORMED  # an undecodable byte in argv


@pytest.mark.parametrize(("value", "path", "says"), [
    ({"a": float("nan")}, "a", "NaN is not"),
    ({"a": [1, float("inf")]}, "a[1]", "Infinity is not"),
    ((1, float("-inf")), "[1]", "-Infinity is not"),
    ({"k\x00": 1}, '["k\\u0000"]', "U+0000"),
    (["\ud800"], "[0]", "surrogate"),
    ({"a": 10**5000}, "a", "over 4,300 digits"),
])
def test_the_encoder_refuses_what_the_decoder_would(value: Any, path: str, says: str) -> None:
    with pytest.raises(JsonRefused) as caught:
        strict_json.dumps(value)
    assert caught.value.path == path and says in caught.value.message, caught.value


def test_the_encoder_writes_compact_utf8() -> None:
    value = {"a": [1, 2.5, "é", None, True], "literal": "\\u0000"}
    assert strict_json.dumps(value) == '{"a":[1,2.5,"é",null,true],"literal":"\\\\u0000"}'.encode()
    with pytest.raises(TypeError):
        strict_json.dumps({"a": object()})


def test_check_finds_the_first_refused_value_in_document_order() -> None:
    with pytest.raises(JsonRefused) as caught:
        strict_json.check({"a": [1, {"b": "ok"}, "x\x00"], "c": float("nan")})
    assert caught.value.path == "a[2]"
    strict_json.check({"a": [1, 2**1000, -(2**1000), "é", True]})  # raises nothing


any_text = st.text(st.characters(exclude_categories=()))  # NUL and lone surrogates too
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(10**300, 10**320) | st.floats()
    | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=25)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(json_values)
def test_the_decoder_accepts_exactly_what_check_accepts(value: Any) -> None:
    """Whatever Python writes (NaN, infinities, NUL and surrogates included, escaped or not):
    the decoder gives back what json.loads does, or refuses what check refuses, at the same
    path."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        try:
            data = text.encode()
        except UnicodeEncodeError:  # a raw lone surrogate cannot even be sent as UTF-8
            assert refusal(text).code == MALFORMED
            continue
        try:
            strict_json.check(json.loads(text))
        except JsonRefused as expected:
            assert refusal(data).path == expected.path
        else:
            assert strict_json.loads(data) == json.loads(text)


def _circular() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


@pytest.mark.timeout(10)
@pytest.mark.parametrize("value", [_circular(), {"x": _circular()}, ({"y": [_circular()]},)],
                         ids=["list", "in a dict", "in a tuple"])
def test_a_circular_payload_is_refused_not_walked_forever(value: Any) -> None:
    """The SDK encodes a user's payload with dumps: a container holding itself must end in
    the encoder's ValueError, not in a check that walks the loop until memory runs out."""
    with pytest.raises(ValueError, match="Circular reference"):
        strict_json.dumps(value)


def test_a_value_shared_by_two_members_is_still_checked() -> None:
    shared = [float("nan")]
    with pytest.raises(strict_json.JsonRefused, match=r"a\[0\]: NaN"):
        strict_json.dumps({"a": shared, "b": shared})
