"""A trial-ending reminder, cancelled when the customer converts (sync client, for scripts).

Run it against a broker:  python examples/trial_reminder.py [URL] [--remind-after 2s]

When a trial starts, a timer named ``trial-ending:<account>`` is scheduled in the queue
``reminders``; in production the delay would be ``"72h"``. The name is the handle: converting
cancels it by that name, with nothing to look up. A cancel that answers ``absent`` means the
timer is no longer pending, which includes "already delivered", so the reminder sender checks
the account's plan before sending anything: a customer who converted a moment too late gets
no reminder either.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

from queen_trio.client import Message, SyncClient, TimerResult, delay_ms

REMINDERS, ACCOUNTS, EMAILS = "reminders", "accounts", "emails"


def start_trial(queen: SyncClient, account: str, remind_after: str) -> TimerResult:
    queen.kv.put(ACCOUNTS, account, {"plan": "trial"}, forever=True)
    return (queen.timer(REMINDERS).key(f"trial-ending:{account}").delay(remind_after)
            .payload({"accountId": account}).schedule())


def convert(queen: SyncClient, account: str) -> TimerResult:
    # The plan is written first: whatever the cancel answers, the sender will see it.
    queen.kv.put(ACCOUNTS, account, {"plan": "paid"}, forever=True)
    return queen.timer(REMINDERS).key(f"trial-ending:{account}").cancel()


def send_reminder(queen: SyncClient, message: Message) -> None:
    account = message.data["accountId"]
    entry = queen.kv.get(ACCOUNTS, account)
    if entry is not None and entry.value["plan"] == "trial":
        queen.push(EMAILS, {"to": account, "template": "trial-ending"},
                   txn=f"trial-ending-email:{account}")  # a redelivery cannot email twice


def main(url: str, *, remind_after: str = "2s", idle: str = "500ms") -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    converts, lapses = f"acct-{run}-1", f"acct-{run}-2"
    with SyncClient(url) as queen:
        scheduled = {a: start_trial(queen, a, remind_after).status for a in (converts, lapses)}
        cancelled = convert(queen, converts)
        time.sleep(delay_ms(remind_after) / 1000)  # the other trial runs out
        queen.consume(REMINDERS, lambda m: send_reminder(queen, m), idle_timeout=idle)
        emailed = [m.data["to"] for m in queen.pop(EMAILS, batch=100, auto_ack=True)]
    summary = {"scheduled": scheduled, "cancelled": cancelled.status,
               "emailed": [a for a in emailed if run in a],
               "accounts": {"converts": converts, "lapses": lapses}}
    print(f"{converts}: converted, reminder {cancelled.status}")
    print(f"{lapses}: reminder {'sent' if lapses in emailed else 'not sent'}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("QUEEN_URL",
                                                                 "http://127.0.0.1:6632"))
    parser.add_argument("--remind-after", default="2s", help="72h in real life")
    args = parser.parse_args()
    main(args.url, remind_after=args.remind_after)
