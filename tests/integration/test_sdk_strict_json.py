"""The SDK and the CLI refuse what JSON or the broker cannot carry: NaN, infinities,
U+0000 and unpaired surrogates before anything is sent, naming the value's path; an integer
beyond the range of a double the broker refuses, and the SDK says so as a BadRequest."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from queen_trio import cli
from queen_trio.client import BadRequest, Client, SyncClient
from queen_trio.server import BrokerHandle
from queen_trio.strict_json import JsonRefused

from . import test_sdk

settings, queen = test_sdk.settings, test_sdk.queen

UNSENDABLE = {"NaN": float("nan"), "Infinity": float("inf"), "NUL": "a\x00b",
              "surrogate": "\ud800"}


@pytest.mark.parametrize("kind", UNSENDABLE)
async def test_the_async_client_refuses_before_sending(queen: Client, kind: str) -> None:
    value = UNSENDABLE[kind]
    attempts: list[Any] = [
        (lambda: queen.push("sj", {"price": value}), "items[0].payload.price"),
        (lambda: queen.kv.put("sj", "k", [1, value], forever=True), "operations[0].value[1]"),
        (lambda: queen.timer("sj").key("k").delay("1m").payload({"a": value}).schedule(),
         "payload.a"),
        (lambda: queen.transaction().push("sj", value).commit(), "operations[0].items[0].payload"),
    ]
    for attempt, path in attempts:
        with pytest.raises(JsonRefused) as caught:
            await attempt()
        assert caught.value.path == path, caught.value
        assert path in str(caught.value)
    # Nothing reached the broker.
    assert len(await queen.pop("sj")) == 0
    assert await queen.kv.get("sj", "k") is None
    assert await queen.timer("sj").key("k").peek() is None


async def test_the_sync_client_refuses_before_sending(broker: BrokerHandle) -> None:
    def run() -> None:
        with SyncClient(broker.url) as sync:
            with pytest.raises(JsonRefused) as caught:
                sync.push("sj", {"price": float("nan")})
            assert caught.value.path == "items[0].payload.price"
            assert len(sync.pop("sj")) == 0

    await trio.to_thread.run_sync(run)


async def test_an_integer_beyond_a_double_is_the_brokers_bad_request(queen: Client) -> None:
    with pytest.raises(BadRequest) as caught:
        await queen.kv.put("sj", "big", {"n": 10**400}, forever=True)
    # Queen's family code on the KV route, ours in reason (as the timer routes answer)
    assert (caught.value.code, caught.value.body["reason"]) == ("kv_bad_request",
                                                                 "invalid_json_value")
    assert caught.value.body["field"] == "operations[0].value.n"
    assert "401 digits" in caught.value.message
    entry = await queen.kv.put("sj", "big", {"n": 2**63 - 1, "m": 10**300}, forever=True)
    assert entry.applied
    got = await queen.kv.get("sj", "big")
    assert got is not None and got.value == {"n": 2**63 - 1, "m": 10**300}


@pytest.mark.parametrize(("payload", "says"), [
    ("NaN", "NaN is not a JSON value"),
    ('{"a": 1e999}', "a: 1e999 is beyond the range of a double"),
    ('"\\u0000"', "U+0000"),
])
async def test_the_cli_refuses_such_payloads_as_usage_errors(
    broker: BrokerHandle, queen: Client, capsys: pytest.CaptureFixture[str], payload: str,
    says: str,
) -> None:
    for argv in (["push", "sj", payload], ["kv", "put", "sj", "k", payload]):
        code = await trio.to_thread.run_sync(cli.main, [*argv, "--url", broker.url])
        err = capsys.readouterr().err
        assert code == 2 and says in err, (argv, code, err)
    assert len(await queen.pop("sj")) == 0
    assert await queen.kv.get("sj", "k") is None
