"""The failed-authentication limiter (queen_trio.tenants.failures), on a clock of our own."""

from __future__ import annotations

from queen_trio.tenants import failures
from queen_trio.tenants.failures import FailedAuthLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_twice_the_rate_then_the_rate() -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(10, clock=clock)
    assert [limiter.take("a") for _ in range(20)] == [None] * 20
    wait = limiter.take("a")
    assert wait is not None and 0 < wait <= 0.1
    assert limiter.take("b") is None  # another address has its own bucket
    clock.now += 0.5
    assert [limiter.take("a") for _ in range(5)] == [None] * 5
    assert limiter.take("a") is not None


def test_a_good_token_gives_its_lookup_back() -> None:
    limiter = FailedAuthLimiter(1, clock=Clock())
    for _ in range(100):
        assert limiter.take("a") is None
        limiter.succeeded("a")


def test_wrong_tokens_are_remembered_for_a_while_and_in_bounded_number() -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(10, clock=clock)
    limiter.failed("qt_x")
    assert limiter.known_bad("qt_x") and not limiter.known_bad("qt_y")
    clock.now += failures.BAD_TOKEN_TTL_S + 1
    assert not limiter.known_bad("qt_x")
    for n in range(failures.MAX_BAD_TOKENS + 10):
        limiter.failed(f"t{n}")
    assert not limiter.known_bad("t0") and limiter.known_bad(f"t{failures.MAX_BAD_TOKENS + 9}")
    assert len(limiter._bad) == failures.MAX_BAD_TOKENS


def test_addresses_are_remembered_in_bounded_number() -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(10, clock=clock)
    for n in range(failures.MAX_CLIENTS + 500):
        limiter.take(f"10.0.{n}")
    assert len(limiter._buckets) <= failures.MAX_CLIENTS
