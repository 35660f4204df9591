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
    assert not any("payload" in t for t in rows)  # a list leaves payloads out, not "payload": null
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
    assert code == 0 and out.splitlines()[0].split()[:3] == [
        "TRANSACTION_ID", "PARTITION_ID", "LEASE_ID"]
    assert "[1, 2]" in out


async def test_what_pop_prints_is_what_ack_and_nack_take(qt: Cli, queen: Client) -> None:
    """pop leases; ack and nack settle with the first three columns it printed, so nothing
    waits for the lease to run out."""
    await qt("configure", "jobs", "--retry-limit", "0")
    for n in range(3):
        await qt("push", "jobs", f'{{"n": {n}}}')
    code, out, _ = await qt("pop", "jobs", "--batch", "2")
    assert code == 0
    rows = [line.split()[:3] for line in out.splitlines()[1:]]
    assert len(rows) == 2
    code, out, err = await qt("ack", *rows[0])
    assert code == 0, err
    assert [line.split() for line in out.splitlines() if line.startswith("status")] == [
        ["status", "completed"]]
    code, r = await qt.json("nack", *rows[1], "--error", "bad input")
    assert code == 0 and (r["status"], r["dead_lettered"]) == ("failed", True)
    (letter,) = [d async for d in queen.dlq.list("jobs")]
    assert (letter.data, letter.error) == ({"n": 1}, "bad input")
    # The third message is next: nothing is held by a lease.
    code, r = await qt.json("pop", "jobs", "--batch", "5")
    assert [m["data"] for m in r["messages"]] == [{"n": 2}]
    # A repeated ack of a settled message is the broker's verdict, printed with its code.
    code, _, err = await qt("nack", *rows[0])
    assert code == 4 and err.startswith("queen-trio: "), err
    # In a consumer group: the same --group.
    await qt("push", "jobs", '"g"')
    code, r = await qt.json("pop", "jobs", "--group", "billing")
    m = r["messages"][0]
    code, r = await qt.json("ack", m["transaction_id"], m["partition_id"], m["lease_id"],
                            "--group", "billing")
    assert code == 0 and r["status"] == "completed" and r["refused"] is None


async def test_configure_and_queues(qt: Cli) -> None:
    code, r = await qt.json("configure", "mail", "--lease-time", "5m", "--retry-limit", "7",
                            "--delayed-processing", "30", "--retry-delay", "250ms",
                            "--dead-letter-queue", "off")
    assert code == 0 and (r["queue"], r["lease_time_s"], r["retry_limit"],
                          r["delayed_processing_s"], r["retry_delay_ms"],
                          r["dead_letter_queue"]) == ("mail", 300, 7, 30, 250, False)
    code, _, err = await qt("configure", "mail", "--lease-time", "1.5m")
    assert code == 2 and "1.5m" in err
    # Options not given keep their values.
    code, r = await qt.json("configure", "mail", "--retry-limit", "2")
    assert code == 0 and (r["lease_time_s"], r["retry_limit"], r["delayed_processing_s"],
                          r["retry_delay_ms"], r["dead_letter_queue"]) == (300, 2, 30, 250,
                                                                           False)
    await qt("configure", "mail", "--retry-limit", "7")
    for n in range(4):
        await qt("push", "inbox", str(n))
    code, _, _ = await qt("pop", "inbox", "--batch", "1", "--auto-ack")
    assert code == 0
    code, out, _ = await qt("queues")
    header, *lines = out.splitlines()
    assert code == 0 and header.split()[:4] == ["QUEUE", "PARTITIONS", "PENDING", "TOTAL"]
    assert [line.split()[:4] for line in lines] == [["inbox", "1", "3", "4"],
                                                    ["mail", "1", "0", "0"]]
    code, rows = await qt.json("queues")
    assert code == 0 and rows[1]["queue"] == "mail" and rows[1]["retry_limit"] == 7


async def test_one_output_style(qt: Cli) -> None:
    """None is `-` in a record as in a table (not `null` in one and `-` in the other)."""
    await qt("timers", "schedule", "r", "k", "--delay", "1h")
    code, out, _ = await qt("timers", "peek", "r", "k")
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert fields["payload"] == "-" and fields["last_error"] == "-"
    assert "null" not in out
    code, out, _ = await qt("timers", "list", "r")
    assert out.splitlines()[1].split()[-1] == "-"  # last_error


async def test_help_points_at_what_exists(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert "README" not in top and "queen-trio COMMAND --help" in top
    for command in ("ack", "nack", "configure", "queues"):
        assert command in top
    with pytest.raises(SystemExit):
        cli.main(["pop", "--help"])
    pop = " ".join(capsys.readouterr().out.split())
    assert "--batch N up to N messages, all of one partition" in pop
    assert "--partition PARTITION pop from this partition only" in pop


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
