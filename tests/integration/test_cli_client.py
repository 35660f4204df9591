"""The client commands of ``queen-trio`` against a live broker: output, --json and exit codes."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import trio

from queen_trio import cli
from queen_trio.client import Client
from queen_trio.server import BrokerHandle

from ..brokers import REPO, free_port
from . import test_sdk

settings, queen = test_sdk.settings, test_sdk.queen


class Cli:
    """Runs ``queen-trio …`` in-process (in a worker thread: the broker runs on this loop)."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.capsys = url, capsys

    async def __call__(self, *argv: str, url: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await trio.to_thread.run_sync(cli.main, [*argv, "--url", url or self.url])
        out, err = self.capsys.readouterr()
        return code, out, err

    async def json(self, *argv: str) -> tuple[int, Any]:
        code, out, _ = await self(*argv, "--json")
        return code, json.loads(out)


@pytest.fixture
def qt(broker: BrokerHandle, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(broker.url, capsys)


async def test_timers_schedule_peek_list_cancel(qt: Cli) -> None:
    code, r = await qt.json("timers", "schedule", "reminders", "trial-ending:42",
                            "--delay", "30m", "--payload", '{"accountId": 42}')
    assert code == 0 and r["status"] == "scheduled" and r["key"] == "trial-ending:42"
    code, r = await qt.json("timers", "schedule", "reminders", "trial-ending:42",
                            "--delay", "1800000", "--txn", "t-42", "--partition", "eu")
    assert code == 0 and (r["status"], r["txn"], r["partition"]) == ("rescheduled", "t-42", "eu")
    assert r["deliver_at"].endswith("Z")

    code, r = await qt.json("timers", "peek", "reminders", "trial-ending:42")
    assert code == 0 and (r["payload"], r["state"], r["attempts"]) == (None, "pending", 0)
    code, out, _ = await qt("timers", "peek", "reminders", "trial-ending:42")
    assert code == 0 and "state" in out and "pending" in out

    await qt("timers", "schedule", "reminders", "welcome:42", "--delay", "1h")
    code, rows = await qt.json("timers", "list", "reminders")
    assert code == 0 and [t["key"] for t in rows] == ["trial-ending:42", "welcome:42"]
    assert not any("payload" in t for t in rows)  # not "payload": null (issue 21 item 9)
    code, out, _ = await qt("timers", "list", "reminders", "--limit", "1")
    header, *lines = out.splitlines()
    assert header.split()[:3] == ["KEY", "DELIVER_AT", "STATE"]
    assert len(lines) == 1 and lines[0].startswith("trial-ending:42")

    code, r = await qt.json("timers", "cancel", "reminders", "trial-ending:42", "--txn", "t-42")
    assert code == 0 and (r["ok"], r["status"], r["txn"]) == (True, "cancelled", "t-42")
    # absent is a verdict: its own exit code, the same document.
    code, r = await qt.json("timers", "cancel", "reminders", "trial-ending:42", "--txn", "t-42")
    assert code == 3 and (r["ok"], r["status"], r["txn"]) == (False, "absent", "t-42")
    code, out, _ = await qt("timers", "peek", "reminders", "trial-ending:42")
    assert code == 3 and out.startswith("absent")
    code, r = await qt.json("timers", "peek", "reminders", "trial-ending:42")
    assert code == 3 and r["status"] == "absent"


async def test_push_and_pop(qt: Cli) -> None:
    code, r = await qt.json("push", "orders", '{"id": 1}', "--txn", "order-1")
    assert code == 0 and (r["status"], r["offset"]) == ("queued", 0)
    code, r = await qt.json("push", "orders", '{"id": 1}', "--txn", "order-1")
    assert code == 0 and r["status"] == "duplicate"
    await qt("push", "orders", '"plain text"')
    code, batch = await qt.json("pop", "orders", "--batch", "5", "--auto-ack")
    assert code == 0 and [m["data"] for m in batch["messages"]] == [{"id": 1}, "plain text"]
    code, out, _ = await qt("pop", "orders", "--wait", "200ms")
    assert code == 3 and out.strip() == "no message"
    await qt("push", "orders", "[1, 2]")
    code, out, _ = await qt("pop", "orders")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["OFFSET", "TRANSACTION_ID"]
    assert "[1, 2]" in out


async def test_kv(qt: Cli) -> None:
    code, r = await qt.json("kv", "put", "saga", "b-1", '{"step": "held"}', "--ttl", "1h")
    assert code == 0 and r["applied"] is True and r["expires_at"] and r["version"] > 0
    code, out, _ = await qt("kv", "get", "saga", "b-1")
    assert code == 0 and json.loads(out) == {"step": "held"}
    code, r = await qt.json("kv", "get", "saga", "b-1")
    assert code == 0 and r["value"] == {"step": "held"}
    code, r = await qt.json("kv", "delete", "saga", "b-1")
    assert code == 0 and r["applied"] is True
    code, out, _ = await qt("kv", "get", "saga", "b-1")
    assert code == 3 and out.startswith("absent")


async def test_dead_letters(qt: Cli, queen: Client) -> None:
    await queen.configure("dl", retry_limit=0)
    await queen.push("dl", {"n": 1})
    message = (await queen.pop("dl")).messages[0]
    await queen.ack(message, "failed", error="bad input")
    code, letters = await qt.json("dlq", "list", "dl")
    assert code == 0 and [(d["data"], d["error"]) for d in letters] == [({"n": 1}, "bad input")]
    code, out, _ = await qt("dlq", "list")
    assert "bad input" in out and out.startswith("ID")
    code, r = await qt.json("dlq", "replay", str(letters[0]["id"]))
    assert code == 0 and r["pushed"]["status"] == "queued"
    code, r = await qt.json("dlq", "replay", "424242")
    assert code == 4 and (r["ok"], r["error"], r["status"]) == (False, "dead_letter_not_found",
                                                                404)


async def test_usage_errors_send_nothing(qt: Cli, queen: Client) -> None:
    code, out, err = await qt("timers", "schedule", "q", "k", "--delay", "1.5h")
    assert code == 2 and "1.5h" in err and out == ""
    code, r = await qt.json("push", "q", "{not json")
    assert code == 2 and r["error"] == "usage" and "JSON" in r["message"]
    code, _, err = await qt("kv", "put", "ns", "k", "1", "--ttl", "500ms")
    assert code == 2 and "whole number of seconds" in err
    with pytest.raises(SystemExit) as missing:
        await trio.to_thread.run_sync(cli.main, ["timers", "schedule", "q", "k"])
    assert missing.value.code == 2
    assert [t async for t in queen.timers("q").list()] == []
    assert len(await queen.pop("q")) == 0


async def test_broker_errors_and_unreachable_brokers(qt: Cli) -> None:
    code, out, err = await qt("timers", "schedule", "q", "k", "--delay", "2h")
    assert code == 4 and "horizon" in err
    assert err.startswith("queen-trio: timer_horizon_exceeded: "), err  # the code is printed
    code, r = await qt.json("timers", "schedule", "q", "k", "--delay", "2h")
    assert code == 4 and (r["error"], r["status"]) == ("timer_horizon_exceeded", 403)
    dead = f"http://127.0.0.1:{free_port()}"
    code, _, err = await qt("kv", "get", "ns", "k", url=dead)
    assert code == 5 and "no broker answered" in err
    # Failover: a list of URLs, the dead one first.
    code, _, _ = await qt("kv", "put", "ns", "k", "1", url=f"{dead},{qt.url}")
    assert code == 0


async def test_the_installed_command_reads_queen_url_and_stdin(broker: BrokerHandle) -> None:
    env = {**os.environ, "QUEEN_URL": broker.url}
    done = await trio.run_process(
        [sys.executable, "-m", "queen_trio", "timers", "schedule", "bookings.expire", "b 7",
         "--delay", "15m", "--payload", "-", "--json"],
        cwd=REPO, env=env, stdin=b'{"bookingId": 7}', capture_stdout=True, capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "scheduled"
    async with Client(broker.url) as queen:
        info = await queen.timer("bookings.expire").key("b 7").peek()
    assert info.payload == {"bookingId": 7}


async def test_the_broker_commands_are_still_there(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.startswith("queen-trio ")
