"""Pure log rules: names, transaction ids, queue options, push/pop/ack bodies; no database."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from queen_trio.errors import ClientError, PayloadTooLarge, ValidationError
from queen_trio.log import rules
from queen_trio.log.rules import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PARTITION,
    MAX_POP_BATCH,
    MAX_POP_TIMEOUT_MS,
    MAX_PUSH_ITEMS,
    MAX_TRANSACTION_ID_LENGTH,
    QUEUE_MODE_GROUP,
    TIMER_GROUP,
    QueueOptions,
)

PARTITION_ID = "0190b6a4-7c5e-7b2a-9c3d-4e5f60718293"
LEASE_ID = "0190b6a4-7c5e-7b2a-9c3d-000000000001"
CEILING = DEFAULT_MAX_MESSAGE_BYTES


def _fails(fn: Any, *args: Any, **kwargs: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        fn(*args, **kwargs)
    return info.value


# --- errors -------------------------------------------------------------------------------


def test_validation_error_is_a_400_client_error() -> None:
    exc = ValidationError("some_code", "some message")
    assert isinstance(exc, ClientError)
    assert (exc.code, exc.message, exc.status) == ("some_code", "some message", 400)
    assert str(exc) == "some message"


def test_a_payload_too_large_is_a_413_validation_error() -> None:
    exc = PayloadTooLarge("payload_too_large", "big")
    assert isinstance(exc, ValidationError) and exc.status == 413
    assert ValidationError("x", "y").status == 400  # the status is the class's


# --- queue names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["q", "orders", "Orders_2024", "a.b.c", "ns:queue", "with-dash", "0", "x" * 128]
)
def test_valid_queue_names_are_returned_unchanged(name: str) -> None:
    assert rules.queue_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x" * 129,
        "a/b",
        "a b",
        " q",
        "q ",
        "q\n",
        "q\x00",
        "q\t",
        "q\x7f",
        "café",
        "q@x",
        "q=x",
        "q+x",
        "q*",
        "q?",
        "q#",
        "q%20",
        None,
        1,
        1.5,
        True,
        ["q"],
        {"name": "q"},
        b"q",
    ],
)
def test_invalid_queue_names_are_refused(name: Any) -> None:
    exc = _fails(rules.queue_name, name)
    assert exc.code == "invalid_queue"
    assert exc.status == 400
    assert "queue" in exc.message
    assert "128" in exc.message


def test_queue_name_error_names_the_given_field() -> None:
    exc = _fails(rules.queue_name, "a/b", "items[3].queue")
    assert exc.message.startswith("items[3].queue ")


# --- partition names ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["p", "Default", "user@example.com", "k=v", "a+b", "a.b:c-d_e", "p" * 256]
)
def test_valid_partition_names_are_returned_unchanged(name: str) -> None:
    assert rules.partition_name(name) == name


def test_missing_partition_is_default() -> None:
    assert rules.partition_name(None) == DEFAULT_PARTITION == "Default"


@pytest.mark.parametrize(
    "name",
    ["", "p" * 257, "a/b", "a b", "p\n", "p\x00", "p\x1f", "ünïcode", "a,b", 5, True, ["p"], {}],
)
def test_invalid_partition_names_are_refused(name: Any) -> None:
    exc = _fails(rules.partition_name, name, "items[0].partition")
    assert exc.code == "invalid_partition"
    assert exc.status == 400
    assert exc.message.startswith("items[0].partition ")
    assert "256" in exc.message


def test_partition_error_default_field_name() -> None:
    assert _fails(rules.partition_name, "a/b").message.startswith("partition ")


# --- consumer groups ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, ""])
def test_missing_or_empty_group_is_queue_mode(value: Any) -> None:
    assert rules.consumer_group(value) == QUEUE_MODE_GROUP == "__QUEUE_MODE__"
    assert rules.consumer_group(value, for_pop=False) == QUEUE_MODE_GROUP


@pytest.mark.parametrize("name", ["workers", "g-1", "analytics.v2", "ns:group", "G_" + "x" * 126])
def test_valid_groups_are_returned_unchanged(name: str) -> None:
    assert rules.consumer_group(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "x" * 129, "a/b", "a b", "g\n", "g\x00", "g\x7f", "grüppe", "g@h",
        0, 1, True, False, ["g"], {},
    ],
)
def test_invalid_groups_are_refused(name: Any) -> None:
    exc = _fails(rules.consumer_group, name)
    assert exc.code == "invalid_consumer_group"
    assert exc.status == 400
    assert "consumerGroup" in exc.message


def test_timer_group_cannot_pop() -> None:
    exc = _fails(rules.consumer_group, TIMER_GROUP)
    assert exc.code == "reserved_consumer_group"
    assert exc.status == 400
    assert "__timer__" in exc.message


def test_timer_group_allowed_outside_pops() -> None:
    assert rules.consumer_group(TIMER_GROUP, for_pop=False) == "__timer__"


# --- transaction ids ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["a", "order-42", "x" * MAX_TRANSACTION_ID_LENGTH, "with space", "ünïcode ✓", "a/b?c=d"],
)
def test_valid_transaction_ids(value: str) -> None:
    assert rules.transaction_id(value) == value


@pytest.mark.parametrize(
    "value", ["", "x" * (MAX_TRANSACTION_ID_LENGTH + 1), None, 42, 4.2, True, ["a"], {"a": 1}]
)
def test_transaction_id_must_be_a_bounded_non_empty_string(value: Any) -> None:
    exc = _fails(rules.transaction_id, value, "items[2].transactionId")
    assert exc.code == "invalid_transaction_id"
    assert exc.status == 400
    assert exc.message.startswith("items[2].transactionId ")
    assert str(MAX_TRANSACTION_ID_LENGTH) in exc.message


@pytest.mark.parametrize("value", ["a\nb", "a\x00", "\tlead", "trail\r", "del\x7f", "\x1b[31m"])
def test_transaction_id_refuses_control_characters(value: str) -> None:
    exc = _fails(rules.transaction_id, value)
    assert exc.code == "invalid_transaction_id"
    assert "transactionId" in exc.message
    assert "control" in exc.message


# --- generated transaction ids (UUIDv7) ---------------------------------------------------


def test_new_transaction_id_is_a_uuid7_string() -> None:
    txn = rules.new_transaction_id()
    assert isinstance(txn, str)
    parsed = uuid.UUID(txn)
    assert str(parsed) == txn  # canonical lower-case hyphenated form
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert rules.transaction_id(txn) == txn  # usable as a transactionId


def test_new_transaction_ids_are_distinct() -> None:
    ids = {rules.new_transaction_id() for _ in range(2000)}
    assert len(ids) == 2000


def test_every_generated_id_has_version_and_variant() -> None:
    for _ in range(500):
        u = rules.uuid7()
        assert u.version == 7
        assert u.variant == uuid.RFC_4122


def test_uuid7_embeds_the_current_unix_milliseconds() -> None:
    before = time.time_ns() // 1_000_000
    u = rules.uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= u.int >> 80 <= after


def test_ids_minted_in_bulk_are_canonical_distinct_version_7_uuids_of_now() -> None:
    before = time.time_ns() // 1_000_000
    ids = rules.new_transaction_ids(3000) + [rules.new_transaction_id()]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids) == 3001
    for text in ids:
        u = uuid.UUID(text)
        assert (str(u), u.version, u.variant) == (text, 7, uuid.RFC_4122)
        assert before <= u.int >> 80 <= after
    # the variant's digit carries two random bits: all four values turn up
    assert {text[19] for text in ids} == set("89ab")


def test_ids_created_apart_sort_in_creation_order() -> None:
    ids = []
    for _ in range(5):
        ids.append(rules.new_transaction_id())
        time.sleep(0.002)
    assert sorted(ids) == ids
    assert sorted(uuid.UUID(i) for i in ids) == [uuid.UUID(i) for i in ids]


# --- payload size -------------------------------------------------------------------------


def test_the_payload_is_measured_as_the_compact_utf8_json_that_is_stored() -> None:
    assert rules.payload_json({"a": 1, "b": [1, 2]}, 100, "p") == '{"a":1,"b":[1,2]}'
    assert rules.payload_json("é", 4, "p") == '"é"'  # 4 bytes: not \u00e9-escaped
    assert rules.payload_json(None, 4, "p") == "null"


def test_push_items_carry_the_text_the_store_writes() -> None:
    (item,) = rules.push_items({"items": [{"queue": "q", "payload": {"x": "é"}}]}, 100)
    assert item.payload_json == '{"x":"é"}'


def test_payload_at_the_ceiling_is_accepted() -> None:
    rules.payload_json("a" * 8, 10, "items[0]")  # '"aaaaaaaa"' is 10 bytes


def test_payload_above_the_ceiling_is_413() -> None:
    exc = _fails(rules.payload_json, "a" * 9, 10, "items[1]")
    assert exc.code == "payload_too_large"
    assert exc.status == 413
    assert "items[1]" in exc.message
    assert "11" in exc.message and "10" in exc.message


def test_multibyte_characters_count_as_bytes() -> None:
    exc = _fails(rules.payload_json, "é" * 5, 11, "items[0]")  # 2 + 10 bytes
    assert exc.status == 413


# --- queue options ------------------------------------------------------------------------


@pytest.mark.parametrize("options", [None, {}])
def test_queue_options_defaults(options: Any) -> None:
    opts = rules.queue_options(options)
    assert opts == QueueOptions()
    assert opts.to_wire() == {
        "leaseTime": 300,
        "retryLimit": 3,
        "retryDelay": 0,
        "maxSize": 0,
        "ttl": 0,
        "deadLetterQueue": True,
        "delayedProcessing": 0,
        "retentionSeconds": 0,
        "completedRetentionSeconds": 0,
        "retentionEnabled": True,
        "retainUntilConsumed": False,
        "maxWaitTimeSeconds": 0,
        "windowBuffer": 0,
        "encryptionEnabled": False,
    }


def test_queue_options_overrides() -> None:
    opts = rules.queue_options(
        {
            "leaseTime": 60,
            "retryLimit": 0,
            "delayedProcessing": 5,
            "retentionSeconds": 3600,
            "deadLetterQueue": False,
        }
    )
    assert opts == QueueOptions(
        lease_time_s=60, retry_limit=0, delayed_processing_s=5, retention_s=3600,
        dead_letter_queue=False,
    )
    assert opts.to_wire()["deadLetterQueue"] is False


def test_partial_options_keep_other_defaults() -> None:
    opts = rules.queue_options({"retryLimit": 7})
    assert opts == QueueOptions(retry_limit=7)


def test_null_options_take_their_defaults() -> None:
    opts = rules.queue_options({"leaseTime": None, "retryLimit": None, "deadLetterQueue": None})
    assert opts == QueueOptions()


def test_queen_options_are_applied_ignored_by_name_or_refused() -> None:
    name, req = rules.configure_request({"queue": "q", "options": {
        "priority": 5, "maxSize": 10000, "retryDelay": 250, "ttl": 60, "leaseTime": 10,
        "windowBuffer": 0, "encryptionEnabled": False, "colour": "red"}})
    assert name == "q"
    assert req.options == QueueOptions(lease_time_s=10, max_size=10000, retry_delay_ms=250,
                                       ttl_s=60)
    # windowBuffer is applied (here at its default); priority is not.
    assert (req.ignored, req.unknown) == (["priority", "colour"], ["colour"])
    assert (req.echo["priority"], req.echo["windowBuffer"], req.echo["encryptionEnabled"]) == (
        5, 0, False)
    _, sealed = rules.configure_request({"queue": "q", "options": {"encryptionEnabled": True}})
    assert sealed.options.encryption_enabled and sealed.echo["encryptionEnabled"] is True
    exc = _fails(rules.configure_request, {"queue": "q", "options": {"ttl": "x"}})
    assert exc.code == "invalid_option" and "ttl" in exc.message
    exc = _fails(rules.configure_request, {"queue": "q", "namespace": 3})
    assert exc.code == "invalid_option" and "namespace" in exc.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("leaseTime", 1),
        ("leaseTime", 86_400),
        ("retryLimit", 0),
        ("retryLimit", 1000),
        ("delayedProcessing", 0),
        ("delayedProcessing", 7 * 86_400),
        ("retentionSeconds", 0),
        ("retentionSeconds", 10 * 365 * 86_400),
    ],
)
def test_option_range_bounds_are_inclusive(key: str, value: int) -> None:
    assert rules.queue_options({key: value}).to_wire()[key] == value


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("leaseTime", 0),
        ("leaseTime", -1),
        ("leaseTime", 86_401),
        ("leaseTime", True),
        ("leaseTime", False),
        ("leaseTime", 30.0),
        ("leaseTime", "30"),
        ("leaseTime", [30]),
        ("retryLimit", -1),
        ("retryLimit", 1001),
        ("retryLimit", True),
        ("retryLimit", 2.5),
        ("delayedProcessing", -5),
        ("delayedProcessing", 7 * 86_400 + 1),
        ("delayedProcessing", "0"),
        ("retentionSeconds", -1),
        ("retentionSeconds", 10 * 365 * 86_400 + 1),
        ("retentionSeconds", False),
    ],
)
def test_bad_integer_options_name_the_option(key: str, value: Any) -> None:
    exc = _fails(rules.queue_options, {key: value})
    assert exc.code == "invalid_option"
    assert exc.status == 400
    assert exc.message.startswith(f"{key} ")
    assert "integer" in exc.message


@pytest.mark.parametrize("value", [1, 0, "true", "false", [], {}])
def test_dead_letter_queue_must_be_boolean(value: Any) -> None:
    exc = _fails(rules.queue_options, {"deadLetterQueue": value})
    assert exc.code == "invalid_option"
    assert "deadLetterQueue" in exc.message


@pytest.mark.parametrize("options", [[], [{"leaseTime": 1}], "leaseTime=1", 5, True])
def test_options_must_be_an_object(options: Any) -> None:
    exc = _fails(rules.queue_options, options)
    assert exc.code == "invalid_option"
    assert exc.status == 400
    assert "options" in exc.message


def test_queue_options_are_immutable() -> None:
    with pytest.raises(AttributeError):
        rules.queue_options({}).retry_limit = 9  # type: ignore[misc]


# --- push items ---------------------------------------------------------------------------


def test_push_item_defaults() -> None:
    [item] = rules.push_items({"items": [{"queue": "orders", "payload": {"n": 1}}]}, CEILING)
    assert item.index == 0
    assert item.queue == "orders"
    assert item.partition == DEFAULT_PARTITION == "Default"
    assert item.payload == {"n": 1}
    assert item.client_transaction_id is False
    parsed = uuid.UUID(item.transaction_id)
    assert parsed.version == 7


def test_push_item_with_client_values() -> None:
    [item] = rules.push_items(
        {"items": [{"queue": "q", "partition": "user-7", "payload": [1], "transactionId": "t-1"}]},
        CEILING,
    )
    assert (item.partition, item.transaction_id, item.client_transaction_id) == (
        "user-7", "t-1", True,
    )


def test_push_items_keep_order_and_index() -> None:
    body = {
        "items": [
            {"queue": "a", "payload": 1},
            {"queue": "b", "payload": 2, "transactionId": "x"},
            {"queue": "a", "payload": 3, "partition": "p"},
        ]
    }
    items = rules.push_items(body, CEILING)
    assert [(i.index, i.queue, i.payload) for i in items] == [(0, "a", 1), (1, "b", 2), (2, "a", 3)]
    assert [i.client_transaction_id for i in items] == [False, True, False]
    assert items[0].transaction_id != items[2].transaction_id


@pytest.mark.parametrize("payload", [None, 0, "", False, [], {}])
def test_falsy_payloads_are_accepted(payload: Any) -> None:
    [item] = rules.push_items({"items": [{"queue": "q", "payload": payload}]}, CEILING)
    assert item.payload == payload


def test_null_transaction_id_means_generated() -> None:
    [item] = rules.push_items(
        {"items": [{"queue": "q", "payload": 1, "transactionId": None}]}, CEILING
    )
    assert item.client_transaction_id is False
    assert uuid.UUID(item.transaction_id).version == 7


@pytest.mark.parametrize("body", [{}, {"items": None}, {"items": {}},
                                  {"items": "x"}, {"items": {"queue": "q", "payload": 1}}])
def test_items_must_be_an_array(body: dict[str, Any]) -> None:
    exc = _fails(rules.push_items, body, CEILING)
    assert exc.code == "invalid_items"
    assert exc.status == 400
    assert "items" in exc.message


def test_no_items_is_an_empty_push() -> None:
    assert rules.push_items({"items": []}, CEILING) == []  # Queen answers it 201 []


def test_item_count_is_capped() -> None:
    items = [{"queue": "q", "payload": 1}] * (MAX_PUSH_ITEMS + 1)
    exc = _fails(rules.push_items, {"items": items}, CEILING)
    assert exc.code == "invalid_items"
    assert str(MAX_PUSH_ITEMS) in exc.message


def test_item_count_at_the_cap_is_accepted() -> None:
    items = [{"queue": "q", "payload": 1}] * MAX_PUSH_ITEMS
    assert len(rules.push_items({"items": items}, CEILING)) == MAX_PUSH_ITEMS


@pytest.mark.parametrize("bad", [None, "x", 1, ["q", 1]])
def test_non_object_item_is_named(bad: Any) -> None:
    exc = _fails(rules.push_items, {"items": [{"queue": "q", "payload": 1}, bad]}, CEILING)
    assert exc.code == "invalid_items"
    assert "items[1]" in exc.message
    assert "object" in exc.message


def test_missing_payload_is_named() -> None:
    exc = _fails(rules.push_items, {"items": [{"queue": "q", "payload": 1}, {"queue": "q"}]},
                 CEILING)
    assert exc.code == "missing_field"
    assert exc.status == 400
    assert "items[1].payload" in exc.message


@pytest.mark.parametrize("queue", [None, "", "a/b", 7])
def test_bad_queue_in_item_is_named(queue: Any) -> None:
    item: dict[str, Any] = {"payload": 1}
    if queue is not None:
        item["queue"] = queue
    exc = _fails(rules.push_items, {"items": [{"queue": "ok", "payload": 1}, item]}, CEILING)
    assert exc.code == "invalid_queue"
    assert "items[1].queue" in exc.message


@pytest.mark.parametrize("partition", ["", "a b", "a/b", 3])
def test_bad_partition_in_item_is_named(partition: Any) -> None:
    exc = _fails(rules.push_items,
                 {"items": [{"queue": "q", "partition": partition, "payload": 1}]}, CEILING)
    assert exc.code == "invalid_partition"
    assert "items[0].partition" in exc.message


@pytest.mark.parametrize("txn", ["", 5, "x" * 300, "a\nb"])
def test_bad_transaction_id_in_item_is_named(txn: Any) -> None:
    exc = _fails(rules.push_items,
                 {"items": [{"queue": "q", "payload": 1}, {"queue": "q", "payload": 1,
                                                           "transactionId": txn}]}, CEILING)
    assert exc.code == "invalid_transaction_id"
    assert "items[1].transactionId" in exc.message


def test_oversized_item_is_413_and_names_its_index() -> None:
    body = {"items": [{"queue": "q", "payload": "small"}, {"queue": "q", "payload": "x" * 100}]}
    exc = _fails(rules.push_items, body, 50)
    assert exc.code == "payload_too_large"
    assert exc.status == 413
    assert "items[1]" in exc.message


def test_payload_over_the_default_one_mib_ceiling() -> None:
    body = {"items": [{"queue": "q", "payload": "x" * DEFAULT_MAX_MESSAGE_BYTES}]}
    exc = _fails(rules.push_items, body, DEFAULT_MAX_MESSAGE_BYTES)
    assert exc.status == 413
    assert "items[0]" in exc.message


def test_unencodable_payload_is_a_validation_error_not_a_crash() -> None:
    with pytest.raises(ValidationError) as info:
        rules.push_items({"items": [{"queue": "q", "payload": "\ud800"}]}, CEILING)
    assert (info.value.status, info.value.code) == (400, "invalid_payload")
    assert "items[0]" in info.value.message
    with pytest.raises(ValidationError) as info:
        rules.transaction_id("t\udfff")
    assert info.value.code == "invalid_transaction_id"


def test_non_ascii_digits_are_not_numbers() -> None:
    with pytest.raises(ValidationError):
        rules.pop_request("q", None, {"batch": "\u0661"})


# --- pop requests -------------------------------------------------------------------------


def test_pop_request_defaults() -> None:
    req = rules.pop_request("orders", None, {})
    assert req.queue == "orders"
    assert req.partition is None
    assert req.group == QUEUE_MODE_GROUP
    assert (req.batch, req.wait, req.timeout_ms, req.auto_ack) == (1, False, 30_000, False)


def test_pop_request_empty_parameters_take_defaults() -> None:
    req = rules.pop_request(
        "q", None, {"batch": "", "wait": "", "timeout": "", "autoAck": "", "consumerGroup": ""}
    )
    assert (req.batch, req.wait, req.timeout_ms, req.auto_ack) == (1, False, 30_000, False)
    assert req.group == QUEUE_MODE_GROUP


def test_pop_request_reads_every_parameter() -> None:
    req = rules.pop_request(
        "q", "user-1",
        {"batch": "50", "wait": "true", "timeout": "1000", "autoAck": "1", "consumerGroup": "g"},
    )
    assert (req.partition, req.group, req.batch) == ("user-1", "g", 50)
    assert (req.wait, req.timeout_ms, req.auto_ack) == (True, 1000, True)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("TRUE", True), ("True", True), ("1", True),
     ("false", False), ("FALSE", False), ("0", False)],
)
@pytest.mark.parametrize("key", ["wait", "autoAck"])
def test_boolean_parameters(key: str, raw: str, expected: bool) -> None:
    req = rules.pop_request("q", None, {key: raw})
    assert {"wait": req.wait, "autoAck": req.auto_ack}[key] is expected


@pytest.mark.parametrize("raw", ["yes", "no", "2", "on", "t", " true", "-1"])
@pytest.mark.parametrize("key", ["wait", "autoAck"])
def test_bad_boolean_parameters_are_named(key: str, raw: str) -> None:
    exc = _fails(rules.pop_request, "q", None, {key: raw})
    assert exc.code == "invalid_parameter"
    assert exc.status == 400
    assert exc.message.startswith(f"{key} ")


@pytest.mark.parametrize(("raw", "expected"), [("1", 1), (str(MAX_POP_BATCH), MAX_POP_BATCH),
                                               ("007", 7)])
def test_batch_in_range(raw: str, expected: int) -> None:
    assert rules.pop_request("q", None, {"batch": raw}).batch == expected


@pytest.mark.parametrize(("raw", "expected"), [("0", 0), (str(MAX_POP_TIMEOUT_MS),
                                                          MAX_POP_TIMEOUT_MS)])
def test_timeout_in_range(raw: str, expected: int) -> None:
    assert rules.pop_request("q", None, {"timeout": raw}).timeout_ms == expected


@pytest.mark.parametrize(
    ("key", "raw"),
    [
        ("batch", "0"),
        ("batch", str(MAX_POP_BATCH + 1)),
        ("batch", "-1"),
        ("batch", "+5"),
        ("batch", "1.5"),
        ("batch", "ten"),
        ("batch", " 5"),
        ("batch", "1e3"),
        ("batch", "9999999999"),
        ("timeout", "-1"),
        ("timeout", str(MAX_POP_TIMEOUT_MS + 1)),
        ("timeout", "abc"),
        ("timeout", "100ms"),
        ("timeout", "0x10"),
    ],
)
def test_bad_integer_parameters_are_named(key: str, raw: str) -> None:
    exc = _fails(rules.pop_request, "q", None, {key: raw})
    assert exc.code == "invalid_parameter"
    assert exc.status == 400
    assert exc.message.startswith(f"{key} ")
    assert "integer" in exc.message


def test_pop_validates_queue_partition_and_group() -> None:
    assert _fails(rules.pop_request, "a/b", None, {}).code == "invalid_queue"
    assert _fails(rules.pop_request, "q", "a b", {}).code == "invalid_partition"
    assert _fails(rules.pop_request, "q", "", {}).code == "invalid_partition"
    assert _fails(rules.pop_request, "q", None, {"consumerGroup": "a/b"}).code == (
        "invalid_consumer_group"
    )


def test_pop_refuses_the_timer_group() -> None:
    exc = _fails(rules.pop_request, "q", None, {"consumerGroup": TIMER_GROUP})
    assert exc.code == "reserved_consumer_group"
    assert exc.status == 400


def test_query_int_honours_its_declared_range() -> None:
    assert rules.query_int({"cursor": "1000000000"}, "cursor", 0, lo=0, hi=10**18) == 10**9


# --- single acks --------------------------------------------------------------------------


def _ack_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"transactionId": "t-1", "partitionId": PARTITION_ID}
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def test_ack_defaults() -> None:
    a = rules.ack(_ack_body(), 0)
    assert a.index == 0
    assert a.transaction_id == "t-1"
    assert a.partition_id == uuid.UUID(PARTITION_ID)
    assert a.status == "completed"
    assert a.group == QUEUE_MODE_GROUP
    assert a.lease_id is None
    assert a.error is None


@pytest.mark.parametrize("status", [None, ""])
def test_missing_status_means_completed(status: Any) -> None:
    assert rules.ack(_ack_body(status=status), 0).status == "completed"


def test_success_is_an_alias_of_completed() -> None:
    assert rules.ack(_ack_body(status="success"), 0).status == "completed"


@pytest.mark.parametrize("status", ["completed", "failed", "dlq", "retry"])
def test_every_ack_status(status: str) -> None:
    assert rules.ack(_ack_body(status=status), 0).status == status


@pytest.mark.parametrize("status", ["done", "COMPLETED", "Failed", "ok", 1, True, ["completed"]])
def test_invalid_status_is_refused(status: Any) -> None:
    exc = _fails(rules.ack, _ack_body(status=status), 0)
    assert exc.code == "invalid_status"
    assert exc.status == 400
    assert exc.message.startswith("status ")
    for name in rules.ACK_STATUSES:
        assert name in exc.message


@pytest.mark.parametrize("field", ["transactionId", "partitionId"])
def test_missing_ids_are_named(field: str) -> None:
    exc = _fails(rules.ack, _ack_body(**{field: ...}), 0)
    assert exc.code == "missing_field"
    assert exc.status == 400
    assert exc.message.startswith(f"{field} ")


@pytest.mark.parametrize("txn", [None, "", 5, "a\x00b", "x" * 257])
def test_bad_ack_transaction_id(txn: Any) -> None:
    exc = _fails(rules.ack, _ack_body(transactionId=txn), 0)
    assert exc.code == "invalid_transaction_id"
    assert "transactionId" in exc.message


@pytest.mark.parametrize("pid", ["not-a-uuid", "", "1234", PARTITION_ID + "0", None, 5, {}])
def test_bad_partition_id(pid: Any) -> None:
    exc = _fails(rules.ack, _ack_body(partitionId=pid), 0)
    assert exc.code == "invalid_partition_id"
    assert exc.status == 400
    assert "partitionId" in exc.message


def test_partition_id_accepts_any_uuid_spelling() -> None:
    a = rules.ack(_ack_body(partitionId=PARTITION_ID.upper()), 0)
    assert a.partition_id == uuid.UUID(PARTITION_ID)


def test_lease_id_is_parsed() -> None:
    assert rules.ack(_ack_body(leaseId=LEASE_ID), 0).lease_id == uuid.UUID(LEASE_ID)


@pytest.mark.parametrize("lease", [None, ""])
def test_empty_lease_id_is_none(lease: Any) -> None:
    assert rules.ack(_ack_body(leaseId=lease), 0).lease_id is None


@pytest.mark.parametrize("lease", ["nope", "123", 7, ["x"]])
def test_bad_lease_id(lease: Any) -> None:
    exc = _fails(rules.ack, _ack_body(leaseId=lease), 0)
    assert exc.code == "invalid_lease_id"
    assert "leaseId" in exc.message


@pytest.mark.parametrize("value", ["nope", None, 5])
def test_lease_id_helper(value: Any) -> None:
    exc = _fails(rules.lease_id, value)
    assert exc.code == "invalid_lease_id"
    assert exc.message.startswith("leaseId ")
    assert rules.lease_id(LEASE_ID) == uuid.UUID(LEASE_ID)


def test_ack_group_is_validated_but_may_be_the_timer_group() -> None:
    assert rules.ack(_ack_body(consumerGroup="g"), 0).group == "g"
    assert rules.ack(_ack_body(consumerGroup=TIMER_GROUP), 0).group == TIMER_GROUP
    assert rules.ack(_ack_body(consumerGroup=""), 0).group == QUEUE_MODE_GROUP
    assert _fails(rules.ack, _ack_body(consumerGroup="a b"), 0).code == "invalid_consumer_group"


def test_string_error_is_kept() -> None:
    assert rules.ack(_ack_body(status="failed", error="boom"), 0).error == "boom"


@pytest.mark.parametrize(
    ("error", "expected"),
    [({"reason": "x"}, '{"reason": "x"}'), ([1, 2], "[1, 2]"), (42, "42"), (False, "false")],
)
def test_non_string_error_is_serialized(error: Any, expected: str) -> None:
    assert rules.ack(_ack_body(status="failed", error=error), 0).error == expected


def test_empty_error_is_none() -> None:
    assert rules.ack(_ack_body(error=""), 0).error is None


def test_long_error_is_truncated() -> None:
    a = rules.ack(_ack_body(status="failed", error="e" * 5000), 0)
    assert a.error == "e" * 2000


@pytest.mark.parametrize("body", [None, [], "ack", 1])
def test_ack_body_must_be_an_object(body: Any) -> None:
    exc = _fails(rules.ack, body, 0)
    assert exc.code == "invalid_body"
    assert exc.status == 400
    assert "body" in exc.message


# --- ack batches --------------------------------------------------------------------------


def test_ack_batch_parses_each_item_with_its_index() -> None:
    acks = rules.ack_batch(
        {
            "acknowledgments": [
                _ack_body(transactionId="a"),
                _ack_body(transactionId="b", status="failed", consumerGroup="g2"),
            ]
        }
    )
    assert [(a.index, a.transaction_id, a.status) for a in acks] == [
        (0, "a", "completed"), (1, "b", "failed"),
    ]
    assert [a.group for a in acks] == [QUEUE_MODE_GROUP, "g2"]


def test_top_level_group_overrides_per_item_groups() -> None:
    acks = rules.ack_batch(
        {
            "consumerGroup": "top",
            "acknowledgments": [_ack_body(), _ack_body(consumerGroup="item")],
        }
    )
    assert [a.group for a in acks] == ["top", "top"]


def test_empty_top_level_group_uses_per_item_groups() -> None:
    acks = rules.ack_batch(
        {"consumerGroup": "", "acknowledgments": [_ack_body(consumerGroup="item"), _ack_body()]}
    )
    assert [a.group for a in acks] == ["item", QUEUE_MODE_GROUP]


def test_bad_top_level_group_is_refused() -> None:
    exc = _fails(rules.ack_batch, {"consumerGroup": "a/b", "acknowledgments": [_ack_body()]})
    assert exc.code == "invalid_consumer_group"


def test_timer_group_may_ack_in_batches() -> None:
    [a] = rules.ack_batch({"consumerGroup": TIMER_GROUP, "acknowledgments": [_ack_body()]})
    assert a.group == TIMER_GROUP


@pytest.mark.parametrize("body", [{}, {"acknowledgments": []}, {"acknowledgments": None},
                                  {"acknowledgments": {}}, {"acknowledgments": _ack_body()}])
def test_acknowledgments_must_be_a_non_empty_array(body: dict[str, Any]) -> None:
    exc = _fails(rules.ack_batch, body)
    assert exc.code == "invalid_body"
    assert exc.status == 400
    assert "acknowledgments" in exc.message


@pytest.mark.parametrize(
    ("bad", "code", "field"),
    [
        ("x", "invalid_body", "acknowledgments[1]"),
        (_ack_body(status="nope"), "invalid_status", "acknowledgments[1].status"),
        (_ack_body(transactionId=...), "missing_field", "acknowledgments[1].transactionId"),
        (_ack_body(partitionId=...), "missing_field", "acknowledgments[1].partitionId"),
        (_ack_body(partitionId="zz"), "invalid_partition_id", "acknowledgments[1].partitionId"),
        (_ack_body(transactionId=""), "invalid_transaction_id",
         "acknowledgments[1].transactionId"),
        (_ack_body(leaseId="zz"), "invalid_lease_id", "acknowledgments[1].leaseId"),
    ],
)
def test_batch_errors_name_the_item(bad: Any, code: str, field: str) -> None:
    exc = _fails(rules.ack_batch, {"acknowledgments": [_ack_body(), bad]})
    assert exc.code == code
    assert exc.status == 400
    assert field in exc.message


# --- subscription and multi-partition pop parameters ---------------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    ({}, None),
    ({"subscriptionMode": "all"}, None),
    ({"subscriptionMode": ""}, None),
    ({"subscriptionMode": "new"}, rules.SUBSCRIBE_NOW),
    ({"subscriptionMode": "new-only"}, rules.SUBSCRIBE_NOW),
    ({"subscriptionFrom": "now"}, rules.SUBSCRIBE_NOW),
    ({"subscriptionFrom": "beginning"}, None),
    ({"subscriptionMode": "new", "subscriptionFrom": "beginning"}, None),  # From wins
    ({"subscriptionFrom": "2025-01-01T00:00:00Z"},
     datetime(2025, 1, 1, tzinfo=UTC)),
    ({"subscriptionMode": "all", "subscriptionFrom": "2025-01-01T02:00:00+02:00"},
     datetime(2025, 1, 1, tzinfo=UTC)),
])
def test_subscription_parameters(args: dict[str, str], expected: object) -> None:
    assert rules.pop_request("q", None, {"consumerGroup": "g", **args}).subscribe_from == expected


def test_queue_mode_does_not_subscribe_but_validates() -> None:
    assert rules.pop_request("q", None, {"subscriptionMode": "new"}).subscribe_from is None
    assert _fails(rules.pop_request, "q", None,
                  {"subscriptionMode": "newest"}).code == "invalid_subscription_mode"


@pytest.mark.parametrize("raw", ["later", "2025-01-01", "2025-01-01T00:00:00",
                                 "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-14:00",
                                 "2025-02-30T00:00:00Z"])
def test_bad_subscription_from(raw: str) -> None:
    exc = _fails(rules.pop_request, "q", None, {"consumerGroup": "g", "subscriptionFrom": raw})
    assert (exc.code, exc.status) == ("invalid_subscription_from", 400)


def test_partitions_parameter() -> None:
    assert rules.pop_request("q", None, {}).partitions == 1
    assert rules.pop_request("q", None, {"partitions": "7"}).partitions == 7
    assert rules.pop_request("q", "p", {"partitions": "7"}).partitions == 1  # the route names one
    for raw in ("0", "101", "x", "-1"):
        assert _fails(rules.pop_request, "q", None, {"partitions": raw}).code == "invalid_parameter"


def test_pop_autopilot_sizes_only_what_the_client_left_unset() -> None:
    both = rules.pop_request("q", None, {"autopilot": "true"})
    assert (both.auto_batch, both.auto_partitions) == (True, True)
    sized = rules.autopilot_sizing(both, lane_pops=1)
    assert (sized.batch, sized.partitions) == (100, 64)
    # the sweep is shared among the pops of the lane waiting here, never below one
    assert rules.autopilot_sizing(both, lane_pops=4).partitions == 16
    assert rules.autopilot_sizing(both, lane_pops=1000).partitions == 1
    pinned = rules.pop_request("q", None, {"autopilot": "true", "partitions": "1"})
    assert (rules.autopilot_sizing(pinned, 1).partitions,
            rules.autopilot_sizing(pinned, 1).batch) == (1, 100)
    batch = rules.pop_request("q", None, {"autopilot": "true", "batch": "5"})
    assert (rules.autopilot_sizing(batch, 1).batch,
            rules.autopilot_sizing(batch, 1).partitions) == (5, 5)  # width <= batch
    # the partition route is one partition; without autopilot nothing changes
    named = rules.pop_request("q", "p", {"autopilot": "true"})
    assert rules.autopilot_sizing(named, 1).partitions == 1
    plain = rules.pop_request("q", None, {})
    assert rules.autopilot_sizing(plain, 1) == plain and plain.batch == 1


def test_pop_lease_seconds_and_conflation_width() -> None:
    assert rules.pop_request("q", None, {"leaseSeconds": "30"}).lease_s == 30
    assert rules.pop_request("q", None, {"leaseSeconds": "0"}).lease_s is None
    asked = rules.pop_request("q", None, {"conflation": "true", "consumerGroup": "g",
                                          "batch": "500"})
    assert (asked.conflation_asked, asked.partitions) == (True, 1)
    # the width follows the group's stored policy, not what the pop asked
    wide = rules.with_group_policy(asked, True)
    assert (wide.conflation, wide.partitions, wide.conflation_conflict) == (True, 64, False)
    refused = rules.with_group_policy(asked, False)
    assert (refused.conflation, refused.partitions, refused.conflation_conflict) == (
        False, 1, True)
    silent = rules.with_group_policy(rules.pop_request("q", None, {"consumerGroup": "g",
                                                                   "batch": "5"}), True)
    assert (silent.partitions, silent.conflation_conflict) == (5, False)
    pinned = rules.pop_request("q", None, {"conflation": "true", "consumerGroup": "g",
                                           "batch": "500", "partitions": "3"})
    assert rules.with_group_policy(pinned, True).partitions == 3
