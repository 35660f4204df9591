"""A booking saga: a seat is held, and a compensating timer releases it unless payment comes.

Run it against a broker:  python examples/booking_saga.py [URL] [--hold 3s]

Every event of one booking travels in the queue ``bookings``, in the partition named after
the booking, and so does its expiry timer's message. A partition is handed to one consumer at
a time, in order, so the handler below sees a booking's events one after another and its
"read the state, then act" never races with itself.

* ``requested``: hold the seat. One transaction acks the event, records the saga state in KV,
  writes an audit line and schedules the expiry timer. Either all of it happens or none.
* ``paid``: if the seat is still held, confirm it and cancel the expiry timer, in one
  transaction. The cancel may answer ``absent``: the timer could have gone out a moment ago.
  That is fine, because of the next rule.
* ``expire`` (the timer's message): compensate only if the state still says ``held``. A timer
  that fired just before the cancel finds ``confirmed`` and does nothing. Without this check
  a confirmed booking would be unwound while the cancel answered ``absent``.
* a ``paid`` that arrives after the hold expired is refunded.
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import Any

import trio

from queen_trio.client import Client, Message, TimerStatus, delay_ms

BOOKINGS, AUDIT, RELEASES, REFUNDS, SAGA = "bookings", "audit", "seats.release", "refunds", "saga"


class BookingService:
    def __init__(self, queen: Client, hold_for: str) -> None:
        self.queen, self.hold_for = queen, hold_for
        self.cancel_verdicts: dict[str, TimerStatus] = {}

    async def request(self, booking: str) -> None:
        await self.queen.push(BOOKINGS, {"type": "requested", "bookingId": booking},
                              partition=booking, txn=f"{booking}:requested")

    async def pay(self, booking: str) -> None:
        await self.queen.push(BOOKINGS, {"type": "paid", "bookingId": booking},
                              partition=booking, txn=f"{booking}:paid")

    async def handle(self, message: Message) -> None:
        event, booking = message.data["type"], message.data["bookingId"]
        entry = await self.queen.kv.get(SAGA, booking)
        step = entry.value["step"] if entry else None
        tx = self.queen.transaction().ack(message)
        expiry = tx.timer(BOOKINGS).key(f"expire:{booking}")

        if event == "requested" and step is None:
            tx = (tx.kv.put(SAGA, booking, {"step": "held"}, ttl_seconds="7d")
                  .push(AUDIT, {"event": "booking.held", "bookingId": booking})
                  .timer(BOOKINGS).key(f"expire:{booking}").partition(booking)
                  .delay(self.hold_for).payload({"type": "expire", "bookingId": booking})
                  .schedule())
        elif event == "paid" and step == "held":
            # If the timer is being fired right now the cancel answers too_late (a verdict:
            # the bundle still commits), and its expiry message, arriving a moment later, finds
            # the booking confirmed and is only acked.
            tx = (expiry.cancel()
                  .kv.put(SAGA, booking, {"step": "confirmed"}, ttl_seconds="7d")
                  .push(AUDIT, {"event": "booking.confirmed", "bookingId": booking}))
        elif event == "paid" and step == "expired":
            tx = tx.push(REFUNDS, {"bookingId": booking}, txn=f"{booking}:refund")
        elif event == "expire" and step == "held":
            tx = (tx.kv.put(SAGA, booking, {"step": "expired"}, ttl_seconds="7d")
                  .push(RELEASES, {"bookingId": booking}, txn=f"{booking}:release"))
        # Anything else (an expiry after confirmation, a repeated event) is only acked.

        result = await tx.commit()
        for timer in result.timers:
            if timer.status in (TimerStatus.CANCELLED, TimerStatus.ABSENT):
                self.cancel_verdicts[booking] = timer.status

    async def settle(self, idle: str, count: int | None = None) -> None:
        """Handle ``count`` events, or whatever comes until it has been quiet for ``idle``."""
        # Short polls: after ``count`` events the other workers' polls end within 250 ms.
        await self.queen.consume(BOOKINGS, self.handle, concurrency=4, idle_timeout=idle,
                                 max_messages=count, poll="250ms")

    async def state(self, booking: str) -> str | None:
        entry = await self.queen.kv.get(SAGA, booking)
        return entry.value["step"] if entry else None


async def main(url: str, *, hold_for: str = "3s", idle: str = "500ms") -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    paid_on_time, abandoned, raced = (f"b-{run}-{n}" for n in (1, 2, 3))
    async with Client(url) as queen:
        service = BookingService(queen, hold_for)
        for booking in (paid_on_time, abandoned, raced):
            await service.request(booking)
        await service.settle(idle, count=3)        # three seats held, three timers pending

        await service.pay(paid_on_time)
        await service.settle(idle, count=1)        # confirmed; its timer cancelled

        await service.pay(raced)                   # paid, but nobody handles it until …
        await trio.sleep(delay_ms(hold_for) / 1000 + 0.3)  # … both remaining timers went out
        await service.settle(idle)  # abandoned: released; raced: confirmed, expiry ignored

        await service.pay(abandoned)               # too late: refunded
        await service.settle(idle)

        summary = {
            "states": {b: await service.state(b) for b in (paid_on_time, abandoned, raced)},
            "cancel_verdicts": dict(service.cancel_verdicts),
            "bookings": {"paid_on_time": paid_on_time, "abandoned": abandoned, "raced": raced},
        }
    for name, booking in summary["bookings"].items():
        print(f"{name:<13} {booking}: {summary['states'][booking]}"
              f"  (cancel: {summary['cancel_verdicts'].get(booking, '-')})")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("QUEEN_URL",
                                                                 "http://127.0.0.1:6632"))
    parser.add_argument("--hold", default="3s", help="how long a seat is held (e.g. 15m)")
    args = parser.parse_args()
    trio.run(lambda: main(args.url, hold_for=args.hold))
